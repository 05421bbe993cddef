"""Duplicate detection (x-dedup-window): message-id keys read from the bytes, the window, replicas, the journal."""

from __future__ import annotations

import random
import time
import uuid

import pytest
from proton import Message, symbol, ulong

from hastandby.broker.store import journal_format as jf
from hastandby.broker.message import sections
from hastandby.broker.errors import InvalidArgument
from hastandby.broker.store.journal_replay import QueueReplay
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.queue_kinds import DedupQueue, PriorityQueue, queue_class
from hastandby.broker.queues.registry import Registry, queue_settings
from hastandby.replication.codec import ProtocolError, decode_message_ids, encode_message_ids

from tests.unit.test_queue import FakeConsumer


def msg(body, message_id=None, durable: bool | None = None, **extra) -> bytes:
    message = Message(body=body, id=message_id, **extra)
    if durable is not None:
        message.durable = durable
    return bytes(message.encode())


def dedup_queue(window: int = 60, registry: Registry | None = None, name: str = "q", **arguments) -> Queue:
    registry = registry or Registry()
    queue, _ = registry.declare_queue(name, {"x-dedup-window": window, **arguments})
    return queue


# -- the key, read from the bytes -------------------------------------------------------------------------


ID_VALUES = ["abc", "", "é" * 40, ulong(0), ulong(7), ulong(2**40), ulong(2**64 - 1), uuid.UUID(int=12345),
             b"\x00\x01", b"", b"x" * 200, "s" * 300]


@pytest.mark.parametrize("value", ID_VALUES, ids=repr)
def test_the_key_read_from_the_bytes_is_the_decoders(value):
    for extra in ({}, {"durable": True, "priority": 7, "ttl": 5000},
                  {"annotations": {symbol("x-opt-a"): "b" * 300}, "properties": {"k": "v"}, "subject": "s"}):
        data = msg("body", value, **extra)
        key = sections.message_id_key(data)
        assert key is not None and key == _decoded_key(data)


def _decoded_key(data: bytes) -> bytes | None:
    key = sections._slow_id(data)
    return key if key is None or len(key) <= sections.LONG_ID else sections.message_id_key(data)


def test_equal_ids_in_other_encodings_give_the_same_key():
    smallulong = b"\x00\x53\x73\xc0\x03\x01\x53\x07"  # properties: [smallulong 7]
    ulong8 = b"\x00\x53\x73\xc0\x0a\x01\x80" + (7).to_bytes(8, "big")
    list32 = b"\x00\x53\x73\xd0\x00\x00\x00\x0d\x00\x00\x00\x01\x80" + (7).to_bytes(8, "big")
    str8 = b"\x00\x53\x73\xc0\x05\x01\xa1\x02id"
    str32 = b"\x00\x53\x73\xc0\x08\x01\xb1\x00\x00\x00\x02id"
    assert len({sections.message_id_key(x) for x in (smallulong, ulong8, list32)}) == 1
    assert sections.message_id_key(str8) == sections.message_id_key(str32) == b"\xa1id"
    assert sections.message_id_key(str8) != sections.message_id_key(b"\x00\x53\x73\xc0\x05\x01\xa0\x02id")


def test_no_id_no_properties_and_malformed_bytes_have_no_key():
    assert sections.message_id_key(msg("x")) is None
    assert sections.message_id_key(b"") is None
    assert sections.message_id_key(b"\x00\x53\x73") is None
    assert sections.message_id_key(b"\x00\x53\x73\xc0\xff\x01\xa1\x09ab") is None  # cut short
    assert sections.message_id_key(b"garbage") is None


def test_a_long_id_is_kept_as_its_digest():
    key = sections.message_id_key(msg("x", "i" * 10_000))
    assert key is not None and key.startswith(b"#") and len(key) == 33
    assert key != sections.message_id_key(msg("x", "i" * 10_001))


def test_the_key_never_raises_on_random_bytes():
    rng = random.Random(28)
    good = msg("body", "the-id", durable=True, annotations={symbol("a"): 1})
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        key = sections.message_id_key(bytes(data[: rng.randint(0, len(data))]))
        assert key is None or isinstance(key, bytes)


# -- the queue ------------------------------------------------------------------------------------------------


def test_a_duplicate_within_the_window_is_accepted_and_not_enqueued():
    registry = Registry()
    queue = dedup_queue(registry=registry)
    assert isinstance(queue, DedupQueue)
    for body, message_id in (("a", "1"), ("b", "2"), ("a again", "1"), ("no id", None), ("no id", None),
                             ("c", ulong(1)), ("b again", "2")):
        registry.deliver([queue], msg(body, message_id))
    assert [Message(body=None).decode(d) or None for _, d in queue.messages()] == [None] * 5
    assert queue.depth == 5 and queue.stats["deduplicated"] == 2 and queue.stats["enqueued"] == 5
    described = queue.describe()
    assert described["dedup_window"] == 60 and described["dedup_ids"] == 3
    assert described["stats"]["deduplicated"] == 2


def test_an_id_is_remembered_after_its_message_is_consumed():
    queue = dedup_queue()
    queue.enqueue(msg("a", "x"))
    consumer = FakeConsumer(credit=10)
    queue.add_consumer(consumer)
    queue.acknowledge(consumer.ids[0])
    assert queue.depth == 0
    queue.enqueue(msg("a", "x"))
    assert queue.depth == 0 and queue.stats["deduplicated"] == 1 and len(consumer.got) == 1


def test_an_id_older_than_the_window_is_taken_again(monkeypatch):
    now = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    queue = dedup_queue(window=5)
    queue.enqueue(msg("a", "x"))
    queue.enqueue(msg("b", "y"))
    now[0] += 4.9
    queue.enqueue(msg("a", "x"))
    assert queue.depth == 2
    now[0] += 0.2  # x is 5.1 s old
    queue.enqueue(msg("a", "x"))
    assert queue.depth == 3 and queue.stats["deduplicated"] == 1
    now[0] += 10
    assert queue.describe()["dedup_ids"] == 0  # forgotten


def test_a_replica_never_drops_and_remembers_its_primarys_ids():
    primary, replica = dedup_queue(), dedup_queue()
    primary.add_observer(_Ids(replica))
    for message_id in ("a", "b", "a"):
        primary.enqueue(msg("m", message_id))
    for msg_id, data in primary.messages():
        replica.enqueue(data, msg_id=msg_id)
    replica.enqueue(msg("m", "a"), msg_id=99)  # the primary decided: kept even though remembered
    assert replica.ids() == [1, 2, 99]
    assert {k for k, _, _ in replica.remembered_entries()} == {k for k, _, _ in primary.remembered_entries()}
    # A message the primary took and removed before replicating it: its id arrives in a ``u`` control only.
    primary.enqueue(msg("gone", "c"))
    primary.dequeue(primary.next_id - 1, "consumed")
    replica.enqueue(msg("re-sent after failover", "c"))  # promoted: it answers producers now
    replica.enqueue(msg("new", "d"))
    assert replica.stats["deduplicated"] == 1 and replica.depth == 4


class _Ids:
    """A replicating subscription's part in duplicate detection: the ids it would send in ``u`` controls."""

    follows_acquisitions = False

    def __init__(self, replica: Queue) -> None:
        self.replica = replica

    def id_remembered(self, queue, key, ms, durable):
        self.replica.remember(decode_message_ids(encode_message_ids([(key, ms, durable)])))

    def enqueued(self, *args): pass

    def dequeued(self, *args): pass


def test_remember_keeps_the_later_time_and_skips_what_is_past_the_window():
    queue = dedup_queue(window=10)
    now = int(time.time() * 1000)
    queue.remember([(b"\xa1a", now - 20_000, True), (b"\xa1b", now - 1000, False), (b"\xa1b", now - 5000, False)])
    assert queue.remembered_entries() == [(b"\xa1b", now - 1000, False)]


def test_dedup_combines_with_priorities():
    queue = dedup_queue(**{"qpid.priorities": 10})
    assert isinstance(queue, DedupQueue) and isinstance(queue, PriorityQueue)
    queue.enqueue(msg("low", "1", priority=1))
    queue.enqueue(msg("high", "2", priority=9))
    queue.enqueue(msg("high", "2", priority=9))
    consumer = FakeConsumer(credit=10)
    queue.add_consumer(consumer)
    assert consumer.ids == [2, 1] and queue.stats["deduplicated"] == 1


def test_a_plain_queue_stays_plain():
    assert queue_class(queue_settings({}, default_replicate="none")) is Queue
    assert queue_class(queue_settings({"x-dedup-window": 1}, default_replicate="none")) is DedupQueue


@pytest.mark.parametrize("value, error", [
    (0, "x-dedup-window must be a whole number from 1 to 86400, got 0"),
    (-5, "x-dedup-window must be a whole number from 1 to 86400, got -5"),
    (86_401, "x-dedup-window must be a whole number from 1 to 86400, got 86401"),
    (1.5, "x-dedup-window must be a whole number from 1 to 86400, got 1.5"),
    ("soon", "x-dedup-window must be a whole number from 1 to 86400, got 'soon'"),
    (True, "x-dedup-window must be a whole number"),
])
def test_bad_windows_are_refused_with_a_clear_error(value, error):
    with pytest.raises(InvalidArgument, match=error):
        queue_settings({"x-dedup-window": value}, default_replicate="none")
    assert queue_settings({"x-dedup-window": "30"}, default_replicate="none").dedup_window == 30


# -- the wire and the journal -----------------------------------------------------------------------------------


def test_the_ids_control_round_trips_and_refuses_bad_input():
    entries = [(b"\xa1abc", 1_764_000_000_000, True), (b"\x80" + bytes(8), 5, False)]
    assert decode_message_ids(encode_message_ids(entries)) == entries
    for bad in ([1, 2, 3], [b"x", 1], [b"x", -1, True], [b"", 1, True], [b"x", 1, 1], "str", None):
        with pytest.raises(ProtocolError):
            decode_message_ids(bytes(Message(body=bad).encode()))
    with pytest.raises(ProtocolError):
        decode_message_ids(b"\x00\x53\x77")


def test_the_journal_record_round_trips_and_replay_keeps_the_latest_time():
    entries = [(b"\xa1abc", 1_764_000_000_000), (b"#" + bytes(32), 7)]
    records = list(jf.read_records(jf.message_ids_record(3, entries) + jf.message_ids_record(3, [(b"\xa1abc", 9)]),
                                   jf.Read()))
    assert records[0] == (jf.MESSAGE_IDS, (3, entries))
    replay = QueueReplay()
    for _, (_, found) in records:
        replay.remember(found)
    assert replay.message_ids == {b"\xa1abc": 1_764_000_000_000, b"#" + bytes(32): 7}


def _journaled_node(directory):
    from tests.unit.test_journal import journaled

    return journaled(directory, "orders", {"x-dedup-window": 600}, "6f8c1a52-0000-4000-8000-0000000000dd")


@pytest.mark.parametrize("compact", [False, True])
def test_durable_messages_ids_survive_a_restart(tmp_path, compact):
    registry, journal, loop = _journaled_node(tmp_path)
    orders = registry.queues["orders"]
    for body, message_id, durable in (("kept", "1", True), ("consumed", "2", True), ("transient", "3", False)):
        registry.deliver([orders], msg(body, message_id, durable=durable))
    orders.dequeue(2, "consumed")
    if compact:
        journal._compact()
    loop.settle(until=lambda: not journal._jobs.qsize() and not journal._compacting)
    journal.close()
    again, journal_again, loop_again = _journaled_node(tmp_path)
    orders = again.queues["orders"]
    assert orders.ids() == [1]
    for body, message_id in (("kept", "1"), ("consumed", "2"), ("transient", "3")):
        again.deliver([orders], msg(body, message_id, durable=True))
    # 1 and 2 were durable: remembered; 3 was not (lost at the restart), so its re-sending is taken.
    assert orders.depth == 2 and orders.stats["deduplicated"] == 2
    loop_again.settle(until=lambda: not journal_again._jobs.qsize())
    journal_again.close()
