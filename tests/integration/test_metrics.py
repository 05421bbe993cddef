"""``hastandby serve --metrics-listen``: a real Prometheus scrapes a real node; a primary's replication figures.

The first test starts Debian's Prometheus with a configuration that scrapes a
node every second on loopback and checks its answers through the HTTP API
(``/api/v1/query``).  The second reads a primary's ``/metrics`` directly while
its backup is frozen (SIGSTOP): the backup's lag in messages and seconds and
the producer acknowledgement its guard holds, then all back to 0 once it
resumes.  Every process is stopped by PID at teardown (node fixtures, the
Prometheus fixture).
"""

from __future__ import annotations

import signal
import urllib.request
from typing import Any, Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import Delivery, Message, Timeout
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection

from hastandby.client import ManagementClient
from hastandby.testing import clients
from hastandby.testing.nodes import free_port
from hastandby.testing.prometheus import PrometheusServer
from hastandby.testing.waiting import wait_for


@pytest.fixture
def prometheus(tmp_path) -> Iterator[Callable[[list[str]], PrometheusServer]]:
    servers: list[PrometheusServer] = []

    def start(targets: list[str]) -> PrometheusServer:
        server = PrometheusServer(tmp_path, targets)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def _value(result: list[dict[str, Any]]) -> float | None:
    return float(result[0]["value"][1]) if len(result) == 1 else None


def test_prometheus_scrapes_a_node(node_factory, prometheus):
    metrics = f"127.0.0.1:{free_port()}"
    node = node_factory("--metrics-listen", metrics)
    outcomes = clients.send(node.address, "metrics-q", 7)
    assert outcomes == [Delivery.ACCEPTED] * 7, outcomes

    server = prometheus([metrics])
    depth = 'hastandby_queue_depth{queue="metrics-q"}'
    wait_for(lambda: _value(server.query(depth)) == 7, timeout=30,
             what=f"Prometheus's {depth} to be 7 (log: {server.log()[-1500:]})")
    assert _value(server.query('up{job="hastandby"}')) == 1
    assert _value(server.query('hastandby_queue_enqueued_total{queue="metrics-q"}')) == 7
    assert _value(server.query('hastandby_node_state{state="standalone"}')) == 1
    assert _value(server.query("hastandby_snapshot_ok")) == 1
    assert _value(server.query("hastandby_memory_alarm")) == 0

    # Later scrapes follow the queue: take three, and Prometheus sees 4 left and 3 dequeued.
    assert len(clients.receive(node.address, "metrics-q", 3)) == 3
    wait_for(lambda: _value(server.query(depth)) == 4, timeout=30, what=f"{depth} to fall to 4")
    wait_for(lambda: _value(server.query('hastandby_queue_dequeued_total{queue="metrics-q"}')) == 3, timeout=10,
             what="3 dequeued")
    targets = server.api("targets")["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_primary_reports_its_backup_lag_and_held_acknowledgements(node_factory):
    ports = [free_port(), free_port()]
    brokers = ",".join(f"127.0.0.1:{p}" for p in ports)
    metrics = f"127.0.0.1:{free_port()}"
    # --heartbeat 0: a frozen backup stays connected, so that the primary keeps guarding for it.
    common = ("--ha-cluster", "--brokers-url", brokers, "--heartbeat", "0")
    primary = node_factory(*common, "--node-id", "n0", "--metrics-listen", metrics, port=ports[0], name="ha0")
    backup = node_factory(*common, "--node-id", "n1", port=ports[1], name="ha1")
    with ManagementClient(primary.address, timeout=10) as client:
        client.request("PROMOTE")
    wait_for(lambda: backup.request("STATUS")["state"] == "backup", timeout=30, what="n1 a ready backup")
    primary.request("CREATE", "queue", "hq")
    assert clients.send(primary.address, "hq", 5) == [Delivery.ACCEPTED] * 5

    lag, seconds, held = (("hastandby_backup_lag_messages", (("backup", "n1"), ("queue", "hq"))),
                          ("hastandby_backup_lag_seconds", (("backup", "n1"), ("queue", "hq"))),
                          ("hastandby_backup_acks_held", (("backup", "n1"), ("queue", "hq"))))
    samples = wait_for(lambda: (s := scrape(metrics)).get(lag) == 0 and s, timeout=10, what="backup lag 0")
    assert samples[("hastandby_node_state", (("state", "primary"),))] == 1
    assert samples[("hastandby_node_term", ())] >= 1
    assert samples[("hastandby_cluster_member", (("node_id", "n1"), ("state", "ready"),
                                                  ("url", f"127.0.0.1:{ports[1]}")))] == 1
    assert samples[held] == 0 and samples[seconds] == 0
    assert samples[("hastandby_queue_depth", (("queue", "hq"),))] == 5

    connection = BlockingConnection(clients.auth.url(primary.address), timeout=10)
    backup.signal(signal.SIGSTOP)
    try:
        presettled = connection.create_sender("hq", name="presettled", options=AtMostOnce())
        for i in range(4):
            presettled.send(Message(body=f"fast{i}"))  # not held: nobody waits for them
        waiting = connection.create_sender("hq", name="waiting")
        delivery = waiting.link.send(Message(body="held"))  # its acknowledgement waits for the frozen backup
        try:
            connection.wait(lambda: False, timeout=1.0)  # move the frames; nothing will settle
        except Timeout:
            pass
        frozen = wait_for(lambda: (s := scrape(metrics)).get(seconds, 0) >= 0.5 and s, timeout=10,
                          what="the frozen backup's lag to age past 0.5 s")
        assert frozen[lag] == 5, frozen[lag]
        assert frozen[held] == 1, frozen[held]
        assert frozen[("hastandby_queue_depth", (("queue", "hq"),))] == 10
        assert not delivery.settled and delivery.remote_state != Delivery.ACCEPTED, "acknowledged before the backup had it"
    finally:
        backup.signal(signal.SIGCONT)
    try:
        connection.wait(lambda: delivery.settled, timeout=15)
        assert delivery.remote_state == Delivery.ACCEPTED
    finally:
        connection.close()
    resumed = wait_for(lambda: (s := scrape(metrics)).get(lag) == 0 and s.get(held) == 0 and s, timeout=15,
                       what="lag and held acknowledgements back to 0")
    assert resumed[seconds] == 0
