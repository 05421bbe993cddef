"""Priorities, delivery limits and single active consumers (broker/queues/queue_kinds.py), without any I/O.

A fake consumer stands in for a link; the same queues are built the way a
primary fills them, a backup fills them (replicated ids, some out of order)
and a restarted node fills them (``restore``), and must order alike.
"""

from __future__ import annotations

import math
import random

import pytest
from proton import Message, symbol

from hastandby.broker.store import journal_format as jf
from hastandby.broker.message import sections
from hastandby.broker.errors import InvalidArgument
from hastandby.broker.store.journal_replay import QueueReplay
from hastandby.broker.queues.queue import Queue, QueueSettings
from hastandby.broker.queues.queue_kinds import (
    DeliveryLimitQueue,
    PriorityQueue,
    SingleActiveConsumerQueue,
    priority_levels,
    queue_class,
)
from hastandby.broker.queues.registry import Registry, queue_settings
from hastandby.replication.codec import ProtocolError, decode_counts, encode_counts
from tests.unit.test_queue import FakeConsumer


def msg(body, priority: int | None = None, durable: bool | None = None) -> bytes:
    message = Message(body=body)
    if priority is not None:
        message.priority = priority
    if durable is not None:
        message.durable = durable
    return bytes(message.encode())


def declare(registry: Registry | None = None, name: str = "q", **arguments) -> Queue:
    registry = registry or Registry()
    queue, _ = registry.declare_queue(name, arguments)
    return queue


def priority_queue(levels: int = 10) -> Queue:
    return declare(**{"qpid.priorities": levels})


# -- reading the priority from the bytes ----------------------------------------------------------


BODY = bytes(Message(body="x").encode())


def _list8(fields: bytes, count: int) -> bytes:
    return sections.HEADER_PREFIX + b"\xc0" + bytes([len(fields) + 1, count]) + fields + BODY


def _list32(fields: bytes, count: int) -> bytes:
    return sections.HEADER_PREFIX + b"\xd0" + (len(fields) + 4).to_bytes(4, "big") + count.to_bytes(4, "big") \
        + fields + BODY


@pytest.mark.parametrize("priority", [0, 1, 4, 5, 9, 200, 255])
def test_header_priority_reads_python_proton_headers(priority):
    assert sections.header_priority(msg("x", priority)) == priority
    assert sections.header_priority(msg("x", priority, durable=True)) == priority


def test_header_priority_default_and_other_encodings():
    assert sections.header_priority(BODY) == 4  # proton leaves a default header out
    assert sections.header_priority(sections.HEADER_PREFIX + b"\x45" + BODY) == 4  # the C clients' empty list
    assert sections.header_priority(b"\x00\x53\x75\xa0\x01x") == 4  # no header, just a body
    assert sections.header_priority(_list8(b"\x41", 1)) == 4  # durable only
    assert sections.header_priority(_list8(b"\x40\x40\x52\x05", 3)) == 4  # null priority, a ttl
    assert sections.header_priority(_list8(b"\x41\x50\x07", 2)) == 7
    assert sections.header_priority(_list8(b"\x56\x01\x50\x08", 2)) == 8  # boolean with a value byte
    assert sections.header_priority(_list32(b"\x42\x50\x06", 2)) == 6
    # Not a fast-path encoding (a priority as a long): the decoder reads it.
    assert sections.header_priority(_list8(b"\x40\x55\x03", 2)) == 3


def test_header_priority_never_raises_on_a_malformed_header():
    assert sections.header_priority(sections.HEADER_PREFIX + b"\xc0\x05\x02\x40") == 4
    assert sections.header_priority(sections.HEADER_PREFIX + b"\xff\xff") == 4


def _qpid_level(priority: int, levels: int) -> int:
    """Qpid's PriorityQueue::getPriorityLevel, written out again."""
    first = 5 - min(5, math.ceil(levels / 2))
    return 0 if priority <= first else min(priority - first, levels - 1)


@pytest.mark.parametrize("levels", range(1, 11))
def test_levels_map_priorities_as_qpid_did(levels):
    table = priority_levels(levels)
    assert [table[p] for p in range(256)] == [_qpid_level(p, levels) for p in range(256)]
    assert max(table) == levels - 1


def test_level_examples():
    assert list(priority_levels(10)[:10]) == list(range(10))  # p -> min(p, 9)
    assert list(priority_levels(2)[:10]) == [0] * 5 + [1] * 5
    assert list(priority_levels(3)[:10]) == [0, 0, 0, 0, 1, 2, 2, 2, 2, 2]


# -- ordering -------------------------------------------------------------------------------------------


def test_highest_priority_first_fifo_within_a_level():
    q = priority_queue()
    priorities = [1, 5, 9, 5, 1, 9, 4, 0, 9]
    for i, p in enumerate(priorities):
        q.enqueue(msg(i, p))
    c = FakeConsumer(credit=100)
    q.add_consumer(c)
    expected = [i + 1 for i, _ in sorted(enumerate(priorities), key=lambda item: (-item[1], item[0]))]
    assert c.ids == expected == q.ordered_ids()


def test_a_new_high_priority_message_overtakes_waiting_ones():
    q = priority_queue()
    c = FakeConsumer(credit=1)
    q.add_consumer(c)
    for p in (1, 1, 1):
        q.enqueue(msg("low", p))
    assert c.ids == [1]
    q.enqueue(msg("high", 8))
    c.credit = 10
    q.dispatch()
    assert c.ids == [1, 4, 2, 3]


def test_release_puts_a_message_back_at_its_place_in_its_level():
    q = priority_queue()
    for p in (9, 9, 1):
        q.enqueue(msg(p, p))
    c = FakeConsumer(credit=2)
    q.add_consumer(c)
    assert c.ids == [1, 2]
    q.release(1, delivery_failed=True)
    c2 = FakeConsumer(credit=5)
    q.add_consumer(c2)
    assert [(m[0], m[2]) for m in c2.got] == [(1, 1), (3, 0)]


def test_consumers_take_turns_and_no_message_goes_twice():
    q = priority_queue(5)
    a, b = FakeConsumer(credit=1000), FakeConsumer(credit=1000)
    q.add_consumer(a)
    q.add_consumer(b)
    for i in range(200):
        q.enqueue(msg(i, i % 10))
    assert not set(a.ids) & set(b.ids)
    assert len(a.ids) == len(b.ids) == 100


def _fill_like_a_primary(priorities: list[int]) -> Queue:
    q = priority_queue()
    for i, p in enumerate(priorities):
        q.enqueue(msg(i, p))
    return q


def test_a_replica_and_a_restored_queue_order_as_the_primary():
    rng = random.Random(28)
    priorities = [rng.randrange(10) for _ in range(3000)]
    primary = _fill_like_a_primary(priorities)
    for msg_id in rng.sample(range(1, 3001), 1000):  # consumed on the primary
        primary.dequeue(msg_id, "consumed")
    # A backup: the primary's ids, a batch arriving after a later one (a retransmission after failover),
    # and the primary's dequeues.
    replica = priority_queue()
    messages = [(i + 1, msg(i, p)) for i, p in enumerate(priorities)]
    for msg_id, data in messages[1500:] + messages[:1500]:
        replica.enqueue(data, msg_id=msg_id)
    replica.dequeue_ranges([(m, m) for m in sorted(set(range(1, 3001)) - set(primary.ids()))], "replicated")
    restored = priority_queue()
    restored.restore(primary.ids(), [primary.get(m) for m in primary.ids()])
    order = primary.ordered_ids()
    assert replica.ordered_ids() == restored.ordered_ids() == order
    got = {}
    for name, queue in (("primary", primary), ("replica", replica), ("restored", restored)):
        consumer = FakeConsumer(credit=10_000)
        queue.add_consumer(consumer)  # a promotion: the first consumer takes everything
        got[name] = consumer.ids
    assert got["primary"] == got["replica"] == got["restored"] == order


def test_an_id_enqueued_again_after_its_removal_is_delivered_once():
    q = priority_queue()
    q.enqueue(msg("a", 5), msg_id=1)
    q.enqueue(msg("b", 5), msg_id=2)
    q.dequeue(2, "replicated")
    q.enqueue(msg("b", 5), msg_id=2)  # a replica taking a retransmission
    assert q.priority_index.levels[5] == [1, 2]
    c = FakeConsumer(credit=10)
    q.add_consumer(c)
    assert c.ids == [1, 2]


def test_the_index_of_a_replica_nobody_consumes_stays_bounded():
    q = priority_queue()
    for round_ in range(5):
        first = q.next_id
        for i in range(2000):
            q.enqueue(msg(i, i % 10), msg_id=first + i)
        q.dequeue_ranges([(first, first + 1999)], "replicated")
    assert q.depth == 0
    assert sum(len(ids) for ids in q.priority_index.levels) <= 2100


def test_consuming_a_long_queue_cuts_the_index():
    q = priority_queue()
    for i in range(5000):
        q.enqueue(msg(i, 9 if i % 2 else 1))
    c = FakeConsumer(credit=10_000)
    q.add_consumer(c)
    for msg_id in list(c.ids):
        q.acknowledge(msg_id)
    assert q.depth == 0 and len(c.ids) == 5000
    assert sum(len(ids) for ids in q.priority_index.levels) < 2100
    q.enqueue(msg("again", 3))
    c.credit = 1
    q.dispatch()
    assert c.ids[-1] == 5001


def test_expired_messages_are_dropped_not_delivered():
    q = priority_queue()
    q.enqueue(msg("old", 9), ttl_ms=1)
    q.enqueue(msg("new", 1))
    q._expires[1] = 0.0  # already past
    c = FakeConsumer(credit=5)
    q.add_consumer(c)
    assert c.ids == [2] and q.stats["expired"] == 1


def test_browsers_see_queue_order_and_later_arrivals_once():
    q = priority_queue()
    for p in (1, 9, 5):
        q.enqueue(msg(p, p))
    b = FakeConsumer(credit=100, browsing=True)
    q.add_consumer(b)
    assert b.ids == [2, 3, 1]
    q.enqueue(msg("late high", 9))
    q.enqueue(msg("late low", 0))
    assert b.ids == [2, 3, 1, 4, 5]
    assert q.depth == 5  # browsing takes nothing


def test_a_replicating_browser_still_reads_id_order():
    q = priority_queue()
    for p in (1, 9, 5):
        q.enqueue(msg(p, p))
    r = FakeConsumer(credit=100, browsing=True, sees_acquired=True)
    q.add_consumer(r)
    assert r.ids == [1, 2, 3]


def test_browsers_skip_acquired_messages():
    q = priority_queue()
    for p in (1, 9, 5):
        q.enqueue(msg(p, p))
    c = FakeConsumer(credit=1)
    q.add_consumer(c)
    b = FakeConsumer(credit=100, browsing=True)
    q.add_consumer(b)
    assert c.ids == [2] and b.ids == [3, 1]


# -- delivery limit ---------------------------------------------------------------------------------------


def _limited(limit: int, alternate: bool = True) -> tuple[Registry, Queue, Queue | None]:
    registry = Registry()
    dead = None
    arguments = {"x-delivery-limit": limit}
    if alternate:
        registry.declare_exchange("dlx", "fanout")
        dead, _ = registry.declare_queue("dead")
        registry.bind("dlx", "dead")
    queue, _ = registry.declare_queue("work", arguments, alternate_exchange="dlx" if alternate else None)
    return registry, queue, dead


def test_released_and_unfailed_modified_do_not_count():
    _, q, dead = _limited(2)
    q.enqueue(msg("m"))
    for _ in range(5):
        c = FakeConsumer(credit=1)
        q.add_consumer(c)
        q.remove_consumer(c)
        q.release(1, delivery_failed=False)
    assert q.depth == 1 and q.delivery_count(1) == 0 and dead.depth == 0


def test_the_limit_th_failed_delivery_dead_letters_with_annotations():
    _, q, dead = _limited(3)
    q.enqueue(msg("poison", 7))
    q.enqueue(msg("fine"))
    counts = []
    for attempt in range(3):
        c = FakeConsumer(credit=1)
        q.add_consumer(c)
        assert c.ids == [1]
        counts.append(c.got[0][2])
        q.remove_consumer(c)
        q.release(1, delivery_failed=True)
    assert counts == [0, 1, 2]
    assert q.ids() == [2] and q.stats["dead_lettered"] == 1
    assert dead.depth == 1
    out = Message()
    out.decode(dead.get(dead.ids()[0]))
    assert out.body == "poison" and out.priority == 7
    assert out.annotations == {symbol("x-opt-dead-letter-reason"): "delivery-limit",
                               symbol("x-opt-dead-letter-queue"): "work"}


def test_without_an_alternate_exchange_the_message_is_dropped():
    _, q, _ = _limited(1, alternate=False)
    q.enqueue(msg("poison"))
    c = FakeConsumer(credit=1)
    q.add_consumer(c)
    q.release(1, delivery_failed=True)
    assert q.depth == 0 and q.stats["dead_lettered"] == 1


def test_dead_lettering_keeps_existing_annotations_and_other_sections():
    message = Message(body={"k": 1}, subject="s", properties={"app": 2}, durable=True)
    message.annotations = {symbol("x-opt-keep"): "yes"}
    data = bytes(message.encode())
    out = Message()
    out.decode(sections.with_annotations(data, {symbol("x-opt-dead-letter-reason"): "delivery-limit"}))
    assert out.annotations == {symbol("x-opt-keep"): "yes", symbol("x-opt-dead-letter-reason"): "delivery-limit"}
    assert (out.body, out.subject, out.properties, out.durable) == ({"k": 1}, "s", {"app": 2}, True)
    assert sections.with_annotations(b"\x00garbage", {symbol("a"): 1}) == b"\x00garbage"


def test_a_replica_takes_counts_and_a_promoted_one_counts_on():
    _, primary, _ = _limited(3)
    _, replica, dead = _limited(3)
    primary.enqueue(msg("poison"))
    replica.enqueue(msg("poison"), msg_id=1)
    seen = []

    class Follower:
        follows_acquisitions = False

        def enqueued(self, *args): pass

        def dequeued(self, *args): pass

        def delivery_counted(self, queue, msg_id, count):
            seen.append((msg_id, count))

    primary.add_observer(Follower())
    for _ in range(2):
        c = FakeConsumer(credit=1)
        primary.add_consumer(c)
        primary.remove_consumer(c)
        primary.release(1, delivery_failed=True)
    assert seen == [(1, 1), (1, 2)]
    for msg_id, count in decode_counts(encode_counts(dict(seen[-1:]))):
        replica.set_delivery_count(msg_id, count)
    replica.set_delivery_count(99, 5)  # not held: ignored
    assert replica.delivery_counts() == {1: 2}
    c = FakeConsumer(credit=1)
    replica.add_consumer(c)  # promoted
    assert c.got[0][2] == 2
    replica.remove_consumer(c)
    replica.release(1, delivery_failed=True)
    assert replica.depth == 0 and dead.depth == 1


def test_counts_codec_refuses_bad_input():
    assert decode_counts(encode_counts({5: 1, 2: 3})) == [(2, 3), (5, 1)]
    for body in ([1], [0, 1], [1, -1], [1, 2**32], ["1", 1], {"a": 1}):
        with pytest.raises(ProtocolError):
            decode_counts(bytes(Message(body=body).encode()))


def test_journal_replay_keeps_the_last_count_of_held_messages():
    replay = QueueReplay()
    replay.enqueue([1, 2, 3], [b"a", b"b", b"c"])
    replay.count([(1, 1), (2, 1)])
    replay.count([(1, 2)])
    replay.dequeue([(2, 2)])
    replay.enqueue([3], [b"c2"])  # enqueued again: no failed delivery yet
    replay.count([(3, 0)])
    ids, _, _ = replay.result()
    assert ids == [1, 3] and replay.counts(ids) == {1: 2}
    record = jf.counts_record(7, [(1, 2), (9, 4)])
    result = jf.Read()
    assert list(jf.read_records(record, result)) == [(jf.COUNTS, (7, [(1, 2), (9, 4)]))]
    assert not result.torn


# -- single active consumer ----------------------------------------------------------------------------


def test_only_the_first_consumer_receives_then_the_next_takes_over():
    q = declare(**{"x-single-active-consumer": True})
    a, b, c = FakeConsumer(credit=100), FakeConsumer(credit=100), FakeConsumer(credit=100)
    for consumer in (a, b, c):
        q.add_consumer(consumer)
    for i in range(5):
        q.enqueue(msg(i))
    assert a.ids == [1, 2, 3, 4, 5] and not b.ids and not c.ids
    assert q.describe()["waiting_consumers"] == 2
    q.acknowledge(1)
    q.remove_consumer(a)  # detached with 2-5 unsettled: they go back, to the next consumer
    for msg_id in (2, 3, 4, 5):
        q.release(msg_id, delivery_failed=True)
    assert b.ids == [2, 3, 4, 5] and not c.ids
    assert [m[2] for m in b.got] == [1, 1, 1, 1]


def test_the_active_consumer_without_credit_holds_the_others_back():
    q = declare(**{"x-single-active-consumer": True})
    a, b = FakeConsumer(credit=1), FakeConsumer(credit=100)
    q.add_consumer(a)
    q.add_consumer(b)
    for i in range(3):
        q.enqueue(msg(i))
    assert a.ids == [1] and not b.ids


def test_single_active_consumer_with_priorities():
    q = declare(**{"x-single-active-consumer": True, "qpid.priorities": 10, "x-delivery-limit": 5})
    assert isinstance(q, SingleActiveConsumerQueue) and isinstance(q, PriorityQueue)
    assert isinstance(q, DeliveryLimitQueue)
    for p in (1, 9, 5):
        q.enqueue(msg(p, p))
    a, b = FakeConsumer(credit=100), FakeConsumer(credit=100)
    q.add_consumer(a)
    q.add_consumer(b)
    assert a.ids == [2, 3, 1] and not b.ids


# -- declaration ---------------------------------------------------------------------------------------------


def test_a_queue_without_features_is_a_plain_queue():
    assert queue_class(QueueSettings()) is Queue
    assert type(declare()) is Queue
    assert type(declare(**{"x-single-active-consumer": False})) is Queue
    assert type(declare(**{"qpid.priorities": 3})) is PriorityQueue


@pytest.mark.parametrize("arguments, error", [
    ({"qpid.priorities": 0}, "qpid.priorities must be a whole number from 1 to 10, got 0"),
    ({"qpid.priorities": 11}, "qpid.priorities must be a whole number from 1 to 10, got 11"),
    ({"qpid.priorities": "ten"}, "qpid.priorities must be a whole number from 1 to 10, got 'ten'"),
    ({"qpid.priorities": 2.5}, "qpid.priorities must be a whole number from 1 to 10, got 2.5"),
    ({"qpid.priorities": True}, "qpid.priorities must be a whole number"),
    ({"x-delivery-limit": 0}, "x-delivery-limit must be a whole number from 1 to 2147483647, got 0"),
    ({"x-delivery-limit": -3}, "x-delivery-limit must be a whole number"),
    ({"x-single-active-consumer": "maybe"}, "x-single-active-consumer must be true or false, got 'maybe'"),
    # Strings ``str.isdigit`` takes and ``int`` does not (found by the fuzzer, tests/fuzz/features.py):
    # they raised ValueError out of the management request ("management request failed", a traceback).
    ({"qpid.priorities": "\u00b2"}, "qpid.priorities must be a whole number from 1 to 10, got '\u00b2'"),
    ({"x-delivery-limit": "+-5"}, "x-delivery-limit must be a whole number from 1 to 2147483647, got '\\+-5'"),
    ({"x-dedup-window": "9" * 5000}, "x-dedup-window must be a whole number from 1 to 86400, got '999"),
    ({"qpid.priorities": "\u0663"}, "qpid.priorities must be a whole number"),
])
def test_bad_values_are_refused_with_a_clear_error(arguments, error):
    with pytest.raises(InvalidArgument, match=error.replace("(", r"\(")):
        queue_settings(arguments, default_replicate="none")


def test_good_values_and_their_string_forms():
    settings = queue_settings({"qpid.priorities": "4", "x-delivery-limit": 20, "x-single-active-consumer": "true"},
                              default_replicate="none")
    assert (settings.priorities, settings.delivery_limit, settings.single_active_consumer) == (4, 20, True)
    described = declare(**{"qpid.priorities": 4, "x-delivery-limit": 2, "x-single-active-consumer": True}).describe()
    assert described["priorities"] == 4 and described["delivery_limit"] == 2
    assert described["single_active_consumer"] is True and described["stats"]["dead_lettered"] == 0


# -- the journal: counts and priorities across a restart ----------------------------------------------------


def _journaled_node(directory, compact: bool = False):
    from tests.unit.test_journal import journaled

    registry, journal, loop = journaled(directory, "work", {"x-delivery-limit": 3, "qpid.priorities": 10},
                                        "6f8c1a52-0000-4000-8000-0000000000aa")
    if compact:
        journal._compact()
    return registry, journal, loop


@pytest.mark.parametrize("compact", [False, True])
def test_counts_and_order_survive_a_restart_on_the_journal(tmp_path, compact):
    registry, journal, loop = _journaled_node(tmp_path)
    work = registry.queues["work"]
    for body, priority in (("low", 1), ("high", 9), ("mid", 5), ("transient", 9)):
        registry.deliver([work], msg(body, priority, durable=body != "transient"))
    for _ in range(2):  # the high one fails twice
        c = FakeConsumer(credit=1)
        work.add_consumer(c)
        assert c.ids == [2]
        work.remove_consumer(c)
        work.release(2, delivery_failed=True)
    if compact:
        journal._compact()
    loop.settle(until=lambda: not journal._jobs.qsize() and not journal._compacting)
    journal.close()
    again, journal_again, _ = _journaled_node(tmp_path)
    work = again.queues["work"]
    assert isinstance(work, PriorityQueue) and isinstance(work, DeliveryLimitQueue)
    assert work.delivery_counts() == {2: 2} and work.ordered_ids() == [2, 3, 1]
    c = FakeConsumer(credit=1)
    work.add_consumer(c)
    assert c.got[0][0] == 2 and c.got[0][2] == 2
    work.remove_consumer(c)
    work.release(2, delivery_failed=True)  # the third failure: gone
    assert work.ids() == [1, 3] and work.stats["dead_lettered"] == 1
    journal_again.close()


def test_a_priority_out_of_the_ubyte_range_is_clamped():
    # A producer's header with a long where the ubyte belongs: read by the decoder, kept within 0-255.
    assert sections.header_priority(_list8(b"\x40\x55\x7f", 2)) == 127
    assert sections.header_priority(_list8(b"\x40\x81" + (1000).to_bytes(8, "big", signed=True), 2)) == 255
    assert sections.header_priority(_list8(b"\x40\x54\xfb", 2)) == 0  # a byte of -5
