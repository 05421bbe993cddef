"""Sockets for the fuzzer, every wait bounded: raw bytes, or a proton engine behind our own SASL layer.

``Raw`` is a TCP connection moved by hand (the frame fuzzer writes what it
likes and reads what comes back).  ``Engine`` is a proton engine on a
socket, client or server side, with ``hastandby.security.sasl`` in front of
it exactly as the node has it: the client side logs in with PLAIN or
SCRAM-SHA-256 (``SaslClient``), the server side (a fake primary or DR
source a node connects to) checks the node's login against a users file
(``SaslServer``).  Handlers get ``on_<event>(event)`` calls as in proton's
examples; ``inject`` writes raw bytes between the engine's own frames.

Nothing here waits without a deadline: a node that stops answering shows
up as a timeout, which the runner counts as a hang.
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from proton import Collector, Connection, Endpoint, Transport

from hastandby.security.sasl import SaslClient, SaslServer

IO_CHUNK = 256 * 1024
SEND_TIMEOUT = 3.0  # seconds a write may block (a node that stops reading)


def raw_tag(delivery: Any) -> bytes:
    """A delivery's tag as bytes, whatever they are (proton's ``Delivery.tag`` decodes them as UTF-8)."""
    from cproton import ffi, lib

    tag = lib.pn_delivery_tag(delivery._impl)
    return b"" if tag.start == ffi.NULL or not tag.size else ffi.unpack(tag.start, tag.size)


class WireError(Exception):
    """The peer refused the login, or the socket failed in a way the caller should know."""


class Raw:
    """A plain TCP connection: write bytes, read what comes back within a bound."""

    def __init__(self, host: str, port: int, timeout: float = 3.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.received = bytearray()
        self.peer_closed = False
        self.send_failed: str | None = None

    def send(self, data: bytes) -> bool:
        """Write ``data``; False (and ``send_failed`` says why) if the peer closed or stopped reading."""
        if self.send_failed is not None:
            return False
        self.sock.settimeout(SEND_TIMEOUT)
        try:
            self.sock.sendall(data)
        except TimeoutError:
            self.send_failed = "timeout"
            return False
        except OSError as error:
            self.send_failed = type(error).__name__
            return False
        return True

    def read(self, timeout: float, until: Callable[[bytes], bool] | None = None) -> bytes:
        """Read for up to ``timeout`` seconds, less if the peer closes or ``until(received)`` holds."""
        deadline = time.monotonic() + timeout
        while not self.peer_closed:
            if until is not None and until(bytes(self.received)):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                break
            try:
                data = self.sock.recv(IO_CHUNK)
            except OSError:
                data = b""
            if not data:
                self.peer_closed = True
                break
            self.received += data
        return bytes(self.received)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Engine:
    """A proton engine on a socket, with our SASL layer in front (client or server side)."""

    def __init__(self, sock: socket.socket, sasl: SaslClient | SaslServer, server: bool = False,
                 connection: Connection | None = None) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.sasl = sasl
        self.connection = connection or Connection()
        self.transport = Transport(Transport.SERVER if server else Transport.CLIENT)
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.peer_closed = False
        self.failed: str | None = None
        self._outbound = bytearray()

    @classmethod
    def connect(cls, host: str, port: int, user: str, password: str, mechanism: str = "PLAIN",
                properties: dict | None = None, container: str = "fuzz", timeout: float = 3.0) -> Engine:
        """A client engine, connected, logged in (``mechanism`` PLAIN or SCRAM-SHA-256) and opened.

        Raises ``WireError`` if the node refuses the login or does not answer within ``timeout``.
        """
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sasl = _Preferring(mechanism, user, password, host)
        engine = cls(sock, sasl)
        engine.connection.container = container
        engine.connection.hostname = host
        if properties:
            engine.connection.properties = properties
        engine.connection.open()
        if not engine.run_until(lambda: bool(engine.connection.state & Endpoint.REMOTE_ACTIVE)
                                or engine.connection.state & Endpoint.REMOTE_CLOSED, timeout):
            engine.close()
            raise WireError(engine.failed or f"no open from {host}:{port} within {timeout:g} s")
        if engine.connection.state & Endpoint.REMOTE_CLOSED:
            condition = engine.connection.remote_condition
            engine.close()
            raise WireError(f"connection closed: {condition.name if condition else '?'}: "
                            f"{condition.description if condition else ''}")
        return engine

    # -- moving bytes ----------------------------------------------------------------

    @property
    def authenticated(self) -> bool:
        return self.sasl.done

    def _fill(self) -> None:
        """What goes to the socket next: SASL output, then (once logged in) the engine's."""
        self._outbound += self.sasl.take_output()
        if not self.sasl.done:
            return
        transport = self.transport
        while True:
            pending = transport.pending()
            if pending <= 0:
                break
            chunk = transport.peek(min(pending, IO_CHUNK))
            transport.pop(len(chunk))
            self._outbound += chunk

    def _write(self, deadline: float) -> None:
        while self._outbound and not self.peer_closed:
            try:
                sent = self.sock.send(self._outbound)
            except (BlockingIOError, InterruptedError):
                if time.monotonic() > deadline:
                    return
                select.select([], [self.sock], [], max(0.0, min(0.05, deadline - time.monotonic())))
                continue
            except OSError:
                self.peer_closed = True
                self._outbound.clear()
                return
            del self._outbound[:sent]

    def pump(self, timeout: float) -> None:
        """One round: write what is pending, then read for up to ``timeout`` seconds."""
        self.transport.tick(time.monotonic())
        self._fill()
        self._write(time.monotonic() + SEND_TIMEOUT)
        if self.peer_closed:
            return
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return
        try:
            data = self.sock.recv(IO_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.peer_closed = True
            if self.transport.capacity() >= 0:
                self.transport.close_tail()
            return
        if not self.sasl.done:
            data = self.sasl.receive(data)
            if isinstance(self.sasl, SaslServer):
                data += self.sasl.settle()  # a password check, here and now (a node does it off its reactor)
            if getattr(self.sasl, "failed", None):
                self.failed = f"SASL: {self.sasl.failed}"
                self._fill()
                self._write(time.monotonic() + 0.5)
                self.peer_closed = True
                return
        while data:
            capacity = self.transport.capacity()
            if capacity <= 0:
                break
            pushed = data[:capacity]
            self.transport.push(pushed)
            data = data[len(pushed):]

    def inject(self, raw: bytes) -> None:
        """Write ``raw`` to the socket after everything the engine has produced so far."""
        self._fill()
        self._outbound += raw
        self._write(time.monotonic() + SEND_TIMEOUT)

    def flush(self, timeout: float = 0.5) -> None:
        self._fill()
        self._write(time.monotonic() + timeout)

    # -- events ----------------------------------------------------------------------

    def dispatch(self, handler: Any) -> int:
        """Give every pending event to ``handler`` (``on_<event>(event)``); returns how many there were."""
        count = 0
        collector = self.collector
        while True:
            event = collector.peek()
            if event is None:
                return count
            count += 1
            method = getattr(handler, event.type.method, None) if handler is not None else None
            if method is not None:
                method(event)
            collector.pop()

    def run_until(self, done: Callable[[], Any], timeout: float, handler: Any = None) -> bool:
        """Pump and dispatch until ``done()`` holds (True) or ``timeout`` passes or the peer goes (False)."""
        deadline = time.monotonic() + timeout
        while True:
            self.dispatch(handler)
            if done():
                return True
            left = deadline - time.monotonic()
            if left <= 0 or self.peer_closed:
                self.dispatch(handler)
                return bool(done())
            self.pump(min(left, 0.05))

    def run_for(self, seconds: float, handler: Any = None) -> None:
        self.run_until(lambda: False, seconds, handler)

    def close(self, linger: float = 0.0) -> None:
        """Close the AMQP connection (sending the close for ``linger`` seconds), then the socket."""
        if linger and not self.peer_closed:
            try:
                if self.connection.state & Endpoint.LOCAL_ACTIVE:
                    self.connection.close()
                self.run_until(lambda: bool(self.connection.state & Endpoint.REMOTE_CLOSED), linger)
            except Exception:  # noqa: BLE001, S110 - closing anyway: the socket goes next
                pass
        try:
            self.sock.close()
        except OSError:
            pass


class _Preferring(SaslClient):
    """Our SASL client, made to pick one mechanism (PLAIN or SCRAM-SHA-256) even when both are offered."""

    def __init__(self, mechanism: str, user: str, password: str, hostname: str) -> None:
        super().__init__(user, password, hostname=hostname)
        self._wanted = mechanism

    def _choose(self, offered: Any) -> None:
        if self._wanted == "PLAIN":
            from proton import Array

            names = [str(m) for m in (offered.elements if isinstance(offered, Array) else offered or [])]
            if "PLAIN" in names:
                offered = ["PLAIN"]
        super()._choose(offered)


def server_engine(sock: socket.socket, users: Any) -> Engine:
    """The server side of an accepted socket: our SASL server against ``users``, then a proton engine."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Engine(sock, SaslServer(users, os.urandom(32), allow_anonymous=False), server=True)


class Listener:
    """A listening socket for a node to connect to (a fake primary or DR source)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = socket.create_server((host, port), backlog=16)
        self.port = self.sock.getsockname()[1]

    def accept(self, timeout: float) -> socket.socket | None:
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return None
        conn, _ = self.sock.accept()
        return conn

    def close(self) -> None:
        self.sock.close()
