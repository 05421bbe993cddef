"""A fake peer a node connects to: a listening socket, our SASL server, a proton engine.

The ``backup`` kind's fake primary and the ``dr-replica`` kind's fake source
both wait for the node under fuzz to connect (it was told their port as
its brokers URL or replication source), check its login as ``peer``
against the run's users file (``hastandby.security.sasl.SaslServer``, the
node's own server side), and answer its open, begin and attaches.  What
they then send is up to the kind.  ``Served`` holds one accepted
connection: its links by address, what the node settled, what it sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

from proton import Delivery, Endpoint

from hastandby.security.credentials import Credentials

from .wire import Engine, Listener, raw_tag, server_engine

ACCEPT_TIMEOUT = 8.0  # seconds the node has to (re)connect before a case counts it as a hang


def digest(payload: bytes) -> str:
    """What a node's IDS reply gives per message (management.py)."""
    return blake2b(payload, digest_size=8).hexdigest()


@dataclass
class Served:
    """One connection the node made to us, and what happened on it."""

    engine: Engine
    links: dict[str, Any] = field(default_factory=dict)  # our senders by source address, receivers by target
    attach_properties: dict[str, Any] = field(default_factory=dict)  # the node's link properties by address
    outcomes: dict[bytes, Any] = field(default_factory=dict)  # delivery tag -> remote state
    received: list[tuple[str, bytes]] = field(default_factory=list)  # (link address, payload)
    closed: list[str] = field(default_factory=list)
    user: str | None = None
    properties: dict[Any, Any] = field(default_factory=dict)


class FakePeer:
    """Accepts the node's connections; ``answer(link, served)`` decides what our side of an attach says."""

    def __init__(self, users_file: Any) -> None:
        self.listener = Listener()
        self.port = self.listener.port
        self.address = f"127.0.0.1:{self.port}"
        self.credentials = Credentials.load(users_file)
        self.answer: Callable[[Any, Served], None] = lambda link, served: None

    def accept(self, timeout: float = ACCEPT_TIMEOUT) -> Served | None:
        """The node's next connection, logged in and opened; None if it does not come within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            sock = self.listener.accept(max(0.0, deadline - time.monotonic()))
            if sock is None:
                return None
            engine = server_engine(sock, self.credentials)
            served = Served(engine)
            handler = _Handler(self, served)
            opened = engine.run_until(lambda engine=engine: bool(engine.connection.state & Endpoint.REMOTE_ACTIVE),
                                      max(0.5, min(3.0, deadline - time.monotonic())), handler)
            if opened:
                principal = getattr(engine.sasl, "principal", None)
                served.user = principal.user if principal is not None else None
                served.properties = dict(engine.connection.remote_properties or {})
                served.handler = handler  # type: ignore[attr-defined]
                return served
            engine.close()
            if time.monotonic() > deadline:
                return None

    def run(self, served: Served, seconds: float, until: Callable[[], bool] | None = None) -> bool:
        return served.engine.run_until(until or (lambda: False), seconds, served.handler)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.listener.close()


class _Handler:
    def __init__(self, peer: FakePeer, served: Served) -> None:
        self.peer = peer
        self.served = served

    def on_connection_remote_open(self, event: Any) -> None:
        connection = event.connection
        connection.container = "fuzz-fake-peer"
        connection.open()

    def on_session_remote_open(self, event: Any) -> None:
        event.session.open()

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        served = self.served
        if link.is_sender:
            address = link.remote_source.address or ""
            link.source.copy(link.remote_source)
        else:
            address = link.remote_target.address or ""
            link.target.copy(link.remote_target)
        served.links[address] = link
        try:
            served.attach_properties[address] = dict(link.remote_properties or {})
        except Exception:  # noqa: BLE001 - the node's properties may be anything proton fails to decode
            served.attach_properties[address] = {}
        self.peer.answer(link, served)
        if not link.state & Endpoint.LOCAL_ACTIVE and not link.state & Endpoint.LOCAL_CLOSED:
            link.open()
        if not link.is_sender:
            link.flow(20)

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        link = delivery.link
        tag = raw_tag(delivery)
        if link.is_sender:
            if delivery.remote_state or delivery.settled:
                self.served.outcomes[tag] = delivery.remote_state
                delivery.settle()
            return
        if not delivery.readable or delivery.partial:
            return
        data = link.recv(delivery.pending)
        link.advance()
        link.flow(1)
        self.served.received.append((link.remote_target.address or "", data))
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()

    def on_link_remote_close(self, event: Any) -> None:
        link = event.link
        condition = link.remote_condition
        self.served.closed.append(f"detach {link.name}: {condition.name if condition else None}")
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()

    def on_connection_remote_close(self, event: Any) -> None:
        condition = event.connection.remote_condition
        self.served.closed.append(f"close: {condition.name if condition else None}")
        if event.connection.state & Endpoint.LOCAL_ACTIVE:
            event.connection.close()


def send(link: Any, tag: bytes, payload: bytes, settled: bool = False) -> Any:
    """One delivery on our sending ``link`` (pre-settled if ``settled``)."""
    delivery = link.delivery(tag)
    link.send(payload)
    link.advance()
    if settled:
        delivery.settle()
    return delivery
