"""An accepted connection until it has authenticated: TLS and SASL only, no AMQP engine yet.

Why apart from ``driver.Socket``: anyone who can reach the port makes these,
as many and as often as they like, and most of what a proton connection
costs the reactor thread comes with its engine: the connection and
transport objects and the seven or so engine events each raises between
accept and close, each wrapped in Python.  A connection that never logs in
now costs a socket, its pipe (``security/pipe.py``) and a few reads and
writes; once SASL is done the driver gives it an engine
(``Driver.authenticated``) and the bytes that followed the handshake go to it.

What is expensive in a handshake runs on the node's login pool, never on
the reactor thread (``security/logins.py``, ``login_pool.py``):

- TLS: until its handshake is done, the pipe is handed to the pool with
  each piece of the peer's bytes (the private-key operation is in there);
  bytes that arrive meanwhile wait here, in order, for the next turn.
- SASL: the step that decides a password login pauses the pipe
  (``pipe.verification``) and goes to ``Logins.verify`` (for PLAIN, the
  PBKDF2 check); the verdict comes back on the reactor thread and the
  handshake goes on.

In both cases the socket is still read, so a peer that leaves is noticed.
A connection from a throttled source is not read at all until its delay
has passed (``start``): until then it costs an accept and a timer, and if
its peer has given up by then it is closed unread.
"""

from __future__ import annotations

import select
import selectors
import socket
import time
from typing import Any, Protocol

from hastandby.security.logins import Logins, Pending
from hastandby.security.pipe import PipeError, ServerPipe

from hastandby.broker.transport.sockets import receive, send_out

READ_SIZE = 64 * 1024  # a handshake's messages are small: more than this waiting at once is a peer to refuse


class Host(Protocol):
    """What a handshake needs of the loop that runs it (``driver.Driver``), all on the reactor thread."""

    @property
    def selector(self) -> selectors.BaseSelector: ...

    @property
    def dirty(self) -> set[Any]:
        """What is flushed at the end of the loop's pass."""

    def authenticated(self, handshake: "Handshake", rest: bytes) -> None:
        """``handshake`` is done: its socket gets an engine, fed ``rest``."""

    def handshake_over(self, handshake: "Handshake") -> None:
        """``handshake`` is closed or authenticated: its socket is no longer watched for it."""


class Handshake:
    """One accepted socket from ``source`` (its address; ``peer`` adds the port), until it authenticates."""

    def __init__(self, driver: Host, logins: Logins, sock: socket.socket, pipe: ServerPipe, source: str,
                 peer: str) -> None:
        self.driver = driver
        self.logins = logins
        self.sock = sock
        self.pipe = pipe
        self.source = source
        self.peer = peer
        self.opened_at = time.monotonic()  # when reading began (``start``): the handshake's time runs from then
        self.started = False
        self.closed = False  # closed, or handed over to an engine
        self.events = selectors.EVENT_READ
        self.outbound = bytearray()
        self._inbox = bytearray()  # the peer's bytes that came while the pipe was on the pool
        self._on_pool = False  # the pipe is on the login pool: not to be touched here
        self._refusing: str | None = None  # the handshake failed: send what is left, then close
        self._pending: Pending | None = None  # a verification under way

    def fileno(self) -> int:
        return self.sock.fileno()

    def start(self, held: bool = False) -> None:
        """Begin reading the socket: at accept, or once its source's delay has passed (``held``)."""
        if self.closed:
            return
        if held and _peer_left(self.sock):  # gave up waiting: what it sent meanwhile is not worth a check
            self.close()
            return
        self.started = True
        self.opened_at = time.monotonic()
        self.driver.selector.register(self.sock, selectors.EVENT_READ, self)

    def ready(self, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            self._read()
        if not self.closed:
            self.flush()

    def _read(self) -> None:
        if self._refusing is not None:
            return
        data = receive(self.sock, READ_SIZE)
        if data is None:
            return
        if not data:
            self.close()  # the peer left before authenticating
        elif self._on_pool:
            self._inbox += data
            if len(self._inbox) > READ_SIZE:
                self.refuse(f"more than {READ_SIZE} bytes sent during the TLS handshake")
        else:
            self._receive(data)

    def _receive(self, data: bytes) -> None:
        if self.pipe.tls_handshaking:
            self._on_pool = self.logins.pool.submit(lambda: self._through_tls(data), self._through)
            if not self._on_pool:
                self.refuse(self.logins.busy_refusal())
            return
        try:
            rest = self.pipe.receive(data)
        except PipeError as error:
            self._failed(str(error))
            return
        self._went_on(rest)

    def _through_tls(self, data: bytes) -> bytes | PipeError:
        """On a pool thread: the pipe is not touched anywhere else meanwhile."""
        if self.closed:  # the peer left while this waited: no private-key operation for a peer that is gone
            return b""
        try:
            return self.pipe.receive(data)
        except PipeError as error:
            return error

    def _through(self, result: bytes | PipeError) -> None:
        """Back on the reactor thread from the pool."""
        self._on_pool = False
        if self.closed:
            return
        if isinstance(result, PipeError):
            self._failed(str(result))
        else:
            self._went_on(result)
        if self._inbox and not self.closed and self._refusing is None:
            data, self._inbox = bytes(self._inbox), bytearray()
            self._receive(data)
        if not self.closed:
            self.driver.dirty.add(self)

    def _went_on(self, rest: bytes) -> None:
        if self.pipe.done:
            self.closed = True
            self.driver.authenticated(self, rest)
            return
        verification = self.pipe.verification
        if verification is not None and self._pending is None:
            self._pending = Pending()
            self.logins.verify(self.source, verification, self._pending, self._verdict)

    def _verdict(self, refusal: str | None, busy: bool) -> None:
        """On the reactor thread, perhaps from within ``verify``; never after ``close``."""
        self._pending = None
        try:
            rest = self.pipe.resume(refusal, busy)
        except PipeError as error:
            self._failed(str(error))
            return
        self._went_on(rest)
        if not self.closed:
            self.driver.dirty.add(self)

    def _failed(self, reason: str) -> None:
        if self.pipe.login_failed:
            self.logins.failed(self.source, reason)
        self.refuse(reason)

    def refuse(self, reason: str) -> None:
        """The handshake failed (or took too long): say so in the log, send what is queued, close."""
        if self._refusing is not None:
            return
        self._refusing = reason
        self.logins.refused(self.source, self.peer, reason)
        self.driver.dirty.add(self)

    def flush(self) -> None:
        if self.closed:
            return
        if not self.started:  # held for its source's delay: nothing read, nothing to say
            if self._refusing is not None:
                self.close()
            return
        if not self._on_pool:
            try:
                self.outbound += self.pipe.take_output()
            except PipeError as error:
                self.refuse(str(error))
        if not send_out(self.sock, self.outbound):
            self.close()
            return
        if self._refusing is not None and not self.outbound:
            self.close()
            return
        wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.outbound else 0)
        if wanted != self.events:
            self.events = wanted
            self.driver.selector.modify(self.sock, wanted, self)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._pending is not None:
            self._pending.cancel()
        self.driver.handshake_over(self)
        try:
            self.sock.close()
        except OSError:
            pass


def _peer_left(sock: socket.socket) -> bool:
    """Has the peer closed its end (its last bytes may still be unread)?  One poll, no read."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)
    return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))
