"""The source side: serving DR replicas from this node's queues.

Active while the node serves clients (a standalone node, or an HA cluster's
primary).  It claims the receiving links of connections marked
``hastandby.dr-replica`` (see ``protocol``):

- full mode: a ``FullSourceLink``, the hot-standby replicating browser plus
  ``StatusReports``; no producer is held back unless the replica asked for
  ``sync``, then a guard holds each producer's ``accepted`` until the replica
  has the message (Qpid's standalone replication behaved like that);
- enqueue mode: a ``TapLink`` browsing the replication's *tap* queue, with
  ``StatusReports`` too.  A ``TapFeeder`` copies every message enqueued on the
  source queue onto the tap, so what the replica has not acknowledged stays on
  the source through link outages and while local consumers take the
  original.  The tap is an ordinary queue (``$dr.<key>.<queue>``, ring policy
  at ``--max-backlog``, the source queue's replication level): an HA source
  cluster replicates it to its backups, so it also survives the source's
  failover with its ids.

Each link has one base class from ``replication/`` and owns its status
reports; what a replica's attach and acknowledgements say is decoded by the
typed messages of ``protocol`` (a bad field refuses the attach, or closes the
ack link, naming it).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

import structlog
from proton import Connection, Link

from hastandby.broker.queues import lineage
from hastandby.broker.transport import peer
from hastandby.broker.queues.arrivals import Arrivals
from hastandby.broker.admission.authority import Authority, principal_of
from hastandby.broker.queues.completion import Completion
from hastandby.broker.transport.driver import Driver, Timer
from hastandby.broker.errors import InvalidArgument, NotAllowed, NotFound
from hastandby.broker.queues.exchange import Binding
from hastandby.broker.links import pn_link_credit, send_settled
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import INTERNAL, REPLICATE, Node, Registry
from hastandby.broker.message.values import plain
from hastandby.replication.batching import BatchingLink
from hastandby.replication.guard import QueueGuard
from hastandby.broker.vocabulary import ADMIN_PROPERTY
from hastandby.replication.codec import (
    BACKUP_PROPERTY,
    ProtocolError,
    encode_control,
)
from hastandby.replication.control import ControlReceiver
from hastandby.replication.subscription import ReplicatingSubscription

from hastandby.dr.protocol import (
    ACK_ADDRESS,
    MODE_PROPERTY,
    REPLICA_PROPERTY,
    STATUS_TAG,
    STOPPED,
    TAP_KEY,
    TAP_OF,
    TAP_PREFIX,
    Ack,
    AttachReply,
    LinkRequest,
    ReplicaIdentity,
    StatusReport,
    tap_name,
)

log = structlog.get_logger("hastandby.dr.source")

STATUS_INTERVAL = 1.0  # seconds between status reports to a replica
DEFAULT_MAX_BACKLOG = 1_000_000  # messages an enqueue-mode tap keeps when the replica gave no limit
OVERFLOW_LOG_INTERVAL = 10.0  # seconds between overflow warnings while a tap keeps overflowing
LINGER = 0.003
"""Seconds an asynchronous link collects messages before it sends them (unless
a batch fills first).  A batch per pass of events held about 50 messages at
full load; lingering gives about 500 and takes per-batch work off the source,
at the price of up to this much more lag."""


def replica_info(connection: Connection) -> dict[str, Any] | None:
    """The ``hastandby.dr-replica`` connection property, if this is a replica's connection.

    Any map marks one; its fields are checked (``ReplicaIdentity``) when it attaches a data link."""
    info = peer.properties(connection, "connection properties").get(REPLICA_PROPERTY)
    return plain(info) if isinstance(info, dict) else None


def _is_peer(connection: Connection, authority: Authority) -> bool:
    """An HA backup (admitted as one: it replicates taps like any queue) or an admin (who may inspect them)."""
    properties = peer.properties(connection, "connection properties")
    if BACKUP_PROPERTY in properties:
        return True
    return bool(properties.get(ADMIN_PROPERTY)) and authority.is_admin(principal_of(connection))


class StatusReports:
    """Sends a replica a ``StatusReport`` about once a second, on spare credit of the link it reports on.

    Each source link owns one: ``impl`` is the link's raw C link, ``status``
    says what to report and ``count_credit`` lets the link recount what it may
    still send once a report took a credit.
    """

    def __init__(self, impl: Any, driver: Driver, status: Callable[[], StatusReport],
                 count_credit: Callable[[], None]) -> None:
        self._impl = impl
        self._driver = driver
        self._status = status
        self._count_credit = count_credit
        self._seq = 0
        self._timer: Timer | None = None

    def start(self) -> None:
        """The first report goes as soon as the link is open."""
        self._timer = self._driver.schedule(0.0, self._report)

    def _report(self) -> None:
        impl = self._impl
        if pn_link_credit(impl) > 0:
            self._seq += 1
            send_settled(impl, STATUS_TAG + b"%d" % self._seq, encode_control(self._status().to_wire()))
            self._count_credit()
        self._timer = self._driver.schedule(STATUS_INTERVAL, self._report)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class FullSourceLink(ReplicatingSubscription):
    """Full mode: the queue's messages and dequeues, with catch-up by id set."""

    def __init__(self, link: Link, queue: Queue, registry: Registry, driver: Driver, request: LinkRequest,
                 replica: str) -> None:
        # Another epoch: none of the replica's ids name our messages.  The same
        # one: those below the lineages' divergence point do.  The replica drops
        # the rest itself when it reads our answer (protocol.py).
        foreign = bool(request.epoch) and request.epoch != queue.uuid
        point = 1 if foreign else lineage.divergence(request.lineage, queue.lineage)
        # Asynchronous: sent pre-settled in lingering batches, acknowledged
        # cumulatively.  A message lost with the link is not in the id set the
        # replica sends on reconnect, so the catch-up sends it again.  --sync
        # keeps per-batch accepts at once: the replica acknowledges cumulatively
        # only every 20 ms, too slow for a waiting producer.
        sync = request.sync
        asynchronous = request.ack and not sync
        super().__init__(link, queue, registry, driver, QueueGuard(queue) if sync else None, request.ids,
                         on_ready=self._live, trusted_below=point, cumulative=asynchronous,
                         linger=LINGER if asynchronous else 0.0)
        self.reports = StatusReports(self._impl, driver, self.status, self.count_credit)
        link.properties = AttachReply(queue.uuid, queue.lineage).to_wire()
        self.mode = "full"
        self.replica = replica
        log.info("replica attached", queue=queue.name, mode="full", replica=replica, sync=sync,
                 replica_ids=len(request.ids), new_epoch=foreign, trusted_below=point)

    def start(self) -> None:
        super().start()
        self.reports.start()

    def _live(self, subscription: ReplicatingSubscription) -> None:
        log.info("replica live", queue=self.queue.name, mode="full", replica=self.replica)

    def status(self) -> StatusReport:
        return StatusReport("live" if self.ready else "catching up", self.lag, self.lag_seconds, 0)

    def describe(self) -> dict[str, Any]:
        return {"queue": self.queue.name, "replica": self.replica, **self.status().to_wire(), "mode": "full"}

    def close(self) -> None:
        self.reports.stop()
        super().close()


class TapFeeder:
    """Copies every message enqueued on a source queue onto one tap queue.

    The copies go on the tap ``LINGER`` seconds after the first of them, as
    a run (``Queue.enqueue_run``, the same bytes by reference), so the link
    browsing the tap sends them as one batch.  A copy whose producer awaits
    an acknowledgement goes on at once, with it, when the tap has guards (a
    ``--sync`` link's) or may get some (it is replicated to HA backups: a
    backup that attaches between a message and its copy must not count the
    copy as already acknowledged).
    """

    def __init__(self, source: Queue, tap: Queue, driver: Driver) -> None:
        self.source = source
        self.tap = tap
        self.arrivals = Arrivals()
        self.overflow = tap.stats["ring_dropped"]
        self._warned_at = 0.0
        self._driver = driver
        self._pending: list[bytes] = []
        self._replicated = tap.settings.replicate == "all"
        if tap.depth:  # inherited (restart, failover): its age counts from now
            self.arrivals.add(tap.next_id - 1)
        source.add_observer(self)

    def is_done(self, tap_id: int) -> bool:
        """The replica has acknowledged ``tap_id`` (or the ring dropped it)."""
        return self.tap.get(tap_id) is None

    def enqueued(self, queue: Queue, msg_id: int, data: bytes, completion: Completion | None) -> None:
        if completion is not None and (self._replicated or self.tap.observers):
            self._feed()
            self.arrivals.add(self.tap.enqueue(data, completion))
            self._check_overflow()
            return
        pending = self._pending
        pending.append(data)
        if len(pending) == 1:
            self._driver.schedule(LINGER, self._feed)

    def _feed(self) -> None:
        """What arrived since the last feed goes on the tap."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        tap = self.tap
        self.arrivals.add(tap.next_id)
        tap.enqueue_run(pending)
        self._check_overflow()

    def _check_overflow(self) -> None:
        tap = self.tap
        dropped = tap.stats["ring_dropped"]
        if dropped != self.overflow:
            self.overflow = dropped
            now = time.monotonic()
            if now - self._warned_at >= OVERFLOW_LOG_INTERVAL:
                self._warned_at = now
                log.warning("replication backlog overflow: oldest unreplicated messages dropped",
                            queue=self.source.name, tap=tap.name, dropped_total=dropped,
                            max_count=tap.settings.max_count, max_bytes=tap.settings.max_size)

    def acquired(self, queue: Queue, msg_id: int) -> None:
        pass

    def released(self, queue: Queue, msg_id: int) -> None:
        pass

    def dequeued(self, queue: Queue, msg_id: int, reason: str) -> None:
        pass

    @property
    def overflowing(self) -> bool:
        """Dropping now: the tap is at its limit (the last drop is recent or imminent)."""
        tap, s = self.tap, self.tap.settings
        return bool(self.overflow) and (
            (s.max_count is not None and tap.depth >= s.max_count)
            or (s.max_size is not None and tap.bytes >= s.max_size * 0.99)
        )

    def close(self) -> None:
        """Stop copying; what was collected still goes on the tap (the node may be stepping down, and its
        backups' taps must match their queues)."""
        self.source.remove_observer(self)
        if not self.tap.deleted:
            self._feed()


class TapLink(BatchingLink):
    """Enqueue mode: the link browses the tap; the replica's acknowledgement removes messages from the backlog.

    Browsing, not acquiring: nobody consumes a tap (HA subscriptions browse
    it too), so a message this link sent needs no acquisition to track; what
    the replica has not acknowledged stays on the tap, and the next link
    browses it again from the start, in id order (the order the replica's
    duplicate check needs).
    """

    def __init__(self, link: Link, feeder: TapFeeder, registry: Registry, driver: Driver, request: LinkRequest,
                 replica: str, forget: Callable[[Queue], None]) -> None:
        sync = request.sync
        super().__init__(link, feeder.tap, registry, driver, browsing=True, cumulative=request.ack and not sync)
        self.sees_acquired = True  # an admin's consumer on the tap takes nothing from the replica
        self.reports = StatusReports(self._impl, driver, self.status, self.count_credit)
        link.properties = AttachReply(feeder.tap.uuid, feeder.tap.lineage).to_wire()
        self.mode = "enqueue"
        self.feeder = feeder
        self.replica = replica
        self.forget = forget
        self.guard = QueueGuard(feeder.tap) if sync else None
        self.backlog_at_attach = feeder.tap.next_id - 1
        # Each run the feeder puts on the tap reaches this link in one dispatch.
        feeder.tap.defer_browse = driver.after_events
        log.info("replica attached", queue=feeder.source.name, mode="enqueue", replica=replica, sync=sync,
                 backlog=feeder.tap.depth)

    def start(self) -> None:
        super().start()
        self.reports.start()

    def stored(self, ids: list[int]) -> None:
        """The replica has these: they leave the backlog."""
        self.queue.acknowledge_many(ids)

    def status(self) -> StatusReport:
        feeder = self.feeder
        oldest = feeder.arrivals.oldest(feeder.is_done)
        caught_up = oldest is None or oldest[0] > self.backlog_at_attach
        state = "overflow" if feeder.overflowing else ("live" if caught_up else "catching up")
        return StatusReport(state, feeder.tap.depth, feeder.arrivals.age(feeder.is_done), feeder.overflow)

    def describe(self) -> dict[str, Any]:
        return {"queue": self.feeder.source.name, "replica": self.replica, **self.status().to_wire(),
                "mode": "enqueue"}

    def close(self) -> None:
        if self.closed:
            return
        self.reports.stop()
        if self.guard is not None:
            self.guard.cancel()
        # OutgoingLink.close: the link leaves the tap.  A browsing link acquired
        # nothing, so it releases nothing: what the replica had not acknowledged
        # is still on the tap for the next link.  Sent but unacknowledged
        # batches are forgotten with it.
        super().close()
        self.forget_sent()
        condition = self.link.remote_condition
        if condition is not None and condition.name == STOPPED:
            self.forget(self.queue)


class AckReceiver(ControlReceiver):
    """The replica's cumulative acknowledgements (a control link), for the data link of the same connection."""

    def __init__(self, link: Link, endpoint_for: Callable[[Connection], FullSourceLink | TapLink | None]) -> None:
        super().__init__(link, self._acknowledged, log, "replica acknowledgement refused")
        self.endpoint_for = endpoint_for

    def _acknowledged(self, body: dict[str, Any]) -> None:
        ack = Ack.from_wire(body)
        endpoint = self.endpoint_for(self.link.connection)
        if endpoint is not None:
            endpoint.acknowledged(ack.through)


class DrSource:
    """Everything this node does for the replicas that pull from it."""

    def __init__(self, registry: Registry, driver: Driver, authority: Authority) -> None:
        self.registry = registry
        self.driver = driver
        self.authority = authority
        self.active = False
        self.feeders: dict[str, TapFeeder] = {}
        self.links: list[FullSourceLink | TapLink] = []
        registry.observers.append(self)

    def activate(self) -> None:
        """This node now serves clients: feed every tap it holds (an HA primary inherits them)."""
        self.active = True
        for queue in list(self.registry.queues.values()):
            self._feed(queue)

    def deactivate(self) -> None:
        self.active = False
        for feeder in self.feeders.values():
            feeder.close()
        self.feeders.clear()

    # -- links -------------------------------------------------------------------------

    def attach(self, link: Link) -> Any:
        """Claim a replica's receiving link; None for any other link."""
        properties = plain(peer.properties(link, "link properties"))
        terminus = link.remote_source if link.is_sender else link.remote_target
        address = peer.address(terminus, "source address" if link.is_sender else "target address") or ""
        info = replica_info(link.connection)
        if info is not None and not self.authority.is_cluster(principal_of(link.connection)):
            user = principal_of(link.connection).user
            raise NotAllowed(f"user {user!r} is not in group 'cluster': it may not act as a DR replica")
        if info is not None and not link.is_sender and address == ACK_ADDRESS:
            return AckReceiver(link, self._endpoint_for)
        if info is None or not link.is_sender or str(MODE_PROPERTY) not in properties:
            if address.startswith(TAP_PREFIX) and not _is_peer(link.connection, self.authority):
                raise NotAllowed(f"{address!r} is the backlog of a DR replication, not a client queue")
            return None
        if not self.active:
            raise NotAllowed("this node does not serve clients now: replicate from the primary")
        try:
            replica = ReplicaIdentity.from_wire(info).name
            request = LinkRequest.from_wire(properties)
        except ProtocolError as error:
            raise InvalidArgument(str(error)) from None
        queue = self.registry.queue(address)
        endpoint: FullSourceLink | TapLink
        if request.mode == "full":
            endpoint = FullSourceLink(link, queue, self.registry, self.driver, request, replica)
        else:
            tap = self._tap(queue, request)
            self._replace_stale_links(tap)
            endpoint = TapLink(link, self.feeders[tap.name], self.registry, self.driver, request, replica,
                               self._forget)
        self.links = [e for e in self.links if not e.closed] + [endpoint]
        return endpoint

    def _endpoint_for(self, connection: Connection) -> FullSourceLink | TapLink | None:
        return next((e for e in self.links if not e.closed and e.link.connection == connection), None)

    def _replace_stale_links(self, tap: Queue) -> None:
        """A replica reconnected before this node saw its old link go (a half-open
        WAN connection): end the old link and its connection, which would go on
        sending the tap into a connection nobody reads."""
        for old in self.links:
            if isinstance(old, TapLink) and old.queue is tap and not old.closed:
                log.info("replacing a stale replication link", tap=tap.name, replica=old.replica)
                old.close()
                connection = old.link.connection
                transport = connection.transport
                if transport is not None:  # drop it: its deliveries are void now
                    transport.close_tail()
                    transport.close_head()

    def _tap(self, queue: Queue, request: LinkRequest) -> Queue:
        """The replication's tap, made on its first attach: replication starts there."""
        name = tap_name(queue.name, request.key)
        tap = self.registry.queues.get(name)
        if tap is None:
            count, size = request.max_backlog_count, request.max_backlog_bytes
            arguments: dict[str, Any] = {
                INTERNAL: True, TAP_OF: queue.name, TAP_KEY: request.key, REPLICATE: queue.settings.replicate,
                "qpid.policy_type": "ring",
                "qpid.max_count": count if count else (None if size else DEFAULT_MAX_BACKLOG),
            }
            if size:
                arguments["qpid.max_size"] = size
            arguments = {k: v for k, v in arguments.items() if v is not None}
            tap, _ = self.registry.declare_queue(name, arguments, durable=queue.settings.durable)
            log.info("replication backlog created", queue=queue.name, tap=name,
                     max_count=tap.settings.max_count, max_bytes=tap.settings.max_size)
        return tap

    def _forget(self, tap: Queue) -> None:
        """The replica stopped replicating: its backlog goes."""
        log.info("replication stopped by the replica", tap=tap.name)
        if self.registry.queues.get(tap.name) is tap:
            self.registry.delete_queue(tap.name, reroute=False)

    # -- RegistryObserver: taps follow their source queue ----------------------------------

    def _feed(self, queue: Queue) -> None:
        source_name = queue.settings.arguments.get(TAP_OF)
        if not self.active or not source_name or queue.name in self.feeders:
            return
        source = self.registry.queues.get(str(source_name))
        if source is None:  # its source is gone: so is the replication
            self.driver.schedule(0.0, lambda: self._forget(queue))
            return
        self.feeders[queue.name] = TapFeeder(source, queue, self.driver)

    def created(self, obj: Node) -> None:
        if isinstance(obj, Queue):
            self._feed(obj)

    def deleted(self, obj: Node) -> None:
        if not isinstance(obj, Queue):
            return
        feeder = self.feeders.pop(obj.name, None)
        if feeder is not None:
            feeder.close()
        for tap_feeder in list(self.feeders.values()):
            if tap_feeder.source is obj:
                self.driver.schedule(0.0, partial(self._forget, tap_feeder.tap))
        for endpoint in self.links:
            is_source = endpoint.queue is obj or (isinstance(endpoint, TapLink) and endpoint.feeder.source is obj)
            if is_source and not endpoint.closed:
                # The replica hears why and retries until a queue of that name is back.
                endpoint.fail(NotFound(f"source queue {obj.name!r} was deleted"))

    def bound(self, binding: Binding) -> None:
        pass

    def unbound(self, binding: Binding) -> None:
        pass

    def describe(self) -> list[dict[str, Any]]:
        self.links = [e for e in self.links if not e.closed]
        served = [link.describe() for link in self.links]
        attached = {link.queue.name for link in self.links if isinstance(link, TapLink)}
        for name, feeder in self.feeders.items():
            if name not in attached:  # a replica that is away: its backlog grows
                served.append({"queue": feeder.source.name, "replica": None, "mode": "enqueue",
                               "state": "overflow" if feeder.overflowing else "disconnected",
                               "lag_messages": feeder.tap.depth,
                               "lag_seconds": feeder.arrivals.age(feeder.is_done),
                               "overflow": feeder.overflow})
        return served
