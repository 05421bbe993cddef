"""The HA node loop: a broker node in a cluster, its role governed by the state table.

Everything that changes the node's role goes through ``fire(event)``, which
asks ``states.next_status`` for the transition and performs its actions in
order.  An illegal transition is logged with both states and stops
replication and client service rather than going on in an undefined role.

Roles plug into the broker core through its hooks only: the admission hook
(a backup refuses clients, naming the primary or redirecting to it), the
Open frame's properties (the primary advertises every member in
``failover-server-list``, as ActiveMQ Artemis does), attach
hooks (the primary claims the backups' replication links; a backup refuses
admin writes to replicated objects), management guards and operations
(``PROMOTE``), and status/query extras.

This module drives promotion by an operator (``hastandby promote``), the
way Qpid is driven by a resource manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import structlog
from proton import Condition, Connection, Link, Terminus, int32, symbol

from hastandby.broker.errors import BrokerError, NotAllowed
from hastandby.broker.management import MUTATING, Deferred, Request
from hastandby.broker.outbound import Address
from hastandby.broker.queue import Queue
from hastandby.broker.registry import REPLICATE
from hastandby.broker.server import Refusal
from hastandby.browser.backup import BackupReplication
from hastandby.browser.primary import PrimaryReplication, backup_info
from hastandby.browser.protocol import ADMIN_PROPERTY
from hastandby.broker.authority import principal_of
from hastandby.client import Login, ManagementClient, ManagementError
from hastandby.node import Node, split_hostport

from .cluster import Leader, Store
from .coordinator import CoordinatorError, CoordinatorEvent
from .effects import perform
from .election import ElectionLoop
from .promotion import (
    AlreadyPrimary,
    ForceStart,
    HandOver,
    PromoteNow,
    Refuse,
    operator_term,
    plan_promotion,
)
from .supervised import lease_reporter
from .states import (
    Event,
    IllegalTransition,
    NodeStatus,
    State,
    initial_status,
    next_status,
)

if TYPE_CHECKING:
    from .etcd_client import EtcdSettings

log = structlog.get_logger("hastandby.ha")

# The Open frame's connection property that lists where a client may fail over to, as ActiveMQ Artemis
# sends it and Qpid JMS reads it (QPIDJMS-267): a list of maps shaped like the amqp:connection:redirect
# error's info, with symbol keys and string values (the port an int).
FAILOVER_SERVER_LIST = symbol("failover-server-list")


@dataclass
class HaConfig:
    """The cluster options of ``hastandby serve --ha-cluster``."""

    brokers: list[str] = field(default_factory=list)
    public_url: str | None = None
    backup_timeout: float = 10.0
    client_redirect: bool = False
    client_refusal: str = "abort"
    heartbeat: float = 2.0
    etcd: EtcdSettings | str | None = None  # endpoints, TLS, user (EtcdSettings), or plain endpoints
    cluster: str = "hastandby"
    lease_ttl: int = 2
    lease_margin: float = 0.5
    min_sync: int = 2  # with etcd: nodes that must hold a message before it is acknowledged (primary.py)


# Events whose refusal is an answer, not a broken role: an older primary's term
# (the backup refuses it), an election won too late (the key is given back).
_REFUSABLE = (Event.CONNECTED_TO_PRIMARY, Event.WON_ELECTION, Event.WON_ELECTION_NEW_CLUSTER)


class NotPromotable(BrokerError):
    condition = "amqp:precondition-failed"
    status = 409


class HaNode:
    """Turns a broker node into a cluster member."""

    def __init__(self, node: Node, config: HaConfig) -> None:
        self.node = node
        self.config = config
        self.status: NodeStatus = initial_status(clustered=True)
        self.halted: str | None = None
        self.admitting = False
        host, port = split_hostport(config.public_url or node.config.peer_address)
        self.url = f"{host}:{port}"
        self.addresses: list[Address] = [split_hostport(b) for b in config.brokers]
        self.members: list[dict[str, Any]] = []
        self.leader: Leader | None = None
        self.primary: PrimaryReplication | None = None
        self._expected_sync: frozenset[str] = frozenset()  # the sync members an election was won with
        # It holds data: its journal brought back a store of this cluster, or it has been past connecting.
        self._holds_data = node.journal is not None and node.journal.term > 0
        self.backup = BackupReplication(
            node.registry,
            node.driver,
            self._other_addresses,
            self._me,
            lambda: self.status.term,
            container_id=f"hastandby-{node.node_id}",
            heartbeat=config.heartbeat,
            on_connected=self._connected,
            on_members=self._members,
            on_lost=self._lost,
            memory=node.handler.memory,
            security=node.peer_security,
        )
        node.state = str(self.status.state)
        node.handler.admission = self._admit
        node.handler.open_properties = self._open_properties
        node.handler.attach_hooks.append(self._attach)
        node.management.guards.append(self._guard)
        node.management.register("PROMOTE", self._promote)
        node.management.query_extras["ha"] = self._describe
        node.status_extras.append(self._status)
        # Clients of a stopping cluster node should go straight to the next one.
        node.shutdown_refusal = Refusal(Condition("amqp:connection:forced", "node shutting down"),
                                        abort=config.client_refusal == "abort")
        node.on_start.append(self.backup.start)
        node.on_stop.append(lambda: self.fire(Event.STOP))
        self.on_serving: list[Callable[[bool], None]] = []  # told when client service starts or stops
        self.election: ElectionLoop | None = None
        node.handler.fenced_refusal = self._refusal
        if config.etcd:
            self.election = self._make_election(config)
            node.on_start.append(self.election.start)

    def _make_election(self, config: HaConfig) -> ElectionLoop:
        from .etcd_coordinator import EtcdCoordinator  # gRPC and etcd3 load only for a node with --etcd

        loop: ElectionLoop | None = None

        def notify(event: CoordinatorEvent) -> None:
            if loop is not None:
                loop.notify(event)

        coordinator = EtcdCoordinator(
            config.etcd or "", config.cluster, self.node.node_id, self.url, notify,
            lease_ttl=config.lease_ttl, lease_margin=config.lease_margin, fence=self.node.handler.fence,
            on_lease=lease_reporter(),
        )
        loop = ElectionLoop(self, coordinator)
        return loop

    @property
    def node_id(self) -> str:
        return self.node.node_id

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        self.node.call_soon_threadsafe(fn)

    def follow(self, leader: Leader) -> None:
        """etcd names the primary: replicate from it, and only from it."""
        if self.is_primary:
            return
        previous, self.leader = self.leader, leader
        log.info("leader from etcd", leader=leader.node_id, url=leader.url, term=leader.term)
        outbound = self.backup.outbound
        if outbound.connected and outbound.address == split_hostport(leader.url):
            return
        if previous != leader or not outbound.connected:
            outbound.redirect()

    # -- identity ------------------------------------------------------------------

    def _me(self) -> dict[str, Any]:
        return {"node_id": self.node.node_id, "url": self.url, "state": str(self.status.state)}

    def _other_addresses(self) -> list[Address]:
        """Where to look for the primary: etcd's leader if known, else the brokers URL."""
        listeners = [a for a in (self.node.config.listen, self.node.config.listen_tls) if a]
        own = {split_hostport(self.url), *(split_hostport(a) for a in listeners)}
        if self.leader is not None and self.leader.node_id != self.node.node_id:
            return [split_hostport(self.leader.url)]
        return [address for address in self.addresses if address not in own]

    @property
    def store(self) -> Store:
        """What this node says of its messages (cluster.Store), for a whole-cluster restart's election."""
        journal = self.node.journal
        return Store(journal is not None, self._holds_data)

    @property
    def sync_wanted(self) -> frozenset[str] | None:
        """The sync set this primary's replication wants in etcd (read by the election thread)."""
        primary = self.primary
        return primary.sync_wanted if primary is not None and self.election is not None else None

    def won(self, event: Event, term: int, expected: frozenset[str]) -> bool:
        """An election won with the sync set {this node} | ``expected``: guard for those."""
        self._expected_sync = expected
        return self.fire(event, term)

    def sync_confirmed(self, term: int, members: frozenset[str]) -> None:
        primary = self.primary
        if primary is not None and primary.term == term:
            primary.sync_confirmed(members)

    @property
    def is_primary(self) -> bool:
        return self.status.state is State.PRIMARY and self.halted is None

    # -- the state table ----------------------------------------------------------------

    def fire(self, event: Event, term: int | None = None) -> bool:
        """Apply ``event``; perform the transition's actions; False if it was illegal."""
        try:
            transition = next_status(self.status, event, term)
        except IllegalTransition as error:
            log.error("illegal transition", current=str(error.current), trigger=str(event),
                      target=str(error.target) if error.target else None, reason=error.reason)
            if event not in _REFUSABLE:
                self._halt(str(error))
            return False
        self.status = transition.status
        self.node.state = str(self.status.state)
        if self.status.state in (State.CATCHUP, State.BACKUP, State.PRIMARY):
            self._holds_data = True
        if self.node.journal is not None:
            self.node.journal.term_seen(self.status.term)
        if transition.changed:
            log.info("state change", previous=str(transition.previous), now=str(self.status), trigger=str(event))
        perform(transition.actions, self)
        return True

    # -- the table's actions (effects.RoleEffects); without etcd the last three have nothing to do ----------

    def exclude_clients(self) -> None:
        self._set_admitting(False)
        self._close_clients()

    def admit_clients(self) -> None:
        self._set_admitting(True)

    def stop_replication(self) -> None:
        self.backup.stop()

    def look_for_primary(self) -> None:
        self.backup.start()

    def start_guarding(self) -> None:
        self._become_primary()

    def stop_serving_backups(self) -> None:
        if self.primary is not None:
            self.primary.stop()
            self.primary = None

    def publish_status(self) -> None:
        if self.election is not None:
            self.election.wake()

    def resign(self) -> None:
        election, term = self.election, self.status.term
        if election is not None:
            election.request(lambda: election.coordinator.resign(term))

    def revoke_lease(self) -> None:
        if self.election is not None:
            self.election.stop(revoke=True)

    def _halt(self, reason: str) -> None:
        """Stop replication and client service: better no role than an undefined one."""
        self.halted = reason
        self.exclude_clients()
        self.stop_replication()
        self.stop_serving_backups()
        log.error("replication halted", reason=reason)

    def _set_admitting(self, admitting: bool) -> None:
        changed, self.admitting = admitting != self.admitting, admitting
        if changed:
            for fn in self.on_serving:
                fn(admitting)

    def _close_clients(self) -> None:
        refusal = self._refusal()
        for connection in list(self.node.handler.connections):
            if not self._is_admin(connection) and backup_info(connection) is None:
                self.node.handler.close_connection(connection, refusal)

    # -- backup side -----------------------------------------------------------------

    def _connected(self, term: int, hello: dict[str, Any]) -> None:
        primary = hello.get("primary") or {}
        if hello.get("replicate_default") != self.node.registry.default_replicate:
            log.warning("replication default differs from the primary's",
                        mine=self.node.registry.default_replicate, primary=hello.get("replicate_default"))
        if not self.fire(Event.CONNECTED_TO_PRIMARY, term):
            log.warning("refusing a primary with an older term", primary=primary.get("url"), term=term,
                        known_term=self.status.term)
            self.backup.primary = None
            self.backup.resync(f"primary term {term} is older than {self.status.term}")
            return
        log.info("following the primary", primary=primary.get("url"), term=term)

    def _members(self, term: int, members: list[dict[str, Any]]) -> None:
        # Checked where decoded (browser/protocol.py decode_members): a list of maps.
        self.members = [m for m in members if isinstance(m, dict)] if isinstance(members, list) else []
        members = self.members
        mine = next((m for m in members if m.get("node_id") == self.node.node_id), None)
        if mine is None:
            return
        if mine.get("state") == "ready":
            if self.status.state is State.CATCHUP:
                self.fire(Event.CAUGHT_UP)
        elif self.status.state is State.BACKUP and not mine.get("expected"):
            # The primary counts us as a new backup catching up: it dropped us
            # (heartbeat, backup timeout) or never expected us, and acknowledged
            # messages without us meanwhile.  We must not stay promotable until
            # we have them again (Qpid's ready -> catchup).
            log.warning("the primary does not count this node as ready: catching up again",
                        primary=(self.backup.primary or {}).get("url"), reported=mine.get("state"))
            self.fire(Event.DROPPED_BY_PRIMARY)

    def _lost(self, reason: str) -> None:
        if self.election is not None:
            self.election.wake()
        if self.status.state in (State.CATCHUP, State.BACKUP, State.CONNECTING):
            self.fire(Event.PRIMARY_LOST)

    # -- primary side ----------------------------------------------------------------------

    def _expected_backups(self) -> dict[str, str]:
        """node id -> url of the backups that may hold what was acknowledged before this promotion.

        With etcd: the other members of the sync set the election was won
        with.  Without: the backups the last primary reported ready.
        """
        if self.election is not None:
            snapshot = self.election.snapshot
            urls = {m.node_id: m.url for m in snapshot.members} if snapshot is not None else {}
            return {node_id: urls.get(node_id, "") for node_id in sorted(self._expected_sync)}
        return {
            str(m["node_id"]): str(m.get("url", ""))
            for m in self.members
            if m.get("state") == "ready" and m.get("node_id") != self.node.node_id
        }

    def _become_primary(self) -> None:
        election = self.election
        self.primary = PrimaryReplication(
            self.node.registry,
            self.node.driver,
            me={"node_id": self.node.node_id, "url": self.url},
            term=self.status.term,
            expected=self._expected_backups(),
            backup_timeout=self.config.backup_timeout,
            on_expected_done=self._expected_done,
            on_members=election.wake if election is not None else lambda: None,
            keeps_sync_set=election is not None,
            memory=self.node.handler.memory,
            min_sync=min(self.config.min_sync, len(self.addresses) or self.config.min_sync),
        )
        if not self.primary.recovering:
            self.node.schedule(0.0, lambda: self.fire(Event.EXPECTED_BACKUPS_READY))

    def _expected_done(self, timed_out: bool) -> None:
        self.fire(Event.EXPECTED_BACKUPS_TIMED_OUT if timed_out else Event.EXPECTED_BACKUPS_READY)

    def _promote(self, request: Request) -> tuple[int, Any] | Deferred:
        """``PROMOTE``: the plan is ``promotion.plan_promotion``'s; this carries it out."""
        plan = plan_promotion(self.status, self.halted, self.election is not None, bool(request.body.get("force")))
        if isinstance(plan, AlreadyPrimary):
            return 200, {"state": "primary", "message": "already primary"}
        if isinstance(plan, Refuse):
            raise NotPromotable(plan.reason)
        if isinstance(plan, ForceStart):
            return self._force_start()
        if isinstance(plan, HandOver):
            return self._hand_over()
        if isinstance(plan, PromoteNow):
            return self._promote_now(plan.event)
        return self._check_then_promote(plan.event)

    def _check_then_promote(self, event: Event) -> Deferred:
        """Ask the other nodes first, off the reactor thread (they may not answer for a while)."""
        reply = Deferred()

        def checked(_: Any, error: Exception | None) -> None:
            try:
                if isinstance(error, BrokerError):
                    raise error
                if error is not None:
                    raise NotPromotable(f"cannot check the other nodes: {error}")
                code, body = self._promote_now(event)
            except BrokerError as failure:
                reply.fail(failure)
                return
            reply.resolve(code, body)

        addresses, login = self._other_addresses(), self._peer_login()
        self.node.blocking.run(lambda: _check_fresh_cluster(addresses, login), checked)
        return reply

    def _promote_now(self, event: Event) -> tuple[int, Any]:
        term = operator_term(self.status, (int(m.get("term", 0) or 0) for m in self.members))
        if not self.fire(event, term):
            raise NotPromotable(f"cannot promote from {self.status}")
        log.info("promoted by operator", term=term)
        return 200, self._status()

    def _hand_over(self) -> tuple[int, Any]:
        """With etcd, promotion is a handover: the primary steps down, this node wins."""
        state = self.status.state
        election = self.election
        assert election is not None
        me = self.node.node_id
        election.request(lambda: election.coordinator.set_handover(me, ttl=10))
        return 202, {"state": str(state), "message": "handover requested; the primary steps down"}

    def _force_start(self) -> Deferred:
        """``promote --force``: a restarted cluster waits for a sync member that holds the latest store; the
        operator names this node instead.  The sync set becomes this node alone (only while there is no
        leader), so it may start the cluster; what only the absent members held is lost if they never return."""
        state = self.status.state
        election = self.election
        assert election is not None
        snapshot = election.snapshot
        absent = sorted(snapshot.sync.members - {m.node_id for m in snapshot.members}) \
            if snapshot is not None and snapshot.sync is not None else []
        reply = Deferred()

        def force() -> None:
            try:
                written = election.coordinator.force_sync()
            except CoordinatorError as error:
                refused = NotPromotable(f"etcd refused the forced start: {error}")
                self.node.driver.call_soon_threadsafe(lambda: reply.fail(refused))
                return
            if not written:
                self.node.driver.call_soon_threadsafe(
                    lambda: reply.fail(NotPromotable("the cluster has a leader already: nothing to force")))
                return
            risk = (f"messages that only {', '.join(absent)} held are lost if it does not come back first"
                    if absent else "no absent member was named in the sync set")
            self.node.driver.call_soon_threadsafe(lambda: reply.resolve(202, {
                "state": str(state), "message": f"forced: this node may start the cluster; {risk}"}))

        election.request(force)
        return reply

    def _peer_login(self) -> Login:
        config = self.node.config
        tls = config.tls
        return Login(config.peer_user, config.peer_password, str(tls.ca_file) if tls.ca_file else None,
                     str(tls.cert_file) if tls.cert_file else None, str(tls.key_file) if tls.key_file else None,
                     tls=config.peer_tls)

    # -- broker hooks --------------------------------------------------------------------------

    def _is_admin(self, connection: Connection) -> bool:
        """An admin connection (it may inspect a backup): it says so, and its user is an admin or a peer node."""
        try:
            properties = connection.remote_properties
        except Exception:  # noqa: BLE001 - proton fails on some legal maps (binary keys): not an admin's
            return False
        if not isinstance(properties, dict) or not properties.get(ADMIN_PROPERTY):
            return False
        principal, authority = principal_of(connection), self.node.authority
        return authority.is_admin(principal) or authority.is_cluster(principal)

    def _refusal(self) -> Refusal:
        """How a client is turned away: redirect (if asked and known), forced close, or abort (default)."""
        primary = (self.backup.primary or {}).get("url")
        me = f"node {self.url} is {self.status.state}"
        if self.config.client_redirect and primary:
            host, port = split_hostport(primary)
            info: dict[Any, Any] = {symbol("network-host"): host, symbol("port"): port, symbol("hostname"): host}
            return Refusal(Condition("amqp:connection:redirect", f"{me}; the primary is {primary}", info))
        where = f"; the primary is {primary}" if primary else "; the primary is not known yet"
        condition = Condition("amqp:connection:forced", f"{me}, not the primary{where}")
        return Refusal(condition, abort=self.config.client_refusal == "abort")

    def failover_list(self) -> list[dict[symbol, Any]]:
        """Every member's client address (the brokers URL, or etcd's members), in Artemis's form."""
        scheme = "amqps" if self.node.config.peer_tls else "amqp"  # the brokers URL names TLS listeners then
        entries = []
        for address in self._member_addresses():
            host, port = split_hostport(address)
            entries.append({symbol("network-host"): host, symbol("port"): int32(port),
                            symbol("scheme"): scheme, symbol("hostname"): host})
        return entries

    def _open_properties(self, connection: Connection) -> dict[symbol, Any] | None:
        """The primary's Open frame names every member, so that clients learn where to fail over to."""
        if not self.is_primary:
            return None
        return {FAILOVER_SERVER_LIST: self.failover_list()}

    def _admit(self, connection: Connection) -> Refusal | None:
        if self._is_admin(connection):
            return None
        info = backup_info(connection)
        if info is not None:
            principal = principal_of(connection)
            if not self.node.authority.is_cluster(principal):
                log.warning("denied", user=principal.user, action="act as a backup", object=self.url)
                return Refusal(Condition("amqp:unauthorized-access",
                                         f"user {principal.user!r} is not in group 'cluster': "
                                         "it may not act as a backup"))
            if info.get("node_id") == self.node.node_id:
                return Refusal(Condition("amqp:connection:forced", "a node does not replicate from itself"))
            if self.is_primary:
                return None
            return Refusal(Condition("amqp:connection:forced", f"node {self.url} is {self.status.state}, not the primary"))
        return None if self.admitting and self.is_primary else self._refusal()

    def _attach(self, link: Link) -> Any:
        if self.primary is not None:
            endpoint = self.primary.attach(link)
            if endpoint is not None:
                return endpoint
        if not self.is_primary and self._is_admin(link.connection):
            self._check_admin_link(link)
        return None

    def _check_admin_link(self, link: Link) -> None:
        """Admins may read a backup (browse, query); writes to replicated objects belong to the primary."""
        registry = self.node.registry
        if link.is_sender:
            source = link.remote_source
            if source.dynamic or source.distribution_mode == Terminus.DIST_MODE_COPY:
                return
            node = registry.lookup(source.address or "")
            if isinstance(node, Queue) and node.settings.replicate != "none":
                raise NotAllowed(f"{self.url} is a backup: consuming from replicated queue "
                                 f"{node.name!r} would change it; browse it instead")
            return
        address = link.remote_target.address or ""
        if address == "$management":
            return
        node = registry.lookup(address)
        if node is None or _level(node) != "none":
            raise NotAllowed(f"{self.url} is a backup: send to {address!r} on the primary")

    def _guard(self, request: Request) -> None:
        if self.is_primary or request.operation not in MUTATING:
            return
        registry = self.node.registry
        replicated = False
        if request.operation == "CREATE":
            level = request.arguments().get(REPLICATE, registry.default_replicate)
            replicated = level != "none"
        elif request.operation in ("DELETE", "PURGE"):
            node = registry.lookup(request.name)
            replicated = node is not None and _level(node) != "none"
        else:
            for name in (request.body.get("exchange"), request.body.get("queue")):
                node = registry.lookup(str(name or ""))
                replicated = replicated or (node is not None and _level(node) != "none")
        if replicated:
            raise NotAllowed(f"{self.url} is a backup ({self.status.state}): change replicated objects "
                             "on the primary")

    # -- reporting ----------------------------------------------------------------------------

    def _status(self) -> dict[str, Any]:
        primary = self.url if self.is_primary else (self.backup.primary or {}).get("url")
        return {
            "state": str(self.status.state),
            "detail": str(self.status.detail) if self.status.detail else None,
            "term": self.status.term,
            "primary": self._reachable(primary) if primary else None,
            "brokers": [self._reachable(a) for a in self._member_addresses()],
            "halted": self.halted,
            "etcd": str(self.config.etcd) if self.config.etcd else None,  # the endpoints
        }

    def _reachable(self, address: str) -> str:
        """A member's HOST:PORT as tools must dial it: ``amqps://`` when the members speak TLS."""
        return f"amqps://{address}" if self.node.config.peer_tls else address

    def _member_addresses(self) -> list[str]:
        """Every member's HOST:PORT: the brokers URL, or etcd's member keys without one."""
        if self.addresses:
            return [f"{h}:{p}" for h, p in self.addresses]
        snapshot = self.election.snapshot if self.election is not None else None
        members = snapshot.members if snapshot is not None else ()
        return sorted({m.url for m in members} | {self.url})

    def _describe(self) -> dict[str, Any]:
        members = self.primary.members() if self.primary is not None else self.members
        return {
            "state": str(self.status.state),
            "term": self.status.term,
            "members": [dict(m, url=self._reachable(str(m.get("url", "")))) for m in members],
            "lag": self.primary.lag() if self.primary is not None else {},
            "lag_seconds": self.primary.lag_seconds() if self.primary is not None else {},
            "acks_held": self.primary.acks_held() if self.primary is not None else {"backups": {}, "quorum": {}},
        }



FRESH_CHECK_TIMEOUT = 5.0
"""Seconds another node has to answer before a connecting node's promotion is refused: off the
reactor thread it may be generous (under load, 1 s made a busy backup look hung)."""


def _check_fresh_cluster(addresses: list[Address], login: Login) -> None:
    """A connecting node may only be promoted if no reachable node is past connecting (blocking: a worker thread)."""
    unknown = []
    for host, port in addresses:
        try:
            with ManagementClient(f"{host}:{port}", timeout=FRESH_CHECK_TIMEOUT, login=login) as client:
                state = client.request("STATUS").get("state")
        except ManagementError as error:
            if not error.unreachable:
                # Something is there but could not be asked (TLS, credentials, a hung node): it may be a primary.
                unknown.append(f"{host}:{port} ({error})")
            continue  # nothing listens there: that node holds nothing we could lose
        if state != "connecting":
            raise NotPromotable(f"{host}:{port} is {state}: promote a backup, not a connecting node")
    if unknown:
        raise NotPromotable(f"cannot tell what {', '.join(unknown)} is: stop it, or promote a backup")


def _level(node: Any) -> str:
    return node.settings.replicate if isinstance(node, Queue) else node.replicate
