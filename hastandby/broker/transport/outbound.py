"""An outgoing connection that cycles through a list of nodes until one takes it.

A backup looks for the primary this way (other backups refuse it with
``amqp:connection:forced``), and a DR replica follows its source cluster
through failover the same way.  Reconnects back off from 0.1 s to at most
``max_delay``; the owner hears ``opened(connection)`` and ``lost(reason)``
and receives every other event of the connection as ``on_<event>(event)``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import structlog
from proton import Connection, Endpoint, Event

from hastandby.security.pipe import ClientSecurity

from hastandby.broker.transport.address import Address
from hastandby.broker.transport.driver import Driver, Timer

log = structlog.get_logger("hastandby.outbound")

STABLE_AFTER = 1.0  # seconds a connection must last before reconnects start again at no delay


class Outbound:
    """One logical outgoing connection to whichever of ``addresses`` accepts it."""

    def __init__(
        self,
        driver: Driver,
        addresses: Callable[[], list[Address]],
        owner: Any,
        properties: dict | None = None,
        container_id: str = "hastandby",
        idle_timeout: float = 0.0,
        max_delay: float = 1.0,
        security: ClientSecurity | None = None,
    ) -> None:
        self.driver = driver
        self.security = security  # how we authenticate to the peer (and TLS); anonymous without
        self.addresses = addresses
        self.owner = owner
        self.properties = properties
        self.container_id = container_id
        self.idle_timeout = idle_timeout
        self.max_delay = max_delay
        self.connection: Connection | None = None
        self.address: Address | None = None
        self.connected = False
        self._index = -1
        self._delay = 0.0
        self._timer: Timer | None = None
        self._stopped = False
        self._opened_at = 0.0

    def start(self) -> None:
        self._stopped = False
        self._attempt()

    def stop(self) -> None:
        """Close the connection and stop reconnecting."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        connection = self.connection
        if connection is not None and connection.state & Endpoint.LOCAL_ACTIVE:
            connection.close()
        self.connected = False

    def redirect(self) -> None:
        """The target changed (etcd named a new primary): drop the current attempt or
        connection at once, without waiting for a frozen peer's heartbeat, and try
        the new address now.

        The next attempt is scheduled, never made inline: the caller names the new
        address after this returns (``HaNode.follow``), and an attempt made now
        would go to the old one, a frozen peer that holds it for the handshake bound.
        """
        if self._stopped:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._delay = 0.0
        connection = self.connection
        transport = connection.transport if connection is not None else None
        if transport is not None:
            transport.close_tail()
            transport.close_head()  # -> transport closed -> _lost -> an immediate retry
        else:
            self._timer = self.driver.schedule(0.0, self._attempt)

    def _attempt(self) -> None:
        self._timer = None
        if self._stopped:
            return
        addresses = self.addresses()
        if not addresses:
            self._retry("no address to try")
            return
        self._index = (self._index + 1) % len(addresses)
        host, port = self.address = addresses[self._index]
        connection = Connection()
        connection.container = self.container_id
        connection.hostname = host
        if self.properties:
            connection.properties = self.properties
        self.connection = connection
        socket = self.driver.connect(host, port, connection, self, self.security)
        if self.idle_timeout:
            socket.transport.idle_timeout = self.idle_timeout
        connection.open()

    def _retry(self, reason: str) -> None:
        if self._stopped or self._timer is not None:
            return
        addresses = self.addresses()
        wrapped_around = self._index + 1 >= len(addresses)
        self._delay = min(self.max_delay, max(0.1, self._delay * 2)) if wrapped_around else 0.0
        log.debug("outbound retry", reason=reason, delay=self._delay)
        self._timer = self.driver.schedule(self._delay, self._attempt)

    # -- events of our connection -------------------------------------------------

    def on_connection_remote_open(self, event: Event) -> None:
        if event.connection is not self.connection and event.connection != self.connection:
            return
        self.connected = True
        self._opened_at = time.monotonic()
        self.owner.opened(event.connection)

    def on_connection_remote_close(self, event: Event) -> None:
        connection = event.connection
        condition = connection.remote_condition
        if connection.state & Endpoint.LOCAL_ACTIVE:
            connection.close()
        self._lost(connection, f"{condition.name}: {condition.description}" if condition else "closed by peer")

    def on_transport_closed(self, event: Event) -> None:
        condition = event.transport.condition if event.transport else None
        self._lost(event.connection, f"{condition.name}: {condition.description}" if condition else "disconnected")

    def _lost(self, connection: Connection | None, reason: str) -> None:
        if connection is not None and connection != self.connection:
            return
        was_connected, self.connected = self.connected, False
        self.connection = None
        if was_connected:
            if time.monotonic() - self._opened_at > STABLE_AFTER:
                self._delay = 0.0  # it was a real session, not a refusal: retry at once
            self.owner.lost(reason)
        self._retry(reason)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return getattr(self.owner, name, None)
        raise AttributeError(name)
