"""Scheduled delivery (x-opt-delivery-time / x-opt-delivery-delay) without I/O: a fake consumer, a clock by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import Message, symbol

from hastandby.broker.queues import scheduled
from hastandby.broker.message import sections
from hastandby.broker.queues.completion import Completion
from hastandby.broker.errors import BrokerError
from hastandby.broker.queues.queue import Queue, QueueSettings
from hastandby.broker.queues.registry import Registry

from .test_journal import Loop, _journal
from .test_queue import FakeConsumer

T0 = 1_900_000_000_000  # "now" at the start of each test, ms since the epoch


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(scheduled, "wall_ms", clock)
    return clock


class Timers:
    """The driver's ``schedule``, by hand: what was asked, run on demand."""

    def __init__(self) -> None:
        self.asked: list[tuple[float, object]] = []

    def __call__(self, delay, fn):
        timer = _Timer(delay, fn)
        self.asked.append((delay, timer))
        return timer

    def live(self) -> list[float]:
        return [delay for delay, timer in self.asked if timer.fn is not None]

    def run(self) -> None:
        for _, timer in list(self.asked):
            if timer.fn is not None:
                fn, timer.fn = timer.fn, None
                fn()
        self.asked = [(d, t) for d, t in self.asked if t.fn is not None]


class _Timer:
    def __init__(self, delay, fn) -> None:
        self.delay, self.fn = delay, fn

    def cancel(self) -> None:
        self.fn = None


def message(body: str, annotations: dict | None = None, **fields) -> bytes:
    msg = Message(body=body, **fields)
    if annotations is not None:
        msg.annotations = {symbol(k): v for k, v in annotations.items()}
    return bytes(msg.encode())


def body(data: bytes) -> str:
    msg = Message()
    msg.decode(data)
    return msg.body


def annotations(data: bytes) -> dict:
    msg = Message()
    msg.decode(data)
    return dict(msg.annotations or {})


def node(timers: Timers | None = None, **arguments) -> tuple[Registry, Queue]:
    registry = Registry("none", True, scheduler=timers)
    queue, _ = registry.declare_queue("q", arguments or None)
    return registry, queue


def send(registry: Registry, queue: Queue, data: bytes) -> list[str]:
    outcome: list[str] = []
    completion = Completion(lambda token: outcome.append("accepted"))
    registry.deliver([queue], data, completion)
    completion.release()
    return outcome


def got(consumer: FakeConsumer) -> list[str]:
    return [body(data) for _, data, _ in consumer.got]


# -- reading the annotations -----------------------------------------------------------------------------


def test_the_annotations_are_read_from_the_bytes_integers_of_any_width_and_a_timestamp():
    from proton import int32, timestamp, ulong

    assert sections.schedule_request(message("a", {"x-opt-delivery-delay": 1500})) == (None, 1500)
    assert sections.schedule_request(message("a", {"x-opt-delivery-time": ulong(T0)})) == (T0, None)
    assert sections.schedule_request(message("a", {"x-opt-delivery-time": timestamp(T0)})) == (T0, None)
    assert sections.schedule_request(message("a", {"x-opt-delivery-delay": int32(7)})) == (None, 7)
    assert sections.schedule_request(message("a", {"x-opt-delivery-delay": None})) == (None, None)
    assert sections.schedule_request(message("a", {"other": 1})) == (None, None)
    assert sections.schedule_request(message("a")) == (None, None)


@pytest.mark.parametrize("value", ["5000", 2.5, 1000.0, -1, True])
def test_a_value_that_is_not_a_whole_number_of_milliseconds_0_or_more_is_refused(value):
    for name in ("x-opt-delivery-delay", "x-opt-delivery-time"):
        with pytest.raises(sections.BadSchedule, match=name) as refused:
            sections.schedule_request(message("a", {name: value}))
        assert refused.value.condition == "amqp:invalid-field"


def test_a_long_message_is_searched_in_its_annotations_not_its_body():
    long_body = "x-opt-delivery-time " * 100  # 2000 bytes mentioning it, in the body
    assert not sections.mentions_schedule(message(long_body))
    assert not sections.may_be_scheduled(message(long_body))
    big_annotations = {f"k{i}": "v" * 40 for i in range(40)}  # the annotation past the first 1024 bytes
    big_annotations["x-opt-delivery-delay"] = 10
    data = message(long_body, big_annotations)
    assert data.index(b"x-opt-delivery-delay") > 1024
    assert sections.mentions_schedule(data) and sections.may_be_scheduled(data)
    assert sections.schedule_request(data) == (None, 10)


# -- holding back and ordering -----------------------------------------------------------------------------


def test_a_delay_becomes_an_absolute_time_once_and_the_message_waits_for_it(clock):
    registry, queue = node()
    consumer = FakeConsumer(credit=10)
    queue.add_consumer(consumer)
    assert send(registry, queue, message("later", {"x-opt-delivery-delay": 1500})) == ["accepted"]
    assert send(registry, queue, message("now")) == ["accepted"]
    assert got(consumer) == ["now"]
    assert queue.depth == 2 and queue.describe()["scheduled"] == 1 and queue.describe()["acquired"] == 1
    stored = queue.get(1)
    assert annotations(stored) == {symbol("x-opt-delivery-delay"): 1500, symbol("x-opt-delivery-time"): T0 + 1500}
    clock.now = T0 + 1499
    queue.dispatch()
    assert got(consumer) == ["now"], "delivered early"
    clock.now = T0 + 1500
    queue.dispatch()
    assert got(consumer) == ["now", "later"]
    assert queue.describe()["scheduled"] == 0 and queue.describe()["acquired"] == 2
    queue.acknowledge(1)
    queue.acknowledge(2)
    assert type(queue) is Queue, "a queue with nothing held is its plain class again"


def test_due_messages_go_in_order_of_due_time_then_arrival_ahead_of_the_others(clock):
    registry, queue = node()
    send(registry, queue, message("a3", {"x-opt-delivery-delay": 3000}))
    send(registry, queue, message("b1", {"x-opt-delivery-delay": 1000}))
    send(registry, queue, message("c1", {"x-opt-delivery-time": T0 + 1000}))  # the same time as b1, later
    send(registry, queue, message("d2", {"x-opt-delivery-time": T0 + 2000}))
    send(registry, queue, message("plain1"))
    send(registry, queue, message("plain2"))
    consumer = FakeConsumer(credit=2)
    queue.add_consumer(consumer)
    assert got(consumer) == ["plain1", "plain2"]
    send(registry, queue, message("plain3"))
    clock.now = T0 + 5000  # all due, no consumer credit: they wait in due order
    consumer.credit = 10
    queue.dispatch()
    assert got(consumer) == ["plain1", "plain2", "b1", "c1", "d2", "a3", "plain3"]


def test_a_time_already_past_and_a_zero_delay_are_ordinary_messages_left_as_they_came(clock):
    registry, queue = node()
    past = message("past", {"x-opt-delivery-time": T0 - 1})
    zero = message("zero", {"x-opt-delivery-delay": 0})
    send(registry, queue, past)
    send(registry, queue, zero)
    assert queue.messages() == [(1, past), (2, zero)]
    assert type(queue) is Queue and queue.describe()["scheduled"] == 0


def test_a_message_that_only_mentions_the_annotations_in_its_body_is_ordinary(clock):
    registry, queue = node()
    send(registry, queue, message("about x-opt-delivery-delay"))
    consumer = FakeConsumer(credit=1)
    queue.add_consumer(consumer)
    assert got(consumer) == ["about x-opt-delivery-delay"] and type(queue) is Queue


@pytest.mark.parametrize("value", ["1000", -5, 1.5])
def test_a_bad_value_refuses_the_message_and_enqueues_nothing(clock, value):
    registry, queue = node()
    with pytest.raises(BrokerError, match="x-opt-delivery-delay must be a delay in milliseconds") as refused:
        send(registry, queue, message("bad", {"x-opt-delivery-delay": value}))
    assert refused.value.condition == "amqp:invalid-field"
    assert queue.depth == 0 and queue.next_id == 1 and type(queue) is Queue


def test_a_last_value_or_grouped_queue_refuses_a_message_for_later(clock):
    for arguments in ({"qpid.last_value_queue_key": "k"}, {"qpid.group_header_key": "g"}):
        registry, queue = node(**arguments)
        with pytest.raises(BrokerError, match="does not combine") as refused:
            send(registry, queue, message("later", {"x-opt-delivery-delay": 10}))
        assert refused.value.condition == "amqp:invalid-field" and queue.depth == 0
        send(registry, queue, message("now", {"x-opt-delivery-delay": 0}))  # nothing to hold: taken
        assert queue.depth == 1


def test_a_priority_queue_gives_due_messages_first_then_by_priority(clock):
    registry, queue = node(**{"qpid.priorities": 10})
    send(registry, queue, message("low-later", {"x-opt-delivery-delay": 100}, priority=1))
    send(registry, queue, message("high", priority=9))
    send(registry, queue, message("low", priority=1))
    clock.now = T0 + 100
    consumer = FakeConsumer(credit=10)
    queue.add_consumer(consumer)
    assert got(consumer) == ["low-later", "high", "low"]


def test_a_single_active_consumer_queue_gives_due_messages_to_the_active_one_only(clock):
    registry, queue = node(**{"x-single-active-consumer": True})
    first, second = FakeConsumer(credit=5), FakeConsumer(credit=5)
    queue.add_consumer(first)
    queue.add_consumer(second)
    send(registry, queue, message("a", {"x-opt-delivery-delay": 10}))
    send(registry, queue, message("b", {"x-opt-delivery-delay": 10}))
    clock.now = T0 + 10
    queue.dispatch()
    assert got(first) == ["a", "b"] and got(second) == []


def test_a_dedup_queue_takes_a_scheduled_message_id_once(clock):
    registry, queue = node(**{"x-dedup-window": 60})
    data = message("once", {"x-opt-delivery-delay": 10}, id="m-1")
    send(registry, queue, data)
    send(registry, queue, data)
    assert queue.depth == 1 and queue.stats["deduplicated"] == 1 and queue.describe()["scheduled"] == 1


def test_browsers_do_not_see_a_held_message_replicating_browsers_do(clock):
    registry, queue = node()
    browser = FakeConsumer(credit=10, browsing=True)
    replicating = FakeConsumer(credit=10, browsing=True, sees_acquired=True)
    queue.add_consumer(browser)
    queue.add_consumer(replicating)
    send(registry, queue, message("later", {"x-opt-delivery-delay": 10}))
    send(registry, queue, message("now"))
    assert got(browser) == ["now"]
    assert got(replicating) == ["later", "now"]
    clock.now = T0 + 10
    late_browser = FakeConsumer(credit=10, browsing=True)
    queue.add_consumer(late_browser)  # after its time: it is there to see
    assert got(late_browser) == ["later", "now"]


def test_a_ttl_shorter_than_the_wait_expires_the_held_message_and_purge_takes_held_ones(clock):
    registry, queue = node()
    send(registry, queue, message("short", {"x-opt-delivery-delay": 60_000}, ttl=1))
    send(registry, queue, message("held", {"x-opt-delivery-delay": 60_000}))
    deadline = queue._expiry_heap[0][0]
    assert queue.expire(deadline + 1) == 1 and queue.depth == 1 and queue.stats["expired"] == 1
    assert queue.purge() == 1 and queue.depth == 0 and queue.describe()["scheduled"] == 0


# -- timers -------------------------------------------------------------------------------------------------


def test_one_timer_for_the_earliest_time_at_most_max_wait_away(clock):
    timers = Timers()
    registry, queue = node(timers)
    consumer = FakeConsumer(credit=10)
    queue.add_consumer(consumer)
    send(registry, queue, message("b", {"x-opt-delivery-delay": 1500}))
    assert timers.live() == [1.5]
    send(registry, queue, message("c", {"x-opt-delivery-delay": 1800}))
    assert timers.live() == [1.5], "no timer per message"
    send(registry, queue, message("a", {"x-opt-delivery-delay": 500}))
    assert timers.live() == [0.5], "an earlier message moves the one timer"
    send(registry, queue, message("z", {"x-opt-delivery-delay": 3_600_000}))
    clock.now = T0 + 500
    timers.run()
    assert got(consumer) == ["a"] and timers.live() == [1.0]
    clock.now = T0 + 1800
    timers.run()
    assert got(consumer) == ["a", "b", "c"] and timers.live() == [scheduled.MAX_WAIT]
    clock.now = T0 + 1801  # a timer that fires early (a wall clock stepped back) gives nothing out
    timers.run()
    assert got(consumer) == ["a", "b", "c"] and queue.describe()["scheduled"] == 1


def test_a_backup_holds_a_replicated_message_until_the_primarys_time_not_its_own(clock):
    registry, primary = node()
    send(registry, primary, message("later", {"x-opt-delivery-delay": 2000}))
    msg_id, data = primary.messages()[0]
    clock.now = T0 + 1500  # the backup gets it 1.5 s later
    backup = Queue("q", QueueSettings())
    backup.enqueue(data, None, None, msg_id=msg_id)
    assert backup.describe()["scheduled"] == 1
    consumer = FakeConsumer(credit=5)
    backup.add_consumer(consumer)  # promoted
    clock.now = T0 + 1999
    backup.dispatch()
    assert got(consumer) == []
    clock.now = T0 + 2000
    backup.dispatch()
    assert got(consumer) == ["later"]
    late = Queue("q", QueueSettings())  # a copy that gets it after its time: an ordinary message
    late.enqueue(data, None, None, msg_id=msg_id)
    assert late.describe()["scheduled"] == 0 and type(late) is Queue


def test_a_replicated_dequeue_of_the_last_held_message_ends_scheduling(clock):
    timers = Timers()
    backup = Queue("q", QueueSettings())
    backup.timers = timers
    registry, primary = node()
    send(registry, primary, message("later", {"x-opt-delivery-delay": 2000}))
    msg_id, data = primary.messages()[0]
    backup.enqueue(data, None, None, msg_id=msg_id)
    assert type(backup) is not Queue
    backup.dequeue_ranges([(1, 1)], "replicated")
    timers.run()
    assert type(backup) is Queue and backup._keeper is None and timers.live() == []


# -- the journal ----------------------------------------------------------------------------------------------


def test_a_restart_holds_a_journaled_message_until_the_same_time(tmp_path: Path, clock):
    registry = Registry("none", True)
    queue, _ = registry.declare_queue("q", durable=True, object_uuid="6f8c1a52-0000-4000-8000-00000000005c")
    journal, loop = _journal(tmp_path, registry, "batch")
    outcome = send(registry, queue, message("later", {"x-opt-delivery-delay": 5000}, durable=True))
    send(registry, queue, message("now", durable=True))
    loop.settle(until=lambda: not journal._jobs.qsize())
    journal.close()
    clock.now = T0 + 3000  # restarted 3 s later: 2 s still to wait, not 5
    again = Registry("none", True)
    restored, _ = again.declare_queue("q", durable=True, object_uuid="6f8c1a52-0000-4000-8000-00000000005c")
    journal_again, _ = _journal(tmp_path, again, "batch")
    assert restored.depth == 2 and restored.describe()["scheduled"] == 1
    consumer = FakeConsumer(credit=5)
    restored.add_consumer(consumer)
    assert got(consumer) == ["now"]
    clock.now = T0 + 4999
    restored.dispatch()
    assert got(consumer) == ["now"]
    clock.now = T0 + 5000
    restored.dispatch()
    assert got(consumer) == ["now", "later"]
    journal_again.close()
    assert outcome == [] or outcome == ["accepted"]
    _ = Loop  # the journal's loop, by hand (test_journal)


@pytest.mark.parametrize("fields", [{}, {"durable": True}, {"priority": 7, "ttl": 5.0}, {"durable": True, "id": 3}],
                         ids=["no-header", "durable", "priority-ttl", "durable-id"])
@pytest.mark.parametrize("annotations", [None, {"x-opt-jms-msg-type": 5}, {"x-opt-delivery-delay": 10},
                                         {"a": 1, "x-opt-delivery-time": 10}],
                         ids=["none", "other", "delay", "time-second"])
def test_the_hot_path_check_finds_every_schedule_after_any_header(fields, annotations):
    data = message("x" * 100, annotations, **fields)
    asks = annotations is not None and any(k.startswith("x-opt-delivery-") for k in annotations)
    assert sections.may_be_scheduled(data) == asks
    assert sections.mentions_schedule(data) == asks


def test_the_hot_path_check_reads_past_no_header_and_delivery_annotations():
    annotated = message("x", {"x-opt-delivery-delay": 10})
    plain = message("x-opt-delivery-delay")
    empty_header = b"\x00\x53\x70\x45"  # proton's header when every field is the default
    assert annotated.startswith(empty_header) and plain.startswith(empty_header)
    without_header = annotated[4:], plain[4:]
    assert sections.may_be_scheduled(without_header[0]) and not sections.may_be_scheduled(without_header[1])
    delivery_annotations = b"\x00\x53\x71\xc1\x01\x00"  # an empty map8
    assert sections.may_be_scheduled(empty_header + delivery_annotations + without_header[0])
    assert not sections.may_be_scheduled(empty_header + delivery_annotations + without_header[1])


@pytest.mark.parametrize("annotations", [{"x-opt-delivery-delay": 10}, {"a": "b" * 300, "x-opt-delivery-delay": 7},
                                         {"x-opt-delivery-delay": 10, "z": [1, 2]}], ids=["map32", "long", "list"])
@pytest.mark.parametrize("fields", [{}, {"durable": True, "priority": 6}], ids=["plain", "header"])
def test_the_due_time_is_appended_as_with_annotations_would_write_it(annotations, fields):
    data = message("x" * 50, annotations, **fields)
    when = 1_795_714_610_596
    added = sections.with_due_time(data, when)
    assert added == sections.with_annotations(data, {sections.DELIVERY_TIME: when})
    assert sections.due_time(bytes(bytearray(added))) == when and body(added) == "x" * 50  # a copy: decoded


def test_the_due_time_is_appended_to_a_map8():
    data = message("x", {"x-opt-delivery-delay": 10})
    start = data.index(b"\x00\x53\x72")
    size, count = int.from_bytes(data[start + 4:start + 8], "big"), int.from_bytes(data[start + 8:start + 12], "big")
    map8 = data[:start + 3] + bytes((0xC1, size - 3, count)) + data[start + 12:start + 8 + size] + data[start + 8 + size:]
    assert sections.schedule_request(map8) == (None, 10)
    added = sections.with_due_time(map8, 42)
    assert added[start + 3] == 0xC1 and sections.due_time(bytes(bytearray(added))) == 42 and body(added) == "x"
