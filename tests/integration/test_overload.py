"""Overload, for real: the memory high watermark and the resource limits (docs/limits.md).

Real node processes and python-qpid-proton clients; the node's own status
(``memory``) tells its resident size and whether producers are held.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from proton import ConnectionException, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection, LinkDetached

from hastandby.broker.admission.backlog import UNSETTLED_LIMIT, UNWRITTEN_LIMIT
from hastandby.client import ManagementClient, ManagementError
from hastandby.testing import auth
from hastandby.testing.clients import connect
from hastandby.testing.nodes import NodeProcess, free_port
from hastandby.testing.waiting import wait_for

MiB = 1 << 20
WATERMARK = 160 * MiB
# Above the watermark: one producer link's window (1000 x 10 KB), what a draining connection may hold in
# flight (broker/admission/backlog.py: a consumer granting all its credit at once reaches these), and 24 MiB for what
# arrives between two 0.1 s samples and malloc's free pages not yet given back.
BODY = b"x" * 10_000
SLACK = 1000 * len(BODY) + UNSETTLED_LIMIT + UNWRITTEN_LIMIT + 24 * MiB


class Producer(MessagingHandler):
    """Sends ``count`` numbered 10 KB messages as fast as credit allows; records what was accepted."""

    def __init__(self, url: str, count: int) -> None:
        super().__init__()
        self.url, self.count = url, count
        self.sent = 0
        self.accepted: set[int] = set()
        self.errors: list[str] = []

    def on_start(self, event: Any) -> None:
        connection = event.container.connect(self.url, allow_insecure_mechs=True)
        event.container.create_sender(connection, "big")

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            self.sent += 1
            event.sender.send(Message(id=self.sent, body=BODY), tag=str(self.sent))

    def on_accepted(self, event: Any) -> None:
        self.accepted.add(int(event.delivery.tag))
        if len(self.accepted) == self.count:
            event.connection.close()

    def on_rejected(self, event: Any) -> None:
        self.errors.append(f"rejected {event.delivery.tag}")

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(str(event.transport.condition))


class Consumer(MessagingHandler):
    def __init__(self, url: str, count: int, prefetch: int = 10) -> None:
        super().__init__(prefetch=prefetch)
        self.url, self.count = url, count
        self.received: set[int] = set()

    def on_start(self, event: Any) -> None:
        connection = event.container.connect(self.url, allow_insecure_mechs=True)
        event.container.create_receiver(connection, "big")

    def on_message(self, event: Any) -> None:
        self.received.add(int(event.message.id))
        if len(self.received) == self.count:
            event.connection.close()


def run(handler: MessagingHandler) -> threading.Thread:
    thread = threading.Thread(target=lambda: Container(handler).run(), daemon=True)
    thread.start()
    return thread


def memory(node: NodeProcess) -> dict[str, Any]:
    return node.request("STATUS")["memory"]


@pytest.mark.parametrize("prefetch", [10, 0], ids=["prefetch-10", "all-credit-at-once"])
def test_a_producer_pushing_twice_the_watermark_waits_and_loses_nothing(node_factory, prefetch):
    """``all-credit-at-once``: a consumer granting credit for every message made the node frame the whole
    queue into its connection at once; that memory stayed in use and the alarm never cleared (backlog.py)."""
    node = node_factory("--memory-high-watermark", f"{WATERMARK // MiB}MB")
    count = 2 * WATERMARK // len(BODY)
    producer = Producer(node.url, count)
    sending = run(producer)
    peak = 0

    def held() -> bool:
        nonlocal peak
        status = memory(node)
        peak = max(peak, status["resident"])
        return status["producers_blocked"] and producer.sent < count

    wait_for(held, 60, "producers held at the watermark")
    stalled_at = producer.sent
    time.sleep(1.0)
    assert producer.sent <= stalled_at + 1000, "credit kept flowing above the watermark"
    peak = max(peak, memory(node)["resident"])
    consumer = Consumer(node.url, count, prefetch or count)
    draining = run(consumer)
    while draining.is_alive() and sending.is_alive():
        peak = max(peak, memory(node)["resident"])
        time.sleep(0.1)
    draining.join(60)
    sending.join(60)
    print(f"\nwatermark {WATERMARK // MiB} MB: peak resident {peak / MiB:.0f} MB; "
          f"{count} x 10 KB sent, held at {stalled_at}")
    assert not producer.errors, producer.errors
    assert producer.accepted == set(range(1, count + 1))
    assert consumer.received == producer.accepted, "acknowledged messages lost"
    assert peak <= WATERMARK + SLACK, f"resident {peak / MiB:.0f} MB above {WATERMARK // MiB} MB + slack"
    assert not memory(node)["producers_blocked"]


def test_a_backup_in_memory_alarm_holds_the_primarys_producers(node_factory):
    primary_port, backup_port = free_port(), free_port()
    brokers = f"127.0.0.1:{primary_port},127.0.0.1:{backup_port}"
    primary = node_factory("--ha-cluster", "--brokers-url", brokers, port=primary_port, name="primary")
    backup = node_factory("--ha-cluster", "--brokers-url", brokers, "--memory-high-watermark", "150MB",
                          port=backup_port, name="backup")
    assert primary.request("PROMOTE")["state"] == "primary"
    wait_for(lambda: backup.request("STATUS")["state"] == "backup", 20, "the backup ready")
    primary.request("CREATE", "queue", "big")
    producer = Producer(primary.url, 40_000)
    run(producer)

    def held() -> bool:
        status = memory(primary)
        return status["producers_blocked"] and status["peers_in_alarm"] and not status["alarm"]

    wait_for(held, 60, "the primary holding producers for the backup's alarm")
    stalled_at = producer.sent
    time.sleep(1.0)
    assert producer.sent <= stalled_at + 1000
    assert memory(backup)["resident"] <= 150 * MiB + SLACK
    consumer = Consumer(primary.url, 40_000)
    run(consumer)
    wait_for(lambda: len(consumer.received) == 40_000, 120, "every message consumed")
    assert producer.accepted == consumer.received == set(range(1, 40_001))
    wait_for(lambda: not memory(primary)["producers_blocked"], 10, "the alarm cleared on both")


# -- limits ------------------------------------------------------------------------------------------


def test_connections_beyond_the_limit_are_refused_and_the_others_go_on(node_factory):
    node = node_factory("--limit", "connections=3", "--limit", "connections-per-user=2")
    first, second = connect(node.address), connect(node.address)
    with pytest.raises(ConnectionException, match="connections of user 'app' limit reached: 2"):
        connect(node.address)
    admin = connect(node.address, user=auth.ADMIN)
    with pytest.raises(ConnectionException, match="connections limit reached: 3"):
        connect(node.address, user=auth.PEER)
    sender = first.create_sender("q")
    sender.send(Message(body="still served"))
    for connection in (first, second, admin):
        connection.close()
    assert connect(node.address).create_receiver("q").receive(5).body == "still served"


def test_links_and_auto_created_queues_beyond_their_limits_are_refused(node_factory):
    node = node_factory("--limit", "links-per-connection=2", "--limit", "auto-created-queues=2")
    connection: BlockingConnection = connect(node.address)
    connection.create_sender("a")
    connection.create_sender("b")
    with pytest.raises(LinkDetached, match="links per connection limit reached: 2"):
        connection.create_sender("c")
    other = connect(node.address)
    with pytest.raises(LinkDetached, match="auto-created queues limit reached: 2"):
        other.create_sender("d")
    other.create_sender("a").send(Message(body="known queues still take messages"))
    connection.close()
    other.close()
    node.request("CREATE", "queue", "made-by-an-admin")  # CREATE is not an auto-creation


class _RefusedAgainAndAgain(MessagingHandler):
    """Attaches one sender after another to a refused address; proton detaches each refused link."""

    def __init__(self, url: str, attempts: int) -> None:
        super().__init__()
        self.url, self.attempts = url, attempts
        self.refusals: list[str] = []
        self.connection_error: str | None = None
        self.sent = False

    def on_start(self, event: Any) -> None:
        self.connection = event.container.connect(self.url, reconnect=False)
        self.kept = event.container.create_sender(self.connection, "kept")
        event.container.create_sender(self.connection, "other")

    def on_link_opened(self, event: Any) -> None:
        if event.link.name.endswith("other"):
            event.container.create_sender(self.connection, "refused", name="refused-0")

    def on_link_error(self, event: Any) -> None:  # proton closes the link after this (not the connection)
        self.refusals.append(event.link.remote_condition.description)
        if len(self.refusals) < self.attempts:
            event.container.create_sender(self.connection, "refused", name=f"refused-{len(self.refusals)}")
        elif self.kept.credit and not self.sent:
            self.kept.send(Message(body="the connection still serves"))
            self.sent = True

    def on_accepted(self, event: Any) -> None:
        event.connection.close()

    def on_connection_error(self, event: Any) -> None:
        self.connection_error = str(event.connection.remote_condition)
        event.connection.close()


def test_a_client_that_closes_its_refused_links_is_never_cut_off(node_factory):
    """Refusals count against ``refusals_per_connection`` only while the peer leaves them open: a proton
    MessagingHandler detaches each refused link, so 150 refused attaches in a row (past the limit of
    100) keep its connection.  (BlockingConnection does not detach them: after 100 its connection is
    closed, docs/limits.md.)"""
    node = node_factory("--limit", "links-per-connection=2")  # a management client needs two
    client = _RefusedAgainAndAgain(node.url, 150)
    Container(client).run()
    assert client.connection_error is None
    assert client.refusals == ["links per connection limit reached: 2"] * 150
    assert client.sent
    assert connect(node.address).create_receiver("kept").receive(5).body == "the connection still serves"


def test_a_management_request_over_its_size_limit_is_refused(node_factory):
    node = node_factory("--limit", "management-request=4096")
    with ManagementClient(node.address) as client:
        with pytest.raises(ManagementError):
            client.request("CREATE", "queue", "q", {"arguments": {"x": "y" * 10_000}})
        assert client.request("PING") == {}
