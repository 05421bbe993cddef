"""Cluster members on the HA wiring link (ha/protocol.py ``PeerMember``): the maps a primary sends are the
ones it sent before members were typed, every bad field is refused naming it, and keys this node does not know
are ignored."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hastandby.ha.backup import BackupRole
from hastandby.ha.primary import PrimaryRole
from hastandby.replication.codec import ProtocolError, decode_control, encode_control
from hastandby.ha.protocol import (
    Hello,
    PeerMember,
    decode_hello,
    decode_member,
    decode_members,
    decode_members_update,
)
from hastandby.ha.cluster_management import ClusterManagement
from hastandby.ha.roles import expected_backups
from hastandby.lifecycle.states import State
from tests.unit import ha_roles


def replication(expected: dict[str, str] | None = None, backup: BackupRole | None = None) -> PrimaryRole:
    return ha_roles.primary_role(expected=expected, backup=backup)


def backup_role(members: list[PeerMember]) -> BackupRole:
    """A backup's role that was last told ``members`` by its primary."""
    backup = ha_roles.backup_role()
    backup.told_members = list(members)
    return backup


def over_the_wire(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the backup reads it: AMQP-encoded by the primary, decoded to plain values."""
    return decode_control(encode_control(body))


# -- the primary's maps ----------------------------------------------------------------------------------------


def test_the_primary_sends_the_maps_it_always_sent() -> None:
    primary = replication()
    members = [{"node_id": "p", "url": "h:1", "state": "primary"},
               {"node_id": "b", "url": "h:2", "state": "catchup", "connected": False, "expected": True}]
    assert [m.to_wire() for m in primary.members()] == members
    assert [list(m.to_wire()) for m in primary.members()] == [list(m) for m in members]  # key order too (JSON)
    assert primary.hello() == {"type": "hello", "primary": {"node_id": "p", "url": "h:1"}, "term": 7,
                               "replicate_default": "all", "members": members}


def test_a_hello_round_trips_through_amqp() -> None:
    primary = replication()
    primary.backups["b"].state = State.BACKUP
    primary.backups["b"].connected = True
    hello = decode_hello(over_the_wire(primary.hello()))
    assert hello.primary == PeerMember("p", "h:1")
    assert hello.term == 7
    assert hello.replicate_default == "all"
    assert hello.members == primary.members()
    assert hello.members[1] == PeerMember("b", "h:2", "ready", connected=True, expected=True)
    assert hello.members[1].ready and not hello.members[0].ready


def test_a_members_update_round_trips_through_amqp() -> None:
    primary = replication()
    body = {"type": "members", "term": 7, "members": [m.to_wire() for m in primary.members()]}
    assert decode_members_update(over_the_wire(body)) == (7, primary.members())


@pytest.mark.parametrize("member", [
    PeerMember("n1", "h:1"),
    PeerMember("n1", "h:1", "primary"),
    PeerMember("n2", "h:2", "catchup", connected=True, expected=False),
    PeerMember("n3", "h:3", "ready", connected=False, expected=True, term=2**63 - 2),
    PeerMember(),
])
def test_to_wire_and_from_wire_round_trip(member: PeerMember) -> None:
    assert PeerMember.from_wire(member.to_wire(), "m") == member
    assert PeerMember.from_wire(over_the_wire(member.to_wire()), "m") == member


def test_to_wire_leaves_out_what_is_not_set() -> None:
    assert PeerMember("n", "h:1").to_wire() == {"node_id": "n", "url": "h:1"}
    assert PeerMember("n", "h:1", term=3).to_wire() == {"node_id": "n", "url": "h:1", "term": 3}


# -- what a backup takes ---------------------------------------------------------------------------------------


def test_absent_fields_take_their_defaults() -> None:
    assert decode_member({}, "m") == PeerMember("", "", None, None, None, None)
    assert decode_member({"state": "ready", "term": None, "expected": None}, "m") == PeerMember(state="ready")
    assert decode_members(None) == []


def test_a_hello_without_a_primary_or_members() -> None:
    hello = decode_hello({"type": "hello"})
    assert hello.primary == PeerMember()
    assert (hello.term, hello.replicate_default, hello.members) == (0, None, [])


def test_unknown_keys_are_ignored() -> None:
    """A newer primary may add keys: this node takes the member and leaves them out."""
    member = decode_member({"node_id": "n", "url": "h:1", "state": "ready", "zone": "eu-1", "load": {"cpu": 3}},
                           "m")
    assert member == PeerMember("n", "h:1", "ready")
    assert member.to_wire() == {"node_id": "n", "url": "h:1", "state": "ready"}
    hello = decode_hello({"type": "hello", "primary": {"node_id": "p", "url": "h:1", "since": 5}, "term": 1,
                          "members": [], "features": ["x"]})
    assert hello.primary == PeerMember("p", "h:1")


def test_an_unknown_state_is_taken() -> None:
    """Any string is a state (a newer primary may have more); only "ready" means anything here."""
    member = decode_member({"node_id": "n", "state": "draining"}, "m")
    assert member.state == "draining" and not member.ready


@pytest.mark.parametrize("value, field, reason", [
    (5, "m", "a member is a map, got 5"),
    ("n1", "m", "a member is a map, got 'n1'"),
    ({"node_id": 5}, "m.node_id", "5 is not a string"),
    ({"node_id": None}, "m.node_id", "None is not a string"),
    ({"url": ["h", 1]}, "m.url", "['h', 1] is not a string"),
    ({"state": 1}, "m.state", "1 is not a string"),
    ({"state": None}, "m.state", "None is not a string"),
    ({"term": "x"}, "m.term", "'x' is not a term (an integer 0..2**63-2)"),
    ({"term": -1}, "m.term", "-1 is not a term (an integer 0..2**63-2)"),
    ({"term": True}, "m.term", "True is not a term (an integer 0..2**63-2)"),
    ({"term": 2**63 - 1}, "m.term", f"{2**63 - 1} is not a term (an integer 0..2**63-2)"),
    ({"expected": "yes"}, "m.expected", "'yes' is not a boolean"),
    ({"expected": 1}, "m.expected", "1 is not a boolean"),
    ({"connected": 0}, "m.connected", "0 is not a boolean"),
])
def test_a_bad_field_is_refused_by_name(value: Any, field: str, reason: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        decode_member(value, "m")
    assert raised.value.field == field
    assert str(raised.value) == f"{field}: {reason}"
    assert raised.value.condition == "amqp:invalid-field"


@pytest.mark.parametrize("body, field", [
    ({"type": "hello", "primary": 5}, "hello.primary"),
    ({"type": "hello", "primary": {"url": 5}}, "hello.primary.url"),
    ({"type": "hello", "term": "x"}, "hello.term"),
    ({"type": "hello", "replicate_default": 3}, "hello.replicate_default"),
    ({"type": "hello", "members": 5}, "hello.members"),
    ({"type": "hello", "members": [{"node_id": "a"}, "b"]}, "hello.members[1]"),
    ({"type": "hello", "members": [{"node_id": "a", "expected": "no"}]}, "hello.members[0].expected"),
])
def test_a_bad_hello_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        decode_hello(body)
    assert raised.value.field == field


@pytest.mark.parametrize("body, field", [
    ({"type": "members", "term": -3, "members": []}, "members.term"),
    ({"type": "members", "term": 1, "members": {"a": 1}}, "members"),
    ({"type": "members", "term": 1, "members": ["not a map"]}, "members[0]"),
    ({"type": "members", "term": 1, "members": [{"node_id": "a"}, {"state": 2}]}, "members[1].state"),
])
def test_a_bad_members_update_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        decode_members_update(body)
    assert raised.value.field == field


# -- the consumers ---------------------------------------------------------------------------------------------


def test_query_shows_the_wire_maps_with_reachable_urls() -> None:
    """A backup's QUERY shows the members its primary sent, as the primary sent them; with TLS, ``amqps://``."""
    members = decode_members([{"node_id": "p", "url": "h:1", "state": "primary"},
                              {"node_id": "b", "url": "h:2", "state": "ready", "connected": True, "expected": False}])
    for tls, prefix in ((False, ""), (True, "amqps://")):
        management = object.__new__(ClusterManagement)
        management.ha = SimpleNamespace(role=backup_role(members), status=SimpleNamespace(state="backup", term=4))
        management.node = SimpleNamespace(config=SimpleNamespace(peer_tls=tls))
        described = management.describe()
        assert described["members"] == [
            {"node_id": "p", "url": f"{prefix}h:1", "state": "primary"},
            {"node_id": "b", "url": f"{prefix}h:2", "state": "ready", "connected": True, "expected": False}]


def test_a_primary_query_shows_its_members() -> None:
    management = object.__new__(ClusterManagement)
    management.ha = SimpleNamespace(role=replication(backup=backup_role([])),
                                    status=SimpleNamespace(state="primary", term=7))
    management.node = SimpleNamespace(config=SimpleNamespace(peer_tls=False))
    assert management.describe()["members"] == [
        {"node_id": "p", "url": "h:1", "state": "primary"},
        {"node_id": "b", "url": "h:2", "state": "catchup", "connected": False, "expected": True}]


def test_a_promoted_backup_expects_the_other_ready_backups() -> None:
    backup = backup_role([
        PeerMember("p", "h:1", "primary"),
        PeerMember("me", "h:2", "ready"),
        PeerMember("b", "h:3", "ready", connected=True, expected=False),
        PeerMember("c", "h:4", "catchup", connected=True, expected=False),
        PeerMember("", "h:5", "ready"),  # no node id: nothing to expect
    ])
    assert expected_backups(backup, "me", None, None) == {"b": "h:3"}  # without etcd
    assert expected_backups(backup, "me", frozenset({"c"}), None) == {"c": ""}  # with: the sync set won with


def backup_side(refuse: bool) -> tuple[BackupRole, list[Any]]:
    """A backup's replication, never started: what it tells the node loop of the wiring stream is recorded."""
    told: list[Any] = []

    def connected(term: int, hello: Hello) -> bool:
        told.append(("connected", term, hello))
        return not refuse  # as HaNode's membership answers for an older term

    backup = ha_roles.backup_role(on_connected=connected,
                                  on_members=lambda term, members: told.append(("members", term, members)))
    return backup, told


def test_a_backup_keeps_the_primary_it_follows_and_passes_members_on() -> None:
    primary = replication()
    backup, told = backup_side(refuse=False)
    backup.wiring_message(over_the_wire(primary.hello()))
    assert backup.primary == PeerMember("p", "h:1")
    hello = decode_hello(over_the_wire(primary.hello()))
    assert told == [("connected", 7, hello), ("members", 7, primary.members())]
    body = {"type": "members", "term": 7, "members": [m.to_wire() for m in primary.members()]}
    backup.wiring_message(over_the_wire(body))
    assert told[-1] == ("members", 7, primary.members())


def test_a_refused_primary_is_not_followed() -> None:
    backup, told = backup_side(refuse=True)
    backup.wiring_message(over_the_wire(replication().hello()))
    assert backup.primary is None
    assert [entry[0] for entry in told] == ["connected"]


def test_a_bad_hello_keeps_nothing() -> None:
    backup, told = backup_side(refuse=False)
    with pytest.raises(ProtocolError):
        backup.wiring_message({"type": "hello", "primary": {"node_id": "p", "url": "h:1"},
                               "members": [{"node_id": "b", "connected": "yes"}]})
    assert backup.primary is None and told == []
