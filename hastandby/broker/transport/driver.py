"""A lean event loop for the proton engine: sockets, timers and cross-thread calls.

Why not ``proton.reactor.Container``?  Its pure-Python event dispatch costs
about 20 us per engine event (a wrapper object per event and per context, a
global-handler pass for every one), and a message in a broker raises several
events.  Measured with the C example clients, send and receive running
together, that held the broker to about 8,000 msg/s.  This driver keeps the
proton C engine (framing, SASL, sessions, flow control) and replaces only the
loop around it:

- sockets are multiplexed with ``selectors`` (epoll) and fed to the transport;
  an accepted socket gets its transport only once it has authenticated
  (``handshake.py``: until then TLS and SASL alone, their expensive steps
  on the login pool, so that a client that cannot log in costs little);
- the three events that come per message (a delivery, link flow, transport
  output) are handled straight from the C event, and routed to the link's
  endpoint through a dict keyed by the link's address; no wrapper objects;
- every other event (opens, closes, attaches: per connection or link, not per
  message) is wrapped as a normal ``proton.Event`` and given to the
  connection's handler as ``on_<event>(event)``, as in the proton examples.

Everything here runs on one thread.  Other threads (signal handlers, etcd's
gRPC callbacks) hand work over with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import os
import selectors
import socket
import ssl
import time
from typing import Any, Callable, Protocol

import structlog
from cproton import (
    PN_DELIVERY,
    PN_LINK_FLOW,
    PN_TRANSPORT,
    PN_TRANSPORT_CLOSED,
    ffi,
    lib,
)
from proton import Collector, Condition, Connection, Endpoint, Event, Transport

from hastandby.security.logins import Logins
from hastandby.security.pipe import ClientSecurity, Pipe, PipeError, ServerSecurity

from hastandby.broker.admission.backlog import Backlog
from hastandby.broker.transport.handshake import Handshake
from hastandby.broker.transport.sockets import receive, send_out

log = structlog.get_logger("hastandby.driver")

TICK_INTERVAL = 0.5  # seconds between idle-timeout (heartbeat) ticks
_BOTH_OPEN = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE
HANDSHAKE_TIMEOUT = 10.0  # seconds a connection may take to authenticate
IO_CHUNK = 256 * 1024  # most bytes moved per socket read or write


def link_name(link: Any) -> str:
    """A link's name for logs and checks, whatever bytes the peer sent as it.

    proton decodes the name as UTF-8 on every ``link.name`` and raises on a
    name that is not (fuzz: such an attach crashed the node from inside its
    own containment, which logged the name).  Here bad bytes are replaced,
    and a link attached without a name (NULL) has the empty name.
    """
    name = lib.pn_link_name(link._impl)
    return ffi.string(name).decode("utf-8", "replace") if name != ffi.NULL else ""


def address_of(impl: Any) -> int:
    """The C address of a proton object, for logs.

    Tables are keyed by the cffi pointer itself: it hashes and compares by
    address, and skips the ``int(ffi.cast(...))`` that cost about 9 % of a
    busy primary's CPU when done for every engine event (py-spy).
    """
    return int(ffi.cast("uintptr_t", impl))


class LinkEndpoint(Protocol):
    """What the driver calls on a registered link (``Driver.register``), with raw C pointers (hot path).

    A sending endpoint also has ``flow()``, called when the peer grants credit; a receiving one need
    not: a peer's flow frame for its own sending end asks nothing of us.
    """

    def on_delivery(self, delivery: Any, /) -> None:
        """A delivery event on the link: a transfer in, or a peer's disposition."""

    def fail(self, error: Exception, /) -> None:
        """``on_delivery`` or ``flow`` raised: fail this link only; the node goes on."""


class Timer:
    """A scheduled call; ``cancel()`` stops it from running."""

    __slots__ = ("deadline", "seq", "fn")

    def __init__(self, deadline: float, seq: int, fn: Callable[[], object] | None) -> None:
        self.deadline = deadline
        self.seq = seq
        self.fn = fn

    def cancel(self) -> None:
        self.fn = None

    def __lt__(self, other: "Timer") -> bool:
        return (self.deadline, self.seq) < (other.deadline, other.seq)


class Socket:
    """One AMQP connection's socket, transport and connection.

    An accepted socket becomes one only once it has authenticated (until
    then it is a ``Handshake``).  With a ``pipe`` (``security/pipe.py``: TLS,
    and SASL on our own connections to peers) bytes go through it and
    ``_outbound`` holds what the socket has not taken yet.  A plain
    connection drops its pipe once SASL is done and moves bytes the bare
    way, straight between socket and engine.

    Each readiness reads up to ``IO_CHUNK`` and feeds the engine in pieces
    it has room for (its input buffer is 8 KiB); ``_inbound`` keeps what it
    had no room for at all.  Reading only one buffer's worth per pass of
    the loop starved producers while a consumer drained a deep queue: a
    pass then writes up to a megabyte to the consumer, and the producer got
    8 KiB per pass, about 800 msg/s (issue 13's recovery after an alarm).
    """

    def __init__(self, driver: "Driver", sock: socket.socket, transport: Transport, connection: Connection,
                 pipe: Pipe | None = None) -> None:
        self.driver = driver
        self.sock = sock
        self.transport = transport
        self.connection = connection
        self.t_impl = transport._impl
        self.closed = False
        self.events = selectors.EVENT_READ
        self.connecting = False
        self.on_closed: Callable[["Socket"], None] | None = None
        self.pipe = pipe
        self.opened_at = time.monotonic()
        self._inbound = bytearray()
        self._outbound = bytearray()
        self._refusing: str | None = None  # the handshake failed: send what is left, then close
        self.backlog = Backlog(driver.after_events)
        self.tick_due = 0.0  # when the transport's idle-timeout timer next wants a tick (Driver._tick)

    def fileno(self) -> int:
        return self.sock.fileno()

    def ready(self, mask: int) -> None:
        if self.connecting and mask & selectors.EVENT_WRITE:
            self._connected()
        if mask & selectors.EVENT_READ and not self.closed:
            self._read()
        if not self.closed:
            self.flush()

    def _connected(self) -> None:
        error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self.connecting = False
        if error:
            log.debug("connect failed", error=os.strerror(error))
            lib.pn_transport_close_tail(self.t_impl)
            lib.pn_transport_close_head(self.t_impl)
            self.close()

    def _read(self) -> None:
        if self._refusing is not None:  # the handshake failed: nothing more is read
            return
        if self._inbound:  # the engine had no room last time: no more until it has
            self._push_inbound()
            if self._inbound:
                return
        data = receive(self.sock, IO_CHUNK)
        if data is None:
            return
        if not data:
            lib.pn_transport_close_tail(self.t_impl)
        elif self.pipe is None:
            self._feed(data)
        elif not self._feed_through_pipe(self.pipe, data):
            return
        self.driver.dirty.add(self)

    def _feed_through_pipe(self, pipe: Pipe, data: bytes) -> bool:
        """TLS and SASL bytes in, AMQP bytes to the engine; False if the pipe refused them."""
        try:
            clear = pipe.receive(data)
        except PipeError as error:
            self.refuse(str(error))
            return False
        self._feed(clear)
        return True

    def _feed(self, data: bytes) -> None:
        """Push ``data`` into the engine, a piece as big as its room at a time; keep what finds none."""
        t = self.t_impl
        view = memoryview(data)
        while view:
            room = lib.pn_transport_capacity(t)
            if room <= 0:
                self._inbound += view
                return
            piece = view[:room]
            lib.pn_transport_push(t, ffi.from_buffer(piece), len(piece))
            view = view[len(piece):]

    def _push_inbound(self) -> None:
        data = bytes(self._inbound)
        self._inbound.clear()
        self._feed(data)

    def refuse(self, reason: str) -> None:
        """The handshake failed (or took too long): say so in the log, send what is queued, close."""
        if self._refusing is not None:
            return
        self._refusing = reason
        self.transport.condition = Condition("amqp:unauthorized-access", reason)
        try:
            peer = "%s:%d" % self.sock.getpeername()[:2]
        except OSError:
            peer = "?"
        log.warning("connection not authenticated", peer=peer, reason=reason)
        self.driver.dirty.add(self)

    def _flush_through_pipe(self) -> None:
        pipe = self.pipe
        assert pipe is not None
        t = self.t_impl
        try:
            self._outbound += pipe.take_output()
            if pipe.done and self._refusing is None:
                out = self.driver.out_buffer
                pending = lib.pn_transport_pending(t)
                while pending > 0 and len(self._outbound) < IO_CHUNK:
                    size = lib.pn_transport_peek(t, out, min(pending, IO_CHUNK))
                    self._outbound += pipe.send(bytes(ffi.buffer(out, size)))
                    lib.pn_transport_pop(t, size)
                    pending = lib.pn_transport_pending(t)
        except PipeError as error:
            self.refuse(str(error))
        if not send_out(self.sock, self._outbound):
            self._outbound.clear()
            lib.pn_transport_close_head(t)
        if self._refusing is not None and not self._outbound:
            self.close()
            return
        if pipe.passthrough and not self._outbound and not self._inbound:
            self.pipe = None  # SASL done on a plain connection: the bare path from now on
        pending = lib.pn_transport_pending(t)
        if pending < 0 and lib.pn_transport_capacity(t) < 0 and not self._outbound:
            self.close()
            return
        self.backlog.written(max(pending, 0) + len(self._outbound))
        writing = self._outbound or (pipe.done and pending > 0)
        wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
        if wanted != self.events:
            self.events = wanted
            self.driver.selector.modify(self.sock, wanted, self)

    def flush(self) -> None:
        """Write what the transport has for the peer; watch for writability if some remains.

        Called at the end of a pass, and in the middle of one where output cannot wait for the
        pass to end (a producer's credit: ``links.IncomingLink``).
        """
        if self.closed or self.connecting:
            return
        if self.pipe is not None:
            self._flush_through_pipe()
            return
        t = self.t_impl
        pending = lib.pn_transport_pending(t)
        out = self.driver.out_buffer
        while pending > 0:
            size = lib.pn_transport_peek(t, out, min(pending, IO_CHUNK))
            try:
                sent = self.sock.send(ffi.buffer(out, size))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                lib.pn_transport_close_head(t)
                break
            lib.pn_transport_pop(t, sent)
            pending = lib.pn_transport_pending(t)
        if pending < 0 and lib.pn_transport_capacity(t) < 0:
            self.close()
            return
        self.backlog.written(max(pending, 0))
        wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if pending > 0 else 0)
        if wanted != self.events:
            self.events = wanted
            self.driver.selector.modify(self.sock, wanted, self)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.driver.forget(self)
        try:
            self.sock.close()
        except OSError:
            pass
        if not lib.pn_transport_closed(self.t_impl):
            lib.pn_transport_close_tail(self.t_impl)
            lib.pn_transport_close_head(self.t_impl)
        if self.on_closed is not None:
            self.on_closed(self)


class _Listener:
    def __init__(self, driver: "Driver", sock: socket.socket, tls: ssl.SSLContext | None) -> None:
        self.driver = driver
        self.sock = sock
        self.tls = tls

    def ready(self, mask: int) -> None:
        for _ in range(64):
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                log.warning("accept failed", error=str(error))
                return
            driver = self.driver
            source = str(address[0])
            refusal = driver.handshake_refusal(source)
            if refusal is not None:
                conn.close()  # a flood of sockets that never authenticate: turn them away at the door
                if driver.logins is not None:
                    driver.logins.refused_at_accept(source, "%s:%d" % address[:2], *refusal)
                continue
            driver.adopt(conn, address, self.tls)

    def close(self) -> None:
        self.driver.selector.unregister(self.sock)
        self.sock.close()


class _Wakeup:
    def __init__(self, driver: "Driver") -> None:
        self.driver = driver
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)

    def ready(self, mask: int) -> None:
        try:
            os.read(self.read_fd, 4096)
        except BlockingIOError:
            pass

    def poke(self) -> None:
        try:
            os.write(self.write_fd, b"!")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending anyway


class Driver:
    """Runs the proton engine for every connection of a node on one thread."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.selector = selectors.DefaultSelector()
        self.collector = Collector()
        self._c_impl = self.collector._impl
        self.endpoints: dict[Any, LinkEndpoint] = {}  # C link pointer -> endpoint
        self._pinned: dict[Any, Any] = {}  # C link pointer -> its wrapper
        self.sockets: dict[Any, Socket] = {}  # C transport pointer -> socket
        self.dirty: set[Socket | Handshake] = set()
        self.out_buffer = ffi.new("char[]", IO_CHUNK)
        self._timers: list[Timer] = []
        self._seq = itertools.count()
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._after_events: list[Callable[[], None]] = []
        self._wakeup = _Wakeup(self)
        self.selector.register(self._wakeup.read_fd, selectors.EVENT_READ, self._wakeup)
        self._stopped = False
        # What accepted connections are authenticated against, and who decides their logins; None
        # only where no client ever connects (unit tests of the layers above).
        self.security: ServerSecurity | None = None
        self.logins: Logins | None = None
        self.handshakes: set[Handshake] = set()  # accepted sockets still in TLS/SASL
        self.handshakes_from: collections.Counter[str] = collections.Counter()  # ... per source address
        self.max_handshakes = 0  # of them at once (0: no limit)
        self.max_handshakes_per_source = 0
        self.schedule(TICK_INTERVAL, self._tick)

    # -- registration ----------------------------------------------------------

    def register(self, link: Any, endpoint: LinkEndpoint) -> None:
        """Route a link's deliveries and flow straight to ``endpoint``.

        The endpoint gets ``on_delivery(raw_delivery)``, ``flow()``, and
        ``fail(error)`` if either raised (hot path: raw C pointers).

        The link wrapper is kept (pinned) while registered, so the C link
        cannot be freed and its address given to another link meanwhile.
        """
        impl = link._impl
        log.debug("register", link=link_name(link), address=hex(address_of(impl)),
                  endpoint=type(endpoint).__name__)
        self.endpoints[impl] = endpoint
        self._pinned[impl] = link

    def unregister(self, link: Any) -> None:
        impl = link._impl
        self.endpoints.pop(impl, None)
        self._pinned.pop(impl, None)

    @staticmethod
    def set_handler(connection: Connection, handler: Any) -> None:
        """Events of this connection go to ``handler`` instead of the driver's default.

        Kept in the connection's own record, not in a table keyed by address:
        a freed connection's address is soon another connection's.
        """
        connection.hs_handler = handler

    # -- sockets -----------------------------------------------------------------

    def listen(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> _Listener:
        sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        sock.setblocking(False)
        listener = _Listener(self, sock, tls)
        self.selector.register(sock, selectors.EVENT_READ, listener)
        return listener

    def handshake_refusal(self, source: str) -> tuple[str, str] | None:
        """(limit, reason) if a socket just accepted from ``source`` must be closed at once, else None."""
        if self.max_handshakes and len(self.handshakes) >= self.max_handshakes:
            return "handshakes", f"handshakes limit reached: {self.max_handshakes}"
        if self.max_handshakes_per_source and self.handshakes_from[source] >= self.max_handshakes_per_source:
            return "handshakes_per_source", (f"handshakes from {source} limit reached: "
                                             f"{self.max_handshakes_per_source}")
        return None

    def adopt(self, sock: socket.socket, address: Any, tls: ssl.SSLContext | None = None) -> None:
        """Serve an accepted socket: TLS if its listener has it, then SASL (a ``Handshake``), then AMQP."""
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.security is None or self.logins is None:  # no authentication at all: unit tests of the layers above
            self._add(self._engine(sock, None, None))
            return
        source = str(address[0])
        handshake = Handshake(self, self.logins, sock, self.security.pipe(tls), source, "%s:%d" % tuple(address[:2]))
        self.handshakes.add(handshake)
        self.handshakes_from[source] += 1
        delay = self.logins.wait_for(source, tls is not None)
        if delay > 0:
            self.schedule(delay, lambda: handshake.start(held=True))  # not read before then
        else:
            handshake.start()

    def handshake_over(self, handshake: Handshake) -> None:
        """``handshake`` is closed or authenticated: it no longer counts, and its socket is not watched for it."""
        self.handshakes.discard(handshake)
        self.dirty.discard(handshake)
        remaining = self.handshakes_from[handshake.source] - 1
        if remaining > 0:
            self.handshakes_from[handshake.source] = remaining
        else:
            del self.handshakes_from[handshake.source]
        try:
            self.selector.unregister(handshake.sock)
        except (KeyError, ValueError):
            pass

    def authenticated(self, handshake: Handshake, rest: bytes) -> None:
        """``handshake`` is done: its connection gets an engine, which gets the bytes that followed SASL."""
        self.handshake_over(handshake)
        wrapped = self._engine(handshake.sock, handshake.pipe, handshake.pipe.principal)
        wrapped._outbound = handshake.outbound
        self._add(wrapped)
        wrapped._feed(rest)

    def _engine(self, sock: socket.socket, pipe: Pipe | None, principal: Any) -> Socket:
        connection = Connection()
        connection.collect(self.collector)
        connection.hs_principal = principal
        transport = Transport(Transport.SERVER)  # told nothing of SASL: the pipe did it
        transport.bind(connection)
        return Socket(self, sock, transport, connection, pipe)

    def connect(self, host: str, port: int, connection: Connection, handler: Any,
                security: ClientSecurity | None = None) -> Socket:
        """Open an outgoing connection (TLS and SASL as ``security`` says); ``handler`` gets its events."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.collect(self.collector)
        self.set_handler(connection, handler)
        transport = Transport()
        transport.bind(connection)
        wrapped = Socket(self, sock, transport, connection, (security or ClientSecurity()).pipe(host))
        wrapped.connecting = True
        try:
            sock.connect((host, port))
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as error:
            log.debug("connect failed", host=host, port=port, error=str(error))
            wrapped.connecting = False
            self._add(wrapped)
            lib.pn_transport_close_tail(wrapped.t_impl)
            lib.pn_transport_close_head(wrapped.t_impl)
            self.dirty.add(wrapped)
            return wrapped
        self._add(wrapped)
        wrapped.events = selectors.EVENT_READ | selectors.EVENT_WRITE
        self.selector.modify(sock, wrapped.events, wrapped)
        return wrapped

    def _add(self, wrapped: Socket) -> Socket:
        self.sockets[wrapped.t_impl] = wrapped
        self.selector.register(wrapped.sock, selectors.EVENT_READ, wrapped)
        self.dirty.add(wrapped)
        return wrapped

    def socket_of(self, connection: Connection) -> Socket | None:
        """The socket a connection runs over (None once it is closed)."""
        return self.sockets.get(lib.pn_connection_transport(connection._impl))

    def forget(self, wrapped: Socket) -> None:
        self.sockets.pop(wrapped.t_impl, None)
        self.dirty.discard(wrapped)
        try:
            self.selector.unregister(wrapped.sock)
        except (KeyError, ValueError):
            pass

    # -- time and other threads -----------------------------------------------------

    def schedule(self, delay: float, fn: Callable[[], object]) -> Timer:
        timer = Timer(time.monotonic() + delay, next(self._seq), fn)
        heapq.heappush(self._timers, timer)
        return timer

    def after_events(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the engine events pending now are handled, before output is written."""
        self._after_events.append(fn)

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the driver's thread; safe from any thread and from signal handlers."""
        self._calls.append(fn)
        self._wakeup.poke()

    def _tick(self) -> None:
        """Tick the transports whose idle-timeout timer is due, and end handshakes that take too long.

        proton answers each tick with the time of the next one; a connection
        open on both sides without an idle timeout either way has none, and is
        not ticked again.  Ticking (and flushing) every transport at every
        interval cost a node holding 10,000 idle connections 5.8 % of a core.
        """
        now = time.monotonic()
        for handshake in [h for h in self.handshakes if h.started and now - h.opened_at > HANDSHAKE_TIMEOUT]:
            handshake.refuse(f"no TLS and SASL handshake within {HANDSHAKE_TIMEOUT:g} s")
        for wrapped in list(self.sockets.values()):
            if wrapped.closed or now < wrapped.tick_due:
                continue
            if wrapped.pipe is not None and not wrapped.pipe.done and now - wrapped.opened_at > HANDSHAKE_TIMEOUT:
                wrapped.refuse(f"no TLS and SASL handshake within {HANDSHAKE_TIMEOUT:g} s")
            deadline = wrapped.transport.tick(now)
            if deadline:
                wrapped.tick_due = deadline
            elif wrapped.connection.state & _BOTH_OPEN == _BOTH_OPEN:
                wrapped.tick_due = math.inf
            self.dirty.add(wrapped)
        self.schedule(TICK_INTERVAL, self._tick)

    # -- the loop --------------------------------------------------------------------

    def run(self) -> None:
        while not self._stopped:
            self._run_calls()
            self._process_events()
            self._flush()
            timeout = self._next_timeout()
            for key, mask in self.selector.select(timeout):
                key.data.ready(mask)
            self._run_timers()
        self._process_events()
        self._flush()

    def stop(self) -> None:
        self._stopped = True

    def _next_timeout(self) -> float:
        if self._calls or self._after_events or lib.pn_collector_peek(self._c_impl) != ffi.NULL or self.dirty:
            return 0.0
        if not self._timers:
            return 1.0
        return max(0.0, min(1.0, self._timers[0].deadline - time.monotonic()))

    def _run_calls(self) -> None:
        calls = self._calls
        while calls:
            fn = calls.popleft()
            try:
                fn()
            except Exception:
                log.exception("scheduled call failed")

    def _run_timers(self) -> None:
        now = time.monotonic()
        timers = self._timers
        while timers and timers[0].deadline <= now:
            timer = heapq.heappop(timers)
            fn = timer.fn
            if fn is not None:
                try:
                    fn()
                except Exception:
                    log.exception("timer failed")

    def _flush(self) -> None:
        while self.dirty:
            dirty, self.dirty = self.dirty, set()
            for wrapped in dirty:
                wrapped.flush()
            if self.dirty:
                self._process_events()

    def _process_events(self) -> None:
        """Handle every pending engine event, the per-message kinds first.

        A replicated message raises two deliveries and two transport events
        on a primary; endpoints are called inline (one call less per event).
        """
        collector = self._c_impl
        # C functions as locals: ``lib.name`` costs a lookup (~30 ns) each time.
        peek = lib.pn_collector_peek
        pop = lib.pn_collector_pop
        event_type = lib.pn_event_type
        event_delivery = lib.pn_event_delivery
        delivery_link = lib.pn_delivery_link
        event_transport = lib.pn_event_transport
        endpoints = self.endpoints
        sockets = self.sockets
        while True:
            event = peek(collector)
            if not event:  # NULL
                if not self._after_events:
                    return
                self._run_after_events()
                continue
            kind = event_type(event)
            if kind == PN_DELIVERY:
                delivery = event_delivery(event)
                endpoint = endpoints.get(delivery_link(delivery))
                if endpoint is not None:
                    try:
                        endpoint.on_delivery(delivery)
                    except Exception as error:
                        self._endpoint_failed(endpoint, error)
                else:
                    self._dispatch(event)
            elif kind == PN_TRANSPORT:
                wrapped = sockets.get(event_transport(event))
                if wrapped is not None:
                    self.dirty.add(wrapped)
            elif kind == PN_LINK_FLOW:
                endpoint = endpoints.get(lib.pn_event_link(event))
                if endpoint is not None:
                    # A receiving endpoint has no flow(): a peer's own flow frame for its sending end
                    # (its ``available``, a drain answer) is legal and asks nothing of us.
                    flow = getattr(endpoint, "flow", None)
                    try:
                        if flow is not None:
                            flow()
                    except Exception as error:
                        self._endpoint_failed(endpoint, error)
                else:
                    self._dispatch(event)
            elif kind == PN_TRANSPORT_CLOSED:
                transport = lib.pn_event_transport(event)
                wrapped = self.sockets.get(transport)
                if wrapped is not None:
                    wrapped.flush()
                    wrapped.close()
                self._dispatch(event)
                self._unregister_links(lib.pn_transport_connection(transport))
            else:
                self._dispatch(event)
            pop(collector)

    def _run_after_events(self) -> None:
        calls, self._after_events = self._after_events, []
        for fn in calls:
            try:
                fn()
            except Exception:
                log.exception("after-events call failed")

    def _unregister_links(self, connection: Any) -> None:
        """A closed transport's links get no more events: let go of their endpoints."""
        if connection == ffi.NULL:
            return
        link = lib.pn_link_head(connection, 0)
        while link != ffi.NULL:
            self.endpoints.pop(link, None)
            self._pinned.pop(link, None)
            link = lib.pn_link_next(link, 0)

    def _endpoint_failed(self, endpoint: Any, error: Exception) -> None:
        """One bad link must not stop the node: log, and fail only that link."""
        log.exception("link endpoint failed")
        endpoint.fail(error)

    def _dispatch(self, impl: Any) -> None:
        event = Event.wrap(impl)
        connection = event.connection
        handler = self.handler
        if connection is not None:
            handler = getattr(connection, "hs_handler", None) or handler
        method = getattr(handler, event.type.method, None)
        if method is None:
            return
        try:
            method(event)
        except Exception as error:  # one peer's event must never stop the node
            try:
                self._contain(event, error)
            except Exception:  # containment failed too (a bug): the connection goes, the node stays
                log.exception("containment failed, closing the connection", proton_event=event.type.method)
                if connection is not None and connection.state & Endpoint.LOCAL_ACTIVE:
                    connection.close()

    @staticmethod
    def _contain(event: Event, error: Exception) -> None:
        """A handler failed (on any connection, ours to a peer included): close what the event is about."""
        condition = Condition("amqp:internal-error", f"{type(error).__name__}: {error}")
        link, connection = event.link, event.connection
        log.exception("event handler failed, closing its link or connection", proton_event=event.type.method,
                      link=link_name(link) if link is not None else None)
        if link is not None and link.state & Endpoint.LOCAL_ACTIVE:
            link.condition = condition
            link.close()
        elif connection is not None and connection.state & Endpoint.LOCAL_ACTIVE:
            connection.condition = condition
            connection.close()
