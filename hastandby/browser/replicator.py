"""Backup side of a replicating browser: one per replicated queue.

A receiver on the primary's queue in ``copy`` mode, carrying the ids the
replica already holds.  Each message lands on the replica under the id in
its delivery tag (a duplicate id is dropped by the queue), then is settled
``accepted``: the primary's guard for this backup releases it.  A control
delivery (tag ``d...``) lists ids the primary dequeued.
"""

from __future__ import annotations

from typing import Any, Callable

from cproton import PN_ACCEPTED, lib
from proton import Link, Session, Terminus

from hastandby.broker import sections
from hastandby.broker.links import delivery_tag, take_payload
from hastandby.broker.queue import Queue

from .idset import IdSet
from .protocol import (
    DEQUEUE_TAG,
    IDS_PROPERTY,
    REPLICATE_PROPERTY,
    TERM_PROPERTY,
    decode_dequeues,
)

CREDIT_WINDOW = 5000
"""Messages the primary may have in flight to this backup.  Each costs a round
trip before the producer's ack, so a small window throttles producers:
1000 held a primary with one backup to ~0.4 of standalone sends, 5000 to ~0.65
(benchmarks.ha_throughput, one run each)."""


class QueueReplicator:
    """Keeps one replica queue equal to the primary's queue."""

    def __init__(self, queue: Queue, on_progress: Callable[["QueueReplicator"], None] | None = None) -> None:
        self.queue = queue
        self.on_progress = on_progress
        self.link: Link | None = None
        self._impl: Any = None
        self.received = 0
        self.dequeued = 0
        self.closed = False

    def attach(self, session: Session, term: int) -> Link:
        """Open the receiving link on ``session``, telling the primary what we hold."""
        link = session.receiver(f"qpid.ha-q:{self.queue.name}")
        link.source.address = self.queue.name
        link.source.distribution_mode = Terminus.DIST_MODE_COPY
        link.target.address = self.queue.name
        link.properties = {
            REPLICATE_PROPERTY: True,
            IDS_PROPERTY: IdSet.from_ids(self.queue.ids()).to_wire(),
            TERM_PROPERTY: term,
        }
        self.link = link
        self._impl = link._impl
        link.open()
        lib.pn_link_flow(self._impl, CREDIT_WINDOW)
        return link

    def on_delivery(self, delivery: Any) -> None:
        if lib.pn_delivery_partial(delivery) or not lib.pn_delivery_readable(delivery):
            return
        impl = self._impl
        data = take_payload(impl, lib.pn_delivery_pending(delivery))
        tag = delivery_tag(delivery)
        queue = self.queue
        if tag.startswith(DEQUEUE_TAG):
            for msg_id in decode_dequeues(data):
                if queue.dequeue(msg_id, "replicated") is not None:
                    self.dequeued += 1
        else:
            queue.enqueue(data, None, sections.header_ttl(data), msg_id=int(tag))
            self.received += 1
        if not lib.pn_delivery_settled(delivery):
            lib.pn_delivery_update(delivery, PN_ACCEPTED)
        lib.pn_delivery_settle(delivery)
        credit = lib.pn_link_credit(impl)
        if credit < CREDIT_WINDOW // 2:
            lib.pn_link_flow(impl, CREDIT_WINDOW - credit)
        if self.on_progress is not None:
            self.on_progress(self)

    def flow(self) -> None:
        pass

    def fail(self, error: Exception) -> None:
        self.close()
        if self.link is not None:
            self.link.close()

    def close(self) -> None:
        self.closed = True
