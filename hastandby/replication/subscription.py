"""Primary side of a replicating browser: one per (replicated queue, backup).

It is a browser that also sees acquired-but-unacknowledged messages (so an
in-flight delivery survives failover, Qpid's test_backup_acquired), does not
count as a consumer, and on attach runs the catch-up handshake:

- the backup sent the ids it holds and its queue's lineage (``lineage.py``);
  ids only mean the same message below the point where its lineage and the
  primary's diverge, and the backup drops everything from that point on
  itself when it sees the primary's lineage in the attach reply;
- below it, ids the primary no longer has go back at once as a dequeue
  batch (``backup - primary``), and ids both hold are skipped when the browse
  reaches them (``backup & primary``), so a backup re-attaching after
  failover downloads only what it lacks.

A deduplicating queue's remembered message-ids (``x-dedup-window``) go to
the backup as ``u`` control deliveries (``codec.encode_message_ids``): all
of them when the backup subscribes, then each new one after the batch that
carried its message.

A message's *delivery-count* (how often its delivery failed: a delivery
limit counts on it) goes to the backup too, as a ``c`` control delivery
(``codec.encode_counts``) after the batch that carried the message: when the
count changes for a message the browse has passed, when the browse reaches
a message that has one (the backup may hold the message already, with an
older count).

Messages go in batches (batching.py).  The guard (pre-made by the primary
for expected backups and new queues; none for asynchronous DR replication)
holds each new message's producer acknowledgement until the backup settles
its batch ``accepted``.  The subscription is *ready* once the backup
has every message that may already have been acknowledged to a producer:
the browse has gone past the guard's first id, and nothing older is still
unaccepted (Qpid's ReplicatingSubscription readiness rule).
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import islice
from typing import Callable, Sequence

import structlog
from proton import Link

from hastandby.broker.queues.arrivals import ArrivalFeed, Arrivals
from hastandby.broker.transport.driver import Driver, Timer
from hastandby.broker.links import pn_link_credit, send_settled
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Registry

from hastandby.replication.batching import BatchingLink
from hastandby.replication.guard import QueueGuard
from hastandby.broker.queues.idset import IdSet
from hastandby.replication.codec import COUNTS_TAG, DEQUEUE_TAG, MESSAGE_IDS_TAG, encode_counts, encode_dequeues, encode_message_ids

log = structlog.get_logger("hastandby.replication")

MESSAGE_IDS_PER_CONTROL = 4096


class ReplicatingSubscription(BatchingLink):
    """Streams one queue's messages (in batches) and dequeues to one backup."""

    # QueueObserver: dequeues and failed deliveries only (the browse brings new messages, the
    # ``ArrivalFeed`` their times; who holds a message changes nothing).
    follows_acquisitions = False

    def __init__(
        self,
        link: Link,
        queue: Queue,
        registry: Registry,
        driver: Driver,
        guard: QueueGuard | None,
        backup_ids: IdSet,
        on_ready: Callable[["ReplicatingSubscription"], None],
        trusted_below: int | None = None,
        owns_guard: bool = True,
        cumulative: bool = False,
        linger: float = 0.0,
    ) -> None:
        super().__init__(link, queue, registry, driver, browsing=True, cumulative=cumulative, linger=linger)
        self.sees_acquired = True
        self.on_ready = on_ready
        # Guard first, then read the queue: nothing can slip in between (QPID-4159).
        # Without a guard (asynchronous DR replication) producers are not held.
        self.guard = guard
        self.owns_guard = owns_guard  # else the guard outlives this link (HA: its RemoteBackup's)
        self.first_id = guard.first_id if guard is not None else queue.next_id
        queue.add_observer(self)
        queue.defer_browse = driver.after_events  # new messages go to backups once per pass of events
        # The backup drops its ids from ``trusted_below`` on (lineage.divergence)
        # before our first batch reaches it: only ids below it name our messages.
        backup_ids = backup_ids.below(trusted_below)
        primary_ids = queue.id_set()
        self.skip = backup_ids & primary_ids
        self.pending_dequeues = backup_ids - primary_ids
        self._dequeued: list[int] = []  # dequeued here since the last dequeue control, in no order
        # Delivery-counts to send after the messages they are about (id -> count).  A queue with
        # counts is browsed message by message, so the browse sees each (``deliver``), skipped or not.
        self.pending_counts: dict[int, int] = {}
        # Message-ids a deduplicating queue remembers (key -> (ms, durable)), sent as ``u`` controls after the
        # batch being filled: all of them at subscribe time, then each new one.
        self.pending_message_ids: dict[bytes, tuple[int, bool]] = {}
        remembered = getattr(queue, "remembered_entries", None)
        if remembered is not None:
            self.pending_message_ids = {key: (ms, durable) for key, ms, durable in remembered()}
        # What catch-up cost, logged once ready: a restarted backup with a journal should send ~nothing.
        self.catchup = {"backup_held": len(backup_ids), "skipped": len(self.skip), "sent": 0}
        if guard is not None:
            guard.skip_all(self.skip)
        # Every id to skip is below this (the queue's ids at subscribe time), so
        # newer messages need not ask the IdSet (a Python call per message).
        self._skip_below = queue.next_id if self.skip else 0
        # Given to the link (batched or sent) but not yet stored by the backup,
        # with ids below first_id: readiness waits for them.  A counter, not a
        # scan: readiness is checked on every acknowledgement during catch-up,
        # and scanning a large set was half of the primary's CPU there.
        self._old_in_flight = 0
        self.ready = False
        self._control_seq = 0
        self._flush_timer: Timer | None = None
        # Sampled arrival times, for ``lag_seconds``; what is here now (the catch-up) counts from now.
        self.arrivals = Arrivals()
        if queue.depth:
            self.arrivals.add(queue.next_id - 1)
        ArrivalFeed.of(queue).follow(self.arrivals, self._done)

    def start(self) -> None:
        self.queue.add_consumer(self)
        self._flush_dequeues()
        self._check_ready()

    # -- sending ------------------------------------------------------------------

    def deliver(self, queue: Queue, msg_id: int, data: bytes, delivery_count: int) -> None:
        if msg_id < self._skip_below and msg_id in self.skip:
            self.skip.discard(msg_id)
            if delivery_count:  # the backup has the message, perhaps with an older count
                self._count(msg_id, delivery_count)
            return
        if msg_id < self.first_id:
            self._old_in_flight += 1
            self.catchup["sent"] += 1
        BatchingLink.deliver(self, queue, msg_id, data, delivery_count)
        if delivery_count:  # the queue has counts, so it browses message by message (Queue._dispatch_browser)
            self._count(msg_id, delivery_count)

    def deliver_run(self, queue: Queue, ids: Sequence[int], payloads: list[bytes | None]) -> None:
        """A run of the queue, holes (removed messages) included: skip those and what the backup has."""
        if ids[0] < self._skip_below:
            self._deliver_skipping(queue, ids, payloads)
            return
        if None in payloads:
            self.deliver_each(queue, ids, payloads)
            return
        if ids[0] < self.first_id:
            old = bisect_left(ids, self.first_id)
            self._old_in_flight += old
            self.catchup["sent"] += old
        BatchingLink.deliver_run(self, queue, ids, payloads)

    def _deliver_skipping(self, queue: Queue, ids: Sequence[int], payloads: list[bytes | None]) -> None:
        """Leave out what the backup holds a run of the skip set at a time, deliver the rest one by one.

        Skipped messages take no credit, so one dispatch walks every message the backup holds: a Python
        call per message (a restarted backup holding a million) kept the reactor past the backup's idle
        timeout (2 s), the backup dropped the connection, resubscribed, and never became ready.
        """
        skip = self.skip
        start, end = 0, len(ids)
        while start < end:
            inside, boundary = skip.boundary_after(ids[start])
            stop = end if boundary is None else bisect_left(ids, boundary, start, end)
            if inside:
                skip.discard_range(ids[start], ids[stop - 1])
            else:
                self.deliver_each(queue, ids[start:stop], payloads[start:stop])
            start = stop

    def flow(self) -> None:
        self.count_credit()
        self._flush_dequeues()
        self.queue.dispatch()
        self._check_ready()

    def _flush_dequeues(self) -> None:
        """Send the delivery-counts and the dequeues collected so far, each as one pre-settled control
        delivery, after the batch being filled (the messages they are about go first)."""
        self._flush_timer = None
        if self._dequeued:  # a list while it fills: an IdSet.add per message was three calls per backup
            self.pending_dequeues |= IdSet.from_ids(self._dequeued)
            self._dequeued = []
        if self.closed or not (self.pending_dequeues or self.pending_counts or self.pending_message_ids):
            return
        self.send_batch()  # messages browsed before the dequeues go before them
        while self.pending_message_ids:  # a few thousand ids a delivery: a large set at subscribe time is many
            if pn_link_credit(self._impl) <= 0:
                return  # flow() sends them when the backup grants more
            pending = self.pending_message_ids
            keys = list(islice(pending, MESSAGE_IDS_PER_CONTROL))
            entries = [(key, *pending.pop(key)) for key in keys]
            self._control_seq += 1
            send_settled(self._impl, MESSAGE_IDS_TAG + b"%d" % self._control_seq, encode_message_ids(entries))
            self.count_credit()
        if self.pending_counts:
            if pn_link_credit(self._impl) <= 0:
                return  # flow() sends them when the backup grants more
            counts, self.pending_counts = self.pending_counts, {}
            self._control_seq += 1
            send_settled(self._impl, COUNTS_TAG + b"%d" % self._control_seq, encode_counts(counts))
            self.count_credit()
        if not self.pending_dequeues or pn_link_credit(self._impl) <= 0:
            return  # flow() sends them when the backup grants more
        batch, self.pending_dequeues = self.pending_dequeues, IdSet()
        self._control_seq += 1
        send_settled(self._impl, DEQUEUE_TAG + b"%d" % self._control_seq, encode_dequeues(batch))
        self.count_credit()

    def _count(self, msg_id: int, count: int) -> None:
        self.pending_counts[msg_id] = count
        if self._flush_timer is None:
            self._flush_timer = self.driver.schedule(0.0, self._flush_dequeues)

    # -- the backup's acknowledgements --------------------------------------------------

    def stored(self, ids: list[int]) -> None:
        first = self.first_id
        if ids[0] < first:
            self._old_in_flight -= bisect_left(ids, first)
        if self.guard is not None:
            self.guard.complete_all(ids)
        if not self.ready:
            self._check_ready()

    def _check_ready(self) -> None:
        if self.ready or self.closed:
            return
        if self._old_in_flight:
            return
        if not self.queue.browsed_past(self, self.first_id - 1):
            return
        self.ready = True
        log.info("backup caught up on queue", queue=self.queue.name, **self.catchup)
        self.on_ready(self)

    @property
    def lag(self) -> int:
        """Messages on the queue this backup has not acknowledged yet."""
        if self.closed:
            return 0
        return len(self.awaiting_accept) + self.unacked_count + len(self.batch_ids) + self.queue.count_after(self)

    @property
    def lag_seconds(self) -> float:
        """Seconds since the oldest message on the queue this backup has not acknowledged arrived (0: none)."""
        if self.closed:
            return 0.0
        return self.arrivals.age(self._done)

    def _done(self, msg_id: int) -> bool:
        """The backup holds ``msg_id``, or never needs to (dequeued here before it was sent)."""
        return self._acknowledged_id(msg_id) and self.queue.browsed_past(self, msg_id)

    def _acknowledged_id(self, msg_id: int) -> bool:
        if self.cumulative:
            return not self.unacked or msg_id < self.unacked[0][0]
        return msg_id not in self.awaiting_accept

    # -- QueueObserver: dequeues on the primary go to the backup in batches --------------

    def id_remembered(self, queue: Queue, key: bytes, ms: int, durable: bool) -> None:
        """A deduplicating queue took a message-id: the backup remembers it too (after the message's batch)."""
        self.pending_message_ids[key] = (ms, durable)
        if self._flush_timer is None:
            self._flush_timer = self.driver.schedule(0.0, self._flush_dequeues)

    def delivery_counted(self, queue: Queue, msg_id: int, count: int) -> None:
        """A delivery of ``msg_id`` failed: the backup hears its count now if the browse has passed it
        (sent, or held by the backup already); otherwise the browse brings the count with the message."""
        try:
            passed = queue.browsed_past(self, msg_id)
        except KeyError:  # not browsing yet: the browse will bring it
            return
        if passed:
            self._count(msg_id, count)

    def dequeued(self, queue: Queue, msg_id: int, reason: str) -> None:
        if msg_id < self._skip_below:
            self.skip.discard(msg_id)
        self._dequeued.append(msg_id)
        if self._flush_timer is None:
            self._flush_timer = self.driver.schedule(0.0, self._flush_dequeues)

    # -- end ------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the queue.  Not ``OutgoingLink.close``: a subscription acquired nothing, so it releases
        nothing, and it is no consumer, so its going must not count towards an auto-delete queue's last
        consumer (``Registry.consumers_changed``)."""
        if self.closed:
            return
        self.closed = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        queue = self.queue
        queue.remove_observer(self)
        ArrivalFeed.of(queue).unfollow(self.arrivals)
        if self in queue.browsers:
            queue.remove_consumer(self)
        if self.guard is not None and self.owns_guard:
            self.guard.cancel()
