"""Backup side of a replicating browser: one per replicated queue.

A receiver on the primary's queue in ``copy`` mode, carrying the ids the
replica already holds and its lineage.  The primary's attach reply carries
the primary's lineage: before any message arrives, the replica drops what it
holds from the divergence point on (ids assigned under an epoch the primary
does not share) and adopts the primary's lineage.  Each delivery is a batch of messages (protocol.py);
each message lands on the replica under its replication id (a duplicate id
is dropped by the queue), then the batch is settled ``accepted``: the
primary's guard for this backup releases its messages.  A control delivery
(tag ``d...``) lists ids the primary dequeued; one tagged ``c...`` gives the
delivery-counts of messages whose delivery failed on the primary, so a
delivery limit counts on after a failover; one tagged ``u...`` gives the
message-ids a deduplicating queue remembers, with the primary's times.
"""

from __future__ import annotations

from typing import Any, Callable

from proton import Condition, Link, Session, Terminus

import structlog

from hastandby.broker.queues import lineage
from hastandby.broker.queues.completion import Completion
from hastandby.broker.links import accept, delivery_tag, pn_link_flow, take_deliveries, take_whole
from hastandby.broker.queues.queue import Queue

from hastandby.replication.codec import (
    COUNTS_TAG,
    DEQUEUE_TAG,
    MESSAGE_IDS_TAG,
    ProtocolError,
    decode_batch,
    decode_counts,
    decode_dequeues,
    decode_message_ids,
)
from hastandby.ha.protocol import BrowserRequest

log = structlog.get_logger("hastandby.backup")

CREDIT_WINDOW = 200
"""Deliveries the primary may have in flight to this backup: batches of up to
1000 messages (subscription.BATCH_MESSAGES).  While every batch waits a round
trip for its accept, a small window would throttle producers; 200 is far more
than a loopback or LAN round trip needs and bounds the primary's send buffer."""


class QueueReplicator:
    """Keeps one replica queue equal to the primary's queue."""

    def __init__(self, queue: Queue, refuse: Callable[[ProtocolError], None] | None = None) -> None:
        self.queue = queue
        self.refuse = refuse  # the primary broke the protocol (BackupRole.refuse)
        self.offered: lineage.Lineage = queue.lineage  # what this link's attach said the replica holds
        self.link: Link | None = None
        self._impl: Any = None
        self._unflowed = 0  # deliveries taken since credit was last topped up
        self.received = 0
        self.dequeued = 0
        self.closed = False

    def attach(self, session: Session, term: int) -> Link:
        """Open the receiving link on ``session``, telling the primary what we hold."""
        link = session.receiver(f"qpid.ha-q:{self.queue.name}")
        link.source.address = self.queue.name
        link.source.distribution_mode = Terminus.DIST_MODE_COPY
        link.target.address = self.queue.name
        self.offered = self.queue.lineage
        link.properties = BrowserRequest(term, self.queue.id_set(), self.offered).to_wire()
        self.link = link
        self._impl = link._impl
        link.open()
        pn_link_flow(self._impl, CREDIT_WINDOW)
        return link

    def adopt(self, primary_lineage: Any) -> None:
        """The primary's attach reply: drop the replica's diverged tail, take the primary's lineage.

        Runs before the link's first delivery.  The primary computed the same
        divergence point from what ``attach`` offered, and trusts only ids below it.
        """
        theirs = lineage.from_wire(primary_lineage)
        queue = self.queue
        point = lineage.divergence(self.offered, theirs)
        if point is not None:
            dropped = queue.drop_from(point)
            if dropped:
                log.warning("replica diverged from the primary: dropped messages assigned under another lineage",
                            queue=queue.name, from_id=point, dropped=dropped,
                            replica_lineage=lineage.describe(self.offered), primary_lineage=lineage.describe(theirs))
        queue.lineage = theirs

    def on_delivery(self, delivery: Any) -> None:
        """Every complete batch from the link's current delivery on, whichever ``delivery`` the event
        names (``take_deliveries``: taking only the event's could leave batches unread for good)."""
        take_deliveries(self._impl, self._take)

    def _take(self, delivery: Any) -> bool:
        """Hot path: one batch of messages, as few calls per message as it takes.  The link's current
        delivery: taken (the link moves on), or left while partial.  True once the link is let go of
        (closed, or the primary refused)."""
        impl = self._impl
        data = take_whole(impl, delivery)
        if data is None:
            return self.closed
        tag = delivery_tag(delivery)
        try:
            if not tag:
                raise ProtocolError("delivery-tag", "a replication delivery needs a tag (b... or d...)")
            if tag.startswith(DEQUEUE_TAG):
                self._dequeue(data)
                self._accept(delivery)
            elif tag.startswith(MESSAGE_IDS_TAG):
                entries = decode_message_ids(data)
                remember = getattr(self.queue, "remember", None)
                if remember is not None:  # a deduplicating queue (declared with the primary's arguments)
                    remember(entries)
                self._accept(delivery)
            elif tag.startswith(COUNTS_TAG):
                set_count = self.queue.set_delivery_count
                for msg_id, count in decode_counts(data):
                    set_count(msg_id, count)
                self._accept(delivery)
            else:
                self._enqueue_batch(data, delivery)
        except ProtocolError as error:
            self._refused(error)
            return True
        # Each delivery took one credit: count them here instead of asking the
        # engine every time, and top up once half the window is used.
        self._unflowed += 1
        if self._unflowed >= CREDIT_WINDOW // 2:
            pn_link_flow(impl, self._unflowed)
            self._unflowed = 0
        return self.closed

    def _enqueue_batch(self, data: bytes, delivery: Any) -> None:
        """Store a batch; it is accepted once every message is on the replica for good (one completion:
        the journal holds it until durable messages are on disk, else it completes at once)."""
        ids, payloads = decode_batch(data)
        completion = Completion(self._accept, delivery, self._not_stored)
        self.queue.enqueue_replicated(ids, payloads, completion)
        self.received += len(ids)
        completion.release()

    def _accept(self, delivery: Any) -> None:
        if self.closed:
            return  # the link is gone: the primary sends the batch again to the next one
        accept(delivery)

    def _not_stored(self, delivery: Any, error: Exception) -> None:
        """The journal could not write the batch: never accept it; the link goes, the primary stops counting on us."""
        log.error("replica could not store a batch: leaving the primary's link", queue=self.queue.name,
                  error=str(error))
        self.fail(error)

    def _dequeue(self, data: bytes) -> None:
        self.dequeued += self.queue.dequeue_ranges(decode_dequeues(data).ranges(), "replicated")

    def _refused(self, error: ProtocolError) -> None:
        """Nothing of the delivery was stored: refuse the primary (its connection closes, we reconnect)."""
        if self.refuse is not None:
            self.refuse(error)
            return
        log.warning("replicating browser refused the primary's delivery", queue=self.queue.name,
                    condition=error.condition, error=str(error))
        self.close()
        if self.link is not None:
            self.link.condition = Condition(error.condition, str(error))
            self.link.close()

    def flow(self) -> None:
        pass

    def fail(self, error: Exception) -> None:
        self.close()
        if self.link is not None:
            self.link.close()

    def close(self) -> None:
        self.closed = True
