"""Last-value queues (qpid.last_value_queue_key): the key read from the bytes, replacement, replicas, the journal."""

from __future__ import annotations

import hashlib
import random
import uuid

import pytest
from proton import Message, char, symbol, timestamp, ubyte, uint, ulong

from hastandby.broker.message import sections
from hastandby.broker.errors import InvalidArgument
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.queue_kinds import LastValueQueue, queue_class
from hastandby.broker.queues.registry import Registry, queue_settings

from tests.unit.test_queue import FakeConsumer


def msg(body, key=None, durable: bool | None = None, name: str = "sym", **extra) -> bytes:
    properties = {"other": 1, name: key} if key is not None else {"other": 1}
    message = Message(body=body, properties=properties, **extra)
    if durable is not None:
        message.durable = durable
    return bytes(message.encode())


def lvq(registry: Registry | None = None, name: str = "q", key: str = "sym", **arguments) -> Queue:
    registry = registry or Registry()
    queue, _ = registry.declare_queue(name, {"qpid.last_value_queue_key": key, **arguments})
    return queue



def _body(data: bytes):
    message = Message()
    message.decode(data)
    return message.body


# -- the key, read from the bytes -------------------------------------------------------------------------


VALUES = ["abc", "", "é" * 40, "x" * 300, 7, -7, 2**40, -(2**40), ulong(7), uint(7), ubyte(9), True, False,
          symbol("s"), b"\x00\x01", b"", uuid.UUID(int=5), 3.5, timestamp(1234), char("a")]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_key_read_from_the_bytes_is_the_decoders(value):
    for extra in ({}, {"durable": True, "priority": 7, "ttl": 5000, "id": "m1", "subject": "s",
                       "annotations": {symbol("x-opt-a"): "b" * 300}}):
        data = msg("body", value, **extra)
        key = sections.application_property_key(data, b"sym")
        slow = sections._slow_property(data, b"sym")
        if slow is not None and len(slow) > sections.LONG_ID:
            slow = b"#" + hashlib.sha256(slow).digest()
        assert key is not None and key == slow
        assert sections.application_property_key(data, b"other") == b"I1"
        assert sections.application_property_key(data, b"absent") is None


def test_equal_values_in_other_widths_are_one_key_and_types_differ():
    key = sections.application_property_key
    assert key(msg("a", 7), b"sym") == key(msg("b", ulong(7)), b"sym") == key(msg("c", ubyte(7)), b"sym")
    assert key(msg("a", "7"), b"sym") != key(msg("b", 7), b"sym")
    assert key(msg("a", "7"), b"sym") != key(msg("b", symbol("7")), b"sym")
    assert key(msg("a", "7"), b"sym") != key(msg("b", b"7"), b"sym")


def test_no_property_no_section_and_random_bytes_have_no_key_and_never_raise():
    assert sections.application_property_key(bytes(Message(body="x").encode()), b"sym") is None
    assert sections.application_property_key(b"", b"sym") is None
    assert sections.application_property_key(msg("x", None), b"sym") is None
    data = msg("x", "IBM", durable=True)
    rng = random.Random(28)
    for _ in range(3000):
        broken = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            broken[rng.randrange(len(broken))] = rng.randrange(256)
        sections.application_property_key(bytes(broken[: rng.randint(0, len(broken))]), b"sym")


# -- replacing ------------------------------------------------------------------------------------------------


def test_a_new_value_replaces_the_older_and_messages_without_the_key_stay():
    queue = lvq()
    for body, key in (("ibm-1", "IBM"), ("none-1", None), ("msft-1", "MSFT"), ("ibm-2", "IBM"), ("none-2", None),
                      ("ibm-3", "IBM")):
        queue.enqueue(msg(body, key))
    assert [_body(d) for _, d in queue.messages()] == ["none-1", "msft-1", "none-2", "ibm-3"]
    assert queue.stats["replaced"] == 2
    described = queue.describe()
    assert (described["lvq_key"], described["lvq_values"], described["depth"]) == ("sym", 2, 4)
    consumer = FakeConsumer(credit=10)
    queue.add_consumer(consumer)
    for msg_id in consumer.ids:
        queue.acknowledge(msg_id)
    assert queue.depth == 0 and queue.describe()["lvq_values"] == 0
    queue.enqueue(msg("ibm-4", "IBM"))  # its key was forgotten with its message: nothing to replace
    assert queue.depth == 1 and queue.stats["replaced"] == 2


def test_a_message_a_consumer_holds_is_not_taken_and_is_dropped_if_released():
    queue = lvq()
    consumer = FakeConsumer(credit=1)
    queue.add_consumer(consumer)
    queue.enqueue(msg("old", "IBM"))
    held = consumer.ids[0]
    queue.enqueue(msg("new", "IBM"))
    assert queue.depth == 2 and queue.acquired_count == 1
    queue.release(held, delivery_failed=False)  # a newer value is on the queue: not back
    assert [_body(d) for _, d in queue.messages()] == ["new"] and queue.stats["replaced"] == 1
    consumer.credit = 1
    queue.dispatch()
    assert [_body(d) for _, d, _ in consumer.got] == ["old", "new"]
    queue.acknowledge(consumer.ids[1])
    queue.enqueue(msg("held", "IBM"))
    consumer.credit = 1
    queue.dispatch()
    queue.enqueue(msg("newer", "IBM"))
    queue.acknowledge(consumer.ids[-1])  # settled as usual: the newer one stays
    assert [_body(d) for _, d in queue.messages()] == ["newer"]


def test_a_replica_drops_what_is_replaced_and_a_late_batch_too():
    primary, replica = lvq(), lvq()
    for body, key in (("a1", "A"), ("b1", "B"), ("a2", "A"), ("a3", "A"), ("b2", "B")):
        primary.enqueue(msg(body, key))
    assert primary.ids() == [4, 5]
    # The replica gets what the primary stored, in id order, some late; it drops the replaced ones itself.
    sent = {1: msg("a1", "A"), 2: msg("b1", "B"), 3: msg("a2", "A"), 4: msg("a3", "A"), 5: msg("b2", "B")}
    for msg_id in (3, 5, 4, 1, 2):
        replica.enqueue(sent[msg_id], msg_id=msg_id)
    assert replica.ids() == primary.ids()
    for msg_id in (1, 2, 3):  # the primary's dequeues arrive later: nothing left to drop
        assert replica.dequeue(msg_id, "replicated") is None
    replica.enqueue(msg("a4", "A"))  # promoted: it replaces as the primary did
    assert replica.ids() == [5, 6]


def test_restore_drops_what_a_crash_left_behind():
    queue = lvq()
    queue.restore([1, 2, 3], [msg("a1", "A"), msg("b1", "B"), msg("a2", "A")])
    assert [_body(d) for _, d in queue.messages()] == ["b1", "a2"]


def test_a_dr_tap_run_replaces_too():
    queue = lvq()
    queue.enqueue_run([msg("a1", "A"), msg("a2", "A"), msg("x", None)])
    assert [_body(d) for _, d in queue.messages()] == ["a2", "x"]


def test_lvq_combines_with_priorities_dedup_and_a_delivery_limit():
    queue = lvq(**{"qpid.priorities": 10, "x-dedup-window": 60, "x-delivery-limit": 2})
    queue.enqueue(msg("low", "A", priority=1, id="1"))
    queue.enqueue(msg("high", "B", priority=9, id="2"))
    queue.enqueue(msg("low-again", "A", priority=1, id="1"))  # a duplicate: not taken, nothing replaced
    queue.enqueue(msg("low-2", "A", priority=2, id="3"))
    assert queue.ordered_ids() == [2, 3] and queue.stats["replaced"] == 1 and queue.stats["deduplicated"] == 1
    assert isinstance(queue, LastValueQueue)


def test_a_plain_queue_stays_plain():
    assert queue_class(queue_settings({}, default_replicate="none")) is Queue
    assert queue_class(queue_settings({"qpid.last_value_queue_key": "k"}, default_replicate="none")) \
        is LastValueQueue


@pytest.mark.parametrize("value", ["", 7, True, "k" * 256])
def test_bad_keys_are_refused_with_a_clear_error(value):
    with pytest.raises(InvalidArgument, match="qpid.last_value_queue_key must be the name of an application "
                                              "property"):
        queue_settings({"qpid.last_value_queue_key": value}, default_replicate="none")


# -- the journal ------------------------------------------------------------------------------------------------


def _journaled_node(directory):
    from tests.unit.test_journal import journaled

    return journaled(directory, "prices", {"qpid.last_value_queue_key": "sym"}, "6f8c1a52-0000-4000-8000-0000000000ee")


@pytest.mark.parametrize("compact", [False, True])
def test_the_last_values_survive_a_restart(tmp_path, compact):
    registry, journal, loop = _journaled_node(tmp_path)
    prices = registry.queues["prices"]
    for body, key in (("a1", "A"), ("b1", "B"), ("a2", "A")):
        registry.deliver([prices], msg(body, key, durable=True))
    if compact:
        journal._compact()
    loop.settle(until=lambda: not journal._jobs.qsize() and not journal._compacting)
    journal.close()
    again, journal_again, loop_again = _journaled_node(tmp_path)
    prices = again.queues["prices"]
    assert [_body(d) for _, d in prices.messages()] == ["b1", "a2"]
    again.deliver([prices], msg("b2", "B", durable=True))
    assert [_body(d) for _, d in prices.messages()] == ["a2", "b2"]
    loop_again.settle(until=lambda: not journal_again._jobs.qsize())
    journal_again.close()
