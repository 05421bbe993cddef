"""Configuration replication end to end without I/O: primary registry -> messages -> backup registry."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message

from hastandby.broker.errors import NotFound
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import REPLICATE, Registry
from hastandby.ha import config_events as events
from hastandby.ha.config_publisher import WiringPublisher
from hastandby.ha.config_reconcile import WiringReplica


class Pair:
    """A primary with a publisher and a backup with a replica, linked by a list of messages."""

    def __init__(self, primary_default: str = "all") -> None:
        self.primary = Registry(default_replicate=primary_default)
        self.backup = Registry()  # like Qpid's backups: default none, follows what is tagged
        self.replicated: list[str] = []
        self.dropped: list[str] = []
        self.replica = WiringReplica(self.backup, self._replicated, self._dropped)
        self.publisher: WiringPublisher | None = None
        self.connect()

    def _replicated(self, queue: Queue) -> None:
        assert self.backup.queues[queue.name] is queue
        self.replicated.append(queue.name)

    def _dropped(self, queue: Queue) -> None:
        assert self.backup.queues[queue.name] is queue, "dropped must be heard before the delete"
        self.dropped.append(queue.name)

    def connect(self) -> None:
        """A (new) link: a new publisher whose first message is the snapshot."""
        self.disconnect()
        self.sent: list[dict[str, Any]] = []
        self.publisher = WiringPublisher(self.primary, self.sent.append)
        self.applied = 0

    def disconnect(self) -> None:
        if self.publisher is not None:
            self.publisher.close()

    def sync(self) -> None:
        """Deliver what was sent since the last sync, through a real AMQP encode and decode."""
        for message in self.sent[self.applied :]:
            received = Message()
            received.decode(Message(body=message).encode())
            self.replica.apply(received.body)
        self.applied = len(self.sent)

    def assert_in_sync(self) -> None:
        assert wiring(self.backup) == wiring(self.primary)


def wiring(registry: Registry) -> dict[str, list]:
    """The replicated wiring of a registry, in a comparable form."""
    sink: list[dict[str, Any]] = []
    publisher = WiringPublisher(registry, sink.append)
    publisher.close()
    snap = sink[0]
    return {part: sorted(snap[part], key=repr) for part in ("queues", "exchanges", "bindings")}


@pytest.fixture
def pair() -> Pair:
    return Pair()


def test_snapshot_carries_existing_wiring():
    primary = Registry(default_replicate="all")
    primary.declare_exchange("alt", "fanout")
    primary.declare_exchange("ex", "topic", {"x": 1}, alternate_exchange="alt", durable=True)
    primary.declare_queue("q", {"qpid.max_count": 10}, alternate_exchange="alt", durable=True)
    primary.declare_queue("cfg", {REPLICATE: "configuration"}, exclusive=True, auto_delete=True)
    primary.bind("ex", "q", "a.#", {"k": "v"})
    primary.bind("ex", "cfg", "b")
    sent: list[dict] = []
    WiringPublisher(primary, sent.append)
    assert [m["type"] for m in sent] == ["snapshot"]
    backup = Registry()
    replicated: list[str] = []
    WiringReplica(backup, lambda q: replicated.append(q.name), lambda q: None).apply(sent[0])
    assert wiring(backup) == wiring(primary)
    assert replicated == ["q"]  # only level all needs a replicating browser
    q = backup.queues["q"]
    assert q.uuid == primary.queues["q"].uuid
    assert q.settings.arguments == primary.queues["q"].settings.arguments
    assert q.settings.max_count == 10 and q.settings.alternate_exchange == "alt" and q.settings.durable
    assert backup.queues["cfg"].settings.exclusive and backup.queues["cfg"].settings.auto_delete


def test_events_follow_creates_binds_unbinds_deletes(pair):
    pair.sync()
    p = pair.primary
    p.declare_exchange("ex", "direct")
    p.declare_queue("q1")
    p.declare_queue("q2", {REPLICATE: "configuration"})
    p.bind("ex", "q1", "k1")
    p.bind("ex", "q2", "k2", {"x-match": "all"})
    p.bind("amq.direct", "q1", "k")  # built-in exchange: not replicated
    pair.sync()
    pair.assert_in_sync()
    assert pair.backup.exchange("ex").find("q2", "k2").arguments == {"x-match": "all"}
    assert pair.replicated == ["q1"]
    p.unbind("ex", "q1", "k1")
    pair.sync()
    pair.assert_in_sync()
    assert pair.backup.exchange("ex").find("q1", "k1") is None
    p.delete_queue("q1")
    p.delete_queue("q2")
    p.delete_exchange("ex")
    pair.sync()
    pair.assert_in_sync()
    assert pair.dropped == ["q1"]
    assert set(pair.backup.queues) == set() and "ex" not in pair.backup.exchanges
    assert [m["type"] for m in pair.sent] == [
        "snapshot",
        "exchange-created",
        "queue-created",
        "queue-created",
        "bound",
        "bound",
        "unbound",
        "queue-deleted",
        "unbound",
        "queue-deleted",
        "exchange-deleted",
    ]


def test_missed_recreate_is_replaced_by_uuid(pair):
    """QPID-4428: a queue deleted and recreated under the same name while the backup was away."""
    pair.primary.declare_queue("q")
    pair.sync()
    old = pair.backup.queues["q"]
    old.enqueue(b"stale", msg_id=1)
    pair.disconnect()
    pair.primary.delete_queue("q")
    pair.primary.declare_queue("q")
    pair.connect()
    pair.sync()
    pair.assert_in_sync()
    new = pair.backup.queues["q"]
    assert new is not old and new.uuid == pair.primary.queues["q"].uuid and new.depth == 0
    assert pair.dropped == ["q"]


def test_created_event_with_another_uuid_replaces(pair):
    pair.primary.declare_queue("q")
    pair.sync()
    event = events.queue_created(pair.primary.queues["q"])
    event["uuid"] = "another-incarnation"
    pair.replica.apply(event)
    assert pair.backup.queues["q"].uuid == "another-incarnation"
    assert pair.dropped == ["q"] and pair.replicated == ["q", "q"]


def test_delete_missing_from_snapshot(pair):
    """Objects deleted on the primary while the backup was away go when the snapshot lacks them."""
    p = pair.primary
    p.declare_exchange("alt", "fanout")
    p.declare_exchange("ex", "topic", alternate_exchange="alt")
    p.declare_queue("gone", alternate_exchange="alt")
    p.declare_queue("kept")
    p.bind("ex", "kept", "a")
    p.bind("ex", "kept", "b")
    pair.sync()
    kept = pair.backup.queues["kept"]
    pair.disconnect()
    p.unbind("ex", "kept", "b")
    p.delete_queue("gone")
    p.delete_exchange("ex")
    p.delete_exchange("alt")
    p.declare_exchange("ex", "direct")
    p.bind("ex", "kept", "c")
    pair.connect()
    pair.sync()
    pair.assert_in_sync()
    assert pair.backup.queues["kept"] is kept  # same uuid: left alone
    assert "alt" not in pair.backup.exchanges and "gone" not in pair.backup.queues
    assert pair.dropped == ["gone"]


def test_level_none_objects_are_not_replicated():
    pair = Pair(primary_default="none")
    p = pair.primary
    p.declare_queue("local")
    p.declare_exchange("local-ex", "fanout")
    p.declare_queue("shared", {REPLICATE: "all"})
    p.temporary_queue()
    p.bind("local-ex", "shared", "")  # one end is not replicated
    p.bind("amq.fanout", "shared", "")
    pair.sync()
    pair.assert_in_sync()
    assert set(pair.backup.queues) == {"shared"}
    assert "local-ex" not in pair.backup.exchanges
    assert list(pair.backup.bindings()) == []
    assert [m["type"] for m in pair.sent] == ["snapshot", "queue-created"]


def test_replicate_binding(pair):
    """A binding is replicated unless its own arguments say qpid.replicate none."""
    p = pair.primary
    p.declare_exchange("ex", "direct")
    p.declare_queue("q")
    p.bind("ex", "q", "replicated")
    p.bind("ex", "q", "local", {REPLICATE: "none"})
    pair.sync()
    pair.connect()  # and through a snapshot too
    pair.sync()
    pair.assert_in_sync()
    keys = sorted(b.key for b in pair.backup.bindings())
    assert keys == ["replicated"]
    p.unbind("ex", "q", "local")
    assert [m["type"] for m in pair.sent] == ["snapshot"]


def test_same_snapshot_applied_twice_changes_nothing(pair):
    p = pair.primary
    p.declare_exchange("ex", "fanout")
    p.declare_queue("q")
    p.bind("ex", "q", "")
    pair.connect()
    pair.sync()
    queue = pair.backup.queues["q"]
    queue.enqueue(b"m", msg_id=7)
    pair.replica.apply(pair.sent[0])
    pair.assert_in_sync()
    assert pair.backup.queues["q"] is queue and queue.ids() == [7]
    assert pair.dropped == []
    assert pair.replicated == ["q", "q"]  # each snapshot is a session: every all queue needs a browser


def test_repeated_events_are_no_ops(pair):
    p = pair.primary
    p.declare_exchange("ex", "fanout")
    p.declare_queue("q")
    p.bind("ex", "q", "")
    p.unbind("ex", "q", "")
    p.bind("ex", "q", "")
    pair.sync()
    queue = pair.backup.queues["q"]
    for message in pair.sent[1:]:
        pair.replica.apply(message)
    pair.assert_in_sync()
    assert pair.backup.queues["q"] is queue
    assert pair.replicated == ["q"]
    p.delete_queue("q")
    pair.sync()
    assert [m["type"] for m in pair.sent[-2:]] == ["unbound", "queue-deleted"]
    for message in pair.sent[-2:]:  # unbinding and deleting what is gone
        pair.replica.apply(message)
    pair.assert_in_sync()
    assert pair.dropped == ["q"]


def test_alternate_exchange_may_arrive_after_its_user(pair):
    pair.primary.declare_exchange("alt", "fanout")
    pair.primary.declare_exchange("ex", "direct", {"alternate-exchange": "alt"})
    pair.primary.declare_queue("q", alternate_exchange="alt")
    snap = pair.publisher.snapshot()
    alt_spec, ex_spec = snap["exchanges"]
    snap["exchanges"] = [ex_spec, alt_spec]  # users first
    pair.replica.apply(snap)
    pair.assert_in_sync()
    assert pair.backup.exchange("ex").alternate_exchange == "alt"
    assert pair.backup.exchange("ex").arguments == pair.primary.exchange("ex").arguments
    # Events: a queue may name an alternate the backup does not have yet.
    pair.replica.apply(
        {
            "type": "queue-created",
            "name": "q2",
            "uuid": "u-q2",
            "arguments": {REPLICATE: "configuration"},
            "exclusive": False,
            "auto_delete": False,
            "alternate_exchange": "alt2",
            "durable": False,
        }
    )
    assert pair.backup.queues["q2"].settings.alternate_exchange == "alt2"
    pair.replica.apply(
        {
            "type": "exchange-created",
            "name": "alt2",
            "uuid": "u-alt2",
            "exchange_type": "fanout",
            "arguments": {REPLICATE: "configuration"},
            "alternate_exchange": "",
            "durable": False,
        }
    )
    assert pair.backup.queues["q2"].settings.alternate_exchange == "alt2"


def test_snapshot_deletes_chains_of_alternates_in_any_order(pair):
    p = pair.primary
    p.declare_exchange("alt", "fanout")
    p.declare_exchange("ex", "direct", alternate_exchange="alt")
    snap = pair.publisher.snapshot()
    snap["exchanges"].reverse()  # the backup creates the user before its alternate
    pair.replica.apply(snap)
    assert list(pair.backup.exchanges)[-2:] == ["ex", "alt"]
    pair.disconnect()
    p.delete_exchange("ex")
    p.delete_exchange("alt")
    pair.connect()
    pair.sync()
    pair.assert_in_sync()
    assert "ex" not in pair.backup.exchanges and "alt" not in pair.backup.exchanges


def test_backup_deletes_without_rerouting(pair):
    """The primary's reroutes replicate on their own; the backup must not add its own."""
    p = pair.primary
    p.declare_exchange("alt", "fanout")
    p.declare_queue("dead-letters")
    p.bind("alt", "dead-letters", "")
    p.declare_queue("q", alternate_exchange="alt")
    pair.sync()
    pair.backup.queues["q"].enqueue(b"replicated message", msg_id=1)
    p.delete_queue("q")
    pair.sync()
    assert "q" not in pair.backup.queues
    assert pair.backup.queues["dead-letters"].depth == 0


def test_publisher_close_stops_events(pair):
    pair.disconnect()
    pair.primary.declare_queue("q")
    assert [m["type"] for m in pair.sent] == ["snapshot"]


def test_binding_to_an_unknown_queue_is_refused(pair):
    pair.primary.declare_exchange("ex", "direct")
    pair.primary.declare_queue("q")
    pair.primary.bind("ex", "q", "k")
    bound = pair.sent[-1]
    pair.replica.apply(pair.sent[0])
    pair.replica.apply(pair.sent[1])  # the exchange, not the queue
    with pytest.raises(ValueError, match="no such queue"):
        pair.replica.apply(bound)
    with pytest.raises(NotFound):
        pair.backup.queue("q")


QUEUE = {
    "type": "queue-created",
    "name": "q",
    "uuid": "u1",
    "arguments": {REPLICATE: "all"},
    "exclusive": False,
    "auto_delete": False,
    "alternate_exchange": "",
    "durable": False,
}
EXCHANGE = {
    "type": "exchange-created",
    "name": "ex",
    "uuid": "u2",
    "exchange_type": "direct",
    "arguments": {REPLICATE: "all"},
    "alternate_exchange": "",
    "durable": False,
}
BINDING = {
    "type": "bound",
    "exchange": "ex",
    "exchange_uuid": "u2",
    "queue": "q",
    "queue_uuid": "u1",
    "key": "",
    "arguments": {},
}


def changed(base: dict, **fields: Any) -> dict:
    message = {**base, **fields}
    return {k: v for k, v in message.items() if v is not ...}


def without_type(event: dict) -> dict:
    return {k: v for k, v in event.items() if k != "type"}


def snapshot(queues=(), exchanges=(), bindings=()) -> dict:
    return {
        "type": "snapshot",
        "queues": [without_type(q) for q in queues],
        "exchanges": [without_type(e) for e in exchanges],
        "bindings": [without_type(b) for b in bindings],
    }


@pytest.mark.parametrize(
    "message,complaint",
    [
        ("queue-created", "a wiring message is a map"),
        ({}, "unknown wiring message type None"),
        ({"type": "queue-renamed"}, "unknown wiring message type 'queue-renamed'"),
        (changed(QUEUE, name=...), "has no 'name'"),
        (changed(QUEUE, name=""), "'name' must be a non-empty string"),
        (changed(QUEUE, uuid=7), "'uuid' must be a non-empty string"),
        (changed(QUEUE, arguments=[]), "'arguments' must be a map"),
        (changed(QUEUE, arguments={1: "x", REPLICATE: "all"}), "string keys"),
        (changed(QUEUE, arguments={}), "must carry qpid.replicate"),
        (changed(QUEUE, arguments={REPLICATE: "none"}), "got 'none'"),
        (changed(QUEUE, exclusive=1), "'exclusive' must be true or false"),
        (changed(QUEUE, alternate_exchange=None), "'alternate_exchange' must be a string"),
        (changed(EXCHANGE, exchange_type="headers"), "exchange type 'headers'"),
        (changed(EXCHANGE, exchange_type=...), "has no 'exchange_type'"),
        (changed(EXCHANGE, name="amq.direct"), "built-in exchange 'amq.direct' is never replicated"),
        ({"type": "queue-deleted", "name": "q"}, "has no 'uuid'"),
        (changed(BINDING, key=None), "'key' must be a string"),
        (changed(BINDING, arguments={REPLICATE: "none"}), "cannot have qpid.replicate 'none'"),
        ({"type": "snapshot", "queues": [], "exchanges": []}, "snapshot has no 'bindings'"),
        ({"type": "snapshot", "queues": {}, "exchanges": [], "bindings": []}, "'queues' must be a list"),
        (snapshot(queues=[QUEUE, QUEUE]), "names 'q' twice"),
        (snapshot(queues=[QUEUE], exchanges=[changed(EXCHANGE, name="q")]), "names 'q' twice"),
        (snapshot(queues=[QUEUE], bindings=[BINDING]), "exchange 'ex'"),
        (snapshot(queues=[QUEUE], exchanges=[EXCHANGE], bindings=[changed(BINDING, queue_uuid="u9")]), "queue 'q'"),
        ({"type": "snapshot", "queues": ["q"], "exchanges": [], "bindings": []}, "snapshot queue 0 must be a map"),
    ],
)
def test_malformed_messages_are_refused(pair, message, complaint):
    before = wiring(pair.backup)
    with pytest.raises(ValueError, match=complaint):
        pair.replica.apply(message)
    assert wiring(pair.backup) == before
