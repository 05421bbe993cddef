"""Backup side of hot standby: the role of a node that is not primary, which *is* its replication (Qpid's Backup).

``BackupRole`` finds the primary and replicates its wiring and queues: one
outgoing connection (cycling through the brokers URL, or to etcd's leader,
until the primary takes it) carries the wiring link and one replicating
browser (``replicator.QueueReplicator``) per queue of level ``all``.  What
happens is reported to the node loop, which owns the node's state:
``connected(term, hello)`` on the primary's hello (False: the node refused
that primary's term, and the role lets go of it), ``members(list)`` on each
membership update (that is how a backup learns it is ready), and
``lost(reason)`` when the primary goes away.  ``promote`` hands it to the
primary it becomes, which gives it back when it steps down: what it last
heard of the members, and whether its journal writes, are kept across roles.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import structlog
from proton import Condition, Connection, Endpoint, Event, Link, Session

from hastandby.broker.transport.driver import Driver, Timer
from hastandby.broker.admission.memory import MemoryAlarm
from hastandby.broker.transport.address import Address
from hastandby.broker.transport.outbound import Outbound
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Registry
from hastandby.security.pipe import ClientSecurity
from hastandby.election.cluster import Leader
from hastandby.broker.transport.address import split_hostport
from hastandby.ha.access_replica import ACCESS, AccessReplica
from hastandby.ha.config_reconcile import WiringReplica

from hastandby.replication.codec import (
    BACKUP_PROPERTY,
    STORE_FAILED,
    ProtocolError,
    link_properties,
)
from hastandby.replication import control
from hastandby.replication.control import ControlReceiver
from hastandby.ha.protocol import (
    HELLO,
    MEMBERS,
    BackupStatus,
    Hello,
    LINEAGE_PROPERTY,
    PeerMember,
    STATUS_ADDRESS,
    WIRING_ADDRESS,
    decode_hello,
    decode_members_update,
)
from hastandby.ha.replicator import QueueReplicator

log = structlog.get_logger("hastandby.backup")

PROGRESS_EVERY = 100_000  # messages of one queue between catch-up progress lines
PROGRESS_INTERVAL = 1.0  # seconds between looks at the replicators' counters

#: What QUERY shows of a role without backups to report on.
_NO_HOLDS: dict[str, Any] = {"backups": {}, "quorum": {}, "waiting_for": None, "refusing": None}

Next = TypeVar("Next")


class WiringReceiver(ControlReceiver):
    """The receiving end of the wiring stream (a control link): a message that is not the protocol, or a
    failure, costs the whole connection to the primary (a fresh hello and snapshot), not only the link."""

    def __init__(self, link: Link, replication: "BackupRole") -> None:
        super().__init__(link, replication.wiring_message, log, "replication refused the primary's message")
        self.replication = replication

    def refuse(self, error: ProtocolError) -> None:
        self.replication.refuse(error)

    def fail(self, error: Exception) -> None:
        self.replication.resync(f"wiring stream failed: {error}")


class BackupRole:
    """Replicates one primary into the local registry while the node is not primary (connecting, catchup, backup).

    Contract: lives on the reactor thread.  ``HaNode`` makes calls on it (the table's ``stop_replication`` is
    ``stop``, ``look_for_primary`` is ``start``; ``follow`` when etcd names the leader), and it calls the node
    back only through ``on_connected``, ``on_members`` and ``on_lost``; the outbound connection and the
    replicators make calls on it, but not vice-versa.
    """

    def __init__(
        self,
        registry: Registry,
        driver: Driver,
        addresses: Callable[[], list[Address]],
        me: Callable[[], dict[str, Any]],
        term: Callable[[], int],
        container_id: str,
        heartbeat: float,
        on_connected: Callable[[int, Hello], bool],
        on_members: Callable[[int, list[PeerMember]], None],
        on_lost: Callable[[str], None],
        memory: MemoryAlarm,
        check_admin_link: Callable[[Link], None],
        is_admin: Callable[[Connection], bool],
        security: ClientSecurity | None = None,
        access: AccessReplica | None = None,
    ) -> None:
        self.registry = registry
        self.access = access  # the primary's users and rules, adopted as this node's
        self.driver = driver
        self.me = me
        self.term = term
        self.on_connected = on_connected
        self.on_members = on_members
        self.on_lost = on_lost
        self._check_admin_link = check_admin_link
        self._is_admin = is_admin
        self.replicators: dict[str, QueueReplicator] = {}
        self.replica = WiringReplica(registry, self._queue_replicated, self._queue_dropped)
        self.primary: PeerMember | None = None  # the primary followed (its hello's); None: none, or refused
        self.told_members: list[PeerMember] = []  # as the primary followed last told them (kept across roles)
        self.primary_term = 0
        self.not_storing: str | None = None  # why this node's journal cannot write; it replicates nothing meanwhile
        self.connection: Connection | None = None
        self.session: Session | None = None
        self.memory = memory
        memory.listeners.append(self.memory_changed)
        self.status_link: Link | None = None
        self._status_seq = 0
        self._reported: dict[QueueReplicator, int] = {}
        self._progress_timer: Timer | None = None
        self.outbound = Outbound(
            driver, addresses, self, properties=None, container_id=container_id, idle_timeout=heartbeat,
            security=security,
        )

    # -- the role (Role in roles.py) ------------------------------------------------------

    def attach(self, link: Link) -> Any:
        """The broker's link claim: an admin may read a backup, not change what the primary replicates to it."""
        if self._is_admin(link.connection):
            self._check_admin_link(link)  # raises for what would change a replica
        return None

    def members(self) -> list[PeerMember]:
        return self.told_members

    def describe(self) -> dict[str, Any]:
        return {"lag": {}, "lag_seconds": {}, "acks_held": dict(_NO_HOLDS), "not_storing": {}}

    @property
    def primary_url(self) -> str | None:
        """The primary this node follows, if known (from its hello)."""
        primary = self.primary
        return (primary.url or None) if primary is not None else None

    def promote(self, serve: Callable[["BackupRole"], Next]) -> Next:
        """``start_guarding``: the primary ``serve`` starts, which comes back to this role when it steps down."""
        return serve(self)

    def step_down(self) -> BackupRole:
        return self  # serves no backups

    # -- the backup's own ------------------------------------------------------------------

    def follow(self, leader: Leader, previous: Leader | None) -> None:
        """etcd names ``leader`` the primary (``previous``: the one named before): replicate from it, and only it."""
        log.info("leader from etcd", leader=leader.node_id, url=leader.url, term=leader.term)
        if self.not_storing is not None:
            return  # known, not followed: it replicates nothing until its journal writes again
        outbound = self.outbound
        if outbound.connected and outbound.address == split_hostport(leader.url):
            return
        if previous != leader or not outbound.connected:
            outbound.redirect()

    def start(self) -> None:
        """``look_for_primary``: look for the primary and replicate from it."""
        if self.not_storing is not None:
            log.warning("not looking for the primary: this node's journal cannot write", error=self.not_storing)
            return
        self.outbound.properties = {BACKUP_PROPERTY: self.me()}
        self.outbound.start()
        if self._progress_timer is None:
            self._progress_timer = self.driver.schedule(PROGRESS_INTERVAL, self._report_progress)

    def stop(self) -> None:
        """``stop_replication``: stop replicating from the primary, keeping every replica."""
        if self._progress_timer is not None:
            self._progress_timer.cancel()
            self._progress_timer = None
        self.outbound.stop()
        self._drop_links()
        self.primary = None

    def cannot_store(self, reason: str | None) -> None:
        """This node's journal cannot write (``reason``), or writes again (None).

        While it cannot, the node must not tell a primary it holds what it is sent: the connection it has
        closes (``stop``, the table's ``stop_replication``) with the condition ``hastandby:store-failed``
        and the reason, so the primary says why it left, and ``start`` looks for no primary until then.
        """
        self.not_storing = reason
        connection = self.connection
        if reason is not None and connection is not None and connection.state & Endpoint.LOCAL_ACTIVE:
            connection.condition = Condition(STORE_FAILED, f"the backup's journal cannot write: {reason}")

    def resync(self, reason: str) -> None:
        """The stream broke (a message that does not fit): reconnect for a fresh snapshot."""
        log.warning("replication resync", reason=reason)
        if self.connection is not None and self.connection.state & Endpoint.LOCAL_ACTIVE:
            self.connection.close()

    def refuse(self, error: ProtocolError) -> None:
        """The primary sent something that is not the protocol: close the connection naming it, and
        reconnect (a fresh hello and snapshot) as after any lost primary."""
        log.warning("replication refused the primary's message", condition=error.condition, field=error.field,
                    error=str(error))
        connection = self.connection
        if connection is not None and connection.state & Endpoint.LOCAL_ACTIVE:
            connection.condition = Condition(error.condition, str(error))
            connection.close()

    # -- Outbound owner ------------------------------------------------------------------

    def opened(self, connection: Connection) -> None:
        if self.not_storing is not None:  # the journal failed while this connection was being made
            connection.condition = Condition(STORE_FAILED, f"the backup's journal cannot write: {self.not_storing}")
            self.stop()
            return
        self.outbound.properties = {BACKUP_PROPERTY: self.me()}
        self.connection = connection
        session = connection.session()
        session.open()
        self.session = session
        link = session.receiver("qpid.ha-wiring")
        link.source.address = WIRING_ADDRESS
        link.target.address = WIRING_ADDRESS
        self.driver.register(link, WiringReceiver(link, self))
        link.open()
        link.flow(100)
        self.status_link = control.open_sender(session, "qpid.ha-status", STATUS_ADDRESS)
        self._send_status()

    def memory_changed(self, blocked: bool) -> None:
        """This node's memory alarm changed: tell the primary, which holds its producers meanwhile."""
        self._send_status()

    def _send_status(self) -> None:
        link = self.status_link
        if link is None or not link.state & Endpoint.LOCAL_ACTIVE:
            return
        self._status_seq += 1
        control.send(link, b"s%d" % self._status_seq, BackupStatus(self.memory.local).to_wire())

    def lost(self, reason: str) -> None:
        log.info("lost the primary", reason=reason, primary=self.primary.url if self.primary is not None else None)
        self._drop_links()
        self.primary = None
        self.on_lost(reason)

    def on_link_remote_close(self, event: Event) -> None:
        link = event.link
        if link is None:
            return
        condition = link.remote_condition
        if condition is not None:
            log.warning("replication link refused", link=link.name,
                        error=condition.name, reason=condition.description)
        self.driver.unregister(link)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()
        if link.name == "qpid.ha-wiring":
            self.resync("wiring link closed by the primary")

    def on_link_remote_open(self, event: Event) -> None:
        """A replicating browser's attach reply carries the primary's lineage: adopt it before any message."""
        link = event.link
        if link is None:
            return
        try:
            reply = link_properties(lambda: link.remote_properties, "attach properties")
        except ProtocolError as error:
            self.refuse(error)
            return
        if str(LINEAGE_PROPERTY) not in reply:
            return  # the wiring link, or a refusal (its close follows)
        replicator = next((r for r in self.replicators.values() if r.link == link), None)
        if replicator is None:
            return
        try:
            replicator.adopt(reply[str(LINEAGE_PROPERTY)])
        except ValueError as error:
            self.resync(f"the primary sent a bad lineage for {replicator.queue.name!r}: {error}")

    def on_session_remote_open(self, event: Event) -> None:
        pass

    # -- wiring stream ---------------------------------------------------------------------

    def wiring_message(self, body: dict[str, Any]) -> None:
        kind = body.get("type")
        if kind == HELLO:
            hello = decode_hello(body)  # ProtocolError before anything is kept
            self.primary = hello.primary
            self.primary_term = hello.term
            if self.on_connected(self.primary_term, hello):
                self._members(self.primary_term, hello.members)
            else:  # the node loop refused the term: an older primary
                self.primary = None
                self.resync(f"primary term {hello.term} is older than {self.term()}")
        elif kind == MEMBERS:
            term, members = decode_members_update(body)
            self._members(term, members)
        elif kind == ACCESS:
            if self.access is not None and self.primary is not None:  # only from a primary whose hello was taken
                try:
                    self.access.apply(body)
                except ValueError as error:
                    self.resync(str(error))
        else:
            try:
                self.replica.apply(body)
            except ValueError as error:
                self.resync(str(error))

    def _members(self, term: int, members: list[PeerMember]) -> None:
        self.told_members = list(members)
        self.on_members(term, members)

    def _queue_replicated(self, queue: Queue) -> None:
        """Start (or restart, on a new session) the replicating browser for ``queue``."""
        if self.session is None:
            return
        old = self.replicators.pop(queue.name, None)
        if old is not None:
            self._close_replicator(old)
        replicator = QueueReplicator(queue, refuse=self.refuse)
        link = replicator.attach(self.session, self.primary_term)
        self.driver.register(link, replicator)
        self.replicators[queue.name] = replicator

    def _queue_dropped(self, queue: Queue) -> None:
        replicator = self.replicators.pop(queue.name, None)
        if replicator is not None:
            self._close_replicator(replicator)

    def _close_replicator(self, replicator: QueueReplicator) -> None:
        replicator.close()
        if replicator.link is not None:
            self.driver.unregister(replicator.link)
            if replicator.link.state & Endpoint.LOCAL_ACTIVE:
                replicator.link.close()

    def _drop_links(self) -> None:
        self.status_link = None
        for replicator in self.replicators.values():
            replicator.close()
            if replicator.link is not None:
                self.driver.unregister(replicator.link)
        self.replicators.clear()
        self.connection = None
        self.session = None

    def _report_progress(self) -> None:
        """A progress line per queue that received another PROGRESS_EVERY messages.

        Read from the replicators' counters by a timer: a callback per
        replicated message was measurable on the backup's hot path.
        """
        reported = {}
        for replicator in self.replicators.values():
            last = self._reported.get(replicator, 0)
            if replicator.received - last >= PROGRESS_EVERY:
                last = replicator.received
                log.info("catch-up progress", queue=replicator.queue.name, received=replicator.received,
                         depth=replicator.queue.depth)
            reported[replicator] = last
        self._reported = reported
        self._progress_timer = self.driver.schedule(PROGRESS_INTERVAL, self._report_progress)
