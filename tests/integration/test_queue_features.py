"""Priorities, delivery limits and single active consumers (docs/queues.md) with real nodes and real clients.

Each feature on a standalone node (python-qpid-proton clients; rhea for a
priority queue's producer and consumer, a consumer that releases and fails
deliveries up to the delivery limit, and two consumers of a single active
consumer queue), then across a failover: kill -9 of the primary
and an etcd election, or a promotion (``HaCluster``); durable queues across
a restart on their journal; and a DR replica declared with the same options.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from proton import Delivery, Message, symbol
from proton.reactor import Copy
from proton.utils import BlockingConnection

from hastandby.testing import auth
from hastandby.testing.clients import browse, connect, send
from hastandby.testing.nodes import REPO
from hastandby.testing.waiting import wait_for

RHEA_CLIENT = REPO / "tests" / "rhea" / "client.js"
PRIORITIES = [3, 9, 0, 5, 9, 4, 7, 1, 5, 8, 2, 6, 9, 0, 4]  # one of every level, some twice
DEAD_LETTER_REASON = symbol("x-opt-dead-letter-reason")
DEAD_LETTER_QUEUE = symbol("x-opt-dead-letter-queue")


def hastandby(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "hastandby", *args], cwd=REPO, capture_output=True, text=True,
                            timeout=30)
    if ok:
        assert result.returncode == 0, f"hastandby {' '.join(args)}: {result.stdout}{result.stderr}"
    return result


def prioritized(prefix: str = "", priorities: list[int] = PRIORITIES, durable: bool = False) -> list[Message]:
    return [Message(body=f"{prefix}{i}:p{p}", priority=p, durable=durable) for i, p in enumerate(priorities)]


def queue_order(messages: list[Message]) -> list[Any]:
    """Highest priority first, then the order they were sent (with 10 levels, every priority 0-9 is a level)."""
    ranked = sorted(enumerate(messages), key=lambda item: (-item[1].priority, item[0]))
    return [message.body for _, message in ranked]


def describe(address: str, name: str) -> dict[str, Any]:
    result = json.loads(hastandby("query", "--json", "-b", address).stdout)
    return next(q for q in result["queues"] if q["name"] == name)


def dead_letter_route(address: str, durable: bool = False) -> None:
    """A fanout exchange ``dlx`` with queue ``dead`` bound to it."""
    flag = ("--durable",) if durable else ()
    hastandby("add", "exchange", "fanout", "dlx", "-b", address, *flag)
    hastandby("add", "queue", "dead", "-b", address, *flag)
    hastandby("bind", "dlx", "dead", "-b", address)


class Taker:
    """One consumer on its own connection: takes a message, then settles it one way or another.

    With ``credit`` 0 it grants one credit per ``take`` (nothing is prefetched: a prefetched message
    would go back as a failed delivery when the connection closes); with more, it keeps that many
    granted (python-qpid-proton's prefetch).
    """

    def __init__(self, address: str, queue: str, credit: int = 0, **connect_options: Any) -> None:
        self.connection: BlockingConnection = connect(address, **connect_options)
        self.receiver = self.connection.create_receiver(queue, credit=credit)

    def take(self, timeout: float = 5.0) -> Message:
        return self.receiver.receive(timeout=timeout)

    def nothing(self, timeout: float = 1.0) -> bool:
        try:
            self.receiver.receive(timeout=timeout)
        except Exception:  # proton.Timeout
            return True
        return False

    def fail(self) -> None:
        """``modified`` with delivery-failed: the delivery counts as failed."""
        delivery = self.receiver.fetcher.unsettled.popleft()
        delivery.local.failed = True
        delivery.update(Delivery.MODIFIED)
        delivery.settle()
        self.connection.wait(lambda: True, timeout=1)  # let the disposition go out

    def accept(self) -> None:
        self.receiver.accept()

    def close(self) -> None:
        try:
            self.connection.close()
        except Exception:  # noqa: BLE001 - its node was killed: nothing to close cleanly
            pass


def fail_once(address: str, queue: str, **connect_options: Any) -> Message:
    """Take the queue's next message and answer ``modified`` (delivery-failed); the message as received."""
    taker = Taker(address, queue, **connect_options)
    try:
        message = taker.take()
        taker.fail()
        return message
    finally:
        taker.close()


def take_all(address: str, queue: str, count: int, accept: bool = True) -> list[Message]:
    taker = Taker(address, queue, credit=count)
    try:
        got = []
        for _ in range(count):
            got.append(taker.take())
            if accept:
                taker.accept()
        return got
    finally:
        taker.close()


def rhea(*args: str) -> dict[str, Any]:
    node_binary = shutil.which("node")
    assert node_binary, "Node.js is needed for the rhea tests (scripts/setup installs it)"
    assert (RHEA_CLIENT.parent / "node_modules" / "rhea").is_dir(), "rhea is not installed: run scripts/setup"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HASTANDBY_")}
    environment.update(auth.client_environment())
    result = subprocess.run([node_binary, str(RHEA_CLIENT), "--timeout", "20", *args], capture_output=True,
                            text=True, timeout=40, env=environment)
    lines = result.stdout.strip().splitlines()
    assert lines and result.returncode == 0, f"rhea (exit {result.returncode}): {result.stdout}{result.stderr}"
    return json.loads(lines[-1])


# -- standalone ----------------------------------------------------------------------------------------


def test_priorities_python_producer_rhea_consumer(node):
    hastandby("add", "queue", "pq", "--priorities", "10", "-b", node.address)
    messages = prioritized()
    send(node.address, "pq", messages)
    expected = queue_order(messages)
    assert [m.body for m in browse(node.address, "pq", len(messages))] == expected  # browsing shows queue order
    result = rhea("--url", f"amqp://{node.address}", "--queue", "pq", "--receive", str(len(messages)))
    assert result["bodies"] == expected
    described = describe(node.address, "pq")
    assert described["priorities"] == 10 and described["arguments"]["qpid.priorities"] == 10
    assert described["depth"] == 0
    text = hastandby("query", "-b", node.address).stdout
    assert '"qpid.priorities": 10' in text


def test_two_levels_map_priorities_as_qpid_did(node):
    hastandby("add", "queue", "two", "--priorities", "2", "-b", node.address)
    send(node.address, "two", [Message(body=f"p{p}", priority=p) for p in (0, 4, 5, 9, 3, 6)])
    # Levels: 0-4 low, 5-9 high; FIFO within each.
    assert [m.body for m in take_all(node.address, "two", 6)] == ["p5", "p9", "p6", "p0", "p4", "p3"]


def test_bad_values_are_refused_with_a_clear_error(node):
    for option, value, error in (("--priorities", "0", "0 is not in the range 1<=x<=10"),
                                 ("--priorities", "11", "11 is not in the range 1<=x<=10"),
                                 ("--priorities", "high", "'high' is not a valid integer"),
                                 ("--delivery-limit", "0", "0 is not in the range x>=1")):
        result = hastandby("add", "queue", "bad", option, value, "-b", node.address, ok=False)
        assert result.returncode != 0 and error in result.stderr, result.stderr
    # The node checks too, whatever the client: the arguments as any AMQP management client sends them.
    for argument, error in (("qpid.priorities=0", "qpid.priorities must be a whole number from 1 to 10, got 0"),
                            ("qpid.priorities=2.5", "qpid.priorities must be a whole number from 1 to 10, got 2.5"),
                            ("x-delivery-limit=0", "x-delivery-limit must be a whole number from 1 to"),
                            ("x-single-active-consumer=7", "x-single-active-consumer must be true or false")):
        result = hastandby("add", "queue", "bad", "--argument", argument, "-b", node.address, ok=False)
        assert result.returncode != 0 and error in result.stderr, result.stderr
    assert "bad" not in {q["name"] for q in json.loads(hastandby("query", "--json", "-b", node.address).stdout)
                         ["queues"]}


def test_delivery_limit_dead_letters_what_fails_and_keeps_what_is_released(node):
    dead_letter_route(node.address)
    hastandby("add", "queue", "work", "--delivery-limit", "3", "--alternate-exchange", "dlx", "-b", node.address)
    send(node.address, "work", [Message(body="poison")])  # alone: what a take gets next is the one put back
    # released and modified without delivery-failed do not count
    taker = Taker(node.address, "work")
    assert taker.take().body == "poison"
    taker.receiver.release(delivered=False)
    assert taker.take().body == "poison"
    taker.receiver.settle(Delivery.MODIFIED)  # modified, not failed
    assert taker.take().delivery_count == 0
    taker.fail()  # 1: modified with delivery-failed
    taker.close()
    # 2: the connection goes while the message is unsettled
    lost = Taker(node.address, "work")
    assert (message := lost.take()).body == "poison" and message.delivery_count == 1
    lost.close()
    third = fail_once(node.address, "work")  # 3: the limit
    assert (third.body, third.delivery_count) == ("poison", 2)
    send(node.address, "work", [Message(body="ok")])
    assert [m.body for m in take_all(node.address, "work", 1)] == ["ok"]
    dead = take_all(node.address, "dead", 1)[0]
    assert dead.body == "poison"
    assert dead.annotations == {DEAD_LETTER_REASON: "delivery-limit", DEAD_LETTER_QUEUE: "work"}
    described = describe(node.address, "work")
    assert described["delivery_limit"] == 3 and described["stats"]["dead_lettered"] == 1
    assert described["arguments"]["x-delivery-limit"] == 3


def test_delivery_limit_without_an_alternate_exchange_drops_with_a_log_line(node):
    hastandby("add", "queue", "work", "--delivery-limit", "1", "-b", node.address)
    send(node.address, "work", [Message(body="poison")])
    fail_once(node.address, "work")
    wait_for(lambda: describe(node.address, "work")["stats"]["dead_lettered"] == 1, 5, "dead-lettered")
    assert describe(node.address, "work")["depth"] == 0
    assert "it reached the queue's delivery limit and the queue has no alternate exchange" in node.log()


def test_single_active_consumer_hands_over_in_attach_order(node):
    hastandby("add", "queue", "sac", "--single-active-consumer", "-b", node.address)
    first, second, third = (Taker(node.address, "sac", credit=20) for _ in range(3))
    try:
        send(node.address, "sac", [Message(body=f"m{i}") for i in range(5)])
        assert [first.take().body for _ in range(5)] == [f"m{i}" for i in range(5)]
        assert second.nothing() and third.nothing()
        assert describe(node.address, "sac")["waiting_consumers"] == 2
        first.accept()  # m0 settled, m1-m4 still unsettled when its connection goes
        first.close()
        got = [second.take() for _ in range(4)]
        assert [(m.body, m.delivery_count) for m in got] == [(f"m{i}", 1) for i in range(1, 5)]
        assert third.nothing()
        second.close()
        assert third.take().body == "m1"  # and third is next
    finally:
        for taker in (first, second, third):
            taker.close()


def test_delivery_limit_with_a_rhea_consumer(node):
    """rhea's ``released`` does not count, its ``modified`` with delivery-failed does, and the header's
    delivery-count says so; at the limit the message leaves for the dead-letter route, annotated."""
    dead_letter_route(node.address)
    hastandby("add", "queue", "work", "--delivery-limit", "2", "--alternate-exchange", "dlx", "-b", node.address)
    send(node.address, "work", [Message(body="poison")])
    url = f"amqp://{node.address}"
    seen = [rhea("--url", url, "--queue", "work", "--receive", "1", "--outcome", outcome)
            for outcome in ("release", "fail", "release", "fail")]
    assert [(r["bodies"], r["delivery_counts"]) for r in seen] == [(["poison"], [0]), (["poison"], [0]),
                                                                   (["poison"], [1]), (["poison"], [1])]
    wait_for(lambda: describe(node.address, "work")["stats"]["dead_lettered"] == 1, 5, "dead-lettered")
    assert describe(node.address, "work")["depth"] == 0
    dead = rhea("--url", url, "--queue", "dead", "--receive", "1")
    assert dead["bodies"] == ["poison"]
    assert dead["annotations"] == [{"x-opt-dead-letter-reason": "delivery-limit", "x-opt-dead-letter-queue": "work"}]


def test_single_active_consumer_and_priorities_with_rhea(node):
    """A rhea producer's header priorities order the queue; of two rhea consumers on one session, the first
    attached gets every message, highest priority first; python-qpid-proton then takes over the queue."""
    hastandby("add", "queue", "sac", "--single-active-consumer", "--priorities", "10", "-b", node.address)
    url = f"amqp://{node.address}"
    sent = rhea("--url", url, "--queue", "sac", "--send", "10", "--priority-from", "3")  # priorities 3..9, 0..2
    assert sent["accepted"] == 10
    got = rhea("--url", url, "--queue", "sac", "--receive", "6", "--consumers", "2")
    assert got["consumers"] == [0] * 6
    by_priority = sorted(range(10), key=lambda i: (-((3 + i) % 10), i))  # message i has priority (3 + i) % 10
    assert got["bodies"] == [f"rhea-{i}" for i in by_priority[:6]]
    assert [m.body for m in take_all(node.address, "sac", 4)] == [f"rhea-{i}" for i in by_priority[6:]]


# -- across a failover ----------------------------------------------------------------------------------------


def admin_browse(address: str, queue: str, count: int) -> list[Message]:
    return browse(address, queue, count, admin=True)


@pytest.mark.etcd
def test_priorities_and_delivery_counts_survive_kill_9_and_an_election(ha):
    c = ha(3)
    primary = c.wait_replicating()
    backups = [i for i in range(3) if i != primary]
    address = c[primary].address
    dead_letter_route(address)
    hastandby("add", "queue", "work", "--priorities", "10", "--delivery-limit", "3", "--alternate-exchange", "dlx",
              "-b", address)
    messages = prioritized()
    send(address, "work", messages)  # accepted: every ready backup has them
    expected = queue_order(messages)
    for index in backups:  # each backup's replica orders them as the primary does
        assert [m.body for m in admin_browse(c[index].address, "work", len(messages))] == expected
    for attempt in range(2):  # the first in queue order fails twice on this primary
        failed = fail_once(address, "work")
        assert (failed.body, failed.delivery_count) == (expected[0], attempt)
    for index in backups:
        wait_for(lambda: admin_browse(c[index].address, "work", 1)[0].delivery_count == 2, 10,
                 f"{c.ids[index]}'s copy counting two failed deliveries")
    c[primary].kill()
    new, _ = c.wait_new_primary(backups, 30)
    address = c[new].address
    wait_for(lambda: c.state(new) == "primary" and describe(address, "work")["priorities"] == 10, 20,
             "the new primary serving")
    third = fail_once(address, "work")  # the third failure, on the new primary: the limit
    assert (third.body, third.delivery_count) == (expected[0], 2)
    assert [m.body for m in take_all(address, "work", len(messages) - 1)] == expected[1:]
    dead = take_all(address, "dead", 1)[0]
    assert dead.body == expected[0] and dead.annotations[DEAD_LETTER_REASON] == "delivery-limit"
    assert describe(address, "work")["stats"]["dead_lettered"] == 1


def test_single_active_consumer_and_priorities_across_kill_9_and_promote(cluster_factory):
    c = cluster_factory(2)
    hastandby("add", "queue", "sac", "--single-active-consumer", "--priorities", "10", "-b", c[0].address)
    wait_for(lambda: c.queue(1, "sac") is not None, 10, "the backup to have the queue")
    messages = prioritized()
    send(c[0].address, "sac", messages)
    expected = queue_order(messages)
    active, waiting = Taker(c[0].address, "sac", credit=3), Taker(c[0].address, "sac", credit=30)
    try:
        assert [active.take().body for _ in range(3)] == expected[:3]  # taken, never settled
        assert waiting.nothing()
        c[0].kill()
        c.promote(1)
        address = c[1].address
        # After the failover, whoever attaches first to the new primary is the active consumer.
        later_first, later_second = Taker(address, "sac", credit=30), Taker(address, "sac", credit=30)
        try:
            assert [later_first.take().body for _ in expected] == expected
            assert later_second.nothing()
            assert describe(address, "sac")["waiting_consumers"] == 1
        finally:
            later_first.close()
            later_second.close()
    finally:
        active.close()
        waiting.close()


# -- durable queues across a restart ----------------------------------------------------------------------------


def test_durable_priorities_counts_and_single_consumer_survive_a_restart(node_factory, tmp_path):
    data = str(tmp_path / "data")
    node = node_factory("--data-dir", data)
    dead_letter_route(node.address, durable=True)
    hastandby("add", "queue", "work", "--durable", "--priorities", "10", "--delivery-limit", "3",
              "--single-active-consumer", "--alternate-exchange", "dlx", "-b", node.address)
    messages = prioritized(durable=True)
    send(node.address, "work", messages)
    expected = queue_order(messages)

    def written() -> int:
        return node.request("STATUS")["journal"]["bytes_written"]

    for _ in range(2):
        before = written()
        fail_once(node.address, "work")
        # A failed delivery's count is written after the fact (nobody waits for it): kill -9 only once it is.
        wait_for(lambda: written() > before, 10, "the delivery count in the journal")
    port = node.port
    node.kill()
    restarted = node_factory("--data-dir", data, port=port)
    described = describe(restarted.address, "work")
    assert (described["priorities"], described["delivery_limit"], described["single_active_consumer"]) == \
        (10, 3, True)
    assert [m.body for m in browse(restarted.address, "work", len(messages))] == expected
    third = fail_once(restarted.address, "work")
    assert (third.body, third.delivery_count) == (expected[0], 2)  # the count came back from the journal
    first, second = Taker(restarted.address, "work", credit=30), Taker(restarted.address, "work", credit=30)
    try:
        assert [first.take().body for _ in expected[1:]] == expected[1:]
        assert second.nothing()
    finally:
        first.close()
        second.close()
    assert take_all(restarted.address, "dead", 1)[0].body == expected[0]


# -- DR replicas ----------------------------------------------------------------------------------------------


def test_a_dr_replica_declared_alike_orders_alike_and_keeps_its_options(node_factory, tmp_path):
    source = node_factory(name="source")
    data = str(tmp_path / "replica-data")
    replica = node_factory("--data-dir", data, name="replica")
    hastandby("add", "queue", "pq", "--priorities", "10", "--delivery-limit", "5", "-b", source.address)
    hastandby("add", "queue", "pq", "--priorities", "10", "--delivery-limit", "5", "-b", replica.address,
              "--start-replica", source.address)
    messages = prioritized()
    send(source.address, "pq", messages)
    expected = queue_order(messages)
    wait_for(lambda: [m.body for m in browse(replica.address, "pq", len(messages), timeout=0.5)] == expected, 20,
             "the replica to hold the messages in queue order")
    fail_once(source.address, "pq")  # a full replica mirrors the delivery-count too
    wait_for(lambda: browse(replica.address, "pq", 1)[0].delivery_count == 1, 10, "the replica's count")
    # Not durable: a restarted replica node declares it again, as it was declared.
    port = replica.port
    replica.kill()
    restarted = node_factory("--data-dir", data, name="replica", port=port)
    wait_for(lambda: [m.body for m in browse(restarted.address, "pq", len(messages), timeout=0.5)] == expected, 20,
             "the restarted replica to hold the messages in queue order")
    described = describe(restarted.address, "pq")
    assert (described["priorities"], described["delivery_limit"]) == (10, 5)


def test_browsing_a_priority_queue_with_a_copy_receiver(node):
    """Browsers see queue order, messages sent while browsing included, each once."""
    hastandby("add", "queue", "pq", "--priorities", "10", "-b", node.address)
    send(node.address, "pq", [Message(body="low", priority=1), Message(body="high", priority=8)])
    conn = connect(node.address)
    try:
        browser = conn.create_receiver("pq", credit=10, options=Copy())
        assert [browser.receive(timeout=5).body for _ in range(2)] == ["high", "low"]
        send(node.address, "pq", [Message(body="later", priority=9)])
        assert browser.receive(timeout=5).body == "later"
    finally:
        conn.close()
    assert describe(node.address, "pq")["depth"] == 3

