"""A bound on each connect attempt of a python-qpid-proton ``Container`` client, so that a URL list moves on.

python-qpid-proton 0.40 has no connect timeout.  A connect to an address
that does not answer at all (a cut link, a host that is down: no reset comes
back) waits until the kernel gives up its SYN retries, about two minutes on
Linux, and the heartbeat (the transport's idle timeout) does not start until
the socket has connected.  A client with a URL list sits on that address the
whole time instead of trying the next one; since proton starts the list again
at its first URL whenever a connection opens, a cut node listed first costs
that wait on every loss.

``ConnectTimeout``, one of a client handler's ``handlers``, gives up every
attempt (each transport proton's reconnect binds, one per address tried) that
has not received the peer's Open within its bound: the socket still in its
TCP connect is dropped and the transport closed with a ``connect-timeout``
condition, so proton's reconnect goes on to the next address after its
back-off delay, as after a refused connect.  An attempt that connected but
whose peer stays silent (a frozen process) is bounded the same way; once the
Open has come, the heartbeat watches the connection.

Blocking clients need no handler: ``BlockingConnection`` waits for the Open
at most its ``timeout`` (``hastandby.client.ManagementClient``).
"""

from __future__ import annotations

from typing import Any

from proton import Condition, Handler, Transport

CONNECT_TIMEOUT = 5.0
"""Seconds a connect may take to the peer's Open by default: a node on a LAN answers in milliseconds,
a busy one (TLS, password hashing) in well under a second; a cut link never does."""

TIMED_OUT = "hastandby:connect-timeout"
_ATTEMPT = "hastandby_connect_attempt"  # the attempt's record, kept in the transport's proton attachments


class ConnectTimeout(Handler):
    """Closes a client connection attempt that got no Open within ``timeout`` s (0: never)."""

    def __init__(self, timeout: float = CONNECT_TIMEOUT) -> None:
        self.timeout = timeout

    def on_connection_bound(self, event: Any) -> None:
        """Proton bound a fresh transport: one attempt at one address; start its clock."""
        transport, connection = event.transport, event.connection
        if self.timeout <= 0 or transport is None or connection is None:
            return
        container = getattr(connection, "_reactor", None)  # the Container that made it
        if container is None or getattr(connection, "_acceptor", None) is not None:  # a listener's: not ours
            return
        attempt = _Attempt(transport, f"no AMQP open from {connection.url} within {self.timeout:g} s")
        attempt.task = container.schedule(self.timeout, attempt)
        setattr(transport, _ATTEMPT, attempt)

    def on_connection_remote_open(self, event: Any) -> None:
        _end(event.transport)

    def on_transport_closed(self, event: Any) -> None:
        _end(event.transport)


def _end(transport: Transport | None) -> None:
    """The attempt on ``transport`` is over (opened, or lost): its timer is cancelled, so that it does not
    keep a finished container running until it fires."""
    attempt = getattr(transport, _ATTEMPT, None) if transport is not None else None
    if attempt is not None:
        attempt.end()


class _Attempt(Handler):
    """One transport's attempt at one address; its timer gives the attempt up."""

    def __init__(self, transport: Transport, description: str) -> None:
        self.transport: Transport | None = transport
        self.description = description
        self.task: Any = None

    def end(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.transport = self.task = None

    def on_timer_task(self, event: Any) -> None:
        transport = self.transport
        self.end()
        if transport is not None and not transport.closed:
            _give_up(transport, Condition(TIMED_OUT, self.description))


def _give_up(transport: Transport, condition: Condition) -> None:
    """Close ``transport`` with ``condition`` (reconnect, if on, tries the next address), even mid TCP connect.

    python-qpid-proton 0.40 keeps a socket still connecting in the
    transport's ``_connect_selectable`` (its own ``Connection.close`` takes it
    apart the same way); left there it would be watched until the kernel
    gives up, and keep the container running.
    """
    connecting = getattr(transport, "_connect_selectable", None)
    if connecting is not None:
        transport._connect_selectable = None
        connecting._transport = None
        connecting.terminate()
        connecting.update()
    transport.condition = condition
    transport.close_tail()
    transport.close_head()
