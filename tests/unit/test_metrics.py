"""The Prometheus collector over fixed snapshots (no I/O), the reactor hand-over, and the primary's figures."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hastandby.broker.queues.arrivals import Arrivals
from hastandby.broker.queues.completion import Completion
from hastandby.ha.primary import PrimaryRole
from hastandby.metrics import NodeCollector, Snapshot, SnapshotSource, families
from tests.unit.ha_roles import primary_role

# Shaped like a primary's Node.status() and Management.query() (HA and DR sections included).
STATUS: dict[str, Any] = {
    "state": "primary", "detail": "active", "term": 4, "node_id": "n1", "url": "amqp://127.0.0.1:5672",
    "version": "0.1.0", "pid": 1, "uptime": 12.5, "connections": 3, "queues": 2, "halted": None,
    "memory": {"resident": 100, "high_watermark": 1000, "low_watermark": 800, "alarm": False,
               "peers_in_alarm": ["n3"], "producers_blocked": True, "heap_in_use": 50, "heap_free": 5},
    "journal": {"sync": "batch", "term": 4, "writing": True, "error": None, "recovered_messages": 0,
                "clean_shutdown": True, "file_bytes": 4096, "messages": 10, "writes": 3, "fsyncs": 2,
                "bytes_written": 5000, "compactions": 0},
    "logins": {"failed": 12, "throttled_sources": 1, "held": 30, "busy": 0, "login_checks": 2, "cached": 3,
               "refused_at_accept": {"handshakes_per_source": 7}, "handshakes": 4},
}
QUERY: dict[str, Any] = {
    "queues": [
        {"name": "orders", "depth": 7, "bytes": 700, "acquired": 2, "scheduled": 3, "consumers": 1,
         "stats": {"enqueued": 10, "dequeued": 3, "expired": 0, "ring_dropped": 0, "rejected": 1,
                   "dead_lettered": 2, "deduplicated": 3, "replaced": 4}},
        {"name": "empty", "depth": 0, "bytes": 0, "acquired": 0, "consumers": 0,
         "stats": {"enqueued": 0, "dequeued": 0, "expired": 0, "ring_dropped": 0, "rejected": 0,
                   "dead_lettered": 0, "deduplicated": 0, "replaced": 0}},
    ],
    "exchanges": [{"name": "amq.topic", "routed": 5, "dropped": 1}],
    "bindings": [],
    "memory": STATUS["memory"],
    "ha": {
        "state": "primary", "term": 4,
        "members": [{"node_id": "n1", "url": "127.0.0.1:5672", "state": "primary"},
                    {"node_id": "n2", "url": "127.0.0.1:5673", "state": "ready"},
                    {"node_id": "n3", "url": "127.0.0.1:5674", "state": "catchup"}],
        "lag": {"orders": {"n2": 0, "n3": 7}, "empty": {"n2": 0, "n3": 0}},
        "lag_seconds": {"orders": {"n2": 0.0}, "empty": {"n2": 0.0}},
        "acks_held": {"backups": {"orders": {"n2": 0, "n3": 4}}, "quorum": {"orders": 1}, "waiting_for": None,
                      "refusing": "fewer than min_sync (2) nodes can store messages: backup n4: Read-only file system"},
        "not_storing": {"n4": "the backup's journal cannot write: Read-only file system"},
    },
    "replication": {
        "sources": [{"queue": "orders", "replica": "dr1:5672", "mode": "full", "state": "live",
                     "lag_messages": 2, "lag_seconds": 0.25, "overflow": 0},
                    {"queue": "audit", "replica": None, "mode": "enqueue", "state": "disconnected",
                     "lag_messages": 40, "lag_seconds": 9.5, "overflow": 3}],
        "replicas": [{"queue": "mirror", "source": "src:5672", "mode": "full", "sync": False, "state": "live",
                      "lag_messages": None, "lag_seconds": None, "overflow": 0, "received": 12,
                      "duplicates_dropped": 1, "error": None, "reported_ago": 0.5},
                     {"queue": "copy", "source": "src:5672", "mode": "enqueue", "sync": True, "state": "catching up",
                      "lag_messages": 30, "lag_seconds": 1.5, "overflow": 0, "received": 70,
                      "duplicates_dropped": 0, "error": None, "reported_ago": 0.9}],
    },
}


class _Fixed:
    """A collector that returns the families of one fixed snapshot."""

    def __init__(self, snapshot: Snapshot | None) -> None:
        self.snapshot = snapshot

    def collect(self) -> Any:
        return families(self.snapshot, waited=0.01, timeouts=2, failures=0)


def scrape(collector: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Exposition text, parsed back: (sample name, sorted labels) -> value."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_a_primary_snapshot_becomes_every_metric():
    samples = scrape(_Fixed(Snapshot(STATUS, QUERY)))

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("hastandby_snapshot_ok") == 1
    assert value("hastandby_snapshot_timeouts_total") == 2
    assert value("hastandby_node_info", node_id="n1", version="0.1.0", url="amqp://127.0.0.1:5672") == 1
    assert value("hastandby_node_state", state="primary") == 1
    assert value("hastandby_node_state", state="backup") == 0
    assert value("hastandby_node_term") == 4
    assert value("hastandby_node_halted") == 0
    assert value("hastandby_node_recovering") == 0
    assert value("hastandby_connections") == 3
    assert value("hastandby_queues") == 2
    assert value("hastandby_queue_depth", queue="orders") == 7
    assert value("hastandby_queue_bytes", queue="orders") == 700
    assert value("hastandby_queue_acquired", queue="orders") == 2
    assert value("hastandby_queue_scheduled", queue="orders") == 3
    assert value("hastandby_queue_consumers", queue="orders") == 1
    assert value("hastandby_queue_enqueued_total", queue="orders") == 10
    assert value("hastandby_queue_dequeued_total", queue="orders") == 3
    assert value("hastandby_queue_rejected_total", queue="orders") == 1
    assert value("hastandby_queue_depth", queue="empty") == 0
    assert value("hastandby_exchange_routed_total", exchange="amq.topic") == 5
    assert value("hastandby_cluster_member", node_id="n3", url="127.0.0.1:5674", state="catchup") == 1
    assert value("hastandby_backup_lag_messages", queue="orders", backup="n3") == 7
    assert value("hastandby_backup_lag_seconds", queue="orders", backup="n2") == 0
    assert ("hastandby_backup_lag_seconds", (("backup", "n3"), ("queue", "orders"))) not in samples
    assert value("hastandby_backup_acks_held", queue="orders", backup="n3") == 4
    assert value("hastandby_quorum_acks_held", queue="orders") == 1
    assert value("hastandby_memory_resident_bytes") == 100
    assert value("hastandby_memory_high_watermark_bytes") == 1000
    assert value("hastandby_memory_alarm") == 0
    assert value("hastandby_memory_producers_blocked") == 1
    assert value("hastandby_memory_peer_alarm", peer="n3") == 1
    assert value("hastandby_journal_writing") == 1
    assert value("hastandby_journal_damaged") == 0
    assert value("hastandby_journal_bytes_written_total") == 5000
    assert value("hastandby_backup_not_storing", backup="n4") == 1  # the disk faults, as QUERY names them
    assert value("hastandby_refusing_min_sync") == 1
    assert value("hastandby_failed_logins_total") == 12
    assert value("hastandby_throttled_sources") == 1
    assert value("hastandby_handshakes") == 4
    assert value("hastandby_logins_held_total") == 30
    assert value("hastandby_handshakes_refused_total", limit="handshakes_per_source") == 7
    assert value("hastandby_dr_source_lag_messages", queue="orders", replica="dr1:5672", mode="full") == 2
    assert value("hastandby_dr_source_lag_seconds", queue="audit", replica="", mode="enqueue") == 9.5
    assert value("hastandby_dr_source_overflow_messages", queue="audit", replica="", mode="enqueue") == 3
    assert value("hastandby_dr_source_state", queue="audit", replica="", mode="enqueue", state="disconnected") == 1
    assert value("hastandby_dr_replica_received_total", queue="mirror", source="src:5672", mode="full") == 12
    assert value("hastandby_dr_replica_report_age_seconds", queue="mirror", source="src:5672", mode="full") == 0.5
    assert value("hastandby_dr_replica_lag_seconds", queue="copy", source="src:5672", mode="enqueue") == 1.5
    assert value("hastandby_dr_replica_state", queue="copy", source="src:5672", mode="enqueue",
                 state="catching up") == 1
    # No report from the source yet: no lag sample rather than a made-up 0.
    assert ("hastandby_dr_replica_lag_messages", (("mode", "full"), ("queue", "mirror"), ("source", "src:5672"))) \
        not in samples


def test_a_standalone_node_has_no_cluster_figures():
    status = {k: v for k, v in STATUS.items() if k not in ("term", "detail", "halted", "journal")}
    status["state"] = "standalone"
    query = {k: v for k, v in QUERY.items() if k not in ("ha", "replication")}
    samples = scrape(_Fixed(Snapshot(status, query)))
    names = {name for name, _ in samples}
    assert samples[("hastandby_node_state", (("state", "standalone"),))] == 1
    assert "hastandby_node_term" not in names and "hastandby_node_halted" not in names
    assert not any(name.startswith(("hastandby_backup_", "hastandby_journal_", "hastandby_dr_")) for name in names)
    assert samples[("hastandby_queue_depth", (("queue", "orders"),))] == 7


def test_no_snapshot_serves_only_the_scrape_figures():
    samples = scrape(_Fixed(None))
    assert samples[("hastandby_snapshot_ok", ())] == 0
    assert {name for name, _ in samples} == {"hastandby_snapshot_ok", "hastandby_snapshot_seconds",
                                             "hastandby_snapshot_timeouts_total", "hastandby_snapshot_failures_total"}


# -- the hand-over to the reactor thread ------------------------------------------------------


class FakeReactor:
    """Stands in for the driver: runs handed-over calls on its own thread, or holds them (a stuck reactor)."""

    def __init__(self, running: bool = True) -> None:
        self.running = running
        self.calls: list[Callable[[], None]] = []
        self.threads: set[str] = set()

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        self.calls.append(fn)
        if self.running:
            threading.Thread(target=self._run, args=(fn,), name="reactor").start()

    def _run(self, fn: Callable[[], None]) -> None:
        self.threads.add(threading.current_thread().name)
        fn()


def test_the_snapshot_is_built_on_the_reactor_thread():
    reactor = FakeReactor()
    built_on: list[str] = []

    def build() -> Snapshot:
        built_on.append(threading.current_thread().name)
        return Snapshot(STATUS, QUERY)

    source = SnapshotSource(reactor.call_soon_threadsafe, build, timeout=5.0)
    samples = scrape(NodeCollector(source))
    assert built_on == ["reactor"]
    assert samples[("hastandby_snapshot_ok", ())] == 1
    assert samples[("hastandby_queue_depth", (("queue", "orders"),))] == 7


def test_a_stuck_reactor_costs_a_scrape_its_node_metrics_within_the_timeout():
    reactor = FakeReactor(running=False)
    source = SnapshotSource(reactor.call_soon_threadsafe, lambda: Snapshot(STATUS, QUERY), timeout=0.2)
    started = time.monotonic()
    first = scrape(NodeCollector(source))
    second = scrape(NodeCollector(source))
    assert time.monotonic() - started < 2.0
    assert first[("hastandby_snapshot_ok", ())] == 0 and ("hastandby_queue_depth", (("queue", "orders"),)) not in first
    assert second[("hastandby_snapshot_timeouts_total", ())] == 2
    assert len(reactor.calls) == 1, "a second scrape queued another snapshot behind the stuck one"
    reactor.calls[0]()  # the reactor gets to it at last: the next scrape asks afresh
    reactor.running = True
    third = scrape(NodeCollector(source))
    assert third[("hastandby_snapshot_ok", ())] == 1 and len(reactor.calls) == 2


def test_a_failing_snapshot_is_counted_not_raised():
    def build() -> Snapshot:
        raise KeyError("bug")

    source = SnapshotSource(FakeReactor().call_soon_threadsafe, build, timeout=5.0)
    samples = scrape(NodeCollector(source))
    assert samples[("hastandby_snapshot_ok", ())] == 0
    assert samples[("hastandby_snapshot_failures_total", ())] == 1


# -- what the primary reports (ha/primary.py) ----------------------------------------------


def _primary(keeps_sync_set: bool = False, min_sync: int = 1) -> PrimaryRole:
    return primary_role(term=1, keeps_sync_set=keeps_sync_set, min_sync=min_sync)


def _produce(primary: PrimaryRole, count: int) -> None:
    for _ in range(count):
        completion = Completion(lambda token: None)
        primary.registry.queues["q"].enqueue(b"m", completion)
        completion.release()


def test_acks_held_counts_each_backup_guard_and_the_quorum_hold():
    primary = _primary()
    _produce(primary, 3)
    assert primary.acks_held() == {"backups": {"q": {"b": 3}}, "quorum": {}, "waiting_for": None, "refusing": None}
    assert primary.lag() == {"q": {"b": 3}}  # no browser yet: the whole queue
    assert primary.lag_seconds() == {}  # ... and no age to tell
    quorum = _primary(keeps_sync_set=True, min_sync=3)  # p and b: fewer than 3
    _produce(quorum, 2)
    held = quorum.acks_held()
    assert (held["backups"], held["quorum"], held["refusing"]) == ({"q": {"b": 2}}, {"q": 2}, None)
    assert held["waiting_for"] == "fewer than min_sync (3) nodes hold every message: held until a sync set that " \
        "large is confirmed"


# -- the docs and the Grafana dashboard name what the collector serves ---------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _served_names() -> set[str]:
    return {name for name, _ in scrape(_Fixed(Snapshot(STATUS, QUERY)))}


def test_docs_metrics_md_lists_every_metric_served():
    text = (DOCS / "metrics.md").read_text()
    missing = sorted(name for name in _served_names() if f"`{name}`" not in text)
    assert not missing, f"docs/metrics.md does not list {missing}"
    # ... and lists no metric that is not served (a rename left behind)
    documented = set(re.findall(r"`(hastandby_[a-z_]+)`", text))
    assert not documented - _served_names(), f"docs/metrics.md lists {sorted(documented - _served_names())}"


def test_the_grafana_dashboard_queries_served_metrics():
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert expressions
    used = set(re.findall(r"\b(hastandby_[a-z_]+|process_[a-z_]+)", " ".join(expressions)))
    served = _served_names() | {"process_cpu_seconds_total"}  # the ProcessCollector's
    assert used <= served, f"the dashboard queries unknown metrics: {sorted(used - served)}"
    assert {"hastandby_queue_depth", "hastandby_backup_lag_seconds", "hastandby_backup_acks_held",
            "hastandby_memory_alarm", "hastandby_dr_source_lag_seconds", "hastandby_node_state"} <= used


def test_arrivals_say_whether_they_sampled():
    """ReplicatingSubscription prunes its samples only when it took one (at most every 5 ms)."""
    arrivals = Arrivals(resolution=60.0)
    assert arrivals.add(1) is True
    assert arrivals.add(2) is False
    assert arrivals.oldest(lambda i: i <= 1) is None


def test_a_damaged_or_failing_journal_shows_in_the_metrics():
    status = dict(STATUS, journal=dict(STATUS["journal"], writing=False, error="Read-only file system",
                                       damaged=[{"file": "journal.quarantined-x", "lost_bytes": 4032}]))
    samples = scrape(_Fixed(Snapshot(status, QUERY)))
    assert samples[("hastandby_journal_writing", ())] == 0
    assert samples[("hastandby_journal_damaged", ())] == 1
