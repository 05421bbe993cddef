"""Queue semantics without any I/O: a fake consumer stands in for a link."""

from __future__ import annotations

import pytest

from hastandby.broker.queues.completion import Completion
from hastandby.broker.errors import ResourceLimitExceeded
from hastandby.broker.queues.queue import Queue, QueueSettings


class FakeConsumer:
    def __init__(self, credit: int = 0, browsing: bool = False, sees_acquired: bool = False) -> None:
        self.credit = credit
        self.browsing = browsing
        self.sees_acquired = sees_acquired
        self.got: list[tuple[int, bytes, int]] = []

    def deliver(self, queue, msg_id, data, delivery_count):
        self.credit -= 1
        self.got.append((msg_id, data, delivery_count))

    def deliver_run(self, queue, ids, payloads):
        for msg_id, data in zip(ids, payloads):
            if data is not None:
                self.deliver(queue, msg_id, data, 0)

    @property
    def ids(self) -> list[int]:
        return [m[0] for m in self.got]


def make(**settings) -> Queue:
    return Queue("q", QueueSettings(**settings))


def test_ids_increase_independently_of_position():
    q = make()
    ids = [q.enqueue(b"m%d" % i) for i in range(5)]
    assert ids == [1, 2, 3, 4, 5]
    q.dequeue(1, "consumed")
    assert q.enqueue(b"m5") == 6
    assert q.ids() == [2, 3, 4, 5, 6]


def test_consumer_acquires_in_order_and_ack_removes():
    q = make()
    for i in range(3):
        q.enqueue(b"m%d" % i)
    c = FakeConsumer(credit=2)
    q.add_consumer(c)
    assert [m[0] for m in c.got] == [1, 2]
    assert q.acquired_count == 2 and q.depth == 3
    q.acknowledge(1)
    assert q.depth == 2 and q.ids() == [2, 3]


def test_release_puts_message_back_at_its_place_and_counts_failures():
    q = make()
    for i in range(3):
        q.enqueue(b"m%d" % i)
    c1 = FakeConsumer(credit=2)
    q.add_consumer(c1)
    q.release(1, delivery_failed=True)
    c2 = FakeConsumer(credit=5)
    q.add_consumer(c2)
    assert [(m[0], m[2]) for m in c2.got] == [(1, 1), (3, 0)]
    q.release(2, delivery_failed=False)
    assert c2.got[-1][0] == 2 and c2.got[-1][2] == 0


def test_no_message_goes_to_two_consumers():
    q = make()
    a, b = FakeConsumer(credit=100), FakeConsumer(credit=100)
    q.add_consumer(a)
    q.add_consumer(b)
    for _ in range(50):
        q.enqueue(b"x")
    ids_a = {m[0] for m in a.got}
    ids_b = {m[0] for m in b.got}
    assert not ids_a & ids_b
    assert len(ids_a | ids_b) == 50
    assert len(ids_a) == len(ids_b) == 25  # round robin


def test_browser_sees_everything_in_order_without_taking_it_and_follows_new_ones():
    q = make()
    for i in range(3):
        q.enqueue(b"m%d" % i)
    browser = FakeConsumer(credit=10, browsing=True)
    q.add_consumer(browser)
    q.enqueue(b"m3")
    assert [m[0] for m in browser.got] == [1, 2, 3, 4]
    assert q.depth == 4 and q.acquired_count == 0
    consumer = FakeConsumer(credit=4)
    q.add_consumer(consumer)
    assert [m[0] for m in consumer.got] == [1, 2, 3, 4]


def test_deferred_browse_sends_what_was_enqueued_once_per_pass_in_order():
    q = make()
    browser = FakeConsumer(credit=10, browsing=True)
    q.add_consumer(browser)
    pending: list = []
    q.defer_browse = pending.append
    for i in range(3):
        q.enqueue(b"m%d" % i)
    assert browser.got == [] and len(pending) == 1  # one dispatch for the whole pass
    q.dequeue(2, "consumed")  # gone before the browse: never sent
    pending.pop()()
    assert [m[0] for m in browser.got] == [1, 3]
    q.enqueue(b"m3")
    assert len(pending) == 1  # the next pass asks again
    pending.pop()()
    assert [m[0] for m in browser.got] == [1, 3, 4]


def test_deferred_browse_serves_consumers_at_once_and_browsers_beside_them_at_the_end_of_the_pass():
    q = make()
    browser = FakeConsumer(credit=10, browsing=True, sees_acquired=True)
    consumer = FakeConsumer(credit=10)
    q.add_consumer(browser)
    q.add_consumer(consumer)
    pending: list = []
    q.defer_browse = pending.append
    q.enqueue(b"m0")
    q.enqueue(b"m1")
    q.enqueue(b"m2")
    assert [m[0] for m in consumer.got] == [1, 2, 3] and browser.got == []
    q.acknowledge(2)  # consumed within the pass: the browse finds a hole there
    assert len(pending) == 1
    pending.pop()()
    assert [m[0] for m in browser.got] == [1, 3]
    q.enqueue(b"m3")
    assert len(pending) == 1 and [m[0] for m in consumer.got] == [1, 2, 3, 4]


def test_plain_browser_skips_acquired_replicating_browser_does_not():
    q = make()
    for i in range(3):
        q.enqueue(b"m%d" % i)
    q.add_consumer(FakeConsumer(credit=1))
    plain = FakeConsumer(credit=10, browsing=True)
    replicating = FakeConsumer(credit=10, browsing=True, sees_acquired=True)
    q.add_consumer(plain)
    q.add_consumer(replicating)
    assert [m[0] for m in plain.got] == [2, 3]
    assert [m[0] for m in replicating.got] == [1, 2, 3]


def test_browser_resumes_after_compaction():
    q = make()
    browser = FakeConsumer(credit=1, browsing=True)
    q.add_consumer(browser)
    for _ in range(5000):
        q.enqueue(b"x")
    for msg_id in range(2, 4000):
        q.dequeue(msg_id, "consumed")
    browser.credit = 10
    q.dispatch()
    assert [m[0] for m in browser.got] == [1] + list(range(4000, 4010))


def test_in_order_consumption_compacts_the_prefix_and_keeps_the_head():
    q = make()
    for _ in range(3000):
        q.enqueue(b"x")
    consumer = FakeConsumer(credit=2500)
    q.add_consumer(consumer)
    for msg_id in range(1, 2001):  # holes 1..2000 outnumber the 1000 left: compacted
        q.acknowledge(msg_id)
    assert q.ids() == list(range(2001, 3001)) and q.depth == 1000 and q.acquired_count == 500
    consumer.credit = 10
    q.dispatch()  # the acquired 2001..2500 are not given again
    assert [m[0] for m in consumer.got][-10:] == list(range(2501, 2511))
    q.release(2001, delivery_failed=False)
    consumer.credit = 1
    q.dispatch()
    assert consumer.got[-1][0] == 2001


def test_reject_policy_refuses_and_keeps_contents():
    q = make(max_count=2, policy="reject")
    q.enqueue(b"a")
    q.enqueue(b"b")
    with pytest.raises(ResourceLimitExceeded, match="max-count 2"):
        q.check_capacity(1)
    assert q.ids() == [1, 2]
    size_limited = make(max_size=10, policy="reject")
    size_limited.enqueue(b"12345678")
    with pytest.raises(ResourceLimitExceeded, match="max-size"):
        size_limited.check_capacity(5)


def test_ring_policy_drops_oldest():
    q = make(max_count=3, policy="ring")
    for i in range(5):
        q.enqueue(b"m%d" % i)
    assert q.ids() == [3, 4, 5]
    assert q.stats["ring_dropped"] == 2


def test_ring_skips_acquired_messages_and_drops_the_next_available():
    q = make(max_count=3, policy="ring")
    for i in range(3):
        q.enqueue(b"m%d" % i)
    consumer = FakeConsumer(credit=1)
    q.add_consumer(consumer)  # acquires 1
    for i in range(3, 6):
        q.enqueue(b"m%d" % i)
    assert q.ids() == [1, 5, 6] and q.stats["ring_dropped"] == 3
    q.release(1, delivery_failed=False)  # available again: the oldest, dropped next
    q.enqueue(b"m6")
    assert q.ids() == [5, 6, 7]


def test_ttl_expiry_removes_unacquired_and_skips_at_dispatch():
    q = make()
    q.enqueue(b"short", ttl_ms=10)
    q.enqueue(b"long", ttl_ms=60_000)
    q.enqueue(b"forever")
    import time

    assert q.expire(time.monotonic() + 1.0) == 1
    assert q.ids() == [2, 3]
    q.enqueue(b"gone", ttl_ms=1)
    time.sleep(0.01)
    c = FakeConsumer(credit=10)
    q.add_consumer(c)
    assert [m[0] for m in c.got] == [2, 3]


def test_replica_takes_given_ids_in_order_and_drops_duplicates():
    q = make()
    assert q.enqueue(b"b", msg_id=5) == 5
    q.enqueue(b"a", msg_id=3)
    q.enqueue(b"b-again", msg_id=5)
    q.enqueue(b"c", msg_id=9)
    assert q.messages() == [(3, b"a"), (5, b"b"), (9, b"c")]
    assert q.next_id == 10


def test_restore_fills_an_empty_queue_in_order_with_the_ttls_it_is_given():
    from proton import Message

    short = bytes(Message(body="short", durable=True, ttl=0.01).encode())
    kept = bytes(Message(body="kept", durable=True).encode())
    q = make()
    q.restore([4, 7, 9], [kept, short, b"plain"], {7: 10})
    assert (q.ids(), q.depth, q.next_id) == ([4, 7, 9], 3, 10)
    assert q.bytes == len(kept) + len(short) + len(b"plain")
    import time

    assert q.expire(time.monotonic() + 1.0) == 1 and q.ids() == [4, 9]
    assert q.enqueue(b"next") == 10
    with pytest.raises(ValueError, match="not empty"):
        q.restore([11], [b"x"])


class Recorder:
    def __init__(self):
        self.events = []

    def enqueued(self, queue, msg_id, data, completion):
        self.events.append(("enqueued", msg_id))
        if completion is not None:
            completion.hold()
            self.held = completion

    def acquired(self, queue, msg_id):
        self.events.append(("acquired", msg_id))

    def released(self, queue, msg_id):
        self.events.append(("released", msg_id))

    def dequeued(self, queue, msg_id, reason):
        self.events.append(("dequeued", msg_id, reason))


def test_observers_see_every_transition_and_may_hold_completion():
    q = make()
    recorder = Recorder()
    q.add_observer(recorder)
    done = []
    completion = Completion(done.append, "token")
    q.enqueue(b"m", completion)
    completion.release()
    assert done == []  # held by the observer
    recorder.held.release()
    assert done == ["token"]
    c = FakeConsumer(credit=2)
    q.add_consumer(c)
    q.release(1, delivery_failed=False)
    q.dequeue(1, "expired")
    assert recorder.events == [("enqueued", 1), ("acquired", 1), ("released", 1), ("acquired", 1), ("dequeued", 1, "expired")]


def test_an_observer_that_does_not_follow_acquisitions_sees_only_what_is_stored():
    """The journal's way (``follows_acquisitions = False``): no call for each delivery to a consumer."""

    class Stored(Recorder):
        follows_acquisitions = False

    q = make()
    stored, every = Stored(), Recorder()
    q.add_observer(stored)
    q.add_observer(every)
    q.enqueue(b"m")
    q.add_consumer(FakeConsumer(credit=2))
    q.release(1, delivery_failed=False)
    q.dequeue(1, "consumed")
    assert stored.events == [("enqueued", 1), ("dequeued", 1, "consumed")]
    assert every.events == [("enqueued", 1), ("acquired", 1), ("released", 1), ("acquired", 1), ("dequeued", 1, "consumed")]


class RunConsumer(FakeConsumer):
    """Takes runs of messages (a batching replication link) and records each call."""

    def __init__(self, credit: int = 0, browsing: bool = False, sees_acquired: bool = False) -> None:
        super().__init__(credit, browsing, sees_acquired)
        self.runs: list[list[int]] = []

    def deliver_run(self, queue, ids, payloads):
        self.runs.append(list(ids))
        super().deliver_run(queue, ids, payloads)


def test_replicating_browser_takes_one_run_per_deferred_pass_and_runs_stop_at_its_credit():
    q = make()
    passes: list = []
    q.defer_browse = passes.append
    b = RunConsumer(credit=4, browsing=True, sees_acquired=True)
    q.add_consumer(b)
    for i in range(6):
        q.enqueue(b"m%d" % i)
    assert b.got == [] and len(passes) == 1
    passes.pop()()
    assert b.runs == [[1, 2, 3, 4]]
    b.credit = 10
    q.dispatch()
    assert b.runs[1:] == [[5, 6]] and q.acquired_count == 0


def test_enqueue_run_assigns_ids_in_one_step_and_tells_observers():
    q = make()
    recorder = Recorder()
    q.add_observer(recorder)
    q.enqueue(b"a")
    q.enqueue_run([b"bb", b"ccc"])
    assert q.messages() == [(1, b"a"), (2, b"bb"), (3, b"ccc")]
    assert q.depth == 3 and q.bytes == 6 and q.next_id == 4 and q.stats["enqueued"] == 3
    assert recorder.events == [("enqueued", 1), ("enqueued", 2), ("enqueued", 3)]


def test_enqueue_run_past_a_ring_limit_drops_what_one_by_one_would():
    runs, single = make(max_count=3, policy="ring"), make(max_count=3, policy="ring")
    for q in (runs, single):
        q.enqueue(b"old")
    runs.enqueue_run([b"m%d" % i for i in range(4)])
    for i in range(4):
        single.enqueue(b"m%d" % i)
    assert runs.messages() == single.messages() == [(3, b"m1"), (4, b"m2"), (5, b"m3")]
    assert runs.stats["ring_dropped"] == single.stats["ring_dropped"] == 2


def test_acknowledge_many_removes_a_stretch_and_tells_observers():
    q = make()
    recorder = Recorder()
    q.add_observer(recorder)
    for i in range(6):
        q.enqueue(b"m%d" % i)
    c = RunConsumer(credit=4)
    q.add_consumer(c)
    q.acknowledge_many([1, 2, 3])
    assert q.ids() == [4, 5, 6] and q.depth == 3 and q.bytes == 6 and q.acquired_count == 1
    assert [e for e in recorder.events if e[0] == "dequeued"] == [("dequeued", i, "consumed") for i in (1, 2, 3)]
    assert q.stats["dequeued"] == 3


def test_acknowledge_many_with_gaps_falls_back_to_one_by_one():
    q = make()
    for i in range(6):
        q.enqueue(b"m%d" % i)
    q.dequeue(3, "purged")
    c = RunConsumer(credit=6)
    q.add_consumer(c)
    q.acknowledge_many([1, 2, 4, 5])
    assert q.ids() == [6] and q.depth == 1 and q.acquired_count == 1
    q.acknowledge_many([])
    assert q.ids() == [6]


def test_acknowledge_many_removes_a_browsed_stretch():
    q = make()
    b = RunConsumer(credit=10, browsing=True, sees_acquired=True)
    q.add_consumer(b)
    q.enqueue_run([b"m%d" % i for i in range(5)])
    q.acknowledge_many([1, 2, 3])
    assert q.ids() == [4, 5] and q.stats["dequeued"] == 3 and [m[0] for m in b.got] == [1, 2, 3, 4, 5]


def test_drop_from_removes_a_diverged_tail_and_tells_observers():
    queue = Queue("q", QueueSettings())
    for index in range(1, 8):
        queue.enqueue(b"m%d" % index)
    queue.dequeue(5, "consumed")
    recorder = Recorder()
    queue.add_observer(recorder)
    assert queue.drop_from(4) == 3
    assert queue.ids() == [1, 2, 3]
    assert queue.depth == 3
    assert [event for event in recorder.events if event[0] == "dequeued"] == [
        ("dequeued", 4, "diverged"), ("dequeued", 6, "diverged"), ("dequeued", 7, "diverged")]
    assert queue.next_id == 8  # ids are never given out twice on one node
    assert queue.drop_from(100) == 0


def test_dequeue_ranges_work_by_what_is_held_not_by_the_width_of_the_range():
    queue = Queue("q", QueueSettings())
    for index in range(1, 11):
        queue.enqueue(b"m%d" % index)
    assert queue.dequeue_ranges([(3, 4), (9, 2**62)], "replicated") == 4  # a peer's absurd range: cheap
    assert queue.ids() == [1, 2, 5, 6, 7, 8]
    assert queue.dequeue_ranges([(100, 2**62)], "replicated") == 0


def test_id_set_reads_the_ids_with_and_without_holes():
    q = make()
    for body in (b"a", b"b", b"c", b"d"):
        q.enqueue(body)
    assert q.id_set().to_wire() == [1, 4]
    q.dequeue(2, "consumed")
    assert q.id_set().to_wire() == [1, 1, 3, 4]
