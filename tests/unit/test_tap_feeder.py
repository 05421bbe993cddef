"""The enqueue-mode tap feeder without I/O: a list of scheduled calls stands in for the driver."""

from __future__ import annotations

from typing import Callable

from hastandby.broker.completion import Completion
from hastandby.broker.queue import Queue, QueueSettings
from hastandby.replication.guard import QueueGuard
from hastandby.dr.source import LINGER, TapFeeder


class Timers:
    """``Driver.schedule`` recorded: the test decides when each call runs."""

    def __init__(self) -> None:
        self.due: list[tuple[float, Callable[[], None]]] = []

    def schedule(self, delay: float, fn: Callable[[], None]) -> None:
        self.due.append((delay, fn))

    def run(self) -> None:
        due, self.due = self.due, []
        for _, fn in due:
            fn()


def feeder(**tap_settings) -> tuple[Queue, Queue, TapFeeder, Timers]:
    source, tap, timers = Queue("q", QueueSettings()), Queue("$dr.k.q", QueueSettings(**tap_settings)), Timers()
    return source, tap, TapFeeder(source, tap, timers), timers  # type: ignore[arg-type]


def test_copies_go_on_the_tap_as_one_run_a_linger_after_the_first():
    source, tap, _, timers = feeder()
    for i in range(3):
        source.enqueue(b"m%d" % i)
    assert tap.depth == 0 and [d for d, _ in timers.due] == [LINGER]  # one timer for the whole run
    timers.run()
    assert tap.messages() == [(1, b"m0"), (2, b"m1"), (3, b"m2")]
    source.enqueue(b"m3")
    assert len(timers.due) == 1  # the next run asks again
    timers.run()
    assert tap.ids() == [1, 2, 3, 4]


def test_a_copy_stays_when_a_source_consumer_takes_the_original_first():
    source, tap, _, timers = feeder()
    source.enqueue(b"m")
    source.dequeue(1, "consumed")
    timers.run()
    assert source.depth == 0 and tap.messages() == [(1, b"m")]


def test_a_guarded_tap_gets_each_copy_at_once_and_holds_the_producer():
    """A --sync link's guard (or an HA guard) may hold the producer's acknowledgement,
    so the copy must be on the tap, with that acknowledgement, before routing ends."""
    source, tap, _, timers = feeder()
    source.enqueue(b"early")  # pending when the guard arrives: goes first, in order
    guard = QueueGuard(tap)
    done: list[str] = []
    completion = Completion(done.append, "producer")
    source.enqueue(b"held", completion)
    completion.release()
    assert tap.ids() == [1, 2] and done == []
    guard.complete(2)
    assert done == ["producer"]
    timers.run()  # the early run's timer finds nothing left
    assert tap.ids() == [1, 2]


def test_overflow_is_counted_and_the_newest_kept():
    source, tap, fed, timers = feeder(max_count=3, policy="ring")
    for i in range(5):
        source.enqueue(b"m%d" % i)
    timers.run()
    assert tap.messages() == [(3, b"m2"), (4, b"m3"), (5, b"m4")]
    assert fed.overflow == 2 and fed.overflowing


def test_a_replicated_tap_gets_each_acknowledged_copy_at_once():
    """A backup may attach to the tap at any moment: a copy must not trail its message."""
    source, tap, _, timers = feeder(replicate="all")
    done: list[str] = []
    completion = Completion(done.append, "producer")
    source.enqueue(b"m", completion)
    assert tap.ids() == [1] and timers.due == []
    source.enqueue(b"pre-settled")  # no acknowledgement to protect: it may linger
    assert tap.ids() == [1] and len(timers.due) == 1


def test_close_puts_what_was_collected_on_the_tap_and_copies_nothing_more():
    source, tap, fed, timers = feeder()
    source.enqueue(b"m")
    fed.close()  # e.g. the node steps down: its backups' taps must match their queues
    source.enqueue(b"n")
    timers.run()
    assert tap.messages() == [(1, b"m")] and source.depth == 2
