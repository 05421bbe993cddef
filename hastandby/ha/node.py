"""The HA node: a broker node as a cluster member, its role governed by the state table.

Everything that changes the node's role goes through ``fire(event)``: its ``Standing``
(``lifecycle/standing.py``) applies the table, and ``effects.perform`` carries out the
transition's actions, each a method of this class.  The node holds its parts and calls on
them; they never reach round it: the role (``roles.py``), which the actions swap; the broker's
hooks (``admission.py``); management (``cluster_management.py``); the journal (``journal.py``);
the observers of its role (``observers.py``); and with etcd the election loop (``election/``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from hastandby import settings
from hastandby.broker.transport.address import Address
from hastandby.election.cluster import Leader, Store
from hastandby.election.loop import ElectionLoop, etcd_election
from hastandby.election.sync_request import SyncRequest
from hastandby.ha.access_replica import AccessReplica
from hastandby.ha.addresses import ClusterAddresses
from hastandby.ha.admission import ClientAdmission
from hastandby.ha.backup import BackupRole
from hastandby.ha.cluster_management import ClusterManagement
from hastandby.ha.journal import ClusterJournal
from hastandby.ha.membership import Membership
from hastandby.ha.observers import RoleObservers
from hastandby.ha.primary import PrimaryRole
from hastandby.ha.protocol import BackupIdentity
from hastandby.ha.roles import NodeRole, expected_backups
from hastandby.host.supervised import lease_reporter
from hastandby.lifecycle.effects import perform
from hastandby.lifecycle.standing import REFUSABLE, Standing
from hastandby.lifecycle.states import Event, IllegalTransition, NodeStatus
from hastandby.node import Node

if TYPE_CHECKING:
    from collections.abc import Callable

    from hastandby.election.etcd_client import EtcdSettings

log = structlog.get_logger("hastandby.ha")


@dataclass
class HaConfig:
    """The cluster options of ``hastandby serve --ha-cluster``; defaults and ranges: ``settings``'s table."""

    brokers: list[str] = field(default_factory=list)
    public_url: str | None = None
    backup_timeout: float = settings.BACKUP_TIMEOUT.default
    client_redirect: bool = False
    client_refusal: str = settings.CLIENT_REFUSAL.default
    heartbeat: float = settings.HEARTBEAT.default
    etcd: EtcdSettings | str | None = None  # endpoints, TLS, user (EtcdSettings), or plain endpoints
    cluster: str = settings.CLUSTER.default
    lease_ttl: int = settings.LEASE_TTL.default
    lease_margin: float = settings.LEASE_MARGIN.default
    min_sync: int = settings.MIN_SYNC.default  # with etcd: nodes that must hold a message before it is acknowledged

    def __post_init__(self) -> None:
        settings.check_named(vars(self))  # every field the table names, in its range (SettingError, a ValueError)

    @property
    def sync_quorum(self) -> int:  # min_sync as the primary keeps it: at most the --brokers-url members
        return settings.sync_quorum(self.min_sync, len(self.brokers))


class HaNode:
    """Turns a broker node into a cluster member.

    Contract: runs on the node's reactor thread.  It makes calls on its role, admission, management and the
    election loop; they call it back on this thread only (the role's ``on_*`` callbacks, the loop through
    ``call_soon_threadsafe``).  The election thread reads ``status``, ``leader``, ``sync`` and ``store``.
    """

    def __init__(self, node: Node, config: HaConfig) -> None:
        self.node = node
        self.config = config
        # It holds data: its journal brought back a store of this cluster, or it has been past connecting.
        self.standing = Standing(holds_data=node.journal is not None and node.journal.term > 0)
        self.addresses = ClusterAddresses(node.node_id, node.config, config.public_url, config.brokers)
        self.url = self.addresses.url
        self.leader: Leader | None = None
        self.sync = SyncRequest(node.call_soon_threadsafe)  # the sync set a primary wants in etcd
        self.admission = ClientAdmission(self, node, config.client_redirect, config.client_refusal == "abort")
        self.management = ClusterManagement(self, node, str(config.etcd) if config.etcd else None)
        # The role: a backup until the table's actions promote it (start_guarding) or step it down again.
        membership = Membership(self)  # what the role hears of the primary, as the table's events
        self.role: NodeRole = BackupRole(
            node.registry, node.driver, self.other_addresses,
            lambda: BackupIdentity(node.node_id, self.url, self.status.state).to_wire(), lambda: self.status.term,
            container_id=f"hastandby-{node.node_id}", heartbeat=config.heartbeat, on_connected=membership.connected,
            on_members=membership.members, on_lost=membership.lost, memory=node.handler.memory,
            check_admin_link=self.management.check_admin_link, is_admin=self.admission.is_admin,
            security=node.peer_security, access=AccessReplica(node.authority, node.config.acl_path),
        )
        node.use_hooks(self.admission)
        node.handler.claim_links(lambda link: self.role.attach(link))
        self.observers = RoleObservers()
        self.on_role_change, self.on_serving = self.observers.on_role_change, self.observers.on_serving
        node.on_start.append(lambda: self.observers.tell_role(self.standing))
        node.on_start.append(self.look_for_primary)
        node.on_stop.append(lambda: self.fire(Event.STOP))
        self.election: ElectionLoop | None = None
        self.journal = ClusterJournal(self, node, node.journal) if node.journal is not None else None
        if config.etcd:
            self.election = etcd_election(self, config.etcd, config.cluster, self.url, lease_ttl=config.lease_ttl,
                                          lease_margin=config.lease_margin, fence=node.handler.fence,
                                          on_lease=lease_reporter())
            node.on_start.append(self.election.start)

    # -- what the election loop reads (ElectedNode) ----------------------------------------------

    @property
    def node_id(self) -> str:
        return self.node.node_id

    @property
    def status(self) -> NodeStatus:
        return self.standing.status

    @property
    def store(self) -> Store:
        """What this node says of its messages (cluster.Store), for a whole-cluster restart's election."""
        journal = self.node.journal
        return Store(journal is not None, self.standing.holds_data, journal is not None and bool(journal.damage))

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        self.node.call_soon_threadsafe(fn)

    def follow(self, leader: Leader) -> None:
        """etcd names the primary: a backup replicates from it, and only from it; a primary follows nobody."""
        if isinstance(self.role, BackupRole):
            self.role.follow(leader, self.leader)
            self.leader = leader

    # -- the state table ----------------------------------------------------------------

    def fire(self, event: Event, term: int | None = None) -> bool:
        """Apply ``event``; perform the transition's actions; False if it was refused."""
        transition = self.standing.fire(event, term)
        if isinstance(transition, IllegalTransition):
            log.error("illegal transition", current=str(transition.current), trigger=str(event),
                      target=str(transition.target) if transition.target else None, reason=transition.reason)
            if event not in REFUSABLE:
                self._halt()
            return False
        if self.journal is not None:
            self.journal.status_changed(self.status)
        if transition.changed:
            log.info("state change", previous=str(transition.previous), now=str(self.status), trigger=str(event))
            self.observers.tell_role(self.standing)
        perform(transition.actions, self)
        return True

    def _halt(self) -> None:
        """Stop replication and client service: better no role than an undefined one."""
        self.observers.tell_role(self.standing)
        self.exclude_clients()
        self.stop_replication()
        self.stop_serving_backups()
        log.error("replication halted", reason=self.standing.halted)

    # -- the table's actions (effects.RoleEffects); without etcd the last three have nothing to do ----------

    def exclude_clients(self) -> None:
        self._serve(False)
        self.admission.close_clients()

    def admit_clients(self) -> None:
        self._serve(True)

    def _serve(self, admitting: bool) -> None:
        if self.standing.admit(admitting):
            self.observers.tell_serving(admitting)

    def stop_replication(self) -> None:
        if isinstance(self.role, BackupRole):  # a primary replicates from nobody: its backup stopped when promoted
            self.role.stop()

    def look_for_primary(self) -> None:
        if isinstance(self.role, BackupRole):  # the table steps a primary down first
            self.role.start()

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

    # -- becoming primary -----------------------------------------------------------------------

    def _serve_backups(self, backup: BackupRole) -> PrimaryRole:
        """The primary this node becomes (``BackupRole.promote``), guarding for the backups it expects: with etcd
        the other members of the sync set the election was won with, without the ones last reported ready."""
        election = self.election
        snapshot = election.snapshot if election is not None else None
        primary = PrimaryRole(
            self.node.registry, self.node.driver, backup, me={"node_id": self.node.node_id, "url": self.url},
            term=self.status.term,
            expected=expected_backups(backup, self.node.node_id, self.sync.won_with if election else None, snapshot),
            backup_timeout=self.config.backup_timeout, on_expected_done=self._expected_done,
            on_members=election.wake if election is not None else lambda: None,
            sync=self.sync if election is not None else None, memory=self.node.handler.memory,
            min_sync=self.config.sync_quorum, authority=self.node.authority,
        )
        if not primary.recovering:
            self.node.schedule(0.0, lambda: self.fire(Event.EXPECTED_BACKUPS_READY))
        return primary

    def _expected_done(self, timed_out: bool) -> None:
        self.fire(Event.EXPECTED_BACKUPS_TIMED_OUT if timed_out else Event.EXPECTED_BACKUPS_READY)

    # -- addresses ----------------------------------------------------------------------------

    def other_addresses(self) -> list[Address]:
        """Where to look for the primary: etcd's leader if known, else the brokers URL."""
        return self.addresses.others(self.leader)

    def member_addresses(self) -> list[str]:
        """Every member's HOST:PORT: the brokers URL, or etcd's member keys without one."""
        return self.addresses.members(self.election.snapshot if self.election is not None else None)
