"""Small blocking python-qpid-proton clients for tests (real AMQP, no mocks); a PLAIN ``SaslClient``.

Every client authenticates (PLAIN, credentials in the URL, ``auth.url``): as
``app`` by default, as ``admin`` where it must see a backup (``admin=True``,
the ``qpid.ha-admin`` connection property) or names ``user=auth.ADMIN``.
"""

from __future__ import annotations

from typing import Any

from proton import Array, Described, Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, Copy, Filter
from proton.utils import BlockingConnection

from hastandby.security.sasl import SaslClient, SaslError

from hastandby.testing import auth

TOPIC_FILTER = symbol("apache.org:legacy-amqp-topic-binding:string")


class TestConnection(BlockingConnection):
    """python-qpid-proton's ``BlockingConnection``, whose ``close`` ends when the socket does.

    proton's ``close`` waits for the peer's close frame and notes a lost socket
    only while not closing, so closing a connection to a node the test killed
    waited out the whole connection timeout, once per connection (20 s of one
    test's 27).  Here a socket lost while closing ends the wait at once.
    """

    def on_transport_closed(self, event: Any) -> None:
        super().on_transport_closed(event)
        if self.closing and not self.disconnected:
            self.disconnected = event.transport.condition or "the socket closed while closing"


def connect(address: str, user: str = auth.APP, **kwargs: Any) -> BlockingConnection:
    return TestConnection(auth.url(address, user), timeout=10, **kwargs)


def send(address: str, queue: str, messages: list[Message] | int, **kwargs: Any) -> list[Any]:
    """Send and wait for each outcome; returns the remote states (ACCEPTED, REJECTED, ...)."""
    if isinstance(messages, int):
        messages = [Message(body=f"m{i}") for i in range(messages)]
    conn = connect(address, **kwargs)
    try:
        sender = conn.create_sender(queue)
        outcomes = []
        for message in messages:
            try:
                delivery = sender.send(message)
                outcomes.append(delivery.remote_state)
            except Exception as error:  # a rejected send raises in BlockingSender
                outcomes.append(error)
        return outcomes
    finally:
        conn.close()


def receive(address: str, queue: str, count: int, timeout: float = 5.0, accept: bool = True,
            user: str = auth.APP, **options: Any) -> list[Message]:
    """Receive ``count`` messages (fewer if none come within ``timeout``)."""
    conn = connect(address, user)
    try:
        receiver = conn.create_receiver(queue, credit=count or 1, **options)
        got = []
        for _ in range(count):
            try:
                message = receiver.receive(timeout=timeout)
            except Exception:
                break
            got.append(message)
            if accept:
                receiver.accept()
        return got
    finally:
        conn.close()


def browse(address: str, queue: str, count: int, timeout: float = 5.0, admin: bool = False) -> list[Message]:
    """Browse without consuming; ``admin`` connections (user ``admin``) may browse an HA backup."""
    conn = connect(address, auth.ADMIN if admin else auth.APP,
                   properties={symbol("qpid.ha-admin"): True} if admin else None)
    try:
        receiver = conn.create_receiver(queue, credit=max(count, 1), options=Copy())
        got = []
        for _ in range(count):
            try:
                got.append(receiver.receive(timeout=timeout))
            except Exception:
                break
            receiver.accept()
        return got
    finally:
        conn.close()


class _IdBrowser(MessagingHandler):
    """Browses a whole queue on an admin connection: replication id (the delivery tag) -> body."""

    def __init__(self, url: str, queue: str, quiet: float) -> None:
        super().__init__(prefetch=1000)
        self.url, self.queue, self.quiet = url, queue, quiet
        self.contents: dict[int, Any] = {}
        self.error: str | None = None
        self._connection: Any = None

    def on_start(self, event: Any) -> None:
        self._connection = event.container.connect(self.url, reconnect=False,
                                                   properties={symbol("qpid.ha-admin"): True})
        event.container.create_receiver(self._connection, self.queue, options=Copy())
        event.container.schedule(self.quiet, self)

    def on_message(self, event: Any) -> None:
        self.contents[int(event.delivery.tag)] = event.message.body

    def on_timer_task(self, event: Any) -> None:
        self._connection.close()

    def on_link_error(self, event: Any) -> None:
        self.error = str(event.link.remote_condition)
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        self.error = str(event.transport.condition)


def browse_ids(address: str, queue: str, quiet: float = 1.0) -> dict[int, Any]:
    """Every message of ``queue`` on the node at ``address`` (primary or backup), by replication id."""
    browser = _IdBrowser(auth.url(address, auth.ADMIN), queue, quiet)
    Container(browser).run()
    assert browser.error is None, f"browsing {queue!r} on {address}: {browser.error}"
    return browser.contents


def topic_filter(pattern: str) -> Filter:
    return Filter({symbol("subject-filter"): Described(TOPIC_FILTER, pattern)})



class _CloseRecorder(MessagingHandler):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.condition: tuple[str, str, dict] | None = None

    def on_start(self, event: Any) -> None:
        event.container.connect(self.url, reconnect=False)

    def on_connection_remote_close(self, event: Any) -> None:
        condition = event.connection.remote_condition
        if condition is not None:
            info = {str(k): v for k, v in (condition.info or {}).items()}
            self.condition = (condition.name, condition.description, info)
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        if event.connection is not None:
            event.connection.close()


def close_condition(address: str, user: str = auth.APP) -> tuple[str, str, dict] | None:
    """Open a plain client connection (as ``user``) and return the condition the node closes it with."""
    recorder = _CloseRecorder(auth.url(address, user))
    Container(recorder).run()
    return recorder.condition


class PlainSaslClient(SaslClient):
    """``SaslClient`` taking PLAIN although the node offers SCRAM-SHA-256 first (it prefers SCRAM)."""

    def _choose(self, offered: Any) -> None:
        names = [str(m) for m in (offered.elements if isinstance(offered, Array) else offered or [])]
        if "PLAIN" not in names:
            raise SaslError(f"PLAIN is not offered (offered: {', '.join(names)})")
        super()._choose([symbol("PLAIN")])
