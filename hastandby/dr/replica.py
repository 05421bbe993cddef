"""The replica side: pulling one queue from its source into the local queue.

One ``ReplicaLink`` per configured replication, each with its own outgoing
connection (an ``Outbound`` cycling through the source's URL list, so it
follows a source HA cluster's primary through failover) and one receiving
link.  Ids make delivery exactly-once at the replica:

- full mode: the local queue holds the source's ids, so a re-sent message is
  a duplicate id the queue drops, and a reconnect sends the ids held so the
  source answers with only what changed (hot-standby catch-up);
- enqueue mode: local consumers take messages, so presence proves nothing.
  Source (tap) ids arrive in order, and the replica enqueues source id ``n``
  under its own id ``base + n``: anything at or below the queue's highest id
  so far is a duplicate.  ``base`` changes only when the source's epoch does
  (a standalone source restarted, its ids begin again) and is kept with the
  configuration.  Local producers are refused so no other message takes ids.

Messages arrive in batches (replication/batching.py), and a batch is
acknowledged to the source only once the local queue has all of it for good:
its enqueues share one ``Completion``, which the replica's own HA guards
(when this node is a cluster primary) hold until its backups have them.  An
unsettled batch is then accepted; a pre-settled one (asynchronous links)
counts towards the cumulative acknowledgement sent on the ack link about
every 20 ms: "stored every message up to source id N".
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

import structlog
from proton import Condition, Connection, Endpoint, Event, Link, Terminus

from hastandby import settings
from hastandby.broker.queues import lineage
from hastandby.broker.message import sections
from hastandby.broker.queues.completion import Completion
from hastandby.broker.transport.driver import Driver
from hastandby.broker.errors import BrokerError
from hastandby.broker.admission.fence import Fence
from hastandby.broker.links import (
    accept,
    delivery_tag,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_link_credit,
    pn_link_flow,
    take_deliveries,
    take_whole,
)
from hastandby.broker.transport.address import Address
from hastandby.broker.transport.outbound import Outbound
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Registry
from hastandby.broker.queues.idset import IdSet
from hastandby.replication.codec import (
    COUNTS_TAG,
    DEQUEUE_TAG,
    MESSAGE_IDS_TAG,
    ProtocolError,
    decode_body,
    decode_counts,
    decode_dequeues,
    decode_message_ids,
    link_properties,
)
from hastandby.replication import control
from hastandby.broker.transport.address import split_hostport
from hastandby.security.pipe import ClientSecurity

from hastandby.dr.config import ReplicationConfig
from hastandby.dr.protocol import (
    ACK_ADDRESS,
    EPOCH_PROPERTY,
    REPLICA_PROPERTY,
    STATUS_TAG,
    STOPPED,
    Ack,
    AttachReply,
    LinkRequest,
    ReplicaIdentity,
    StatusReport,
    decode_ordered_batch,
)

log = structlog.get_logger("hastandby.dr.replica")

CREDIT_WINDOW = 500
"""Batches in flight (up to 1000 messages or 256 KiB each, replication/batching.py):
a 50 ms WAN round trip at 100k msg/s is 5000 messages, tens of batches."""
ACK_INTERVAL = 0.02  # seconds between cumulative acknowledgements


class ReplicaLink:
    """Keeps one local queue replicating from its source, through outages."""

    def __init__(
        self,
        config: ReplicationConfig,
        registry: Registry,
        driver: Driver,
        fence: Fence,
        me: ReplicaIdentity,  # this node as a replica, for the source's logs and status
        save: Callable[[ReplicationConfig], None],
        heartbeat: float = settings.HEARTBEAT.default,
        security: ClientSecurity | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.driver = driver
        self.fence = fence
        self.save = save
        self.link: Link | None = None
        self._impl: Any = None
        self._queue: Queue | None = None  # the local queue, looked up once per link, not per message
        self._generation = 0  # which link a pending accept belongs to
        self._epoch_ok = False  # the source answered this link's attach with an epoch we took
        self._ack_link: Link | None = None
        # The last source id of each batch received, in order, not yet stored for good.
        self._pending: deque[int] = deque()
        self._stored: set[int] = set()  # batches stored, but an earlier one is still pending
        self._through = 0  # every delivery up to this source id is stored
        self._acked = 0  # the last "through" sent to the source
        self._ack_timer: Any = None
        self.remote: StatusReport | None = None  # the source's last status report on this link
        self.remote_at = 0.0
        self.received = 0
        self.duplicates = 0
        self.error: str | None = None
        self._addresses: list[Address] = [split_hostport(a) for a in config.addresses()]
        self.outbound = Outbound(driver, lambda: self._addresses, self, properties={REPLICA_PROPERTY: me.to_wire()},
                                 container_id=f"hastandby-dr-{config.key}", idle_timeout=heartbeat, max_delay=2.0,
                                 security=security)

    @property
    def queue_name(self) -> str:
        return self.config.queue

    def start(self) -> None:
        log.info("replication starting", queue=self.queue_name, source=self.config.source, mode=self.config.mode)
        self.outbound.start()

    def stop(self, final: bool) -> None:
        """Stop pulling; ``final`` tells the source to forget the replication (and its backlog)."""
        link = self.link
        if final and link is not None and link.state & Endpoint.LOCAL_ACTIVE:
            link.condition = Condition(STOPPED, "replication stopped at the replica")
            link.close()
        self._drop_link()
        self.outbound.stop()

    # -- the connection (Outbound owner) ----------------------------------------------------

    def opened(self, connection: Connection) -> None:
        config = self.config
        queue = self._queue = self.registry.queue(config.queue)
        session = connection.session()
        session.open()
        link = session.receiver(f"hastandby.dr:{config.queue}:{config.key}")
        link.source.address = config.queue
        link.target.address = config.queue
        held = IdSet()
        if config.mode == "full":
            link.source.distribution_mode = Terminus.DIST_MODE_COPY
            # Before a first epoch what the queue holds is not the source's (local messages, or
            # none): offered, the source would take those ids for its own and skip them.  We
            # drop them when the source answers (on_link_remote_open).
            if config.epoch:
                held = queue.id_set()
        link.properties = LinkRequest(
            config.mode, config.key, config.epoch, lineage.from_wire(config.lineage), config.sync, ack=True,
            ids=held, max_backlog_count=config.max_backlog_count, max_backlog_bytes=config.max_backlog_bytes,
        ).to_wire()
        self.link = link
        self._impl = link._impl
        self._generation += 1
        self.driver.register(link, self)
        link.open()
        pn_link_flow(self._impl, CREDIT_WINDOW)
        self._ack_link = control.open_sender(session, f"hastandby.dr-ack:{config.queue}:{config.key}", ACK_ADDRESS)
        self._pending.clear()
        self._stored.clear()
        self._through = self._acked = 0
        self._epoch_ok = False

    def lost(self, reason: str) -> None:
        log.info("replication source lost", queue=self.queue_name, reason=reason)
        self._drop_link()

    def on_link_remote_open(self, event: Event) -> None:
        """The source's answer, before its first batch: align with its epoch and lineage (protocol.py)."""
        link = event.link
        if link is None or (link is not self.link and link != self.link):
            return
        try:
            reply = AttachReply.from_wire(link_properties(lambda: link.remote_properties, "attach properties"))
        except ProtocolError as error:
            self._refuse(error)
            return
        if reply is None:
            return  # a refusal: its detach follows (batches before an epoch are refused)
        epoch, theirs = reply.epoch, reply.lineage
        config = self.config
        self.error = None
        mine = lineage.from_wire(config.lineage)
        if config.epoch and epoch != config.epoch:
            log.warning("source ids started again (the source queue is new or its node restarted)",
                        queue=config.queue, old_epoch=config.epoch, epoch=epoch)
        # A full source computes the same point from what we offered (FullSourceLink; before a
        # first epoch we offered nothing, and what the queue holds is not the source's: dropped);
        # an enqueue replica's first epoch starts after whatever the queue held.
        new_epoch = epoch != config.epoch
        point = 1 if new_epoch else lineage.divergence(mine, theirs)
        if point is not None:
            self._diverged(point, mine, theirs)
        if epoch != config.epoch or theirs != mine:
            config.epoch, config.lineage = epoch, lineage.to_wire(theirs)
            self.save(config)
        self._epoch_ok = True

    def _diverged(self, point: int, mine: lineage.Lineage, theirs: lineage.Lineage) -> None:
        """Source ids from ``point`` on are not the ones we hold under them."""
        config, queue = self.config, self.registry.queue(self.config.queue)
        if config.mode == "full":
            dropped = queue.drop_from(point)
            if dropped:
                log.warning("replica diverged from its source: dropped messages assigned under another lineage",
                            queue=config.queue, from_id=point, dropped=dropped,
                            replica_lineage=lineage.describe(mine), source_lineage=lineage.describe(theirs))
        elif config.base + point < queue.next_id:
            # Local consumers may have taken what we hold: keep it, and give the
            # source's ids from ``point`` on fresh local ids.
            config.base = queue.next_id - point
            log.warning("replica diverged from its source: its ids from here on are new messages",
                        queue=config.queue, from_id=point, base=config.base,
                        replica_lineage=lineage.describe(mine), source_lineage=lineage.describe(theirs))

    def on_link_remote_close(self, event: Event) -> None:
        link = event.link
        if link is None:
            return
        condition = link.remote_condition
        self.error = f"{condition.name}: {condition.description}" if condition else "link closed by the source"
        log.warning("replication link refused", queue=self.queue_name, error=self.error)
        self._drop_link()
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()
        connection = link.connection
        if connection.state & Endpoint.LOCAL_ACTIVE:
            connection.close()  # the outbound reconnects (backing off) and tries again

    def on_session_remote_open(self, event: Event) -> None:
        pass

    def _drop_link(self) -> None:
        if self.link is not None:
            self.driver.unregister(self.link)
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        self._ack_link = None
        self._generation += 1
        self._epoch_ok = False
        self.link = None
        self._impl = None
        self.remote = None

    # -- deliveries (driver endpoint) ----------------------------------------------------------

    def on_delivery(self, delivery: Any) -> None:
        """Every complete delivery from the link's current one on, whichever ``delivery`` the event
        names (``take_deliveries``: taking only the event's could leave batches unread for good)."""
        impl = self._impl
        if impl is not None:
            take_deliveries(impl, self._take)

    def _take(self, delivery: Any) -> bool:
        """The link's current delivery: taken (the link moves on), or left while partial.  True once
        the link is dropped (refused, failed, fenced: ``_drop_link``)."""
        impl = self._impl
        if impl is None:
            return True
        data = take_whole(impl, delivery)
        if data is None:
            return False
        tag = delivery_tag(delivery)
        credit = pn_link_credit(impl)
        if credit < CREDIT_WINDOW // 2:
            pn_link_flow(impl, CREDIT_WINDOW - credit)
        try:
            if not self._epoch_ok:  # its attach reply had no epoch: a refusal, whose detach should follow
                raise ProtocolError(str(EPOCH_PROPERTY), "a delivery on a link the source gave no epoch")
            if tag.startswith(STATUS_TAG):
                self.remote = StatusReport.from_wire(decode_body(data, "status"))
                self.remote_at = time.monotonic()
                pn_delivery_settle(delivery)
            elif tag.startswith(DEQUEUE_TAG):
                ranges = decode_dequeues(data).ranges()
                if self.config.mode != "full":
                    raise ProtocolError("dequeues", "an enqueue replica takes no dequeues")
                queue = self._queue
                assert queue is not None  # looked up with the link (opened), before any delivery
                queue.dequeue_ranges(ranges, "replicated")
                pn_delivery_settle(delivery)
            elif tag.startswith(MESSAGE_IDS_TAG):  # a full replica remembers its source's message-ids too
                entries = decode_message_ids(data)
                queue = self._queue
                assert queue is not None
                remember = getattr(queue, "remember", None)
                if remember is not None:  # declared with --dedup-window like its source
                    remember(entries)
                pn_delivery_settle(delivery)
            elif tag.startswith(COUNTS_TAG):  # a full replica mirrors its source's delivery-counts too
                pairs = decode_counts(data)
                if self.config.mode != "full":
                    raise ProtocolError("delivery-counts", "an enqueue replica takes no delivery-counts")
                queue = self._queue
                assert queue is not None
                for msg_id, count in pairs:
                    queue.set_delivery_count(msg_id, count)
                pn_delivery_settle(delivery)
            else:
                self._enqueue_batch(delivery, data)
        except ProtocolError as error:
            self._refuse(error)
        return self._impl is not impl

    def _enqueue_batch(self, delivery: Any, data: bytes) -> None:
        """Store a batch of source messages; one completion acknowledges them all."""
        if not self.fence.allows():  # taking nothing we could not acknowledge (broker/admission/fence.py)
            self.fail(BrokerError("this node may not take messages now (fenced)"))
            return
        ids, payloads = decode_ordered_batch(data, self.config.base if self.config.mode == "enqueue" else 0)
        if pn_delivery_settled(delivery):  # pre-settled: acknowledged cumulatively
            pn_delivery_settle(delivery)
            delivery = None
        last = ids[-1]
        self._pending.append(last)
        completion = Completion(self._accept, (self._generation, delivery, last))
        queue, header_ttl, header_prefix = self._queue, sections.header_ttl, sections.HEADER_PREFIX
        assert queue is not None  # looked up with the link (opened), before any delivery
        enqueue_mode = self.config.mode == "enqueue"
        base = self.config.base if enqueue_mode else 0
        stored = 0
        for source_id, payload in zip(ids, payloads):
            msg_id = base + source_id
            if enqueue_mode and msg_id < queue.next_id:  # re-sent after a lost acknowledgement: we have it
                self.duplicates += 1
                continue
            ttl = header_ttl(payload) if payload.startswith(header_prefix) else None
            queue.enqueue(payload, completion, ttl, msg_id=msg_id)
            stored += 1
        self.received += stored
        completion.release()

    def _accept(self, token: tuple[int, Any, int]) -> None:
        """The message is stored for good: accept it, or count it towards the next cumulative ack."""
        generation, delivery, source_id = token
        if self._impl is None or generation != self._generation:
            return  # its link is gone: the source re-sends it, and we drop the duplicate
        if not self.fence.allows():
            return  # fenced: left unacknowledged, the source keeps it
        if delivery is not None:
            accept(delivery)
        pending = self._pending
        if pending and pending[0] == source_id:
            pending.popleft()
            self._through = source_id
            stored = self._stored
            while pending and pending[0] in stored:
                self._through = pending.popleft()
                stored.discard(self._through)
            if self._ack_timer is None:  # idle links run no timer
                self._ack_timer = self.driver.schedule(ACK_INTERVAL, self._send_ack)
        else:
            self._stored.add(source_id)

    def _send_ack(self) -> None:
        """At most one cumulative acknowledgement per ACK_INTERVAL, and only when there is news."""
        self._ack_timer = None
        ack = self._ack_link
        if ack is None or self._through <= self._acked:
            return
        if ack.credit <= 0:  # the source has not granted more yet
            self._ack_timer = self.driver.schedule(ACK_INTERVAL, self._send_ack)
            return
        self._acked = self._through
        control.send(ack, b"%d" % self._acked, Ack(self._acked).to_wire())

    def flow(self) -> None:
        pass

    def _refuse(self, error: ProtocolError) -> None:
        """The source broke the protocol: detach naming what was wrong, and reconnect later (the
        outbound backs off).  Nothing of the refused delivery was stored or acknowledged."""
        condition, text = error.condition, str(error)
        log.warning("replication source refused", queue=self.queue_name, condition=condition,
                    field=error.field, error=text)
        self.error = f"{condition}: {text}"
        link = self.link
        connection = link.connection if link is not None else None
        if link is not None and link.state & Endpoint.LOCAL_ACTIVE:
            link.condition = Condition(condition, text)
            link.close()
        self._drop_link()
        if connection is not None and connection.state & Endpoint.LOCAL_ACTIVE:
            connection.close()

    def fail(self, error: Exception) -> None:
        log.error("replication link failed", queue=self.queue_name, error=str(error))
        self.error = str(error)
        if self.link is not None and self.link.state & Endpoint.LOCAL_ACTIVE:
            self.link.close()
        self._drop_link()

    def close(self) -> None:
        self._drop_link()

    # -- reporting ----------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        config = self.config
        remote = self.remote or StatusReport()
        if self.link is None:
            state = "connecting"
        else:
            state = remote.state if remote.state is not None else "catching up"
        report: dict[str, Any] = {
            "queue": config.queue, "source": config.source, "mode": config.mode, "sync": config.sync,
            "state": state, "lag_messages": remote.lag_messages, "lag_seconds": remote.lag_seconds,
            "overflow": remote.overflow or 0,
            "received": self.received, "duplicates_dropped": self.duplicates, "error": self.error,
        }
        if self.remote is not None:
            report["reported_ago"] = round(time.monotonic() - self.remote_at, 3)
        if self.outbound.connected and self.outbound.address:
            report["connected_to"] = "%s:%d" % self.outbound.address
        return report
