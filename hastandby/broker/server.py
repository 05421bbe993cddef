"""The proton event handler: connections, sessions and links onto the registry.

One handler for the whole node, one short method per proton event.  Every
event is processed under a guard: an error in one link or connection is
logged and closes that link or connection with an AMQP error, and the node
keeps serving everyone else.

Hooks for the layers above (the core knows nothing of HA):

- ``hooks`` (``hooks.NodeHooks``, given once with ``use_hooks``): admission
  at open (a backup refuses clients), the Open frame's properties (HA's
  ``failover-server-list``), and how a fenced producer is turned away.
- ``claim_links(hook)``: each hook may claim an incoming attach before the
  default handling (HA's replicating subscriptions, DR's sources).
- ``authority`` (``authority.py``): every attach is checked against it
  (consume, browse, publish, create on an unknown address), as are
  management requests (in ``management.py``).
- ``fence`` (``fence.py``): until when producers' messages may be taken and
  acknowledged (HA fencing: a primary unsure of its lease takes and
  acknowledges nothing), and ``fenced(connection)``, which ends a producer's
  connection that sent past it.
"""

from __future__ import annotations

import collections
import functools
import uuid as uuidlib
from typing import Any, Callable

import structlog
from proton import (
    Condition,
    Connection,
    Described,
    Endpoint,
    Event,
    Handler,
    Link,
    Terminus,
)

from hastandby.security.sasl import Principal

from hastandby.broker.admission.authority import Authority, principal_of
from hastandby.broker.admission.backlog import Backlog
from hastandby.broker.transport.driver import Driver, link_name
from hastandby.broker.hooks import AttachHook, NodeHooks, Refusal, StandaloneHooks
from hastandby.broker.errors import BrokerError, InvalidArgument, ResourceLimitExceeded, ResourceLocked
from hastandby.broker.queues.exchange import Exchange
from hastandby.broker.admission.fence import Fence
from hastandby.broker.admission.limits import Limits
from hastandby.broker.links import IncomingLink, OutgoingLink
from hastandby.broker.management import Management, ManagementLink
from hastandby.broker.vocabulary import MANAGEMENT_ADDRESS
from hastandby.broker.admission.memory import MemoryAlarm
from hastandby.broker.transport.peer import address as peer_address
from hastandby.broker.transport.peer import field as peer_field
from hastandby.broker.transport.peer import properties as peer_properties
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import REPLICATE, Node, Registry, queue_settings


log = structlog.get_logger("hastandby.server")


def guarded(method: Callable[[Any, Event], None]) -> Callable[[Any, Event], None]:
    """Contain an unexpected error to the link or connection the event belongs to."""

    @functools.wraps(method)
    def wrapper(self: "BrokerHandler", event: Event) -> None:
        try:
            method(self, event)
        except Exception as error:  # never let one peer take the node down
            self.contain(event, error)

    return wrapper


def _binding_key(source: Terminus) -> str | None:
    """The subject filter a receiver on an exchange asked for, if any."""
    data = source.filter
    data.rewind()
    filters = peer_field(lambda: data.get_object() if data.next() else None, "source filter")
    if not isinstance(filters, dict):
        return None
    for value in filters.values():
        if isinstance(value, Described):
            value = value.value
        if isinstance(value, str):
            return str(value)
    return None


class BrokerHandler(Handler):
    """Maps proton events onto the registry's queues and exchanges."""

    def __init__(
        self,
        registry: Registry,
        management: Management,
        max_message_size: int = 0,
        idle_timeout: float = 0.0,
        limits: Limits | None = None,
    ) -> None:
        super().__init__()
        self.registry = registry
        self.management = management
        self.max_message_size = max_message_size
        self.idle_timeout = idle_timeout
        self.limits = limits or Limits()
        self._per_user: collections.Counter[str] = collections.Counter()
        self.container_id = "hastandby"
        self.driver: Driver = Driver(self)
        self.hooks: NodeHooks = StandaloneHooks()
        self.fence = Fence()
        self.memory = MemoryAlarm(high=2**62)  # the node sets its watermark and samples it
        self.memory.listeners.append(self._memory_changed)
        self._starved: set[IncomingLink] = set()
        self._link_claims: list[AttachHook] = []
        self.connections: set[Connection] = set()

    def _memory_changed(self, blocked: bool) -> None:
        """The alarm cleared: every producer link denied credit meanwhile gets it now."""
        if blocked:
            return
        starved = list(self._starved)  # the links hold this set: emptied in place
        self._starved.clear()
        for link in starved:
            link.refill()

    def use_hooks(self, hooks: NodeHooks) -> None:
        """The layer above's answers (``hooks.NodeHooks``); given once, before the node serves."""
        self.hooks = hooks

    def claim_links(self, hook: AttachHook) -> None:
        """``hook`` may claim each incoming attach, after those registered before it and before the default."""
        self._link_claims.append(hook)

    @property
    def authority(self) -> Authority:
        return self.management.authority

    def fenced(self, connection: Connection) -> None:
        """A producer sent past the fence: end its connection so that it goes to the next node."""
        refusal = self.hooks.fenced_refusal()
        log.warning("fenced: ending a producer's connection", reason=refusal.condition.description)
        self.close_connection(connection, refusal)

    # -- containment ------------------------------------------------------------

    def contain(self, event: Event, error: Exception) -> None:
        condition = Condition("amqp:internal-error", f"{type(error).__name__}: {error}")
        link = event.link
        if link is not None:
            log.exception("link error, closing the link", link=link_name(link))
            self._drop_link(link)
            if link.state & Endpoint.LOCAL_ACTIVE:
                link.condition = condition
                link.close()
            return
        connection = event.connection
        log.exception("connection error, closing the connection")
        if connection is not None and connection.state & Endpoint.LOCAL_ACTIVE:
            connection.condition = condition
            connection.close()

    # -- connections -----------------------------------------------------------

    @guarded
    def on_connection_bound(self, event: Event) -> None:
        transport = event.transport
        if transport is None:
            return
        if self.idle_timeout:
            transport.idle_timeout = self.idle_timeout
        if self.limits.max_frame_size:
            transport.max_frame_size = self.limits.max_frame_size

    @guarded
    def on_connection_remote_open(self, event: Event) -> None:
        connection = event.connection
        try:  # checked before anything reads them (admission hooks included)
            peer_properties(connection, "connection properties")
        except BrokerError as error:
            log.info("connection refused", reason=str(error))
            connection.container = self.container_id
            connection.open()
            self._end(connection, Refusal(Condition(error.condition, str(error))))
            return
        refusal = self.hooks.admit(connection)
        if refusal is not None:
            log.info("connection refused", container=connection.remote_container,
                     reason=refusal.condition.description, abort=refusal.abort)
            if not refusal.abort:
                connection.container = self.container_id
                connection.open()
            self._end(connection, refusal)
            return
        connection.container = self.container_id
        user = principal_of(connection).user
        try:
            self.limits.check("connections", len(self.connections), self.limits.connections)
            self.limits.check(f"connections of user {user!r}", self._per_user[user],
                              self.limits.connections_per_user)
        except ResourceLimitExceeded as error:
            log.warning("connection refused", user=user, reason=str(error))
            connection.open()
            self._end(connection, Refusal(Condition(error.condition, str(error))))
            return
        properties = self.hooks.open_properties(connection)
        if properties:
            connection.properties = properties
        connection.open()
        self.connections.add(connection)
        self._per_user[user] += 1
        connection.hs_counted = [0, 0, 0]  # sessions, links, refusals the peer has not closed

    @guarded
    def on_connection_remote_close(self, event: Event) -> None:
        connection = event.connection
        self._drop_connection(connection)
        if connection.state & Endpoint.LOCAL_ACTIVE:
            connection.close()

    @guarded
    def on_transport_closed(self, event: Event) -> None:
        if event.connection is not None:
            self._drop_connection(event.connection)

    def on_transport_error(self, event: Event) -> None:
        condition = event.transport.condition if event.transport else None
        if condition is not None:
            log.info("transport error", error=condition.name, description=condition.description)

    def _drop_connection(self, connection: Connection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            user = principal_of(connection).user
            self._per_user[user] -= 1
            if self._per_user[user] <= 0:
                del self._per_user[user]
        link = connection.link_head(0)
        while link is not None:
            self._drop_link(link)
            link = link.next(0)

    def close_connection(self, connection: Connection, refusal: Refusal) -> None:
        """End one client connection (closed or aborted), releasing what its links held."""
        self._drop_connection(connection)
        self._end(connection, refusal)

    @staticmethod
    def _end(connection: Connection, refusal: Refusal) -> None:
        if refusal.abort:
            transport = connection.transport
            if transport is not None:
                transport.condition = refusal.condition
                transport.close_tail()
                transport.close_head()
        elif connection.state & Endpoint.LOCAL_ACTIVE:
            connection.condition = refusal.condition
            connection.close()

    def close_all(self, refusal: Refusal) -> None:
        """End every client connection (shutdown)."""
        for connection in list(self.connections):
            self.close_connection(connection, refusal)

    # -- sessions --------------------------------------------------------------

    @guarded
    def on_session_remote_open(self, event: Event) -> None:
        connection, session = event.connection, event.session
        if connection not in self.connections:  # one we are refusing
            return
        session.open()
        counted = connection.hs_counted
        if self.limits.sessions_per_connection and counted[0] >= self.limits.sessions_per_connection:
            error = ResourceLimitExceeded(f"sessions per connection limit reached: "
                                          f"{self.limits.sessions_per_connection}")
            log.info("session refused", reason=str(error))
            session.condition = Condition(error.condition, str(error))
            session.close()
            session.hs_refused = True
            self._count_refusal(connection)
            return
        counted[0] += 1

    @guarded
    def on_session_remote_close(self, event: Event) -> None:
        session = event.session
        link = session.connection.link_head(0)
        while link is not None:
            if link.session == session:
                self._drop_link(link)
            link = link.next(0)
        if session.state & Endpoint.LOCAL_ACTIVE:
            session.close()
            if session.connection in self.connections:
                session.connection.hs_counted[0] -= 1
        elif getattr(session, "hs_refused", False) and session.connection in self.connections:
            session.connection.hs_counted[2] -= 1

    # -- links -------------------------------------------------------------------

    @guarded
    def on_link_remote_open(self, event: Event) -> None:
        link = event.link
        if link.connection not in self.connections:
            return  # attached in the same breath as an open we refused
        counted = link.connection.hs_counted
        try:
            try:
                link.name  # noqa: B018 - proton decodes it: a peer's bytes that are not UTF-8 raise
            except UnicodeDecodeError:
                raise InvalidArgument("the link's name is not UTF-8") from None
            self.limits.check("links per connection", counted[1], self.limits.links_per_connection)
            endpoint = self._attach(link)
        except BrokerError as error:
            self._refuse(link, error)
            return
        counted[1] += 1
        if link.is_sender:
            link.source.copy(link.remote_source)
            if link.remote_source.dynamic:
                link.source.address = endpoint.queue.name
        else:
            link.target.copy(link.remote_target)
        link.hs_endpoint = endpoint
        self.driver.register(link, endpoint)
        link.open()
        endpoint.start()

    @guarded
    def on_link_remote_close(self, event: Event) -> None:
        link = event.link
        self._drop_link(link)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()
        elif getattr(link, "hs_refused", False) and link.connection in self.connections:
            link.connection.hs_counted[2] -= 1

    def _drop_link(self, link: Link) -> None:
        endpoint = getattr(link, "hs_endpoint", None)
        if endpoint is not None:
            del link.hs_endpoint
            self.driver.unregister(link)
            endpoint.close()
            counted = getattr(link.connection, "hs_counted", None)
            if counted is not None:
                counted[1] -= 1

    def _refuse(self, link: Link, error: BrokerError) -> None:
        log.info("link refused", link=link_name(link), error=error.condition, reason=str(error))
        link.open()
        link.condition = Condition(error.condition, str(error))
        link.close()
        link.hs_refused = True
        self._count_refusal(link.connection)

    def _count_refusal(self, connection: Connection) -> None:
        """Close a connection whose peer leaves more refused sessions and links open than the limit.

        Proton keeps a refused endpoint until the peer ends or detaches it, so a
        peer that ignores refusals and keeps asking would make the node spend
        time and memory on it without bound (3,000 begins past the session
        limit took the node 2 s; the fuzz suite found it).  A client that
        closes what was refused, as proton's do, never comes near the limit.
        """
        counted = connection.hs_counted
        counted[2] += 1
        limit = self.limits.refusals_per_connection
        if limit and counted[2] > limit and connection.state & Endpoint.LOCAL_ACTIVE:
            error = ResourceLimitExceeded(f"refused sessions and links left open limit reached: {limit}")
            log.warning("connection closed", container=connection.remote_container, reason=str(error))
            self.close_connection(connection, Refusal(Condition(error.condition, str(error))))

    def _attach(self, link: Link) -> Any:
        # What the hooks and the default handling read, checked first: a bad one refuses the link.
        peer_properties(link, "link properties")
        peer_address(link.remote_source, "source address")
        peer_address(link.remote_target, "target address")
        for hook in self._link_claims:
            endpoint = hook(link)
            if endpoint is not None:
                return endpoint
        if link.is_sender:
            return self._attach_outgoing(link)
        return self._attach_incoming(link)

    def _attach_incoming(self, link: Link) -> Any:
        address = link.remote_target.address
        if self.max_message_size:
            link.max_message_size = self.max_message_size
        if address == MANAGEMENT_ADDRESS:
            return ManagementLink(link, self.management, self.limits.management_request)
        principal = principal_of(link.connection)
        if address:
            node = self._resolve(principal, address, "publish")
            return IncomingLink(link, node, self.registry, self.max_message_size, self.fence, self.fenced,
                                self.memory, self._starved, write=self._writer(link))
        # The anonymous relay: each message's own address is checked (a call per message, on relay links only).
        return IncomingLink(link, None, self.registry, self.max_message_size, self.fence, self.fenced,
                            self.memory, self._starved, lambda name: self.authority.check(principal, "publish", name),
                            write=self._writer(link))

    def _resolve(self, principal: Principal, address: str, action: str) -> Node:
        """The node an attach names, checking ``action`` on it (and ``create`` and the limits if it is new)."""
        registry = self.registry
        if registry.lookup(address) is None:
            self.authority.check(principal, "create", address)
            if registry.auto_create:
                self.limits.check("queues", len(registry.queues), self.limits.queues)
                self.limits.check("auto-created queues", len(registry.auto_created), self.limits.auto_created_queues)
        self.authority.check(principal, action, address)
        return registry.resolve(address)

    def _attach_outgoing(self, link: Link) -> OutgoingLink:
        source = link.remote_source
        if source.dynamic:
            return OutgoingLink(link, self.registry.temporary_queue(), self.registry, False, self._backlog(link))
        address = source.address
        if not address:
            raise InvalidArgument("a receiver needs a source address (or a dynamic source)")
        browsing = source.distribution_mode == Terminus.DIST_MODE_COPY
        node = self._resolve(principal_of(link.connection), address, "browse" if browsing else "consume")
        if isinstance(node, Exchange):
            node = self._subscribe(node, link)
            browsing = False
        elif node.settings.exclusive and not browsing and node.consumers:
            raise ResourceLocked(f"queue {node.name!r} is exclusive and already has a consumer")
        return OutgoingLink(link, node, self.registry, browsing, self._backlog(link))

    def _backlog(self, link: Link) -> Backlog | None:
        """The unwritten bytes of the link's connection, which its consumers share."""
        wrapped = self.driver.socket_of(link.connection)
        return wrapped.backlog if wrapped is not None else None

    def _writer(self, link: Link) -> Callable[[], None]:
        """Writes the output of the link's connection now, in the middle of a pass of events."""
        wrapped = self.driver.socket_of(link.connection)
        return wrapped.flush if wrapped is not None else lambda: None

    def _subscribe(self, exchange: Exchange, link: Link) -> Queue:
        """A receiver on an exchange gets a private auto-delete queue bound with its filter."""
        key = _binding_key(link.remote_source)
        if key is None:
            key = "#" if exchange.type == "topic" else ""
        name = f"{exchange.name}.{link.name}.{uuidlib.uuid4().hex[:8]}"
        settings = queue_settings({REPLICATE: "none"}, default_replicate="none", exclusive=True, auto_delete=True)
        queue, _ = self.registry.declare_queue(name, settings=settings)
        self.registry.bind(exchange.name, queue.name, key)
        return queue

