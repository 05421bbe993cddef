"""Replication scenarios of Qpid's src/tests/ha_tests.py, against real node processes.

One test per scenario, named after it.  Every check on a backup reads the
backup itself: management QUERY and browsing over an admin connection
(``qpid.ha-admin``), which backups admit.  Contents are compared exactly and
in order (Qpid's ``assert_browse_backup``), polled with a deadline because
configuration replication and dequeues reach backups asynchronously.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from proton import Delivery, Message
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, AtMostOnce, Container, EventInjector

from hastandby.testing import cexamples
from hastandby.client import ManagementError
from hastandby.testing import auth
from hastandby.testing.clients import browse, connect, receive, send
from hastandby.testing.cluster import HaCluster
from hastandby.testing.nodes import REPO
from hastandby.testing.waiting import wait_for

# -- helpers ------------------------------------------------------------------------


def contents(c: HaCluster, index: int, name: str) -> list[Any] | None:
    """Bodies of the available (not acquired) messages of a queue on a node; None if no such queue."""
    queue = c.queue(index, name)
    if queue is None:
        return None
    count = queue["depth"] - queue["acquired"]
    return [m.body for m in browse(c[index].address, name, count, timeout=2.0, admin=True)]


def assert_contents(c: HaCluster, index: int, name: str, expected: list[Any], timeout: float = 10.0) -> None:
    """The queue on node ``index`` holds exactly ``expected``, in order, within ``timeout``."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        seen = contents(c, index, name)
        if seen == expected:
            return
        time.sleep(0.05)
    raise AssertionError(f"node {index} queue {name!r}: {seen!r} != expected {expected!r}")


def wait_gone(c: HaCluster, index: int, name: str, kind: str = "queues", timeout: float = 10.0) -> None:
    wait_for(lambda: all(o["name"] != name for o in c.query(index)[kind]), timeout,
             f"{kind[:-1]} {name!r} gone from node {index}")


def find(c: HaCluster, index: int, name: str, kind: str = "queues") -> dict[str, Any] | None:
    return next((o for o in c.query(index)[kind] if o["name"] == name), None)


def wait_found(c: HaCluster, index: int, name: str, kind: str = "queues", timeout: float = 10.0) -> dict[str, Any]:
    return wait_for(lambda: find(c, index, name, kind), timeout, f"{kind[:-1]} {name!r} on node {index}")


def bindings(c: HaCluster, index: int) -> set[tuple[str, str, str]]:
    return {(b["exchange"], b["queue"], b["key"]) for b in c.query(index)["bindings"]}


def members(c: HaCluster, index: int) -> dict[str, str]:
    """node_id -> state, as node ``index`` reports its cluster's membership."""
    return {m["node_id"]: m["state"] for m in c.query(index)["ha"]["members"]}


def node_id(c: HaCluster, index: int) -> str:
    return c.status(index)["node_id"]


def cli(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hastandby", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def ok(*args: str) -> str:
    result = cli(*args)
    assert result.returncode == 0, f"hastandby {' '.join(args)} failed: {result.stderr}"
    return result.stdout


def create_queue(c: HaCluster, index: int, name: str, **body: Any) -> dict[str, Any]:
    return c[index].request("CREATE", "queue", name, body)


class _AsyncSender(MessagingHandler):
    """Sends every message without waiting in between; records each one's outcome."""

    def __init__(self, url: str, address: str, messages: list[Message], timeout: float) -> None:
        super().__init__(auto_settle=True)
        self.url = url
        self.address = address
        self.messages = messages
        self.timeout = timeout
        self.outcomes: list[str | None] = [None] * len(messages)
        self.sent = 0
        self.error: str | None = None
        self.connection: Any = None
        self.timer: Any = None

    def on_start(self, event: Any) -> None:
        self.connection = event.container.connect(self.url, reconnect=False)
        event.container.create_sender(self.connection, self.address)
        self.timer = event.container.schedule(self.timeout, self)

    def on_timer_task(self, event: Any) -> None:
        if None in self.outcomes:
            self.error = self.error or f"timed out with {self.outcomes.count(None)} outcomes missing"
            self.connection.close()

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit and self.sent < len(self.messages):
            sender.send(self.messages[self.sent], tag=str(self.sent))
            self.sent += 1

    def _outcome(self, event: Any, name: str) -> None:
        self.outcomes[int(event.delivery.tag)] = name
        if None not in self.outcomes:
            self.timer.cancel()
            event.connection.close()

    def on_accepted(self, event: Any) -> None:
        self._outcome(event, "accepted")

    def on_rejected(self, event: Any) -> None:
        self._outcome(event, "rejected")

    def on_released(self, event: Any) -> None:
        self._outcome(event, "released")

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        self.error = self.error or f"transport error: {condition}"

    def on_link_error(self, event: Any) -> None:
        self.error = self.error or f"link error: {event.link.remote_condition}"
        self.timer.cancel()
        event.connection.close()


def send_async(address: str, queue: str, messages: list[Message], timeout: float = 60.0) -> list[str | None]:
    """Send all of ``messages`` pipelined (unsettled); return the outcome of each, in order."""
    handler = _AsyncSender(auth.url(address), queue, messages, timeout)
    container = Container(handler)
    container.container_id = f"sender-{queue}-{id(handler)}"
    container.run()
    assert handler.error is None, handler.error
    return handler.outcomes


class Holder(MessagingHandler):
    """A consumer in its own thread, so it keeps up heartbeats while the test does other things.

    It attaches to each queue and acquires exactly ``take`` messages, never settling them.
    """

    def __init__(self, address: str, queues: list[str], take: int = 1) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.url = auth.url(address)
        self.queues = queues
        self.take = take
        self.held: dict[str, list[Any]] = {queue: [] for queue in queues}
        self.opened: set[str] = set()
        self.error: str | None = None
        self.connection: Any = None
        self._injector = EventInjector()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=Container(self).run, daemon=True)
        self._thread.start()

    def _check_ready(self) -> None:
        if len(self.opened) == len(self.queues) and all(len(h) == self.take for h in self.held.values()):
            self._ready.set()

    def on_start(self, event: Any) -> None:
        event.container.selectable(self._injector)
        self.connection = event.container.connect(self.url, reconnect=False)
        for queue in self.queues:
            receiver = event.container.create_receiver(self.connection, queue)
            if self.take:
                receiver.flow(self.take)

    def on_link_opened(self, event: Any) -> None:
        self.opened.add(event.link.source.address)
        self._check_ready()

    def on_message(self, event: Any) -> None:
        self.held[event.receiver.source.address].append(event.message.body)
        self._check_ready()

    def on_link_error(self, event: Any) -> None:
        self.error = f"link error: {event.link.remote_condition}"
        self._ready.set()

    def on_transport_error(self, event: Any) -> None:
        self.error = f"transport error: {event.transport.condition}"
        self._ready.set()

    def on_transport_closed(self, event: Any) -> None:
        self._injector.close()

    def on_holder_close(self, event: Any) -> None:
        self.connection.close()

    def wait(self, timeout: float = 10.0) -> dict[str, list[Any]]:
        """Wait until every link is attached and holds its messages; returns them per queue."""
        assert self._ready.wait(timeout), f"held only {self.held} after {timeout}s"
        assert self.error is None, self.error
        return {queue: list(bodies) for queue, bodies in self.held.items()}

    def close(self) -> None:
        """Detach and close from the test's thread: held messages go back to their queues."""
        self._injector.trigger(ApplicationEvent("holder_close"))
        self.join()

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the connection to end (closed, or its node gone)."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the holder's connection outlived its node"


def refused_receiver(address: str, queue: str) -> str:
    """Attach a receiver that the node must refuse; returns the refusal's text."""
    conn = connect(address)
    try:
        conn.create_receiver(queue)
    except Exception as error:
        return str(error)
    finally:
        conn.close()
    raise AssertionError(f"a receiver on {queue!r} at {address} was admitted")


def send_presettled(address: str, queue: str, bodies: list[Any]) -> None:
    """Fire-and-forget sends: nothing waits for replication."""
    conn = connect(address)
    try:
        sender = conn.create_sender(queue, options=AtMostOnce())
        for body in bodies:
            sender.send(Message(body=body))
    finally:
        conn.close()


# -- the scenarios ---------------------------------------------------------------------


def test_sync(cluster_factory):
    """A lone primary gets 0-9, backup 1 joins then 10-19, backup 2 joins then 20-29: both hold 0..29."""
    c = cluster_factory(3)
    c[1].kill()
    c[2].kill()
    wait_for(lambda: len(members(c, 0)) == 1, what="primary alone")
    assert send(c[0].address, "q", [Message(body=i) for i in range(10)]) == [Delivery.ACCEPTED] * 10  # auto-created
    assert c.queue(0, "q")["replicate"] == "all"
    c.restart(1)
    c.wait_state(1, "backup")
    assert send(c[0].address, "q", [Message(body=i) for i in range(10, 20)]) == [Delivery.ACCEPTED] * 10
    c.restart(2)
    c.wait_state(2, "backup")
    assert send(c[0].address, "q", [Message(body=i) for i in range(20, 30)]) == [Delivery.ACCEPTED] * 10
    for index in (0, 1, 2):
        assert_contents(c, index, "q", list(range(30)))
    # The backups took the primary's replication ids, not ids of their own.
    assert {c.queue(i, "q")["next_id"] for i in range(3)} == {31}
    assert {c.queue(i, "q")["uuid"] for i in range(3)} == {c.queue(0, "q")["uuid"]}


def test_send_receive(cluster_factory):
    """2 senders x 2,000 and 2 receivers x 1,950 run at once on the primary; backups end equal to it."""
    c = cluster_factory(3)
    create_queue(c, 0, "q")
    per_sender, per_receiver = 2000, 1950
    receivers = [cexamples.start_receive("127.0.0.1", c[0].port, "q", per_receiver, env=auth.client_environment())
                 for _ in range(2)]
    outcomes: dict[str, list[str | None]] = {}
    errors: list[BaseException] = []

    def run(prefix: str) -> None:
        try:
            messages = [Message(body=f"{prefix}-{i}") for i in range(per_sender)]
            outcomes[prefix] = send_async(c[0].address, "q", messages, timeout=90)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(prefix,)) for prefix in "ab"]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(t.is_alive() for t in threads), "a sender did not finish"
        assert not errors, errors
        for receiver in receivers:
            run_result = receiver.wait(90)
            assert run_result.returncode == 0 and cexamples.received_count(run_result) == per_receiver, run_result
    finally:
        for receiver in receivers:
            receiver.kill()
    assert outcomes == {p: ["accepted"] * per_sender for p in "ab"}
    left = 2 * per_sender - 2 * per_receiver
    primary = c.queue(0, "q")
    assert (primary["depth"], primary["acquired"]) == (left, 0)
    remaining = contents(c, 0, "q")
    assert len(remaining) == left == len(set(remaining))
    # Consumption is FIFO, so what is left of each sender is a suffix of what it sent, in order.
    for prefix in "ab":
        mine = [int(body.split("-")[1]) for body in remaining if body.startswith(prefix + "-")]
        assert mine == list(range(per_sender - len(mine), per_sender)), (prefix, mine)
    for backup in (1, 2):
        assert_contents(c, backup, "q", remaining, timeout=20)
        assert c.queue(backup, "q")["depth"] == left


def test_qpid_config_replication(cluster_factory):
    """Wiring made with the CLI on the primary appears on, and disappears from, every backup."""
    c = cluster_factory(3)
    primary = c[0].address
    ok("add", "queue", "q", "--replicate", "all", "-b", primary)
    ok("add", "queue", "q2", "--replicate", "all", "--max-count", "7", "-b", primary)
    ok("add", "exchange", "topic", "ex", "--replicate", "all", "-b", primary)
    ok("bind", "ex", "q", "a.#", "-b", primary)
    ok("bind", "ex", "q2", "b.#", "-b", primary)
    send(primary, "q", [Message(body="foo")])
    send(primary, "ex", [Message(subject="a.x", body="routed-a"), Message(subject="b.x", body="routed-b")])
    want_q = find(c, 0, "q")
    want_ex = find(c, 0, "ex", "exchanges")
    for backup in (1, 2):
        assert_contents(c, backup, "q", ["foo", "routed-a"])
        assert_contents(c, backup, "q2", ["routed-b"])
        queue = find(c, backup, "q")
        assert (queue["uuid"], queue["replicate"], queue["arguments"]) == (
            want_q["uuid"], "all", {"qpid.replicate": "all"})
        assert find(c, backup, "q2")["arguments"] == {"qpid.replicate": "all", "qpid.max_count": 7}
        exchange = wait_found(c, backup, "ex", "exchanges")
        assert (exchange["uuid"], exchange["type"], exchange["replicate"]) == (want_ex["uuid"], "topic", "all")
        assert {("ex", "q", "a.#"), ("ex", "q2", "b.#")} <= bindings(c, backup)
    # The CLI reads a backup too (admin connection): the replicated wiring is there.
    shown = json.loads(ok("query", "--json", "-b", c[1].address))
    assert {"exchange": "ex", "queue": "q", "key": "a.#", "arguments": {}} in shown["bindings"]
    ok("unbind", "ex", "q2", "b.#", "-b", primary)
    ok("del", "queue", "q", "-b", primary)
    ok("del", "exchange", "ex", "-b", primary)
    for backup in (1, 2):
        wait_gone(c, backup, "q")
        wait_gone(c, backup, "ex", "exchanges")
        assert not {b for b in bindings(c, backup) if b[0] == "ex"}
        assert_contents(c, backup, "q2", ["routed-b"])


def test_ring(cluster_factory):
    """A ring queue's replica holds the primary's tail, also when the ring overflows past an acquired head."""
    c = cluster_factory(2)
    create_queue(c, 0, "ring", arguments={"qpid.policy_type": "ring", "qpid.max_count": 5})
    send(c[0].address, "ring", [Message(body=i) for i in range(10)])
    assert_contents(c, 0, "ring", [5, 6, 7, 8, 9])
    assert_contents(c, 1, "ring", [5, 6, 7, 8, 9])
    assert c.queue(0, "ring")["stats"]["ring_dropped"] == 5
    assert [m.body for m in receive(c[0].address, "ring", 2)] == [5, 6]
    send(c[0].address, "ring", [Message(body=i) for i in (10, 11, 12)])
    assert_contents(c, 0, "ring", [8, 9, 10, 11, 12])
    assert_contents(c, 1, "ring", [8, 9, 10, 11, 12])
    # The head (8) is acquired, unacknowledged, on the primary: the ring drops the
    # oldest *available* message (9) instead, and the replica must do the same.
    holder = Holder(c[0].address, ["ring"])
    try:
        assert holder.wait() == {"ring": [8]}
        send(c[0].address, "ring", [Message(body=13)])
        assert_contents(c, 0, "ring", [10, 11, 12, 13])  # 8 is acquired: browsing skips it
        assert c.queue(0, "ring")["depth"] == 5
        assert_contents(c, 1, "ring", [8, 10, 11, 12, 13])
    finally:
        holder.close()
    assert_contents(c, 0, "ring", [8, 10, 11, 12, 13])  # released at close
    assert_contents(c, 1, "ring", [8, 10, 11, 12, 13])


def test_reject(cluster_factory):
    """A reject-policy queue refuses messages 5..9: the producer hears 'rejected', the replicas never hold them."""
    c = cluster_factory(3)
    create_queue(c, 0, "rq", arguments={"qpid.max_count": 5})  # reject is the default policy
    outcomes = send_async(c[0].address, "rq", [Message(body=i) for i in range(10)], timeout=30)
    assert outcomes == ["accepted"] * 5 + ["rejected"] * 5
    for index in (0, 1, 2):
        assert_contents(c, index, "rq", [0, 1, 2, 3, 4])
    assert c.queue(0, "rq")["stats"]["rejected"] == 5
    for backup in (1, 2):
        queue = c.queue(backup, "rq")
        assert (queue["next_id"], queue["stats"]["enqueued"]) == (6, 5)  # never saw 5..9, not even briefly
    # Room again after a consume: the next message is accepted and replicated.
    assert [m.body for m in receive(c[0].address, "rq", 1)] == [0]
    assert send_async(c[0].address, "rq", [Message(body=10), Message(body=11)]) == ["accepted", "rejected"]
    for index in (0, 1, 2):
        assert_contents(c, index, "rq", [1, 2, 3, 4, 10])


def test_backup_acquired(cluster_factory):
    """Acquired-but-unacknowledged messages are on the backups and redelivered after failover."""
    c = cluster_factory(3)
    c[2].kill()
    create_queue(c, 0, "plain")
    create_queue(c, 0, "ring", arguments={"qpid.policy_type": "ring", "qpid.max_count": 5})
    for name in ("plain", "ring"):
        send(c[0].address, name, [Message(body=i) for i in range(10)])
    holder = Holder(c[0].address, ["plain", "ring"])  # acquires one message of each, never acknowledges
    try:
        assert holder.wait() == {"plain": [0], "ring": [5]}
        assert (c.queue(0, "plain")["acquired"], c.queue(0, "ring")["acquired"]) == (1, 1)
        c.restart(2)  # joins while the messages are acquired
        c.wait_state(2, "backup")
        for backup in (1, 2):
            assert_contents(c, backup, "plain", list(range(10)))
            assert_contents(c, backup, "ring", [5, 6, 7, 8, 9])
    finally:
        c[0].kill()  # with the messages still unacknowledged
        holder.join()
    c.promote(1)
    assert [m.body for m in receive(c[1].address, "plain", 10)] == list(range(10))
    assert [m.body for m in receive(c[1].address, "ring", 5)] == [5, 6, 7, 8, 9]
    for name in ("plain", "ring"):
        c.wait_depth(1, name, 0)  # and nothing more
    # Backup 2 follows the new primary and sees the consumption too.
    c.wait_depth(2, "plain", 0)
    c.wait_depth(2, "ring", 0)


def test_replicate_default(cluster_factory):
    """The node default (--replicate configuration / none) and per-queue overrides decide what backups get."""
    c = cluster_factory(2, "--replicate", "configuration")
    create_queue(c, 0, "q_default")
    create_queue(c, 0, "q_all", arguments={"qpid.replicate": "all"})
    create_queue(c, 0, "q_none", arguments={"qpid.replicate": "none"})
    c[0].request("CREATE", "exchange", "ex_default", {"exchange-type": "fanout"})
    c[0].request("BIND", body={"exchange": "ex_default", "queue": "q_default"})
    for name in ("q_default", "q_all", "q_none", "q_auto"):  # q_auto: created by the sender's attach
        send(c[0].address, name, [Message(body=f"{name}-1"), Message(body=f"{name}-2")])
    assert {q["name"]: q["replicate"] for q in c.query(0)["queues"] if q["name"].startswith("q_")} == {
        "q_default": "configuration", "q_all": "all", "q_none": "none", "q_auto": "configuration"}
    create_queue(c, 0, "sentinel")
    wait_found(c, 1, "sentinel")
    assert_contents(c, 1, "q_all", ["q_all-1", "q_all-2"])
    for name in ("q_default", "q_auto"):
        queue = find(c, 1, name)
        assert queue is not None and queue["depth"] == 0 and queue["arguments"] == {"qpid.replicate": "configuration"}
    assert find(c, 1, "q_none") is None
    assert find(c, 1, "ex_default", "exchanges")["replicate"] == "configuration"
    assert ("ex_default", "q_default", "") in bindings(c, 1)
    assert "q_default" not in c.query(0)["ha"]["lag"]  # no replicating browser for configuration-only

    c = cluster_factory(2, "--replicate", "none")
    create_queue(c, 0, "q_default")
    create_queue(c, 0, "q_all", arguments={"qpid.replicate": "all"})
    create_queue(c, 0, "q_config", arguments={"qpid.replicate": "configuration"})
    c[0].request("CREATE", "exchange", "ex_default", {"exchange-type": "fanout"})
    for name in ("q_default", "q_all", "q_config", "q_auto"):
        send(c[0].address, name, [Message(body=f"{name}-1")])
    create_queue(c, 0, "sentinel", arguments={"qpid.replicate": "configuration"})
    wait_found(c, 1, "sentinel")
    assert_contents(c, 1, "q_all", ["q_all-1"])
    assert find(c, 1, "q_config")["depth"] == 0
    for name in ("q_default", "q_auto"):
        assert find(c, 1, name) is None
    assert find(c, 1, "ex_default", "exchanges") is None


def test_replicate_binding(cluster_factory):
    """A binding with qpid.replicate=none stays on the primary; after failover it no longer routes."""
    c = cluster_factory(2, "--backup-timeout", "1")
    primary = c[0].address
    ok("add", "exchange", "fanout", "ex", "-b", primary)
    ok("add", "queue", "q", "-b", primary)
    ok("add", "queue", "q2", "-b", primary)
    ok("bind", "ex", "q", "--replicate", "none", "-b", primary)
    ok("bind", "ex", "q2", "-b", primary)
    shown = {(b["queue"], json.dumps(b["arguments"])) for b in c.query(0)["bindings"] if b["exchange"] == "ex"}
    assert shown == {("q", '{"qpid.replicate": "none"}'), ("q2", "{}")}
    wait_for(lambda: ("ex", "q2", "") in bindings(c, 1), what="binding ex->q2 on the backup")
    assert ("ex", "q", "") not in bindings(c, 1)  # bound before q2, so it would be there by now
    send(primary, "ex", [Message(body="before")])
    for index in (0, 1):
        assert_contents(c, index, "q", ["before"])  # the message itself is replicated
        assert_contents(c, index, "q2", ["before"])
    c[0].kill()
    c.promote(1)
    send(c[1].address, "ex", [Message(body="after")])
    assert_contents(c, 1, "q2", ["before", "after"])
    assert_contents(c, 1, "q", ["before"])


def test_invalid_replication(cluster_factory):
    """qpid.replicate=bogus is refused with a clear error, and nothing appears on any node."""
    c = cluster_factory(2)
    primary = c[0].address
    result = cli("add", "queue", "qbad", "--argument", "qpid.replicate=bogus", "-b", primary)
    assert result.returncode == 1
    assert result.stderr.strip() == (  # the management reply's AMQP condition, then its description
        "Error: amqp:invalid-field: invalid qpid.replicate value 'bogus': must be one of none, configuration, all")
    with pytest.raises(ManagementError, match="invalid qpid.replicate value 'bogus'") as refused:
        c[0].request("CREATE", "exchange", "exbad",
                     {"exchange-type": "fanout", "arguments": {"qpid.replicate": "bogus"}})
    assert refused.value.status == 400
    create_queue(c, 0, "q")
    c[0].request("CREATE", "exchange", "ex", {"exchange-type": "fanout"})
    with pytest.raises(ManagementError, match="invalid qpid.replicate value 'bogus'"):
        c[0].request("BIND", body={"exchange": "ex", "queue": "q", "arguments": {"qpid.replicate": "bogus"}})
    with pytest.raises(ManagementError, match="invalid qpid.replicate value 3"):
        create_queue(c, 0, "qbad", arguments={"qpid.replicate": 3})
    create_queue(c, 0, "sentinel")
    wait_found(c, 1, "sentinel")
    for index in (0, 1):
        result = c.query(index)
        assert "qbad" not in {q["name"] for q in result["queues"]}
        assert "exbad" not in {e["name"] for e in result["exchanges"]}
        assert [b for b in result["bindings"] if b["exchange"] == "ex"] == []


def test_exclusive_queue(cluster_factory):
    """An exclusive queue is replicated (browsers are exempt) and after failover still admits one consumer."""
    c = cluster_factory(3, "--backup-timeout", "1")
    create_queue(c, 0, "xq", exclusive=True)
    send(c[0].address, "xq", [Message(body="a")])
    first = Holder(c[0].address, ["xq"], take=0)  # the exclusive consumer, with no credit
    try:
        first.wait()
        assert "exclusive" in refused_receiver(c[0].address, "xq")
        send(c[0].address, "xq", [Message(body="b")])
        c[2].kill()
        c.restart(2)  # catches up the exclusive queue while it has a consumer
        c.wait_state(2, "backup")
        for backup in (1, 2):
            assert_contents(c, backup, "xq", ["a", "b"])
            assert find(c, backup, "xq")["exclusive"] is True
    finally:
        c[0].kill()  # the consumer goes with its node
        first.join()
    c.promote(1)
    conn = connect(c[1].address)
    try:
        receiver = conn.create_receiver("xq", credit=2)
        assert "exclusive" in refused_receiver(c[1].address, "xq")
        assert [receiver.receive(timeout=5).body for _ in range(2)] == ["a", "b"]
    finally:
        conn.close()


def test_auto_delete_exclusive(cluster_factory):
    """Exclusive-only, auto-delete-only and exclusive+auto-delete with a timeout are replicated;
    exclusive+auto-delete without one is not, unless tagged.  Auto-delete works through replication."""
    c = cluster_factory(2)
    create_queue(c, 0, "ex", exclusive=True)
    create_queue(c, 0, "ad", **{"auto-delete": True})
    create_queue(c, 0, "exad", exclusive=True, **{"auto-delete": True})
    create_queue(c, 0, "exad_t", exclusive=True, **{"auto-delete": True}, arguments={"qpid.auto_delete_timeout": 2})
    create_queue(c, 0, "exad_tagged", exclusive=True, **{"auto-delete": True}, arguments={"qpid.replicate": "all"})
    for name in ("ex", "ad", "exad", "exad_t", "exad_tagged"):
        send(c[0].address, name, [Message(body=name)])
    assert find(c, 0, "exad")["replicate"] == "none"
    create_queue(c, 0, "sentinel")
    wait_found(c, 1, "sentinel")
    assert find(c, 1, "exad") is None
    for name in ("ex", "ad", "exad_t", "exad_tagged"):
        assert_contents(c, 1, name, [name])
    queue = find(c, 1, "exad_t")
    assert (queue["exclusive"], queue["auto_delete"], queue["arguments"]["qpid.auto_delete_timeout"]) == (True, True, 2)
    # Replicating browsers are not consumers: closing the only client receiver deletes "ad" everywhere.
    assert [m.body for m in receive(c[0].address, "ad", 1)] == ["ad"]
    wait_gone(c, 0, "ad", timeout=5)
    wait_gone(c, 1, "ad", timeout=5)
    # With a timeout the queue outlives its consumer for that long, then goes everywhere.
    before = time.monotonic()  # earlier than the close, so a sound lower bound for the timeout
    assert [m.body for m in receive(c[0].address, "exad_t", 1)] == ["exad_t"]
    assert find(c, 0, "exad_t") is not None and find(c, 1, "exad_t") is not None
    wait_gone(c, 0, "exad_t", timeout=6)
    assert time.monotonic() - before >= 2.0
    wait_gone(c, 1, "exad_t", timeout=5)
    assert find(c, 1, "ex") is not None and find(c, 1, "exad_tagged") is not None


def test_broker_info(cluster_factory):
    """Every node reports the same members with their states; status --all and query show them; lag shows."""
    c = cluster_factory(3, "--heartbeat", "10")
    ids = [node_id(c, i) for i in range(3)]
    assert len(set(ids)) == 3
    want = {ids[0]: "primary", ids[1]: "ready", ids[2]: "ready"}
    for index in range(3):
        wait_for(lambda: members(c, index) == want, what=f"members on node {index}")
        ha = c.query(index)["ha"]
        assert ha["state"] == ("primary" if index == 0 else "backup")
        assert {m["node_id"]: m["url"] for m in ha["members"]} == {ids[i]: c[i].address for i in range(3)}
    for index in range(3):
        lines = ok("status", "--all", "-b", c[index].address).splitlines()
        assert lines == [f"{c[0].address} primary (active)", f"{c[1].address} backup", f"{c[2].address} backup"]
    # A node leaves: every member list drops it, and status --all says it is unreachable.
    c[2].kill()
    want = {ids[0]: "primary", ids[1]: "ready"}
    for index in (0, 1):
        wait_for(lambda: members(c, index) == want, what=f"node 2 gone from node {index}")
    lines = ok("status", "--all", "-b", c[1].address).splitlines()
    assert lines[:2] == [f"{c[0].address} primary (active)", f"{c[1].address} backup"]
    assert lines[2].startswith(f"{c[2].address} unreachable: ")
    # A new node (a restart without a data dir has a new id) joins: every member list has it.
    c.restart(2)
    c.wait_state(2, "backup")
    new_id = node_id(c, 2)
    assert new_id not in ids
    want = {ids[0]: "primary", ids[1]: "ready", new_id: "ready"}
    for index in range(3):
        wait_for(lambda: members(c, index) == want, what=f"members on node {index} after the join")
    # Lag: what a backup has not acknowledged yet.
    create_queue(c, 0, "q")
    send(c[0].address, "q", [Message(body="x")])
    backups = sorted([ids[1], new_id])

    def lag_line(lags: dict[str, int]) -> str:
        return "  lag q: " + ", ".join(f"{b}={lags[b]}" for b in backups)

    c[2].signal(signal.SIGSTOP)
    try:
        send_presettled(c[0].address, "q", ["y1", "y2", "y3"])
        lagging = {ids[1]: 0, new_id: 3}
        wait_for(lambda: c.query(0)["ha"]["lag"]["q"] == lagging, timeout=5, what="lag 3 on node 2")
        assert lag_line(lagging) in ok("query", "-b", c[0].address).splitlines()
    finally:
        c[2].signal(signal.SIGCONT)
    caught_up = {ids[1]: 0, new_id: 0}
    wait_for(lambda: c.query(0)["ha"]["lag"]["q"] == caught_up, what="lag back to 0")
    text = ok("query", "-b", c[0].address).splitlines()
    cluster = text[text.index("Cluster: this node is primary, term 1"):]
    assert sorted(cluster[1:4]) == sorted([f"  {ids[0]} {c[0].address} primary", f"  {ids[1]} {c[1].address} ready",
                                           f"  {new_id} {c[2].address} ready"])
    assert lag_line(caught_up) in cluster
    assert_contents(c, 2, "q", ["x", "y1", "y2", "y3"])


def test_delete_missing_response(cluster_factory, tmp_path):
    """Objects deleted on the primary while a backup was away are gone from it after it reconnects."""
    c = cluster_factory(3)
    for name in ("q1", "q2"):
        create_queue(c, 0, name, durable=True)
    for name in ("e1", "e2"):
        c[0].request("CREATE", "exchange", name, {"exchange-type": "fanout", "durable": True})
    c[0].request("BIND", body={"exchange": "e1", "queue": "q1"})
    c[0].request("BIND", body={"exchange": "e2", "queue": "q2"})
    send(c[0].address, "e1", [Message(body="one")])
    send(c[0].address, "e2", [Message(body="two")])
    # Backup 2 keeps its durable wiring in a data dir: restarted, it comes back with q2 and e2.
    data_dir = tmp_path / "node2-data"
    c[2].kill()
    c.restart(2, "--data-dir", str(data_dir))
    c.wait_state(2, "backup")
    assert_contents(c, 2, "q2", ["two"])
    stored = json.loads((data_dir / "wiring.json").read_text())
    assert {q["name"] for q in stored["queues"]} == {"q1", "q2"}
    c[2].kill()
    c[0].request("DELETE", "queue", "q2")
    c[0].request("DELETE", "exchange", "e2")
    c.restart(2, "--data-dir", str(data_dir))
    c.wait_state(2, "backup")
    wait_gone(c, 2, "q2")
    wait_gone(c, 2, "e2", "exchanges")
    assert find(c, 2, "q1")["uuid"] == find(c, 0, "q1")["uuid"]
    assert find(c, 2, "e1", "exchanges")["uuid"] == find(c, 0, "e1", "exchanges")["uuid"]
    assert_contents(c, 2, "q1", ["one"])
    assert ("e1", "q1", "") in bindings(c, 2)
    stored = json.loads((data_dir / "wiring.json").read_text())
    assert {q["name"] for q in stored["queues"]} == {"q1"}
    assert {e["name"] for e in stored["exchanges"]} == {"e1"}

    # Backup 1 keeps running but loses its connection: hung past the heartbeat, the primary drops it.
    create_queue(c, 0, "q3")
    c[0].request("CREATE", "exchange", "e3", {"exchange-type": "fanout"})
    c[0].request("BIND", body={"exchange": "e3", "queue": "q3"})
    create_queue(c, 0, "keep")
    send(c[0].address, "keep", [Message(body="a"), Message(body="b")])
    send(c[0].address, "q3", [Message(body="gone")])
    assert_contents(c, 1, "q3", ["gone"])
    assert_contents(c, 1, "keep", ["a", "b"])
    id1 = node_id(c, 1)
    c[1].signal(signal.SIGSTOP)
    try:
        wait_for(lambda: id1 not in members(c, 0), timeout=15, what="the primary drops the hung backup")
        c[0].request("DELETE", "queue", "q3")
        c[0].request("DELETE", "exchange", "e3")
        assert [m.body for m in receive(c[0].address, "keep", 1)] == ["a"]
        send(c[0].address, "keep", [Message(body="c")])
    finally:
        c[1].signal(signal.SIGCONT)
    wait_for(lambda: members(c, 0).get(id1) == "ready", timeout=15, what="backup 1 ready again")
    wait_gone(c, 1, "q3")
    wait_gone(c, 1, "e3", "exchanges")
    assert_contents(c, 1, "keep", ["b", "c"])
    assert c.state(1) == "backup"


def test_missed_recreate(cluster_factory):
    """A queue and an exchange deleted and recreated (same names) on a new primary while a backup was
    disconnected: after reconnecting, the backup has the new incarnations, not the old messages or bindings."""
    c = cluster_factory(3, "--backup-timeout", "1")
    create_queue(c, 0, "qq")
    send(c[0].address, "qq", [Message(body=i) for i in range(3)])
    c[0].request("CREATE", "exchange", "xx", {"exchange-type": "fanout"})
    create_queue(c, 0, "xxq")
    c[0].request("BIND", body={"exchange": "xx", "queue": "xxq"})
    old_qq, old_xx = find(c, 0, "qq")["uuid"], find(c, 0, "xx", "exchanges")["uuid"]
    for backup in (1, 2):
        assert_contents(c, backup, "qq", [0, 1, 2])
        wait_for(lambda: find(c, backup, "xx", "exchanges")["bindings"] == 1, what="xx bound on backup")
    c[2].signal(signal.SIGSTOP)  # disconnected through the failover and the recreation
    try:
        c[0].kill()
        c.promote(1)
        c[1].request("DELETE", "queue", "qq")
        create_queue(c, 1, "qq")
        send(c[1].address, "qq", [Message(body="foo")])
        c[1].request("DELETE", "exchange", "xx")
        c[1].request("CREATE", "exchange", "xx", {"exchange-type": "fanout"})
        new_qq, new_xx = find(c, 1, "qq")["uuid"], find(c, 1, "xx", "exchanges")["uuid"]
        assert new_qq != old_qq and new_xx != old_xx
    finally:
        c[2].signal(signal.SIGCONT)
    id2 = node_id(c, 2)
    wait_for(lambda: members(c, 1).get(id2) == "ready", timeout=20, what="node 2 ready with the new primary")
    assert_contents(c, 2, "qq", ["foo"])
    assert find(c, 2, "qq")["uuid"] == new_qq
    xx = find(c, 2, "xx", "exchanges")
    assert (xx["uuid"], xx["bindings"]) == (new_xx, 0)
    assert not {b for b in bindings(c, 2) if b[0] == "xx"}
    send(c[1].address, "xx", [Message(body="dropped")])  # no bindings: routed nowhere
    assert_contents(c, 2, "xxq", [])
    assert c.state(2) == "backup"


def test_expired(cluster_factory):
    """Messages with a TTL expire on the primary and vanish from the backups; short TTLs through a join are safe."""
    c = cluster_factory(3)
    create_queue(c, 0, "q")
    messages = [Message(body=i, ttl=4.0) if i % 2 else Message(body=i) for i in range(10)]
    assert send(c[0].address, "q", messages) == [Delivery.ACCEPTED] * 10
    for index in (1, 2):  # acknowledged, so on every backup, before anything expired
        assert contents(c, index, "q") == list(range(10))
    for index in (0, 1, 2):
        assert_contents(c, index, "q", [0, 2, 4, 6, 8], timeout=15)
    assert c.queue(0, "q")["stats"]["expired"] == 5
    # QPID-4379: 1 ms TTLs racing replication, across a backup joining.
    send(c[0].address, "q2", [Message(body=i, ttl=0.001) for i in range(100)])
    c[2].kill()
    c.restart(2)
    c.wait_state(2, "backup")
    send(c[0].address, "q2", [Message(body=i, ttl=0.001) for i in range(100)] + [Message(body="last")])
    for index in (0, 1, 2):
        assert_contents(c, index, "q2", ["last"])
        assert c.state(index) == ("primary" if index == 0 else "backup")
