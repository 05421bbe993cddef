"""Primary side of hot standby: the primary's role, which *is* its replication (Qpid's Primary).

One ``RemoteBackup`` per known backup (Qpid's RemoteBackup) holds its guards
and tracks its catch-up; ``PrimaryRole`` claims the backup's links
(the wiring link and one replicating browser per queue), guards every new
replicated queue for every known backup from birth, and keeps the
membership every backup is told about.

After a failover the new primary *expects* the backups that were ready
before (with etcd: the live members of the sync set it won with): it guards
every replicated queue for them before admitting clients, so nothing a
producer is told ``accepted`` can be missing from them, and it stays
``recovering`` until they are back and ready, or ``backup_timeout`` passes
for one that does not reconnect.

With etcd the primary also keeps the *sync set* (``election/cluster.py``):
the backups that hold every acknowledged message, the only ones that may be
elected.  ``sync_wanted`` is what it should be: this node, the expected
backups and the ready ones.  A backup in it that goes away (its connection
drops, or an expected one never comes) is *leaving*: its guards keep holding
producers' acknowledgements until etcd confirms the sync set without it
(``sync_confirmed``); only then may the primary acknowledge without it.  The
round trip through the election thread is ``election/sync_request.py``'s.
Otherwise a backup cut off from the primary but not from etcd would stay
electable while lacking what was acknowledged meanwhile.  Without etcd
(manual promotion) a departed backup's guards are released at once, as in Qpid.

``min_sync`` (Kafka's ``min.insync.replicas``): nothing is acknowledged unless
at least that many nodes, this one included, hold it.  A departing backup is
kept in the sync set (and its guards keep holding) while fewer would remain,
and while the set etcd holds is smaller than that (a new cluster, a
promotion whose other members were gone) a *quorum guard* on every
replicated queue holds each new message until a set large enough is
confirmed.  A primary cut off from its backups then stops acknowledging
instead of acknowledging alone, and a backup that holds everything stays
electable for when the primary dies.

A backup whose journal cannot write leaves at once and says so: it closes
its connection with ``hastandby:store-failed`` and the reason
(``BackupRole.cannot_store``).  It departs as above, and the primary
acknowledges without it as soon as etcd has the sync set without it.  When
``min_sync`` keeps it in the sync set instead (too few others), nothing can be
acknowledged until it is back and caught up, and waiting would hold
producers for as long as its disk is broken: the primary *refuses* instead
(Kafka's ``NotEnoughReplicas``), naming the backup and why.  What its guards
held fails (each producer hears ``amqp:resource-limit-exceeded`` and the
message leaves the queues: it was never acknowledged), and new messages for
replicated queues are refused before routing, until it is ready again.
"""

from __future__ import annotations

from typing import Any, Callable

import structlog
from proton import Condition, Connection, Link

from hastandby.broker.admission.authority import Authority
from hastandby.broker.transport.driver import Driver, Timer
from hastandby.broker.queues import lineage
from hastandby.broker.errors import InvalidArgument, NotFound, ResourceLimitExceeded
from hastandby.broker.queues.exchange import Binding
from hastandby.broker.links import pn_delivery_settle, send_settled
from hastandby.broker.admission.memory import MemoryAlarm
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Node, Registry
from hastandby.broker.message.values import plain
from hastandby.lifecycle.states import State
from hastandby.election.sync_request import SyncRequest
from hastandby.ha.access_replica import AccessPublisher
from hastandby.ha.backup import BackupRole
from hastandby.ha.config_publisher import WiringPublisher

from hastandby.replication.guard import QueueGuard
from hastandby.replication.codec import (
    BACKUP_PROPERTY,
    STORE_FAILED,
    ProtocolError,
    encode_control,
    link_properties,
)
from hastandby.replication.control import ControlReceiver
from hastandby.ha.protocol import (
    BrowserReply,
    Hello,
    MembersUpdate,
    PeerMember,
    REPLICATE_PROPERTY,
    STATUS_ADDRESS,
    WIRING_ADDRESS,
    decode_browser_request,
    decode_status,
)
from hastandby.replication.subscription import ReplicatingSubscription

log = structlog.get_logger("hastandby.primary")


def backup_info(connection: Connection) -> dict[str, Any] | None:
    """The ``qpid.ha-backup`` connection property of a backup's connection, if any."""
    try:
        properties = connection.remote_properties
    except Exception:  # noqa: BLE001 - proton fails on some legal maps (binary keys): not a backup's
        return None
    if not isinstance(properties, dict):
        return None
    info = properties.get(BACKUP_PROPERTY)
    return plain(info) if isinstance(info, dict) else None


class WiringLink:
    """The sender of the wiring stream to one backup: hello, snapshot, events, members."""

    def __init__(self, link: Link, replication: "PrimaryRole", backup: "RemoteBackup") -> None:
        self.link = link
        self._impl = link._impl
        self.replication = replication
        self.backup = backup
        self.publisher: WiringPublisher | None = None
        self.access: AccessPublisher | None = None
        self.closed = False
        self._seq = 0

    def start(self) -> None:
        self.send(self.replication.hello())
        if self.replication.authority is not None:
            self.access = AccessPublisher(self.replication.authority, self.send)
        self.publisher = WiringPublisher(self.replication.registry, self.send)

    def send(self, body: dict[str, Any]) -> None:
        if self.closed:
            return
        data = encode_control(body)
        impl = self._impl
        self._seq += 1
        send_settled(impl, b"w%d" % self._seq, data)

    def on_delivery(self, delivery: Any) -> None:
        pn_delivery_settle(delivery)

    def flow(self) -> None:
        pass

    def fail(self, error: Exception) -> None:
        self.close()
        self.link.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.publisher is not None:
            self.publisher.close()
        if self.access is not None:
            self.access.close()
        try:
            condition = self.link.connection.remote_condition
        except Exception:  # noqa: BLE001 - a connection already freed says nothing
            condition = None
        self.replication.disconnected(self.backup, self, condition)


class StatusReceiver(ControlReceiver):
    """A backup's status link (a control link): its memory alarm, which holds this primary's producers too
    (memory.py)."""

    def __init__(self, link: Link, memory: MemoryAlarm, node_id: str) -> None:
        super().__init__(link, self._status, log.bind(backup=node_id), "backup status refused")
        self.memory = memory
        self.node_id = node_id

    def _status(self, body: dict[str, Any]) -> None:
        self.memory.set_remote(self.node_id, decode_status(body))

    def close(self) -> None:
        super().close()
        self.memory.set_remote(self.node_id, None)


class RemoteBackup:
    """What the primary knows of one backup."""

    def __init__(self, node_id: str, url: str, expected: bool) -> None:
        self.node_id = node_id
        self.url = url
        self.expected = expected
        # Where it stands with this primary, as it says itself (the members list names these "catchup", "ready"):
        # CATCHUP, connected or expected but not yet holding every replicated queue; BACKUP, holding every one
        # (it may be elected).
        self.state = State.CATCHUP
        self.connected = False
        self.wiring: WiringLink | None = None
        # One guard per replicated queue, for as long as this backup is known:
        # made at queue creation, at promotion or at subscribe, and kept across
        # its browsers (a browser that re-attaches must not release what it held).
        self.guards: dict[str, QueueGuard] = {}
        self.catchup: set[str] = set()
        self.subscriptions: dict[str, ReplicatingSubscription] = {}

    def guard(self, queue: Queue) -> QueueGuard:
        """This backup's guard on ``queue``, made now if there is none (or only one of a deleted namesake)."""
        guard = self.guards.get(queue.name)
        if guard is None or guard.queue is not queue:
            if guard is not None:
                guard.cancel()
            guard = self.guards[queue.name] = QueueGuard(queue)
        return guard

    def close_subscriptions(self) -> None:
        """Its connection is gone: stop its browsers, keep holding what its guards hold."""
        for subscription in list(self.subscriptions.values()):
            subscription.close()
        self.subscriptions.clear()

    def cancel(self) -> None:
        """Forget this backup: its guards release everything they hold."""
        self.close_subscriptions()
        for guard in self.guards.values():
            guard.cancel()
        self.guards.clear()

    def member(self) -> PeerMember:
        # ``expected`` tells a backup in catch-up whether it may stay ``backup``
        # (ready): a new primary guarded every message for the backups it
        # expects, so nothing acknowledged is missing from them; any other
        # backup in catch-up may lack acknowledged messages.
        return PeerMember.of(self.node_id, self.url, self.state, connected=self.connected, expected=self.expected)


class PrimaryRole:
    """Everything a primary does for its backups: it holds them and their guards, and follows nobody.

    Contract: lives on the reactor thread.  ``HaNode`` makes calls on it (``step_down`` is the table's
    ``stop_serving_backups``), as do the broker (``attach``), the registry (as an observer) and the backups'
    links; it calls the node back only through ``on_expected_done`` and ``on_members``, and wants its sync set
    through ``sync`` (``SyncRequest``), whose confirmation comes back on this thread.  ``backup_role`` is the
    role it came from, which it goes back to when it steps down.
    """

    def __init__(
        self,
        registry: Registry,
        driver: Driver,
        backup_role: BackupRole,
        me: dict[str, Any],
        term: int,
        expected: dict[str, str],
        backup_timeout: float,
        on_expected_done: Callable[[bool], None],
        on_members: Callable[[], None] = lambda: None,
        sync: SyncRequest | None = None,
        memory: MemoryAlarm | None = None,
        min_sync: int = 1,
        authority: Authority | None = None,
    ) -> None:
        self.registry = registry
        self.authority = authority  # users and rules, replicated as cluster state (ha/access_replica.py)
        self.driver = driver
        self.me = me
        self.term = term
        self.backup_timeout = backup_timeout
        self.on_expected_done = on_expected_done
        self.on_members = on_members
        self.backup_role = backup_role  # the role it came from, and goes back to when it steps down
        self.sync = sync  # with etcd: the sync set it wants there (sync_request.py); None: it keeps none
        self.keeps_sync_set = sync is not None
        self.min_sync = min_sync if self.keeps_sync_set else 1
        # While the confirmed sync set is smaller than min_sync: queue name -> the guard holding new messages.
        self._quorum_guards: dict[str, QueueGuard] | None = None
        self.memory = memory or MemoryAlarm(high=2**62)
        self.backups: dict[str, RemoteBackup] = {}
        self.leaving: dict[str, RemoteBackup] = {}  # out of sync_wanted, holding until etcd confirms
        self.sync_wanted: frozenset[str] = frozenset()  # rebound whole: the election thread reads it
        self.not_storing: dict[str, str] = {}  # backups that left because their journal cannot write: why
        self.refusing: str | None = None  # why replicated messages are refused (min_sync cannot be met)
        self._timeout_timer: Timer | None = None
        self.recovering = bool(expected)
        for queue in self._replicated_queues():
            self._claim(queue)
        for node_id, url in expected.items():
            remote = RemoteBackup(node_id, url, expected=True)
            for queue in self._replicated_queues():
                remote.guard(queue)
            self.backups[node_id] = remote
        self._update_sync_wanted()
        if len(self.sync_wanted) < self.min_sync:
            self._hold_for_quorum()
        registry.observers.append(self)
        if expected:
            self._timeout_timer = driver.schedule(backup_timeout, self._timeout_expected)
            log.info("guarding for expected backups", backups=sorted(expected), timeout=backup_timeout)

    def _claim(self, queue: Queue) -> None:
        """Ids this primary gives out from now on are of its epoch (``broker/queues/lineage.py``)."""
        queue.lineage = lineage.extended(queue.lineage, lineage.Epoch(self.term, self.me["node_id"], queue.next_id))

    def _replicated_queues(self) -> list[Queue]:
        return [q for q in self.registry.queues.values() if q.settings.replicate == "all"]

    # -- the role (Role in roles.py) ------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """QUERY's replication figures: the backups' lag, held acknowledgements, and those that cannot store."""
        return {"lag": self.lag(), "lag_seconds": self.lag_seconds(), "acks_held": self.acks_held(),
                "not_storing": dict(self.not_storing)}

    @property
    def primary_url(self) -> str | None:
        return None  # it is the primary: it follows none

    def promote(self, serve: Callable[[BackupRole], PrimaryRole]) -> PrimaryRole:
        return self  # promoting a primary is ignored, as in Qpid

    def step_down(self) -> BackupRole:
        """``stop_serving_backups``: stop serving, and be the backup this node was again."""
        self.stop()
        return self.backup_role

    def stop(self) -> None:
        """Stepping down: stop guarding and serving backups, and want no sync set any more."""
        sync, self.sync = self.sync, None
        if sync is not None:
            sync.withdraw()
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()
        if self in self.registry.observers:
            self.registry.observers.remove(self)
        if self._admit in self.registry.admission_checks:
            self.registry.admission_checks.remove(self._admit)
        self.refusing = None
        self._release_quorum_hold()
        for backup in [*self.backups.values(), *self.leaving.values()]:
            backup.cancel()
            if backup.wiring is not None:
                backup.wiring.closed = True
                backup.wiring.link.connection.close()
        self.backups.clear()
        self.leaving.clear()

    # -- membership -------------------------------------------------------------------

    def members(self) -> list[PeerMember]:
        """This primary and its backups, as the wiring link (``to_wire``) and QUERY tell them."""
        me = PeerMember.of(str(self.me["node_id"]), str(self.me.get("url", "")), State.PRIMARY)
        return [me] + [b.member() for b in self.backups.values()]

    def hello(self) -> dict[str, Any]:
        """The first map on a backup's wiring link (``protocol.Hello``)."""
        me = PeerMember(str(self.me["node_id"]), str(self.me.get("url", "")))
        return Hello(me, self.term, self.registry.default_replicate, self.members()).to_wire()

    def _broadcast_members(self) -> None:
        self._update_sync_wanted()
        body = MembersUpdate(self.term, self.members()).to_wire()
        for backup in self.backups.values():
            if backup.wiring is not None:
                backup.wiring.send(body)
        self.on_members()

    # -- the sync set ---------------------------------------------------------------------

    def _update_sync_wanted(self) -> None:
        """This node, the expected backups and the ready ones: those that hold everything acknowledged.

        Backups on their way out stay in it while fewer than ``min_sync`` nodes would remain.
        """
        wanted = frozenset({str(self.me["node_id"])}) | {
            b.node_id for b in self.backups.values() if b.expected or b.state is State.BACKUP}
        if len(wanted) < self.min_sync:
            wanted |= frozenset(self.leaving)
        if wanted != self.sync_wanted:
            self.sync_wanted = wanted
            if self.sync is not None:
                self.sync.want(self.term, wanted, self.sync_confirmed)  # sync_request.py, step 1

    def _hold_for_quorum(self) -> None:
        """Hold every new replicated message until a sync set of ``min_sync`` nodes is confirmed."""
        if self._quorum_guards is None:
            log.warning("fewer than min_sync nodes hold every message: acknowledgements wait",
                        min_sync=self.min_sync)
            self._quorum_guards = {q.name: QueueGuard(q) for q in self._replicated_queues()}

    def _release_quorum_hold(self) -> None:
        guards, self._quorum_guards = self._quorum_guards, None
        if guards is not None:
            log.info("min_sync nodes hold every message again: acknowledgements flow")
            for guard in guards.values():
                guard.cancel()

    def _depart(self, backup: RemoteBackup) -> None:
        """``backup`` is gone (disconnected, or an expected one that never came).

        If it may be in the sync set, its guards hold on until etcd has the
        set without it; otherwise they release now.
        """
        if self.backups.get(backup.node_id) is backup:
            del self.backups[backup.node_id]
        if self.keeps_sync_set and backup.node_id in self.sync_wanted:
            backup.close_subscriptions()
            previous = self.leaving.pop(backup.node_id, None)
            if previous is not None:  # an older departure: this one caught up past it since
                previous.cancel()
            self.leaving[backup.node_id] = backup
            log.info("backup leaving the sync set: holding its messages until etcd confirms",
                     backup=backup.node_id)
        else:
            backup.cancel()

    def sync_confirmed(self, members: frozenset[str]) -> None:
        """etcd holds ``members`` as the sync set: leaving backups outside it let go; the quorum hold follows its size."""
        if len(members) >= self.min_sync:
            self._release_quorum_hold()
        else:
            self._hold_for_quorum()
        for node_id, backup in list(self.leaving.items()):
            if node_id not in members:
                del self.leaving[node_id]
                backup.cancel()
                log.info("backup out of the sync set: no longer waiting for it", backup=node_id)
        self._check_storing()

    # -- backups that cannot store -------------------------------------------------------

    def _check_storing(self) -> None:
        """Refuse replicated messages while ``min_sync`` keeps a backup that cannot store in the sync set (one
        that merely leaves it, as etcd confirms the set without it, is acknowledged without)."""
        stuck = sorted(node_id for node_id in self.not_storing if node_id in self.leaving
                       and node_id in self.sync_wanted)
        if stuck and self.refusing is None:
            self.refusing = (f"fewer than min_sync ({self.min_sync}) nodes can store messages: "
                             + "; ".join(f"backup {node_id}: {self.not_storing[node_id]}" for node_id in stuck))
            log.error("replicated messages are refused until the backup is back and caught up", reason=self.refusing,
                      min_sync=self.min_sync, backups=stuck)
            self.registry.admission_checks.append(self._admit)
            failure = ResourceLimitExceeded(f"message not taken: {self.refusing}")
            for node_id in stuck:
                for guard in self.leaving[node_id].guards.values():
                    guard.fail(failure)
        elif not stuck and self.refusing is not None:
            log.info("replicated messages are taken again: min_sync nodes can store them", min_sync=self.min_sync)
            self.refusing = None
            if self._admit in self.registry.admission_checks:
                self.registry.admission_checks.remove(self._admit)

    def _admit(self, targets: list[Queue], data: bytes) -> None:
        """Before routing, while refusing: a message for a replicated queue is refused at once, with why."""
        if self.refusing is not None and any(q.settings.replicate == "all" for q in targets):
            raise ResourceLimitExceeded(self.refusing)

    # -- links from backups -------------------------------------------------------------

    def attach(self, link: Link) -> Any:
        """Claim a backup's wiring link, replicating browser or status link; None for anything else."""
        info = backup_info(link.connection)
        if not link.is_sender:
            if info is not None and link.remote_target.address == STATUS_ADDRESS:
                return StatusReceiver(link, self.memory, str(info.get("node_id", "")))
            return None
        try:
            properties = link_properties(lambda: link.remote_properties, "link properties")
        except ProtocolError as error:
            raise InvalidArgument(str(error)) from None
        address = link.remote_source.address
        if info is None:
            if properties.get(str(REPLICATE_PROPERTY)) or address == WIRING_ADDRESS:
                raise InvalidArgument("replication links need a backup connection (qpid.ha-backup)")
            return None
        backup = self._backup(info)
        if address == WIRING_ADDRESS:
            return self._attach_wiring(link, backup)
        if properties.get(str(REPLICATE_PROPERTY)):
            return self._attach_browser(link, backup, properties)
        return None

    def _backup(self, info: dict[str, Any]) -> RemoteBackup:
        node_id = str(info.get("node_id", ""))
        if not node_id:
            raise InvalidArgument("qpid.ha-backup needs a node_id")
        url = str(info.get("url", ""))
        backup = self.backups.get(node_id)
        if backup is None:
            backup = self._expected_at(url)
            if backup is not None:
                # The expected backup's process was restarted (without --data-dir
                # a node gets a new id each start).  Same address, same member:
                # it takes over the guards made for it, which hold everything
                # acknowledged since the promotion until it has it, as a
                # restarted Qpid broker keeps its system id.
                log.info("expected backup is back with a new node id", backup=node_id,
                         was=backup.node_id, url=url)
                del self.backups[backup.node_id]
                backup.node_id = node_id
            else:
                backup = RemoteBackup(node_id, url, expected=False)
            self.backups[node_id] = backup
        return backup

    def _expected_at(self, url: str) -> RemoteBackup | None:
        """The expected backup at ``url`` that has not reconnected yet, if any."""
        if not url:
            return None
        return next((b for b in self.backups.values() if b.expected and not b.connected and b.url == url), None)

    def _attach_wiring(self, link: Link, backup: RemoteBackup) -> WiringLink:
        if backup.wiring is not None:  # a reconnect before we saw the old one go
            # The old connection goes whole: its browsers would go on taking
            # the backup's messages into a connection nobody reads.  Closing
            # the wiring forgets that RemoteBackup (see ``disconnected``): go on
            # with a fresh one that is in ``self.backups``, or this connection
            # and its browsers (which look the backup up again) would use two
            # different objects, and the backup would never become ready.
            old = backup.wiring
            log.info("backup reconnected: its old connection is closed", backup=backup.node_id)
            old.close()
            transport = old.link.connection.transport
            if transport is not None:
                transport.close_tail()
                transport.close_head()
            backup = self._backup({"node_id": backup.node_id, "url": backup.url})
        backup.connected = True
        backup.state = State.CATCHUP
        if self.not_storing.pop(backup.node_id, None) is not None:
            log.info("backup that could not store is back: it catches up", backup=backup.node_id)
        backup.catchup = {q.name for q in self._replicated_queues()}
        wiring = WiringLink(link, self, backup)
        backup.wiring = wiring
        log.info("backup connected", backup=backup.node_id, url=backup.url, queues=len(backup.catchup))
        self.driver.schedule(0.0, self._broadcast_members)
        if not backup.catchup:
            self.driver.schedule(0.0, lambda: self._check_ready(backup))
        return wiring

    def _attach_browser(self, link: Link, backup: RemoteBackup, properties: dict[str, Any]) -> ReplicatingSubscription:
        try:
            request = decode_browser_request(properties)
        except ProtocolError as error:
            raise InvalidArgument(str(error)) from None
        term = request.term
        if term > self.term:
            raise InvalidArgument(f"backup follows term {term}, this primary has the older term {self.term}")
        name = link.remote_source.address or ""
        queue = self.registry.queues.get(name)
        if queue is None:
            raise NotFound(f"no such queue: {name!r}")
        if queue.settings.replicate != "all":
            raise InvalidArgument(f"queue {name!r} is not replicated (qpid.replicate={queue.settings.replicate})")
        backup_ids, backup_lineage = request.ids, request.lineage
        old = backup.subscriptions.pop(name, None)
        if old is not None:
            old.close()  # its guard is the backup's, and holds on for the new browser
        # The backup drops its copy from this point on when it reads our lineage.
        point = lineage.divergence(backup_lineage, queue.lineage)
        link.properties = BrowserReply(queue.lineage).to_wire()
        replaced = len(backup_ids) - len(backup_ids.below(point))
        if replaced:
            log.info("backup holds messages of another lineage: they are replaced", backup=backup.node_id,
                     queue=name, from_id=point, messages=replaced, backup_lineage=lineage.describe(backup_lineage),
                     lineage=lineage.describe(queue.lineage))
        subscription = ReplicatingSubscription(
            link, queue, self.registry, self.driver, backup.guard(queue), backup_ids,
            on_ready=lambda sub: self._queue_ready(backup, sub), trusted_below=point, owns_guard=False,
        )
        backup.subscriptions[name] = subscription
        return subscription

    def _queue_ready(self, backup: RemoteBackup, subscription: ReplicatingSubscription) -> None:
        backup.catchup.discard(subscription.queue.name)
        self._check_ready(backup)

    def _check_ready(self, backup: RemoteBackup) -> None:
        if backup.state is State.BACKUP or not backup.connected or backup.catchup:
            return
        backup.state = State.BACKUP
        log.info("backup ready", backup=backup.node_id)
        earlier = self.leaving.pop(backup.node_id, None)
        if earlier is not None:  # its last connection's guards: this one has all they held now
            earlier.cancel()
        self._broadcast_members()
        self._check_expected()
        self._check_storing()

    def disconnected(self, backup: RemoteBackup, wiring: WiringLink, condition: Condition | None = None) -> None:
        """The backup's connection is gone (``condition``: what its close said): release what it held up."""
        if backup.wiring is not wiring:
            return
        backup.wiring = None
        backup.connected = False
        if condition is not None and condition.name == STORE_FAILED:
            self.not_storing[backup.node_id] = str(condition.description or "its journal cannot write")
            log.warning("backup cannot store: it leaves the ready and sync sets", backup=backup.node_id,
                        reason=self.not_storing[backup.node_id])
        else:
            log.info("backup disconnected", backup=backup.node_id)
        self._depart(backup)
        self._broadcast_members()
        self._check_expected()
        self._check_storing()

    # -- expected backups -----------------------------------------------------------------

    def _check_expected(self) -> None:
        if not self.recovering:
            return
        waiting = [b for b in self.backups.values() if b.expected and b.state is not State.BACKUP]
        if not waiting:
            self._finish_recovery(timed_out=False)

    def _timeout_expected(self) -> None:
        """Drop expected backups that have not even connected (connected ones may go on)."""
        self._timeout_timer = None
        for backup in list(self.backups.values()):
            if backup.expected and not backup.connected:
                log.warning("expected backup did not reconnect in time", backup=backup.node_id)
                self._depart(backup)
        self._broadcast_members()
        if self.recovering and not any(b.expected and b.state is not State.BACKUP for b in self.backups.values()):
            self._finish_recovery(timed_out=True)

    def _finish_recovery(self, timed_out: bool) -> None:
        self.recovering = False
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()
            self._timeout_timer = None
        self.on_expected_done(timed_out)

    # -- RegistryObserver: new replicated queues are guarded from birth --------------------

    def created(self, obj: Node) -> None:
        if isinstance(obj, Queue) and obj.settings.replicate == "all":
            self._claim(obj)
            for backup in self.backups.values():
                backup.guard(obj)
            if self._quorum_guards is not None:
                self._quorum_guards[obj.name] = QueueGuard(obj)

    def deleted(self, obj: Node) -> None:
        if isinstance(obj, Queue):
            if self._quorum_guards is not None and obj.name in self._quorum_guards:
                self._quorum_guards.pop(obj.name).cancel()
            for backup in self.backups.values():
                guard = backup.guards.pop(obj.name, None)
                if guard is not None:
                    guard.cancel()
                backup.catchup.discard(obj.name)
                self._check_ready(backup)

    def bound(self, binding: Binding) -> None:
        pass

    def unbound(self, binding: Binding) -> None:
        pass

    # -- reporting -------------------------------------------------------------------------

    def lag(self) -> dict[str, dict[str, int]]:
        """Per replicated queue and backup: messages not yet acknowledged by that backup."""
        result: dict[str, dict[str, int]] = {}
        for backup in self.backups.values():
            for name, guard in backup.guards.items():
                subscription = backup.subscriptions.get(name)
                lag = subscription.lag if subscription is not None else guard.queue.depth
                result.setdefault(name, {})[backup.node_id] = lag
        return result

    def lag_seconds(self) -> dict[str, dict[str, float]]:
        """Per replicated queue and attached backup: seconds since the oldest message that backup
        has not acknowledged arrived (0.0: it has them all).  A backup without a browser on the
        queue (disconnected, or not subscribed yet) is left out: its ``lag`` is the whole queue."""
        result: dict[str, dict[str, float]] = {}
        for backup in self.backups.values():
            for name, subscription in backup.subscriptions.items():
                result.setdefault(name, {})[backup.node_id] = subscription.lag_seconds
        return result

    def acks_held(self) -> dict[str, Any]:
        """Producer acknowledgements held back now: per replicated queue and backup, what that
        backup's guard holds (a leaving backup's guards included, see ``_depart``), and per queue
        what the quorum hold holds while the sync set is smaller than ``min_sync``."""
        backups: dict[str, dict[str, int]] = {}
        for backup in [*self.backups.values(), *self.leaving.values()]:
            for name, guard in backup.guards.items():
                per_queue = backups.setdefault(name, {})
                per_queue[backup.node_id] = per_queue.get(backup.node_id, 0) + guard.pending
        quorum = {name: guard.pending for name, guard in (self._quorum_guards or {}).items()}
        return {"backups": backups, "quorum": quorum, "waiting_for": self._waiting_for(),
                "refusing": self.refusing}

    def _waiting_for(self) -> str | None:
        """Why acknowledgements are held now beyond a backup's usual round trip (None: they are not)."""
        reasons = [f"backup {node_id} left ({self.not_storing.get(node_id, 'disconnected')}): held until etcd has "
                   f"the sync set without it" + (f", or it is back (min_sync {self.min_sync})"
                                                  if node_id in self.sync_wanted else "")
                   for node_id in sorted(self.leaving)]
        if self._quorum_guards is not None:
            reasons.append(f"fewer than min_sync ({self.min_sync}) nodes hold every message: held until a sync "
                           "set that large is confirmed")
        return "; ".join(reasons) or None
