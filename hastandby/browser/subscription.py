"""Primary side of a replicating browser: one per (replicated queue, backup).

It is a browser that also sees acquired-but-unacknowledged messages (so an
in-flight delivery survives failover, Qpid's test_backup_acquired), does not
count as a consumer, and on attach runs the catch-up handshake:

- the backup sent the ids it holds; ids the primary no longer has go back at
  once as a dequeue batch (``backup - primary``);
- ids both hold are skipped when the browse reaches them (``backup & primary``),
  so a backup re-attaching after failover downloads only what it lacks.

The guard (pre-made by the primary for expected backups and new queues;
none for asynchronous DR replication) holds each new message's producer
acknowledgement until the backup settles it ``accepted``.  The subscription is *ready* once the backup
has every message that may already have been acknowledged to a producer:
the browse has gone past the guard's first id, and nothing older is still
unaccepted (Qpid's ReplicatingSubscription readiness rule).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from cproton import lib
from proton import Link

from hastandby.broker.driver import Driver, Timer
from hastandby.broker.links import OutgoingLink, send_payload
from hastandby.broker.queue import Queue
from hastandby.broker.registry import Registry

from .guard import QueueGuard
from .idset import IdSet
from .protocol import DEQUEUE_TAG, encode_dequeues

# Bound once: ``lib.name`` is a lookup on every use, and these run per message.
_pn_delivery_settled = lib.pn_delivery_settled
_pn_delivery_remote_state = lib.pn_delivery_remote_state
_pn_delivery_settle = lib.pn_delivery_settle


class ReplicatingSubscription(OutgoingLink):
    """Streams one queue's messages and dequeues to one backup."""

    def __init__(
        self,
        link: Link,
        queue: Queue,
        registry: Registry,
        driver: Driver,
        guard: QueueGuard | None,
        backup_ids: IdSet,
        on_ready: Callable[["ReplicatingSubscription"], None],
        foreign_ids: bool = False,
        cumulative: bool = False,
    ) -> None:
        super().__init__(link, queue, registry, browsing=True)
        self.sees_acquired = True
        self.driver = driver
        self.on_ready = on_ready
        # Guard first, then read the queue: nothing can slip in between (QPID-4159).
        # Without a guard (asynchronous DR replication) producers are not held.
        self.guard = guard
        self.first_id = guard.first_id if guard is not None else queue.next_id
        queue.add_observer(self)
        queue.defer_browse = driver.after_events  # new messages go to backups once per pass of events
        if foreign_ids:  # the ids name another incarnation's messages: replace them all
            self.skip = IdSet()
            self.pending_dequeues = backup_ids
        else:
            primary_ids = IdSet.from_ids(queue.ids())
            self.skip = backup_ids & primary_ids
            self.pending_dequeues = backup_ids - primary_ids
        if guard is not None:
            for msg_id in self.skip:
                guard.skip(msg_id)
        # Every id to skip is below this (the queue's ids at subscribe time), so
        # newer messages need not ask the IdSet (a Python call per message).
        self._skip_below = queue.next_id if self.skip else 0
        self.in_flight: set[int] = set()
        # Cumulative acknowledgements (protocol.py): sent pre-settled, in id order,
        # acknowledged by the highest id stored.
        self.cumulative = cumulative
        self._unacked: deque[int] = deque()
        # The id of each message delivery still unsettled, by its C delivery
        # (which hashes by address): an accept names its message without
        # decoding the delivery tag.
        self._sent_ids: dict[Any, int] = {}
        self._accepted: list[Any] = []  # acknowledged deliveries not settled yet
        self._settle_pending = False
        self._old_in_flight = 0  # in flight with ids below first_id: readiness waits for them
        self.ready = False
        self._control_seq = 0
        self._flush_timer: Timer | None = None

    def start(self) -> None:
        self.queue.add_consumer(self)
        self._flush_dequeues()
        self._check_ready()

    # -- sending ------------------------------------------------------------------

    def deliver(self, queue: Queue, msg_id: int, data: bytes, delivery_count: int) -> None:
        if msg_id < self._skip_below and msg_id in self.skip:
            self.skip.discard(msg_id)
            return
        if self.cumulative:
            _pn_delivery_settle(send_payload(self._impl, b"%d" % msg_id, data))
            self._unacked.append(msg_id)
        else:
            self._sent_ids[send_payload(self._impl, b"%d" % msg_id, data)] = msg_id
            self.in_flight.add(msg_id)
        self.credit -= 1
        if msg_id < self.first_id:
            self._old_in_flight += 1

    def acknowledged(self, through: int) -> None:
        """The backup stored every message up to ``through`` (a cumulative acknowledgement)."""
        unacked, guard, first = self._unacked, self.guard, self.first_id
        while unacked and unacked[0] <= through:
            msg_id = unacked.popleft()
            if msg_id < first:
                self._old_in_flight -= 1
            if guard is not None:
                guard.complete(msg_id)
        if not self.ready:
            self._check_ready()

    def flow(self) -> None:
        self.credit = lib.pn_link_credit(self._impl)
        self._flush_dequeues()
        self.queue.dispatch()
        self._check_ready()

    def _send_control(self, data: bytes) -> None:
        impl = self._impl
        self._control_seq += 1
        delivery = send_payload(impl, DEQUEUE_TAG + b"%d" % self._control_seq, data)
        lib.pn_delivery_settle(delivery)  # pre-settled: its accept completes nothing
        self.credit -= 1

    def _flush_dequeues(self) -> None:
        self._flush_timer = None
        if self.closed or not self.pending_dequeues or self.credit <= 0:
            return
        batch, self.pending_dequeues = self.pending_dequeues, IdSet()
        self._send_control(encode_dequeues(batch))

    # -- the backup's acknowledgements --------------------------------------------------

    def on_delivery(self, delivery: Any) -> None:
        if not _pn_delivery_settled(delivery) and not _pn_delivery_remote_state(delivery):
            return
        msg_id = self._sent_ids.pop(delivery, None)
        if msg_id is None:
            return  # a pre-settled dequeue batch, or a message already acknowledged
        # Settled later, together (see _settle_accepted); inlined: once per message.
        self._accepted.append(delivery)
        if not self._settle_pending:
            self._settle_pending = True
            self.driver.after_events(self._settle_accepted)
        self.in_flight.discard(msg_id)
        if msg_id < self.first_id:
            self._old_in_flight -= 1
        if self.guard is not None:
            self.guard.complete(msg_id)
        if not self.ready:
            self._check_ready()

    def _settle_accepted(self) -> None:
        """Settle acknowledged deliveries together, after this pass of engine events.

        Each settle makes the engine raise a transport event for the backup's
        connection, and the producer's accept one for the producer's: settled
        one by one they alternate, are never merged, and were two of the four
        engine events per replicated message.  The deliveries stay valid
        until settled: the link (held by ``self.link``) owns them.
        """
        self._settle_pending = False
        accepted, self._accepted = self._accepted, []
        for delivery in accepted:
            _pn_delivery_settle(delivery)

    def _check_ready(self) -> None:
        if self.ready or self.closed:
            return
        # A counter, not a scan of in_flight: this runs on every accept during
        # catch-up, and iterating a large set that keeps losing members was
        # half of the primary's CPU there (py-spy, 300,000-message catch-up).
        if self._old_in_flight:
            return
        if not self.queue.browsed_past(self, self.first_id - 1):
            return
        self.ready = True
        self.on_ready(self)

    @property
    def lag(self) -> int:
        """Messages on the queue this backup has not acknowledged yet."""
        if self.closed:
            return 0
        return len(self.in_flight) + len(self._unacked) + self.queue.count_after(self)

    # -- QueueObserver: dequeues on the primary go to the backup in batches --------------

    def enqueued(self, queue: Queue, msg_id: int, data: bytes, completion: Any) -> None:
        pass

    def acquired(self, queue: Queue, msg_id: int) -> None:
        pass

    def released(self, queue: Queue, msg_id: int) -> None:
        pass

    def dequeued(self, queue: Queue, msg_id: int, reason: str) -> None:
        if msg_id < self._skip_below:
            self.skip.discard(msg_id)
        self.pending_dequeues.add(msg_id)
        if self._flush_timer is None:
            self._flush_timer = self.driver.schedule(0.0, self._flush_dequeues)

    # -- end ------------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        self._settle_accepted()
        queue = self.queue
        queue.remove_observer(self)
        if self in queue.browsers:
            queue.remove_consumer(self)
        if self.guard is not None:
            self.guard.cancel()
