"""The HA node loop: a broker node in a cluster, its role governed by the state table.

Everything that changes the node's role goes through ``fire(event)``, which
asks ``states.next_status`` for the transition and has ``effects.perform``
carry out its actions, each one a method of this class.  An illegal
transition is logged with both states and stops replication and client
service rather than going on in an undefined role.

Roles plug into the broker core through its hooks only, each concern in a
class of its own: ``admission.ClientAdmission`` (who may connect, how the
others are refused or redirected, the failover list in the Open frame),
``cluster_management.ClusterManagement`` (``PROMOTE``, a backup's guard on
replicated objects, the ``ha`` status), and the role object (``roles.py``:
``BackupRole`` or ``PrimaryRole``, with the attach hook and the replication of
its side, ``primary.py`` and ``backup.py``), which the table's actions swap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import structlog
from proton import Condition, Link

from hastandby.broker.transport.address import Address
from hastandby.broker.server import Refusal
from hastandby.ha.backup import BackupReplication
from hastandby.ha.primary import PrimaryReplication
from hastandby.ha.protocol import BackupIdentity, Hello, PeerMember
from hastandby.broker.transport.address import split_hostport
from hastandby.node import Node
from hastandby.ha.access_replica import AccessReplica

from hastandby.election.cluster import Leader, Store
from hastandby.election.coordinator import LEASE_MARGIN, LEASE_TTL, CoordinatorEvent
from hastandby.ha.admission import ClientAdmission
from hastandby.ha.cluster_management import ClusterManagement
from hastandby.lifecycle.effects import perform
from hastandby.election.loop import ElectionLoop
from hastandby.host.role_hooks import HALTED, role_name
from hastandby.ha.roles import BackupRole, Role
from hastandby.host.supervised import lease_reporter
from hastandby.lifecycle.states import (
    Event,
    IllegalTransition,
    NodeStatus,
    State,
    initial_status,
    next_status,
)

if TYPE_CHECKING:
    from hastandby.election.etcd_client import EtcdSettings

log = structlog.get_logger("hastandby.ha")


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
    lease_ttl: int = LEASE_TTL
    lease_margin: float = LEASE_MARGIN
    min_sync: int = 2  # with etcd: nodes that must hold a message before it is acknowledged (primary.py)


# Events whose refusal is an answer, not a broken role: an older primary's term
# (the backup refuses it), an election won too late (the key is given back).
_REFUSABLE = (Event.CONNECTED_TO_PRIMARY, Event.WON_ELECTION, Event.WON_ELECTION_NEW_CLUSTER)


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
        self.leader: Leader | None = None
        self._expected_sync: frozenset[str] = frozenset()  # the sync members an election was won with
        # It holds data: its journal brought back a store of this cluster, or it has been past connecting.
        self._holds_data = node.journal is not None and node.journal.term > 0
        self._backup = BackupReplication(
            node.registry,
            node.driver,
            self.other_addresses,
            self._me,
            lambda: self.status.term,
            container_id=f"hastandby-{node.node_id}",
            heartbeat=config.heartbeat,
            on_connected=self._connected,
            on_members=self._members,
            on_lost=self._lost,
            memory=node.handler.memory,
            security=node.peer_security,
            access=AccessReplica(node.authority, node.config.acl_path),
        )
        node.state = str(self.status.state)
        self.admission = ClientAdmission(self, node, config.client_redirect, config.client_refusal == "abort")
        node.handler.admission = self.admission.admit
        node.handler.open_properties = self.admission.open_properties
        node.handler.attach_hooks.append(self._attach)
        self.management = ClusterManagement(self, node, str(config.etcd) if config.etcd else None)
        # The role: a backup until the table's actions promote it (start_guarding) or step it down again.
        self.role: Role = BackupRole(self._backup, self.management.check_admin_link, self.admission.is_admin)
        # Clients of a stopping cluster node should go straight to the next one.
        node.shutdown_refusal = Refusal(Condition("amqp:connection:forced", "node shutting down"),
                                        abort=config.client_refusal == "abort")
        # Told the role (role_hooks.role_name, or "halted") and term on every change of state or detail,
        # before its actions run, and the first role once the node starts (role_hooks.py, --on-role-change).
        self.on_role_change: list[Callable[[str, int], None]] = []
        self._role_told: str | None = None
        node.on_start.append(self._tell_role)
        node.on_start.append(self.look_for_primary)
        node.on_stop.append(lambda: self.fire(Event.STOP))
        # Told when client service starts or stops (admit_clients / exclude_clients): every way out of
        # primary (demoted, lost_lease, stop, a halt) excludes clients first (virtual_ip.py, dr/).
        self.on_serving: list[Callable[[bool], None]] = []
        self.election: ElectionLoop | None = None
        node.handler.fenced_refusal = self.admission.refusal
        if node.journal is not None:
            node.journal.on_writing.append(self._store_writing)
            if node.journal.full is not None:  # it could not even write at start: do not replicate until it can
                self._backup.cannot_store(node.journal.full)
        if config.etcd:
            self.election = self._make_election(config)
            node.on_start.append(self.election.start)

    def _make_election(self, config: HaConfig) -> ElectionLoop:
        from hastandby.election.etcd_coordinator import EtcdCoordinator  # gRPC and etcd3 load only for a node with --etcd

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
        """etcd names the primary: a backup replicates from it, and only from it; a primary follows nobody."""
        if self.role.follow(leader, self.leader):
            self.leader = leader

    # -- identity ------------------------------------------------------------------

    def _me(self) -> dict[str, Any]:
        return BackupIdentity(self.node.node_id, self.url, self.status.state).to_wire()

    def other_addresses(self) -> list[Address]:
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
        return Store(journal is not None, self._holds_data, journal is not None and bool(journal.damage))

    @property
    def sync_wanted(self) -> frozenset[str] | None:
        """The sync set this primary's replication wants in etcd (read by the election thread)."""
        return self.role.sync_wanted

    def won(self, event: Event, term: int, expected: frozenset[str]) -> bool:
        """An election won with the sync set {this node} | ``expected``: guard for those."""
        self._expected_sync = expected
        return self.fire(event, term)

    def sync_confirmed(self, term: int, members: frozenset[str]) -> None:
        self.role.sync_confirmed(term, members)

    @property
    def primary_url(self) -> str | None:
        """The primary this node follows, if known (from its hello)."""
        return self.role.primary_url

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
        if self.status.state is State.BACKUP and self.node.journal is not None and self.node.journal.damage:
            # Caught up: the primary sent what the damage took (it compared the ids we hold with its own).
            self.node.journal.repaired(f"caught up from the primary {self.primary_url}")
        if self.node.journal is not None:
            self.node.journal.term_seen(self.status.term)
        if transition.changed:
            log.info("state change", previous=str(transition.previous), now=str(self.status), trigger=str(event))
            self._tell_role()
        perform(transition.actions, self)
        return True

    @property
    def role_name(self) -> str:
        """What role-change hooks are told: ``role_hooks.role_name`` of the status, or ``halted``."""
        if self.halted is not None and self.status.state is not State.STOPPED:
            return HALTED
        return role_name(self.status)

    def _tell_role(self) -> None:
        """Tell the ``on_role_change`` observers the role, if it is not the one they were told last."""
        role = self.role_name
        if role == self._role_told:
            return
        self._role_told = role
        for fn in self.on_role_change:
            try:
                fn(role, self.status.term)
            except Exception:  # an observer only queues work; a bug there must not stop a role change
                log.exception("role change observer failed", role=role)

    # -- the table's actions (effects.RoleEffects); without etcd the last three have nothing to do ----------
    # The role's own work is the role object's (roles.py); start_guarding and stop_serving_backups swap it.

    def exclude_clients(self) -> None:
        self._set_admitting(False)
        self.admission.close_clients()

    def admit_clients(self) -> None:
        self._set_admitting(True)

    def stop_replication(self) -> None:
        self.role.stop()

    def look_for_primary(self) -> None:
        self.role.look_for_primary()

    def start_guarding(self) -> None:
        self.role = self.role.promote(self._serve_backups)

    def stop_serving_backups(self) -> None:
        self.role = self.role.step_down()

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
        self._tell_role()
        self.exclude_clients()
        self.stop_replication()
        self.stop_serving_backups()
        log.error("replication halted", reason=reason)

    def _set_admitting(self, admitting: bool) -> None:
        changed, self.admitting = admitting != self.admitting, admitting
        if changed:
            for fn in self.on_serving:
                try:
                    fn(admitting)
                except Exception:  # client service must change whatever an observer does
                    log.exception("serving observer failed", admitting=admitting)

    # -- backup side -----------------------------------------------------------------

    def _connected(self, term: int, hello: Hello) -> None:
        url = hello.primary.url or None
        if hello.replicate_default != self.node.registry.default_replicate:
            log.warning("replication default differs from the primary's",
                        mine=self.node.registry.default_replicate, primary=hello.replicate_default)
        if not self.fire(Event.CONNECTED_TO_PRIMARY, term):
            log.warning("refusing a primary with an older term", primary=url, term=term,
                        known_term=self.status.term)
            self._backup.primary = None
            self._backup.resync(f"primary term {term} is older than {self.status.term}")
            return
        log.info("following the primary", primary=url, term=term)

    def _members(self, term: int, members: list[PeerMember]) -> None:
        # Checked where decoded (ha/protocol.py PeerMember.from_wire); kept by the replication
        # (BackupReplication.members, which BackupRole.members shows).
        mine = next((m for m in members if m.node_id == self.node.node_id), None)
        if mine is None:
            return
        if mine.ready:
            if self.status.state is State.CATCHUP:
                self.fire(Event.CAUGHT_UP)
        elif self.status.state is State.BACKUP and not mine.expected:
            # The primary counts us as a new backup catching up: it dropped us
            # (heartbeat, backup timeout) or never expected us, and acknowledged
            # messages without us meanwhile.  We must not stay promotable until
            # we have them again (Qpid's ready -> catchup).
            log.warning("the primary does not count this node as ready: catching up again",
                        primary=self.primary_url, reported=mine.state)
            self.fire(Event.DROPPED_BY_PRIMARY)

    def _store_writing(self, reason: str | None) -> None:
        """The journal cannot write (``reason``), or writes again (None).  A backup that cannot store leaves its
        primary at once, telling it why (``BackupReplication.cannot_store``), and is not ready until it writes
        again; then it catches up.  A primary's journal refuses durable messages meanwhile, and with etcd the
        primary hands over to a ready backup of the sync set (``_hand_over_from_a_failing_disk``)."""
        self._backup.cannot_store(reason)
        if reason is not None and self.status.state in (State.CONNECTING, State.CATCHUP, State.BACKUP):
            log.error("this node's journal cannot write: leaving the primary, not ready until it writes again",
                      error=reason, state=str(self.status.state), primary=self.primary_url)
        self.fire(Event.STORE_FAILED if reason is not None else Event.STORE_RESTORED)
        if reason is not None:
            self._hand_over_from_a_failing_disk()

    def _hand_over_from_a_failing_disk(self) -> None:
        """A primary that cannot write refuses every durable message; a backup that can holds everything it
        acknowledged: hand over to one (the operator's handover, through etcd), and look again every second
        while the disk fails and no backup is ready."""
        journal, election = self.node.journal, self.election
        if journal is None or journal.full is None or election is None or not self.is_primary:
            return
        snapshot = election.snapshot
        ready = sorted(m.node_id for m in (snapshot.members if snapshot is not None else ())
                       if m.state is State.BACKUP and m.node_id != self.node_id and snapshot is not None
                       and snapshot.in_sync(m.node_id) and not m.store.damaged)
        if ready:
            log.error("this primary's journal cannot write: handing over to a backup that can", error=journal.full,
                      target=ready[0])
            election.hand_over(ready[0], ttl=10)
        self.node.schedule(1.0, self._hand_over_from_a_failing_disk)

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
        return {m.node_id: m.url for m in self.role.members()
                if m.ready and m.node_id and m.node_id != self.node.node_id}

    def _serve_backups(self) -> PrimaryReplication:
        """The replication of the primary this node becomes (``BackupRole.promote``)."""
        election = self.election
        primary = PrimaryReplication(
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
            authority=self.node.authority,
        )
        if not primary.recovering:
            self.node.schedule(0.0, lambda: self.fire(Event.EXPECTED_BACKUPS_READY))
        return primary

    def _expected_done(self, timed_out: bool) -> None:
        self.fire(Event.EXPECTED_BACKUPS_TIMED_OUT if timed_out else Event.EXPECTED_BACKUPS_READY)

    # -- broker hooks --------------------------------------------------------------------------

    def _attach(self, link: Link) -> Any:
        return self.role.attach(link)

    # -- reporting ----------------------------------------------------------------------------

    def member_addresses(self) -> list[str]:
        """Every member's HOST:PORT: the brokers URL, or etcd's member keys without one."""
        if self.addresses:
            return [f"{h}:{p}" for h, p in self.addresses]
        snapshot = self.election.snapshot if self.election is not None else None
        members = snapshot.members if snapshot is not None else ()
        return sorted({m.url for m in members} | {self.url})
