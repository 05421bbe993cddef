"""The enqueue-mode tap feeder without I/O: a list of scheduled calls stands in for the driver.

The link that browses the tap (``TapLink``) is tested at the end on a real proton link between two in-memory
engines: its status reports and its close path.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

from proton import Condition, Connection, Endpoint, Link, Transport

from hastandby.broker.queues.completion import Completion
from hastandby.broker.queues.queue import Queue, QueueSettings
from hastandby.replication.codec import decode_body
from hastandby.replication.guard import QueueGuard
from hastandby.dr.protocol import STOPPED, LinkRequest, StatusReport
from hastandby.dr.source import LINGER, STATUS_INTERVAL, TapFeeder, TapLink


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


# -- the link that browses the tap -----------------------------------------------------------------------------


class Driver(Timers):
    """``Timers`` plus what a link asks of the driver: cancellable timers, calls after the events."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: list[Callable[[], None]] = []
        self.after: list[Callable[[], None]] = []

    def schedule(self, delay: float, fn: Callable[[], None]) -> Any:
        self.due.append((delay, fn))
        return SimpleNamespace(cancel=lambda: self.cancelled.append(fn))

    def after_events(self, fn: Callable[[], None]) -> None:
        self.after.append(fn)

    def run_after(self) -> None:
        after, self.after = self.after, []
        for fn in after:
            fn()


class Engines:
    """A source's sending link (``link``) and the replica's receiving end (``peer``), two engines, no sockets."""

    def __init__(self, credit: int) -> None:
        near, far = Connection(), Connection()
        self._transports = Transport(), Transport(Transport.SERVER)
        self._transports[0].bind(near)
        self._transports[1].bind(far)
        near.open()
        far.open()
        session = near.session()
        session.open()
        self.link: Link = session.sender("tap")
        self.link.open()
        self.pump()
        far_session, peer = far.session_head(Endpoint.LOCAL_UNINIT), far.link_head(Endpoint.LOCAL_UNINIT)
        assert far_session is not None and peer is not None
        far_session.open()
        self.peer = peer
        self.peer.open()
        self.peer.flow(credit)
        self.pump()

    def pump(self) -> None:
        near, far = self._transports
        moved = True
        while moved:
            moved = False
            for source, sink in ((near, far), (far, near)):
                pending = source.pending()
                if pending > 0:
                    sink.push(source.peek(pending) or b"")
                    source.pop(pending)
                    moved = True

    def received(self) -> list[tuple[str, bytes]]:
        """Tag and bytes of every complete delivery the replica's end holds."""
        self.pump()
        found = []
        while self.peer.current is not None:
            delivery = self.peer.current
            found.append((delivery.tag, bytes(self.peer.recv(delivery.pending) or b"")))
            self.peer.advance()
        return found


def tap_link(credit: int = 10) -> tuple[TapLink, Engines, Driver, list[Any], list[Queue]]:
    driver = Driver()
    source, tap = Queue("q", QueueSettings()), Queue("$dr.k.q", QueueSettings())
    fed = TapFeeder(source, tap, driver)  # type: ignore[arg-type]
    engines = Engines(credit)
    changed: list[Any] = []
    forgotten: list[Queue] = []
    registry = SimpleNamespace(consumers_changed=changed.append)
    link = TapLink(engines.link, fed, registry, driver, LinkRequest("enqueue", "k", ack=True),  # type: ignore[arg-type]
                   "dr1:5672", forgotten.append)
    return link, engines, driver, changed, forgotten


def test_a_tap_link_reports_its_status_on_spare_credit_once_started() -> None:
    link, engines, driver, _, _ = tap_link()
    assert driver.due == []  # nothing before the link is open and started
    link.start()
    assert [delay for delay, _ in driver.due] == [0.0]
    driver.run()
    [(tag, data)] = engines.received()
    assert tag == "s1"
    assert StatusReport.from_wire(decode_body(data, "status")) == link.status() == StatusReport("live", 0, 0.0, 0)
    assert [delay for delay, _ in driver.due] == [STATUS_INTERVAL]  # the next report
    assert link.credit == 9 * 1000  # the report took one of ten batches' credit


def test_a_tap_link_closes_through_its_base_and_leaves_the_backlog_on_the_tap() -> None:
    link, engines, driver, changed, forgotten = tap_link()
    tap = link.queue
    link.start()
    link.flow()  # the replica's credit
    tap.enqueue_run([b"m1", b"m2", b"m3"])
    while driver.after:  # the browse, then the batch: sent, not acknowledged
        driver.run_after()
    assert [tag for tag, _ in engines.received()] == ["b1"]
    assert link.unacked_count == 3
    link.close()
    assert tap.ids() == [1, 2, 3]  # still there for the next link
    assert link not in tap.browsers and changed == [tap]  # OutgoingLink.close ran: the registry heard of it
    assert link.unacked_count == 0 and driver.cancelled  # sent batches forgotten, reports stopped
    assert forgotten == []  # an ordinary detach keeps the replication
    link.close()
    assert changed == [tap]  # once


def test_a_tap_link_detached_with_replication_stopped_forgets_the_replication() -> None:
    link, engines, _, _, forgotten = tap_link()
    link.start()
    engines.peer.condition = Condition(STOPPED, "replication stopped at the replica")
    engines.peer.close()
    engines.pump()
    link.close()
    assert forgotten == [link.queue]
