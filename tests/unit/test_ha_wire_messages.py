"""The HA messages built from their types (ha/protocol.py ``to_wire``) are the maps, and the bytes, that
were built by hand before: hello, members update, a backup's status, a replicating browser's attach and its
reply.  Member states are ``State`` inside the node and Qpid's names on the wire only."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Data, symbol

from hastandby.broker.queues import lineage
from hastandby.broker.queues.idset import IdSet
from hastandby.broker.queues.lineage import Epoch
from hastandby.broker.queues.registry import Registry
from hastandby.ha.primary import PrimaryRole, RemoteBackup
from hastandby.ha.protocol import (
    MEMBER_STATES,
    BackupIdentity,
    BackupStatus,
    BrowserReply,
    BrowserRequest,
    Hello,
    MembersUpdate,
    PeerMember,
    decode_browser_request,
    decode_hello,
    decode_members_update,
    decode_status,
)
from hastandby.lifecycle.states import State
from hastandby.replication.codec import IDS_PROPERTY, decode_control, encode_control
from tests.unit.ha_roles import primary_role

# The keys as ha/protocol.py spelled them before the types built the maps.
REPLICATE_PROPERTY = symbol("qpid.ha-replicate")
TERM_PROPERTY = symbol("qpid.ha-term")
LINEAGE_PROPERTY = symbol("qpid.ha-lineage")


def _properties_bytes(properties: dict[Any, Any]) -> bytes:
    """Link properties as proton puts them on the wire (an AMQP map, in the dict's order)."""
    data = Data()
    data.put_object(properties)
    return bytes(data.encode())


def _primary(replicate_default: str = "all") -> PrimaryRole:
    registry = Registry(replicate_default, True)
    registry.declare_queue("q")
    return primary_role(registry)


@pytest.mark.parametrize("ready", [False, True])
def test_hello_is_the_map_and_bytes_built_by_hand(ready: bool) -> None:
    primary = _primary()
    if ready:
        primary.backups["b"].state = State.BACKUP
    members = [m.to_wire() for m in primary.members()]
    by_hand = {"type": "hello", "primary": primary.me, "term": primary.term,
               "replicate_default": primary.registry.default_replicate, "members": members}
    typed = primary.hello()
    assert typed == by_hand
    assert list(typed) == list(by_hand)
    assert encode_control(typed) == encode_control(by_hand)
    assert decode_hello(decode_control(encode_control(typed))) == Hello(
        PeerMember("p", "h:1"), 7, "all", primary.members())


def test_a_hello_without_a_replication_default_still_names_the_key() -> None:
    hello = Hello(PeerMember("p", "h:1"), 3, None, [])
    by_hand = {"type": "hello", "primary": {"node_id": "p", "url": "h:1"}, "term": 3, "replicate_default": None,
               "members": []}
    assert encode_control(hello.to_wire()) == encode_control(by_hand)
    assert Hello.from_wire(decode_control(encode_control(hello.to_wire()))) == hello


def test_members_update_is_the_map_and_bytes_built_by_hand() -> None:
    primary = _primary()
    by_hand = {"type": "members", "term": 7, "members": [m.to_wire() for m in primary.members()]}
    typed = MembersUpdate(7, primary.members()).to_wire()
    assert typed == by_hand and list(typed) == list(by_hand)
    assert encode_control(typed) == encode_control(by_hand)
    assert decode_members_update(decode_control(encode_control(typed))) == (7, primary.members())


@pytest.mark.parametrize("alarm", [False, True])
def test_backup_status_is_the_map_and_bytes_built_by_hand(alarm: bool) -> None:
    typed = BackupStatus(alarm).to_wire()
    assert encode_control(typed) == encode_control({"memory_alarm": alarm})
    assert decode_status(decode_control(encode_control(typed))) is alarm
    assert BackupStatus.from_wire({}) == BackupStatus(False)


def test_browser_request_is_the_properties_built_by_hand() -> None:
    ids = IdSet()
    ids.add_range(1, 5)
    offered = (Epoch(2, "p", 1), Epoch(5, "b", 4))
    by_hand = {REPLICATE_PROPERTY: True, IDS_PROPERTY: ids.to_wire(), LINEAGE_PROPERTY: lineage.to_wire(offered),
               TERM_PROPERTY: 9}
    typed = BrowserRequest(9, ids, offered).to_wire()
    assert typed == by_hand and list(typed) == list(by_hand)
    assert _properties_bytes(typed) == _properties_bytes(by_hand)
    plain = {str(key): value for key, value in typed.items()}
    request = decode_browser_request(plain)
    assert (request.term, request.ids.to_wire(), request.lineage) == (9, ids.to_wire(), offered)


def test_browser_reply_is_the_properties_built_by_hand() -> None:
    theirs = (Epoch(7, "p", 3),)
    by_hand = {LINEAGE_PROPERTY: lineage.to_wire(theirs)}
    assert BrowserReply(theirs).to_wire() == by_hand
    assert _properties_bytes(BrowserReply(theirs).to_wire()) == _properties_bytes(by_hand)


def test_member_states_are_translated_at_the_wire_only() -> None:
    assert MEMBER_STATES == {State.PRIMARY: "primary", State.BACKUP: "ready", State.CATCHUP: "catchup"}
    for state, wire in MEMBER_STATES.items():
        member = PeerMember.of("n", "h:1", state)
        assert member.to_wire()["state"] == wire
        assert PeerMember.from_wire(member.to_wire(), "m").status is state
        assert member.ready is (state is State.BACKUP)
    etcds_name = PeerMember(state="backup")  # State.BACKUP's own name, not the wire's: not one the wire knows
    assert etcds_name.status is None and not etcds_name.ready
    assert PeerMember().status is None


def test_a_remote_backup_is_described_with_the_wire_names() -> None:
    backup = RemoteBackup("b", "h:2", expected=True)
    assert backup.member().to_wire() == {"node_id": "b", "url": "h:2", "state": "catchup", "connected": False,
                                         "expected": True}
    backup.state = State.BACKUP
    assert backup.member().to_wire()["state"] == "ready"


@pytest.mark.parametrize("state", [State.CONNECTING, State.CATCHUP, State.BACKUP])
def test_backup_identity_is_the_connection_property_built_by_hand(state: State) -> None:
    by_hand = {"node_id": "me", "url": "h:3", "state": str(state)}
    typed = BackupIdentity("me", "h:3", state).to_wire()
    assert typed == by_hand and list(typed) == list(by_hand)
    assert _properties_bytes(typed) == _properties_bytes(by_hand)
    assert typed["state"] == state.value  # State's own name here ("backup"), not a members list's "ready"
