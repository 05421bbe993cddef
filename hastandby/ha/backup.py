"""Backup side of hot standby: find the primary, replicate its wiring and queues.

One outgoing connection (cycling through the brokers URL until the primary
takes it) carries the wiring link and one replicating browser per queue of
level ``all``.  What happens is reported to the node loop, which owns the
node's state: ``connected(term, hello)`` on the primary's hello,
``members(list)`` on each membership update (that is how a backup learns it
is ready), and ``lost(reason)`` when the primary goes away.
"""

from __future__ import annotations

from typing import Any, Callable

import structlog
from proton import Condition, Connection, Endpoint, Event, Link, Session

from hastandby.broker.transport.driver import Driver, Timer
from hastandby.broker.admission.memory import MemoryAlarm
from hastandby.broker.transport.address import Address
from hastandby.broker.transport.outbound import Outbound
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Registry
from hastandby.security.pipe import ClientSecurity
from hastandby.ha.access_replica import ACCESS, AccessReplica
from hastandby.ha.config_reconcile import WiringReplica

from hastandby.replication.codec import (
    BACKUP_PROPERTY,
    STORE_FAILED,
    ProtocolError,
    encode_control,
    link_properties,
    receive_controls,
)
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


class WiringReceiver:
    """The receiving end of the wiring stream."""

    def __init__(self, replication: "BackupReplication") -> None:
        self.replication = replication

    def on_delivery(self, impl: Any) -> None:
        try:
            receive_controls(impl, self.replication.wiring_message)
        except ProtocolError as error:
            self.replication.refuse(error)

    def flow(self) -> None:
        pass

    def fail(self, error: Exception) -> None:
        self.replication.resync(f"wiring stream failed: {error}")

    def close(self) -> None:
        pass


class BackupReplication:
    """Replicates one primary into the local registry while the node is a backup."""

    def __init__(
        self,
        registry: Registry,
        driver: Driver,
        addresses: Callable[[], list[Address]],
        me: Callable[[], dict[str, Any]],
        term: Callable[[], int],
        container_id: str,
        heartbeat: float,
        on_connected: Callable[[int, Hello], None],
        on_members: Callable[[int, list[PeerMember]], None],
        on_lost: Callable[[str], None],
        memory: MemoryAlarm,
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
        self.replicators: dict[str, QueueReplicator] = {}
        self.replica = WiringReplica(registry, self._queue_replicated, self._queue_dropped)
        self.primary: PeerMember | None = None  # the primary followed (its hello's); None: none, or refused
        self.members: list[PeerMember] = []  # as the primary followed last told them (kept across roles)
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

    def start(self) -> None:
        if self.not_storing is not None:
            log.warning("not looking for the primary: this node's journal cannot write", error=self.not_storing)
            return
        self.outbound.properties = {BACKUP_PROPERTY: self.me()}
        self.outbound.start()
        if self._progress_timer is None:
            self._progress_timer = self.driver.schedule(PROGRESS_INTERVAL, self._report_progress)

    def stop(self) -> None:
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
        self.driver.register(link, WiringReceiver(self))
        link.open()
        link.flow(100)
        status = session.sender("qpid.ha-status")
        status.target.address = STATUS_ADDRESS
        status.snd_settle_mode = Link.SND_SETTLED
        status.open()
        self.status_link = status
        self._send_status()

    def memory_changed(self, blocked: bool) -> None:
        """This node's memory alarm changed: tell the primary, which holds its producers meanwhile."""
        self._send_status()

    def _send_status(self) -> None:
        link = self.status_link
        if link is None or not link.state & Endpoint.LOCAL_ACTIVE:
            return
        self._status_seq += 1
        delivery = link.delivery(f"s{self._status_seq}")
        link.send(encode_control(BackupStatus(self.memory.local).to_wire()))
        link.advance()
        delivery.settle()

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
            self.on_connected(self.primary_term, hello)
            if self.primary is not None:  # the node loop may have refused the term
                self._members(self.primary_term, hello.members)
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
        self.members = list(members)
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
