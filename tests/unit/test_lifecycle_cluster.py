"""Key layout and value format of the cluster in etcd (pure, no etcd)."""

from __future__ import annotations

import pytest

from hastandby.election.cluster import (
    ClusterKeys,
    ClusterSnapshot,
    Leader,
    Member,
    SyncSet,
    decode_handover,
    decode_leader,
    decode_member,
    decode_sync,
    encode_handover,
    encode_leader,
    encode_member,
    encode_sync,
)
from hastandby.lifecycle.states import Detail, NodeStatus, State


def test_key_layout() -> None:
    keys = ClusterKeys("prod")
    assert keys.prefix == "/hastandby/prod/"
    assert keys.leader == "/hastandby/prod/leader"
    assert keys.handover == "/hastandby/prod/handover"
    assert keys.member("n1") == "/hastandby/prod/members/n1"
    assert keys.sync == "/hastandby/prod/sync"


@pytest.mark.parametrize("name", ["", "a/b"])
def test_names_cannot_escape_their_prefix(name: str) -> None:
    with pytest.raises(ValueError):
        ClusterKeys(name)
    with pytest.raises(ValueError):
        ClusterKeys("prod").member(name)


def test_values_round_trip() -> None:
    assert decode_leader(encode_leader("n1", "amqp://h:5672"), 17) == Leader("n1", "amqp://h:5672", 17)
    status = NodeStatus(State.PRIMARY, Detail.RECOVERING, 17)
    assert decode_member("n1", encode_member("amqp://h", status)) == Member(
        "n1", "amqp://h", State.PRIMARY, Detail.RECOVERING
    )
    assert decode_member("n2", encode_member("amqp://g", NodeStatus(State.CATCHUP))).detail is None
    assert decode_handover(encode_handover("n2")) == "n2"


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"[1]",
        b'{"url": "amqp://h"}',
        b'{"url": "amqp://h", "state": "ready"}',
        b'{"url": "amqp://h", "state": "primary", "detail": "busy"}',
    ],
)
def test_bad_member_values_are_refused_with_the_node_named(value: bytes) -> None:
    with pytest.raises(ValueError, match="member n1"):
        decode_member("n1", value)


def test_every_member_connecting_needs_members() -> None:
    assert not ClusterSnapshot(1).every_member_connecting()
    connecting = Member("n1", "amqp://n1", State.CONNECTING)
    assert ClusterSnapshot(1, members=(connecting,)).every_member_connecting()
    backup = Member("n2", "amqp://n2", State.BACKUP)
    assert not ClusterSnapshot(1, members=(connecting, backup)).every_member_connecting()
    assert ClusterSnapshot(1, members=(connecting, backup)).member("n2") == backup


def test_sync_set_round_trip_and_bad_values() -> None:
    assert decode_sync(encode_sync(frozenset({"n2", "n1"}), "n1"), 9) == SyncSet(frozenset({"n1", "n2"}), "n1", 9)
    for value in (b"[]", b'{"members": "n1", "leader": "n1"}', b'{"members": ["n1", ""], "leader": "n1"}',
                  b'{"members": ["n1"]}'):
        with pytest.raises(ValueError, match="sync key"):
            decode_sync(value, 1)


def test_sync_membership_and_its_live_members() -> None:
    backup, catchup = Member("n2", "amqp://n2", State.BACKUP), Member("n3", "amqp://n3", State.CATCHUP)
    assert ClusterSnapshot(1, members=(backup,)).in_sync("n2")  # no sync key yet: no restriction
    cluster = ClusterSnapshot(1, members=(backup, catchup), sync=SyncSet(frozenset({"n1", "n2", "n3"}), "n1"))
    assert cluster.in_sync("n3") and not cluster.in_sync("n4")
    assert cluster.live_sync_members() == frozenset({"n2"})
