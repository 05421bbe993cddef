"""Replica comparison: browse every replicated queue on the primary and its backups, compare by id.

An admin connection (connection property ``qpid.ha-admin: True``) may attach
a browsing receiver (distribution mode ``copy``) even on a backup.  The
delivery tag of each browsed message is its replication id in decimal, so
one browse gives a queue's ``{id: bytes}``.  The receiver asks for all of it
with drain mode: the node sends what it has and then reports the credit
drained, so the browse ends exactly when the queue has been read.

What is compared is the message without its header section: the header is
per-delivery state the broker rewrites (``delivery-count`` after a
redelivery), the rest is the producer's bytes as the broker stored them.

:func:`verify_replicas` is the one entry point the runner uses, so that it
can later become a call of a ``hastandby verify`` command.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proton import Data, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, Copy

from hastandby.client import Login, ManagementClient, ManagementError

from .checker import Browse, ReplicaDiff, compare_replicas

ADMIN = {symbol("qpid.ha-admin"): True}
HEADER_PREFIX = b"\x00\x53\x70"  # described section, smallulong descriptor 0x70 (header)
BROWSE_CREDIT = 1_000_000
BROWSE_TIMEOUT = 10.0


class BrowseError(RuntimeError):
    """A node could not be browsed; the message says which and why."""


def without_header(data: bytes) -> bytes:
    """The message bytes after the header section (all of them if there is none)."""
    if not data.startswith(HEADER_PREFIX):
        return data
    section = Data()
    used = section.decode(data)
    return data[used:]


class _Browser(MessagingHandler):
    """Browse ``queues`` on one node, each to the end (drain), then close."""

    def __init__(self, address: str, queues: list[str], login: Login, timeout: float) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.address = address
        self.login = login
        self.queues = queues
        self.timeout = timeout
        self.got: dict[str, dict[int, bytes]] = {q: {} for q in queues}
        self.pending: set[str] = set(queues)
        self.error: str | None = None
        self.connection: Any = None
        self.timer: Any = None

    def on_start(self, event: Any) -> None:
        self.connection = event.container.connect(f"amqp://{self.address}", reconnect=False, properties=ADMIN,
                                                  **self.login.connect_options(self.address.rsplit(":", 1)[0]))
        for queue in self.queues:
            event.container.create_receiver(self.connection, queue, name=f"verify-{queue}", options=Copy())
        self.timer = event.container.schedule(self.timeout, self)

    def on_link_opened(self, event: Any) -> None:
        event.link.drain(BROWSE_CREDIT)

    def on_delivery(self, event: Any) -> None:
        delivery, link = event.delivery, event.link
        if not delivery.readable or delivery.partial:
            return
        data = link.recv(delivery.pending)
        link.advance()
        self.got[link.source.address][int(delivery.tag)] = without_header(data or b"")
        delivery.settle()

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_receiver and link.state & link.REMOTE_ACTIVE and not link.draining():
            self.pending.discard(link.source.address)
            if not self.pending:
                self._close()

    def on_link_error(self, event: Any) -> None:
        self.error = f"{event.link.name}: {event.link.remote_condition}"
        self._close()

    def on_transport_error(self, event: Any) -> None:
        self.error = f"transport: {event.transport.condition}"
        self._close()

    def on_timer_task(self, event: Any) -> None:
        if self.pending and self.error is None:
            self.error = f"browse not finished within {self.timeout:g} s (queues {sorted(self.pending)})"
            self._close()

    def _close(self) -> None:
        """Close the connection and cancel the timer: the container runs until both are done."""
        if self.timer is not None:
            self.timer.cancel()
        self.connection.close()


def browse(address: str, queues: list[str], login: Login,
           timeout: float = BROWSE_TIMEOUT) -> dict[str, dict[int, bytes]]:
    """Every message of ``queues`` on the node at ``address``: queue -> replication id -> bytes."""
    if not queues:
        return {}
    browser = _Browser(address, queues, login, timeout)
    container = Container(browser)
    container.run()
    if browser.error is not None or browser.pending:
        raise BrowseError(f"{address}: {browser.error or 'incomplete'}")
    return browser.got


def replicated_queues(address: str, login: Login) -> list[str]:
    """The queues the node at ``address`` holds with ``qpid.replicate`` ``all``."""
    try:
        with ManagementClient(address, timeout=5, login=login) as client:
            queues = client.request("QUERY")["queues"]
    except ManagementError as error:
        raise BrowseError(f"{address}: {error}") from None
    return sorted(q["name"] for q in queues if q.get("replicate") == "all")


def verify_replicas(primary: str, backups: Mapping[str, str], login: Login) -> list[ReplicaDiff]:
    """Compare the primary's replicated queues (``primary``: its address) with each backup's copy.

    ``backups`` maps node ids to addresses; ``login`` is an admin's.  A backup is browsed only for the
    queues it has (browsing a missing one could create it); one it lacks
    counts as empty.  Raises BrowseError if a node cannot be read.
    """
    queues = replicated_queues(primary, login)
    first: Browse = browse(primary, queues, login)
    copies = {}
    for node_id, address in backups.items():
        held = set(replicated_queues(address, login))
        copies[node_id] = browse(address, [q for q in queues if q in held], login) if held & set(queues) else {}
    return compare_replicas(first, copies)
