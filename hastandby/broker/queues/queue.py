"""A queue: messages in replication-id order, acquired by consumers, seen by browsers.

Every message carries a per-queue *replication id* (Qpid QPID-4348): an
increasing number independent of the message's position, which is what names
a message across nodes.  The queue keeps its messages sorted by that id in two
parallel arrays (ids in a compact ``array('q')``, payload bytes in a list), so a
million queued 100-byte messages cost little more than their bytes, and any id
is found by bisection.  A removed message leaves a hole (``None``) that is
compacted away once holes outnumber live messages.

Ids are comparable across nodes only within one lineage (``lineage.py``):
``Queue.lineage`` records which primary assigned which ids.  The core only
keeps it; HA and DR set it and compare it.

HA plugs in through ``observers`` (enqueued / acquired / released / dequeued)
and through the ``Completion`` handed to ``enqueue``: an observer may hold a
producer's acknowledgement back until it releases it.
"""

from __future__ import annotations

import heapq
import time
import uuid as uuidlib
from array import array
from bisect import bisect_left, bisect_right
from itertools import islice, repeat
from operator import lt
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence, TypeVar

from hastandby.broker.queues import scheduled
from hastandby.broker.queues.completion import Completion
from hastandby.broker.errors import ResourceLimitExceeded
from hastandby.broker.queues.idset import IdSet
from hastandby.broker.queues.lineage import Lineage
from hastandby.broker.message.sections import HEADER_PREFIX, NO_SCHEDULE_PREFIXES, SCHEDULE_MARK, header_ttl, may_be_scheduled

Scheduler = Callable[[float, Callable[[], None]], Any]
T = TypeVar("T")


class Consumer(Protocol):
    """What a queue needs of a link that takes (or browses) its messages."""

    credit: int
    browsing: bool
    sees_acquired: bool
    """A replication link's browser: it sees acquired messages too, and the queue hands it runs of them."""

    def deliver(self, queue: "Queue", msg_id: int, data: bytes, delivery_count: int) -> None:
        """Send one message; for an acquiring consumer it is now acquired by it."""

    def deliver_run(self, queue: "Queue", ids: Sequence[int], payloads: list[bytes | None]) -> None:
        """Send a run of consecutive messages (``None``: removed since), for a browser that ``sees_acquired``
        and never redelivers: one call per run instead of one per message."""


class QueueObserver(Protocol):
    """The hooks HA and the journal use to follow a queue (Qpid's QueueObserver).

    An observer whose class says ``follows_acquisitions = False`` (the journal:
    it records what is stored, not who holds it) is not called for ``acquired``
    and ``released``, which come with every delivery to a consumer, and need
    not have them.  An observer without ``enqueued`` or ``dequeued`` (a
    backup's replicating browser, which the browse hands new messages) is not
    called for those: the queue asks once, when the observer comes.
    """

    def enqueued(self, queue: "Queue", msg_id: int, data: bytes, completion: Completion | None) -> None: ...

    def acquired(self, queue: "Queue", msg_id: int) -> None: ...

    def released(self, queue: "Queue", msg_id: int) -> None: ...

    def dequeued(self, queue: "Queue", msg_id: int, reason: str) -> None: ...


class CountObserver(Protocol):
    """An observer that also follows failed deliveries (the journal, replication): a queue calls
    ``delivery_counted`` of each observer that has it when a message's delivery-count changes, so
    a backup, a DR replica and a restarted node know how often it failed (a delivery limit counts on)."""

    def delivery_counted(self, queue: "Queue", msg_id: int, count: int) -> None: ...


MAX_MSG_ID = 2**63 - 2
"""The highest replication id a queue takes: it keeps its ids in an array of signed 64-bit integers,
and its ``next_id`` (one more, also sent in lineages) must fit one too."""


@dataclass
class QueueSettings:
    """A queue's declared properties, validated once at declare time."""

    replicate: str = "none"
    max_count: int | None = None
    max_size: int | None = None
    policy: str = "reject"
    exclusive: bool = False
    auto_delete: bool = False
    auto_delete_timeout: float = 0.0
    alternate_exchange: str | None = None
    durable: bool = False
    priorities: int = 0  # qpid.priorities: levels of a priority queue (0: a plain FIFO queue)
    delivery_limit: int = 0  # x-delivery-limit: failed deliveries before dead-lettering (0: none)
    single_active_consumer: bool = False  # x-single-active-consumer
    dedup_window: int = 0  # x-dedup-window: seconds a message-id is remembered (0: no duplicate detection)
    lvq_key: str | None = None  # qpid.last_value_queue_key: the application property a new message replaces by
    group_header: str | None = None  # qpid.group_header_key: the application property naming a message's group
    shared_groups: bool = False  # qpid.shared_msg_group (as qpid-config sets it with --shared-groups)
    arguments: dict[str, Any] = field(default_factory=dict)


class Queue:
    """Messages of one queue plus who consumes and browses them."""

    timers: Scheduler | None = None
    """The driver's ``schedule`` (the registry sets it): a queue holding scheduled messages keeps one timer,
    for the earliest (``scheduled.py``).  Without it they fall due when the queue next dispatches."""

    def __init__(self, name: str, settings: QueueSettings, object_uuid: str | None = None) -> None:
        self.name = name
        self.settings = settings
        # Asked of every message before ``check_capacity``, which it spares the queues with no limit to refuse by.
        self.refuses_when_full = settings.policy == "reject" and (
            settings.max_count is not None or settings.max_size is not None)
        self.uuid = object_uuid or str(uuidlib.uuid4())
        self.observers: list[Any] = []  # each has some of QueueObserver's hooks
        self._enqueue_observers: list[QueueObserver] = []  # those that have ``enqueued``
        self._dequeue_observers: list[QueueObserver] = []  # ... ``dequeued``
        self._acquisition_observers: list[QueueObserver] = []  # those called for acquired/released too
        self._count_observers: list[CountObserver] = []  # those told of failed deliveries
        self.consumers: list[Consumer] = []
        self.browsers: list[Consumer] = []
        self.deleted = False
        self.ever_consumed = False
        self.next_id = 1
        self._lineage: Lineage = ()
        self.lineage_listeners: list[Callable[["Queue"], None]] = []  # the journal records each change
        self.depth = 0
        self.bytes = 0
        self.stats = {"enqueued": 0, "dequeued": 0, "expired": 0, "ring_dropped": 0, "rejected": 0,
                      "dead_lettered": 0, "deduplicated": 0, "replaced": 0}
        self._ids = array("q")
        self._data: list[bytes | None] = []
        self._holes = 0
        self._head = 0  # every index below it is a hole or acquired
        self._acquired: dict[int, Consumer] = {}
        self._delivery_counts: dict[int, int] = {}
        self._expiry_heap: list[tuple[float, int]] = []
        self._expires: dict[int, float] = {}
        # Scheduled delivery (scheduled.py): messages held back until their time, id -> due (ms since the epoch).
        # They wait in ``_acquired`` (under ``scheduled.HELD``), so no dispatch of any kind takes them early.
        self._scheduled: dict[int, int] = {}
        self._keeper: Any = None  # the ScheduleKeeper observer while the queue holds scheduled messages
        self._browse_pos: dict[int, tuple[int, int]] = {}  # id(browser) -> (last id, index hint)
        self._rr = 0
        self._dispatching = False
        # When set (a primary's replicated queue: the driver's ``after_events``),
        # new messages reach browsers in one dispatch per pass of the event
        # loop instead of one per message: 0.96 -> 0.54 us per message and
        # browser.  With a consumer, everything is dispatched at once as before.
        self.defer_browse: Callable[[Callable[[], None]], None] | None = None
        self._browse_deferred = False

    @property
    def lineage(self) -> Lineage:
        """Which primaries gave out this queue's ids (``lineage.py``); HA and DR set it."""
        return self._lineage

    @lineage.setter
    def lineage(self, value: Lineage) -> None:
        if value != self._lineage:
            self._lineage = value
            for listener in self.lineage_listeners:
                listener(self)

    # -- observers -------------------------------------------------------

    def observer_of(self, kind: type[T]) -> T | None:
        """This queue's observer of class ``kind``, if it has one (one shared by several parties:
        ``QueueGuards``, ``ArrivalFeed``)."""
        for observer in self.observers:
            if isinstance(observer, kind):
                return observer
        return None

    def add_observer(self, observer: object) -> None:
        """Follow this queue.  Safe from inside an observer callback: the lists are rebound."""
        self.observers = [*self.observers, observer]
        self._sort_observers()

    def remove_observer(self, observer: object) -> None:
        self.observers = [o for o in self.observers if o is not observer]
        self._sort_observers()

    def _sort_observers(self) -> None:
        """Which observers each hook calls."""
        self._enqueue_observers = [o for o in self.observers if hasattr(o, "enqueued")]
        self._dequeue_observers = [o for o in self.observers if hasattr(o, "dequeued")]
        self._acquisition_observers = [o for o in self.observers if getattr(o, "follows_acquisitions", True)]
        self._count_observers = [o for o in self.observers if hasattr(o, "delivery_counted")]

    # -- producing -------------------------------------------------------

    def check_capacity(self, size: int) -> None:
        """Raise ResourceLimitExceeded if a reject-policy limit refuses ``size`` more bytes."""
        s = self.settings
        if s.policy != "reject":
            return
        if s.max_count is not None and self.depth + 1 > s.max_count:
            self.stats["rejected"] += 1
            raise ResourceLimitExceeded(f"queue {self.name!r} is full: max-count {s.max_count} reached")
        if s.max_size is not None and self.bytes + size > s.max_size:
            self.stats["rejected"] += 1
            raise ResourceLimitExceeded(f"queue {self.name!r} is full: max-size {s.max_size} bytes reached")

    def enqueue(
        self,
        data: bytes,
        completion: Completion | None = None,
        ttl_ms: int | None = None,
        msg_id: int | None = None,
    ) -> int:
        """Append a message and return its replication id.

        ``msg_id`` is given only by a replica, which takes the primary's ids;
        a message whose id is already present is a duplicate and is dropped.
        A replica does not apply its ring policy itself: the primary's ring
        drops reach it as dequeues, and only the primary knows which messages
        are acquired (its ring skips those, a replica would drop them).
        """
        replica = msg_id is not None
        if msg_id is None:
            msg_id = self.next_id
            self.next_id = msg_id + 1
        elif not 1 <= msg_id <= MAX_MSG_ID:  # before next_id moves: ids and next_id are signed 64-bit
            raise ValueError(f"message id {msg_id} is out of range (1..{MAX_MSG_ID})")
        elif msg_id >= self.next_id:
            self.next_id = msg_id + 1
        if self.settings.policy == "ring" and not replica:
            self._make_room(len(data))
        elif replica and self._keeper is None and not data.startswith(NO_SCHEDULE_PREFIXES) and may_be_scheduled(data):
            self.start_scheduling(data)  # a replica's message with a time to come: held here too (scheduled.py)
        ids = self._ids
        if not ids or msg_id > ids[-1]:
            ids.append(msg_id)
            self._data.append(data)
        else:
            index = bisect_left(ids, msg_id)
            if index < len(ids) and ids[index] == msg_id:
                if self._data[index] is not None:
                    return msg_id
                self._data[index] = data
                self._holes -= 1
            else:
                ids.insert(index, msg_id)
                self._data.insert(index, data)
            if index < self._head:
                self._head = index
        self.depth += 1
        self.bytes += len(data)
        self.stats["enqueued"] += 1
        if ttl_ms:
            deadline = time.monotonic() + ttl_ms / 1000.0
            self._expires[msg_id] = deadline
            heapq.heappush(self._expiry_heap, (deadline, msg_id))
        for observer in self._enqueue_observers:
            observer.enqueued(self, msg_id, data, completion)
        self._arrived()
        return msg_id

    def enqueue_replicated(self, ids: Sequence[int], payloads: list[bytes], completion: Completion | None) -> None:
        """A replica's batch from its primary: ``enqueue`` each message under its id.

        A batch that follows the queue's last message, in increasing order, on a
        queue of the plain kind, with no message that has a ttl or may have a
        delivery time (proton's usual header, no message annotations: one
        ``bytes.startswith`` in C each) is appended in one step, as a backup that
        keeps up receives it; an ``enqueue`` call each was most of its work.
        """
        held = self._ids
        count = len(ids)
        if not (count and type(self).enqueue is Queue.enqueue and self._keeper is None
                and (not held or ids[0] > held[-1]) and ids[0] >= 1 and ids[-1] <= MAX_MSG_ID
                and all(map(lt, ids, islice(ids, 1, None)))
                and all(map(bytes.startswith, payloads, repeat(NO_SCHEDULE_PREFIXES)))):
            for msg_id, payload in zip(ids, payloads):
                ttl = header_ttl(payload) if payload.startswith(HEADER_PREFIX) else None
                self.enqueue(payload, completion, ttl, msg_id=msg_id)
            return
        held.fromlist(list(ids))
        self._data.extend(payloads)
        if ids[-1] >= self.next_id:
            self.next_id = ids[-1] + 1
        self.depth += count
        self.bytes += sum(map(len, payloads))
        self.stats["enqueued"] += count
        for observer in self._enqueue_observers:
            for msg_id, payload in zip(ids, payloads):
                observer.enqueued(self, msg_id, payload, completion)
        self._arrived()

    def enqueue_run(self, payloads: list[bytes]) -> None:
        """``enqueue`` for many messages with no completion or TTL, under new ids, in one step.

        A DR tap takes a source queue's new messages this way, a run every few
        milliseconds: a full ``enqueue`` each was a tenth of the source's CPU.  A run
        that would push a ring queue past its limit goes one by one, so the
        ring drops exactly what it would have.
        """
        count, size = len(payloads), sum(map(len, payloads))
        s = self.settings
        if s.policy == "ring" and (
            (s.max_count is not None and self.depth + count > s.max_count)
            or (s.max_size is not None and self.bytes + size > s.max_size)
        ):
            for payload in payloads:
                self.enqueue(payload)
            return
        first = self.next_id
        self.next_id = first + count
        self._ids.fromlist(list(range(first, first + count)))  # twice as fast as extend(range)
        self._data.extend(payloads)
        self.depth += count
        self.bytes += size
        self.stats["enqueued"] += count
        for observer in self._enqueue_observers:
            for msg_id, payload in zip(range(first, first + count), payloads):
                observer.enqueued(self, msg_id, payload, None)
        self._arrived()

    def restore(self, ids: list[int], payloads: list[bytes], ttls: dict[int, int] | None = None,
                counts: dict[int, int] | None = None) -> None:
        """Fill an empty queue with messages read back from disk, in increasing id order, in one step.

        The journal's recovery gives a restarted node its messages this way: an
        ``enqueue`` each was a fifth of a million-message recovery.  ``ttls``
        (id -> milliseconds) come from the journal's records, so no header is
        read here; a ttl counts from now.  ``counts`` (id -> delivery-count)
        are the failed deliveries journaled.  Nobody observes the queue yet.
        """
        if self._ids:
            raise ValueError(f"queue {self.name!r} is not empty: nothing to restore into")
        if not ids:
            return
        self._ids.fromlist(ids)
        self._data.extend(payloads)
        self.next_id = max(self.next_id, ids[-1] + 1)
        self.depth += len(ids)
        self.bytes += sum(map(len, payloads))
        self.stats["enqueued"] += len(ids)
        now = time.monotonic()
        for msg_id, ttl_ms in (ttls or {}).items():
            deadline = now + ttl_ms / 1000.0
            self._expires[msg_id] = deadline
            heapq.heappush(self._expiry_heap, (deadline, msg_id))
        if counts:
            self._delivery_counts.update(counts)
        for at in [at for at, payload in enumerate(payloads) if SCHEDULE_MARK in payload]:
            if self.start_scheduling(payloads[at]):  # a journaled message with a time still to come: held again
                self._keeper.hold(self, ids[at], payloads[at])
        self._arrived()

    def start_scheduling(self, data: bytes | None = None) -> bool:
        """Hold this queue's messages with a delivery time until then (``scheduled.py``): from now on the
        queue's class is its kind's scheduling variant; it goes back once nothing is held.  False for a
        kind that does not hold messages back (a last-value or grouped queue: docs/queues.md), or when
        ``data`` (a message) has no time still to come."""
        return scheduled.start_scheduling(self, data)

    def scheduled_count(self) -> int:
        """Messages held back until their delivery time (due ones are no longer held: consumers take them first)."""
        return len(self._scheduled)

    def deadlines(self) -> dict[int, float]:
        """A copy of the expiry deadlines (monotonic seconds) of the messages that have a ttl."""
        return dict(self._expires)

    def _arrived(self) -> None:
        """New messages: consumers get them now; browsers now, or, where the queue defers them
        (``defer_browse``: a replicated queue), once this pass of events is done, consumers or not.

        A backup's browser then takes a pass's messages as one run, one batch: while consumers took
        messages as they came, it took them one dispatch and one run each, and a primary with two
        backups spent 6 us more per message sent and consumed together than a standalone node.
        """
        if self.browsers and self.defer_browse is not None and not self._browse_deferred:
            self._browse_deferred = True
            self.defer_browse(self._dispatch_deferred)
        if self.consumers or (self.browsers and not self._browse_deferred):
            self.dispatch()

    def _dispatch_deferred(self) -> None:
        """The deferred browse: every message enqueued since reaches the browsers now."""
        self._browse_deferred = False
        self.dispatch()

    def _make_room(self, size: int) -> None:
        """Ring policy: drop the oldest available messages until ``size`` more fits."""
        s = self.settings
        while self.depth and (
            (s.max_count is not None and self.depth + 1 > s.max_count)
            or (s.max_size is not None and self.bytes + size > s.max_size)
        ):
            # Below ``_head`` all is removed or acquired: no scan of the holes
            # from 0 on every drop (that made a full ring's overflow quadratic).
            index = self._first_available(self._head)
            if index is None:
                return
            self._head = index + 1  # set before the removal, which may compact
            self._remove(index, "ring")
            self.stats["ring_dropped"] += 1

    # -- consuming ---------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        if consumer.browsing:
            self.browsers.append(consumer)
            self._browse_pos[id(consumer)] = (0, 0)
        else:
            self.consumers.append(consumer)
            self.ever_consumed = True
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer.browsing:
            self.browsers.remove(consumer)
            self._browse_pos.pop(id(consumer), None)
        else:
            self.consumers.remove(consumer)

    def dispatch(self) -> None:
        """Give available messages to consumers with credit, and new ones to browsers (unless their
        dispatch is deferred to the end of this pass: ``_arrived``)."""
        if self._dispatching or self.deleted:
            return
        self._dispatching = True
        try:
            if self.consumers:
                self._dispatch_consumers(self.consumers)
            if not self._browse_deferred:
                for browser in self.browsers:
                    if browser.credit > 0:
                        self._dispatch_browser(browser)
        finally:
            self._dispatching = False

    def _dispatch_consumers(self, consumers: list[Consumer]) -> None:
        """Available messages, in id order, to ``consumers`` with credit, in turn (the queue's consumers;
        a single-active-consumer queue passes only its first)."""
        while consumers:
            index = self._first_available(self._head)
            if index is None:
                return
            count = len(consumers)
            for step in range(count):
                consumer = consumers[(self._rr + step) % count]
                if consumer.credit > 0:
                    self._rr = (self._rr + step + 1) % count
                    break
            else:
                return
            self._head = index + 1
            msg_id = self._ids[index]
            if self._expires and self._expired(msg_id):
                self._remove(index, "expired")
                self.stats["expired"] += 1
                continue
            self._acquired[msg_id] = consumer
            for observer in self._acquisition_observers:
                observer.acquired(self, msg_id)
            consumer.deliver(self, msg_id, self._data[index], self._delivery_counts.get(msg_id, 0))

    # The plain queue's loop above inlines these two, one call fewer per message; the kinds that order
    # messages otherwise (queue_kinds.py, scheduled.py) share them.

    def _next_consumer(self, consumers: list[Consumer]) -> Consumer | None:
        """The next of ``consumers`` with credit, in turn."""
        count = len(consumers)
        for step in range(count):
            consumer = consumers[(self._rr + step) % count]
            if consumer.credit > 0:
                self._rr = (self._rr + step + 1) % count
                return consumer
        return None

    def _hand_over(self, consumer: Consumer, msg_id: int, index: int) -> None:
        """Message ``msg_id`` (at ``index``, not acquired) to ``consumer``, or dropped if its TTL has run out."""
        if self._expires and self._expired(msg_id):
            self._remove(index, "expired")
            self.stats["expired"] += 1
            return
        self._acquired[msg_id] = consumer
        for observer in self._acquisition_observers:
            observer.acquired(self, msg_id)
        payload = self._data[index]
        assert payload is not None  # callers pass messages still here
        consumer.deliver(self, msg_id, payload, self._delivery_counts.get(msg_id, 0))

    def _dispatch_browser(self, browser: Consumer) -> None:
        key = id(browser)
        last_id, hint = self._browse_pos[key]
        ids = self._ids
        data = self._data
        if not (0 < hint <= len(ids) and ids[hint - 1] == last_id):
            hint = bisect_right(ids, last_id)
        index = hint
        end = len(ids)
        acquired = self._acquired
        counts = self._delivery_counts
        # A browser that sees every message takes runs of them in one call
        # (a batching replication link: a call per message was most of its cost).
        deliver_run = browser.deliver_run if browser.sees_acquired and not counts else None
        while index < end and browser.credit > 0:
            if deliver_run is not None:
                stop = min(end, index + browser.credit)
                deliver_run(self, ids[index:stop], data[index:stop])
                last_id = ids[stop - 1]
                index = stop
                continue
            payload = data[index]
            msg_id = ids[index]
            index += 1
            if payload is None or (not browser.sees_acquired and msg_id in acquired):
                continue
            last_id = msg_id
            browser.deliver(self, msg_id, payload, counts.get(msg_id, 0) if counts else 0)
            if self._ids is not ids:  # compacted while delivering
                break
        if self._ids is ids:
            self._browse_pos[key] = (last_id, index)
        else:
            self._browse_pos[key] = (last_id, 0)

    def browsed_past(self, browser: Consumer, msg_id: int) -> bool:
        """Has ``browser`` gone past every message still here with an id up to ``msg_id``?"""
        last_id, _ = self._browse_pos[id(browser)]
        if last_id >= msg_id:
            return True
        ids, data = self._ids, self._data
        index = bisect_right(ids, last_id)
        while index < len(ids) and data[index] is None:
            index += 1
        return index >= len(ids) or ids[index] > msg_id

    def count_after(self, browser: Consumer) -> int:
        """Messages still here that ``browser`` has not reached yet."""
        last_id, _ = self._browse_pos[id(browser)]
        index = bisect_right(self._ids, last_id)
        return sum(1 for payload in self._data[index:] if payload is not None)

    def _first_available(self, start: int) -> int | None:
        data = self._data
        ids = self._ids
        acquired = self._acquired
        end = len(data)
        index = start
        while index < end:
            if data[index] is not None and (not acquired or ids[index] not in acquired):
                return index
            index += 1
        return None

    # -- settling ------------------------------------------------------------

    def acknowledge(self, msg_id: int) -> None:
        """The consumer accepted an acquired message: it leaves the queue."""
        index = self._index(msg_id)  # ``dequeue`` inlined: a consumer acknowledges every message
        if index is not None:
            self._remove(index, "consumed")  # which lets go of the acquisition too
        else:
            self._acquired.pop(msg_id, None)

    def acknowledge_many(self, ids: Sequence[int]) -> None:
        """``acknowledge`` for ascending ``ids`` (acquired, or browsed by a DR tap's link):
        a run that is a stretch of the queue goes in one step."""
        if not ids:
            return
        acquired = self._acquired
        if acquired:
            for msg_id in ids:
                acquired.pop(msg_id, None)
        all_ids, data, count = self._ids, self._data, len(ids)
        lo = bisect_left(all_ids, ids[0])
        hi = lo + count
        size = None
        if not (hi > len(all_ids) or all_ids[lo] != ids[0] or all_ids[hi - 1] != ids[-1]
                or self._expires or self._delivery_counts):
            try:
                size = sum(map(len, data[lo:hi]))
            except TypeError:  # a hole (None) in the stretch
                pass
        if size is None:
            for msg_id in ids:
                self.dequeue(msg_id, "consumed")
            return
        # Both id sequences strictly increase: equal ends and length make them equal.
        data[lo:hi] = [None] * count
        self._holes += count
        self.depth -= count
        self.bytes -= size
        self.stats["dequeued"] += count
        for observer in self._dequeue_observers:
            for msg_id in ids:
                observer.dequeued(self, msg_id, "consumed")
        if self._holes > 1024 and self._holes > self.depth:
            self._compact()

    def release(self, msg_id: int, delivery_failed: bool) -> None:
        """Put an acquired message back at its place; count a failed delivery."""
        if self._acquired.pop(msg_id, None) is None:
            return
        if delivery_failed:
            count = self._delivery_counts[msg_id] = self._delivery_counts.get(msg_id, 0) + 1
            for observer in self._count_observers:
                observer.delivery_counted(self, msg_id, count)
        index = self._index(msg_id)
        if index is None:
            return
        if index < self._head:
            self._head = index
        for observer in self._acquisition_observers:
            observer.released(self, msg_id)
        self.dispatch()

    def delivery_count(self, msg_id: int) -> int:
        """How often delivering the message failed (its delivery-count)."""
        return self._delivery_counts.get(msg_id, 0)

    def delivery_counts(self) -> dict[int, int]:
        """A copy of the delivery-counts of the messages that have one (id -> count)."""
        return dict(self._delivery_counts)

    def set_delivery_count(self, msg_id: int, count: int) -> None:
        """A replica takes its primary's (or the journal's) delivery-count of a message it holds."""
        if self._index(msg_id) is None or count <= 0 or self._delivery_counts.get(msg_id) == count:
            return
        self._delivery_counts[msg_id] = count
        for observer in self._count_observers:
            observer.delivery_counted(self, msg_id, count)

    def dequeue(self, msg_id: int, reason: str) -> bytes | None:
        """Remove a message by id (ack, expiry, replication); returns its bytes."""
        index = self._index(msg_id)
        if index is None:
            return None
        return self._remove(index, reason)

    def get(self, msg_id: int) -> bytes | None:
        index = self._index(msg_id)
        return None if index is None else self._data[index]

    def holds(self, msg_id: int) -> bool:
        """Is message ``msg_id`` on the queue (acquired or not)?"""
        return self._index(msg_id) is not None

    def _index(self, msg_id: int) -> int | None:
        ids = self._ids
        index = bisect_left(ids, msg_id)
        if index < len(ids) and ids[index] == msg_id and self._data[index] is not None:
            return index
        return None

    def _remove(self, index: int, reason: str) -> bytes:
        msg_id = self._ids[index]
        payload = self._data[index]
        assert payload is not None
        self._data[index] = None
        self._holes += 1
        self.depth -= 1
        self.bytes -= len(payload)
        self.stats["dequeued"] += 1
        self._acquired.pop(msg_id, None)
        if self._delivery_counts:
            self._delivery_counts.pop(msg_id, None)
        if self._expires:
            self._expires.pop(msg_id, None)
        for observer in self._dequeue_observers:
            observer.dequeued(self, msg_id, reason)
        if self._holes > 1024 and self._holes > self.depth:
            self._compact()
        return payload

    def _compact(self) -> None:
        data, holes = self._data, self._holes
        # New arrays, never edited in place: a loop holding the old ones sees the change.
        if data[:holes].count(None) == holes:  # consumed in order: the holes are one prefix, cut in C
            self._ids = self._ids[holes:]
            self._data = data[holes:]
            self._holes = 0
            self._head = max(0, self._head - holes)
            return
        head_id = self._ids[self._head] if self._head < len(self._ids) else None
        keep = [i for i, payload in enumerate(data) if payload is not None]
        self._ids = array("q", (self._ids[i] for i in keep))
        self._data = [self._data[i] for i in keep]
        self._holes = 0
        self._head = len(self._ids) if head_id is None else bisect_left(self._ids, head_id)

    # -- expiry and housekeeping ----------------------------------------------

    def _expired(self, msg_id: int, now: float | None = None) -> bool:
        deadline = self._expires.get(msg_id)
        return deadline is not None and deadline <= (now if now is not None else time.monotonic())

    def expire(self, now: float | None = None) -> int:
        """Remove messages whose TTL has passed (acquired ones wait for release; a held one goes: it is
        nobody's, ``scheduled.py``)."""
        now = time.monotonic() if now is None else now
        heap = self._expiry_heap
        removed = 0
        while heap and heap[0][0] <= now:
            _, msg_id = heapq.heappop(heap)
            if msg_id not in self._expires or (msg_id in self._acquired and msg_id not in self._scheduled):
                continue
            if self.dequeue(msg_id, "expired") is not None:
                self.stats["expired"] += 1
                removed += 1
        return removed

    def dequeue_ranges(self, ranges: Iterable[tuple[int, int]], reason: str) -> int:
        """Remove the messages whose ids fall in the closed ``ranges``; how many.

        The work follows the messages held, not the width of the ranges: a peer
        that sends the range [1, 2**62] costs a bisection, not 2**62 steps.
        """
        removed = 0
        for lo, hi in ranges:
            ids, data = self._ids, self._data
            index, end = bisect_left(ids, lo), bisect_right(ids, hi)
            doomed = [ids[i] for i in range(index, end) if data[i] is not None]
            for msg_id in doomed:
                if self.dequeue(msg_id, reason) is not None:
                    removed += 1
        return removed

    def drop_from(self, first_id: int) -> int:
        """Remove every message with an id of ``first_id`` or more (a replica's diverged tail); how many."""
        start = bisect_left(self._ids, first_id)
        doomed = [msg_id for msg_id, payload in zip(self._ids[start:], self._data[start:]) if payload is not None]
        for msg_id in doomed:
            self.dequeue(msg_id, "diverged")
        return len(doomed)

    def purge(self) -> int:
        """Remove every available (not acquired) message."""
        available = [i for i, p in zip(self._ids, self._data) if p is not None and i not in self._acquired]
        for msg_id in available:
            self.dequeue(msg_id, "purged")
        return len(available)

    def ids(self) -> list[int]:
        """Replication ids of the messages on the queue, in order."""
        return [i for i, p in zip(self._ids, self._data) if p is not None]

    def id_set(self) -> IdSet:
        """The replication ids of the messages on the queue, as runs.

        What a backup offers and a primary compares on every (re)subscribe: for
        a restarted backup's million messages, building the set from a list
        of every id was most of the catch-up after its journal's recovery.
        Without holes the id array itself is the increasing sequence to read.
        """
        return IdSet.from_increasing(self.ids() if self._holes else self._ids)

    def page(self, after: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` messages with ids above ``after``, in id order (a bounded read of a long queue)."""
        ids, data = self._ids, self._data
        index, end = bisect_right(ids, after), len(ids)
        found: list[tuple[int, bytes]] = []
        while index < end and len(found) < limit:
            payload = data[index]
            if payload is not None:
                found.append((ids[index], payload))
            index += 1
        return found

    def messages(self) -> list[tuple[int, bytes]]:
        return [(i, p) for i, p in zip(self._ids, self._data) if p is not None]

    @property
    def acquired_count(self) -> int:
        return len(self._acquired) - len(self._scheduled)

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {
            "name": self.name,
            "uuid": self.uuid,
            "depth": self.depth,
            "bytes": self.bytes,
            "acquired": len(self._acquired) - len(self._scheduled),
            "scheduled": len(self._scheduled),
            "consumers": len(self.consumers),
            "browsers": len(self.browsers),
            "replicate": s.replicate,
            "durable": s.durable,
            "exclusive": s.exclusive,
            "auto_delete": s.auto_delete,
            "alternate_exchange": s.alternate_exchange,
            "arguments": dict(s.arguments),
            "stats": dict(self.stats),
            "next_id": self.next_id,
        }
