"""Scheduled delivery: a message held back until its ``x-opt-delivery-time`` (docs/queues.md).

A producer asks with ActiveMQ Artemis's message annotations, ``x-opt-delivery-time``
(milliseconds since the epoch) or ``x-opt-delivery-delay`` (milliseconds).  The
primary turns a delay into an absolute time once, when it takes the message
(``Registry.deliver``: the message gets an ``x-opt-delivery-time`` annotation, its
other bytes as the producer sent them), so the time travels *in the message*:
a backup, a DR replica and a node restarted on its journal read the same
wall-clock time from the same bytes, whenever they get them, and none of them
counts a delay from its own arrival.  No control or journal record is needed
for it.

A queue holds nothing back until it first takes such a message: then its class
becomes its kind's scheduling variant (``Scheduling`` composed with it,
as ``queue_kinds.queue_class`` composes features) and a ``ScheduleKeeper``
observes it; once nothing is held any more it goes back to its plain class.
``Queue.start_scheduling`` calls this module, which does not import ``queue.py``:
what it needs of a queue is ``Holder``, and ``Scheduling`` is a mixin that
only ever comes composed with a kind (a ``Queue`` subclass).
So a queue that never sees the annotations pays nothing, and the check for
them on the hot path reads a few bytes (``sections.may_be_scheduled``).

A held message is on the queue (its depth, its bytes, replication, the
journal: it is an ordinary message there) but sits in ``Queue._acquired``
under ``HELD``: every dispatch (FIFO, priorities) and every client browser
passes over an acquired message, so nothing takes it early, and replicating
browsers, which see acquired messages, replicate it as any other.  When its
time comes it is *due*: no longer held (a browser that has not passed its
place sees it), and consumers get due messages first, in order of due time
then arrival (replication id), ahead of the messages that have no time:
every dispatch goes through ``Scheduling._dispatch_consumers``, which
serves the due ones before its kind's own order, so the kind's dispatch
only runs once no due message is left or no consumer has credit.  Once given
to a consumer a message is an ordinary acquired one (a release puts it back
at its place by arrival).

Timers: one per queue, for the earliest time held (``Queue.timers``, the
driver's ``schedule``), never longer than ``MAX_WAIT`` so that a wall clock
stepped forward is noticed; a message is never given out before the node's
wall clock says its time has come.
"""

from __future__ import annotations

import heapq
import time
from typing import Any, Callable, Protocol

from hastandby.broker.message import sections
from hastandby.broker.queues.completion import Completion

MAX_WAIT = 2.0
"""Seconds a queue's timer waits at most: the timer runs on the monotonic clock, due times are wall-clock."""


class _Held:
    """The consumer a held message is 'acquired' by: nobody (never delivered to; a marker)."""

    credit = 0
    browsing = False
    sees_acquired = False

    def __repr__(self) -> str:
        return "<held until its delivery time>"


HELD: Any = _Held()


class Holder(Protocol):
    """What scheduling needs of a queue (``queue.Queue`` has it): its settings, its timers, and the two tables
    held messages live in, which the queue keeps for this module (so that every dispatch, of every kind, passes
    over a held message at no cost to the queues that hold none)."""

    name: str
    settings: Any  # queue.QueueSettings
    timers: Any  # the driver's ``schedule``, or None: ``Queue.timers``
    _acquired: dict[int, Any]  # id -> its consumer, or HELD
    _scheduled: dict[int, int]  # id -> due (ms since the epoch) of the held
    _keeper: Any  # its ScheduleKeeper while it holds messages, else None
    _dispatching: bool

    def holds(self, msg_id: int) -> bool: ...

    def add_observer(self, observer: object) -> None: ...

    def remove_observer(self, observer: object) -> None: ...


def wall_ms() -> int:
    """Now, in milliseconds since the epoch (the clock due times are in; tests replace it)."""
    return int(time.time() * 1000)


def refusal(queue: Holder) -> str | None:
    """Why ``queue`` cannot hold a message back (a sentence), or None if it can."""
    settings = queue.settings
    if settings.lvq_key is not None:
        return ("scheduled delivery (x-opt-delivery-time, x-opt-delivery-delay) does not combine with a "
                f"last-value queue: {queue.name!r} keeps the latest value now, not one for later")
    if settings.group_header is not None:
        return ("scheduled delivery (x-opt-delivery-time, x-opt-delivery-delay) does not combine with message "
                f"groups: {queue.name!r} delivers a group's messages in arrival order")
    return None


class ScheduleKeeper:
    """Holds each message with a delivery time still to come as it is enqueued; forgets it as it leaves.

    A queue observer, told of enqueues before the queue dispatches them (so a
    consumer with credit never sees a held message) and of removals.
    """

    follows_acquisitions = False  # QueueObserver: enqueues and removals only

    def __init__(self) -> None:
        self.held: list[tuple[int, int]] = []  # heap of (due ms, id) of the held (Queue._scheduled)
        self.due: list[tuple[int, int]] = []  # heap of (due ms, id): due, waiting for a consumer
        self.due_ids: set[int] = set()  # the ids in ``due`` still waiting (on the queue, not given out)
        self.timer: Any = None
        self.timer_at = 0  # wall ms the timer fires at, at the latest
        self.stop_pending = False
        self.removed = 0  # entries gone from the heaps since they were last rebuilt

    def idle(self, queue: Holder) -> bool:
        """Nothing held and nothing due: the queue can go back to its plain class."""
        return not queue._scheduled and not self.due_ids

    def hold(self, queue: Holder, msg_id: int, data: bytes) -> None:
        """Hold ``msg_id`` if its bytes carry a delivery time still to come (by this node's clock)."""
        due = sections.due_time(data)
        if due is None or due <= wall_ms() or not queue.holds(msg_id):
            return  # no time, or its time has come: an ordinary message
        if msg_id in queue._acquired:  # (a pre-settled consumer cannot have it yet: the keeper comes first)
            return
        queue._scheduled[msg_id] = due
        queue._acquired[msg_id] = HELD
        heapq.heappush(self.held, (due, msg_id))
        if isinstance(queue, Scheduling):
            queue._arm()

    # -- QueueObserver ----------------------------------------------------------------------

    def enqueued(self, queue: Holder, msg_id: int, data: bytes, completion: Completion | None) -> None:
        if sections.may_be_scheduled(data):
            self.hold(queue, msg_id, data)

    def acquired(self, queue: Holder, msg_id: int) -> None:
        pass

    def released(self, queue: Holder, msg_id: int) -> None:
        pass

    def dequeued(self, queue: Holder, msg_id: int, reason: str) -> None:
        if queue._scheduled.pop(msg_id, None) is None:
            if not self.due_ids or msg_id not in self.due_ids:
                return
            self.due_ids.discard(msg_id)
        self.removed += 1
        if self.removed > 1024 and self.removed > len(queue._scheduled) + len(self.due_ids):
            self.rebuild(queue)
        if self.idle(queue) and not self.stop_pending and queue.timers is not None:
            # Nothing held any more: back to the plain class, from the top of the event loop (not from
            # inside whichever queue method removed the message).
            self.stop_pending = True
            queue.timers(0, lambda: self._stop_later(queue))

    def _stop_later(self, queue: Holder) -> None:
        self.stop_pending = False
        if queue._keeper is self and self.idle(queue) and not queue._dispatching:
            stop_scheduling(queue)

    def rebuild(self, queue: Holder) -> None:
        """Drop the heaps' entries of messages gone (a backup, whose held messages its primary's consumers
        take, would keep one per message otherwise)."""
        self.held = [(due, msg_id) for msg_id, due in queue._scheduled.items()]
        heapq.heapify(self.held)
        self.due = [entry for entry in self.due if entry[1] in self.due_ids]
        heapq.heapify(self.due)
        self.removed = 0


class Scheduling:
    """A queue kind's variant while it holds scheduled messages: due messages go to consumers first.

    A mixin: ``scheduling_class`` composes it with a kind, before it, so ``super()`` is the kind's queue.
    """

    # The kind's own (``queue.Queue``'s), for the type checker only: nothing here is set on the class.
    name: str
    settings: Any
    timers: Any
    _keeper: ScheduleKeeper
    _acquired: dict[int, Any]
    _scheduled: dict[int, int]
    _dispatching: bool
    holds: Callable[[int], bool]
    add_observer: Callable[[object], None]
    remove_observer: Callable[[object], None]
    _index: Callable[[int], int | None]
    _next_consumer: Callable[[list[Any]], Any]
    _hand_over: Callable[[Any, int, int], None]
    dequeue: Callable[[int, str], bytes | None]

    def dispatch(self) -> None:
        keeper = self._keeper
        if keeper.held and keeper.held[0][0] <= wall_ms():
            self._ripen()
        super().dispatch()  # type: ignore[misc]
        if not self._dispatching and self._keeper.idle(self):
            stop_scheduling(self)

    def _dispatch_consumers(self, consumers: list[Any]) -> None:
        if self._keeper.due:
            self._dispatch_due(consumers[:1] if self.settings.single_active_consumer else consumers)
        super()._dispatch_consumers(consumers)  # type: ignore[misc]

    def _dispatch_due(self, consumers: list[Any]) -> None:
        """Due messages, in order of due time then arrival, to ``consumers`` with credit, in turn."""
        keeper = self._keeper
        due, waiting, acquired = keeper.due, keeper.due_ids, self._acquired
        while due:
            msg_id = due[0][1]
            if msg_id not in waiting:  # gone since (expired, purged, a replicated dequeue)
                heapq.heappop(due)
                continue
            consumer = self._next_consumer(consumers)
            if consumer is None:
                return
            heapq.heappop(due)
            waiting.discard(msg_id)
            index = self._index(msg_id)
            if index is None or msg_id in acquired:
                continue
            self._hand_over(consumer, msg_id, index)

    def _ripen(self) -> None:
        """Held messages whose time has come are due: no longer held, first in line for consumers."""
        keeper = self._keeper
        held, due, scheduled, acquired = keeper.held, keeper.due, self._scheduled, self._acquired
        now = wall_ms()
        while held and held[0][0] <= now:
            entry = heapq.heappop(held)
            msg_id = entry[1]
            if scheduled.get(msg_id) == entry[0]:
                del scheduled[msg_id]
                if acquired.get(msg_id) is HELD:
                    del acquired[msg_id]
                keeper.due_ids.add(msg_id)
                heapq.heappush(due, entry)

    def _arm(self) -> None:
        """One timer, for the earliest time held (at most ``MAX_WAIT`` away)."""
        keeper = self._keeper
        if not keeper.held or self.timers is None:
            return
        now = wall_ms()
        at = min(keeper.held[0][0], now + int(MAX_WAIT * 1000))
        if keeper.timer is not None:
            if keeper.timer_at <= at:
                return
            keeper.timer.cancel()
        keeper.timer_at = at
        keeper.timer = self.timers(max(0.0, (at - now) / 1000.0), self._on_timer)

    def _on_timer(self) -> None:
        keeper = self._keeper
        if keeper is None:
            return  # stopped meanwhile
        keeper.timer = None
        self._ripen()
        self._arm()
        self.dispatch()

    def purge(self) -> int:
        held = [msg_id for msg_id in self._scheduled]
        for msg_id in held:
            self.dequeue(msg_id, "purged")
        return len(held) + int(super().purge())  # type: ignore[misc]

    def due_order(self) -> list[int]:
        """The ids due then held, in the order they go out (due time, then arrival): tests."""
        keeper = self._keeper
        due = sorted(entry for entry in keeper.due if entry[1] in keeper.due_ids)
        return [msg_id for _, msg_id in due + sorted((when, msg_id) for msg_id, when in self._scheduled.items())]


_VARIANTS: dict[type, type] = {}


def scheduling_class(kind: type) -> type:
    """``kind``'s scheduling variant (made once per kind: ``SchedulingQueue`` for ``Queue``)."""
    if issubclass(kind, Scheduling):
        return kind
    found = _VARIANTS.get(kind)
    if found is None:
        found = type("Scheduling" + kind.__name__, (Scheduling, kind), {"plain_kind": kind})
        _VARIANTS[kind] = found
    return found


def start_scheduling(queue: Holder, data: bytes | None = None) -> bool:
    """Make ``queue`` hold messages with a delivery time (``Queue.start_scheduling``); with ``data``, only if
    that message has a time still to come."""
    if queue._keeper is not None:
        return True
    if refusal(queue) is not None:
        return False
    if data is not None and (sections.due_time(data) or 0) <= wall_ms():
        return False
    queue.__class__ = scheduling_class(type(queue))
    queue._keeper = ScheduleKeeper()
    queue.add_observer(queue._keeper)
    return True


def stop_scheduling(queue: Holder) -> None:
    """Nothing is held: ``queue`` goes back to its plain kind, without the keeper."""
    keeper = queue._keeper
    if keeper is None or not keeper.idle(queue):
        return
    if keeper.timer is not None:
        keeper.timer.cancel()
    queue._keeper = None
    queue.remove_observer(keeper)
    queue.__class__ = type(queue).plain_kind  # type: ignore[attr-defined]
