"""Prometheus metrics of one node: ``hastandby serve --metrics-listen HOST:PORT``.

An HTTP server (``prometheus-client``'s, in a thread of its own) answers
``GET /metrics`` in the Prometheus text exposition format.  What it says is
built, at each scrape, from one *snapshot* of the node: the same two maps the
node gives its management clients, ``Node.status()`` (what ``hastandby status
--json`` prints) and ``Management.query()`` (what ``hastandby query --json``
prints: every queue, exchange and binding, the memory alarm, the HA section
with the members, each backup's lag and the acknowledgements held, and DR
replication).  ``families()`` turns a snapshot into metric families; it does no
I/O, so it is tested over a fixed snapshot.  The names, labels and meanings
are listed in ``docs/metrics.md``.

Why a snapshot taken on the reactor thread
------------------------------------------

Proton objects and the node's state (queues, links, guards, the HA roles)
belong to the driver's thread (``broker/transport/driver.py``): nothing locks them, and
reading them from the HTTP thread while the reactor changes them could see a
dict change size mid-iteration or a half-made update (a queue's depth without
its bytes), and touching a proton object from two threads is not safe at all.
So the collector does not read them itself: it hands the building of the
snapshot to the reactor with ``call_soon_threadsafe`` and waits for it, at
most ``SNAPSHOT_TIMEOUT`` seconds.  The two maps are built of plain values
(numbers, strings, lists, dicts made afresh), so once handed over the HTTP
thread owns them.  A reactor that does not answer in time (overloaded, or
stuck) gets ``hastandby_snapshot_ok 0`` and no node metrics for that scrape,
rather than stale or torn figures; the process metrics (``process_*``, read
from ``/proc``) are still served.  Scrapes that come while a snapshot is still
being taken wait for that one instead of queueing another, so a stuck reactor
gathers at most one pending snapshot call.

The cost on the reactor is that of one QUERY and one STATUS request per scrape
(proportional to the number of queues), without the AMQP round trip.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol

import structlog
from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hastandby.lifecycle.states import State

log = structlog.get_logger("hastandby.metrics")

SNAPSHOT_TIMEOUT = 2.0  # seconds a scrape waits for the reactor thread
PREFIX = "hastandby"


@dataclass
class Snapshot:
    """What the node said about itself, in plain values (safe to read on any thread once taken)."""

    status: dict[str, Any]  # Node.status(): the STATUS reply
    query: dict[str, Any]  # Management.query(): the QUERY reply


class _Node(Protocol):
    """What the metrics need of a ``hastandby.node.Node``."""

    management: Any

    def status(self) -> dict[str, Any]: ...

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None: ...


def take_snapshot(node: _Node) -> Snapshot:
    """Build a snapshot.  Reactor thread only."""
    return Snapshot(status=node.status(), query=node.management.query())


class _Pending:
    """One snapshot asked of the reactor thread, and its result once there."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.snapshot: Snapshot | None = None
        self.error: str | None = None


class SnapshotSource:
    """Takes snapshots on the reactor thread for the HTTP thread, with a bound on the wait."""

    def __init__(self, call_soon_threadsafe: Callable[[Callable[[], None]], None],
                 build: Callable[[], Snapshot], timeout: float = SNAPSHOT_TIMEOUT) -> None:
        self._call_soon_threadsafe = call_soon_threadsafe
        self._build = build
        self.timeout = timeout
        self._lock = threading.Lock()
        self._pending: _Pending | None = None
        self.timeouts = 0  # scrapes the reactor did not answer in time
        self.failures = 0  # snapshots that raised

    def get(self) -> tuple[Snapshot | None, str | None, float]:
        """(snapshot, None, seconds waited), or (None, why not, seconds waited).  Any thread but the reactor's."""
        started = time.monotonic()
        with self._lock:
            pending = self._pending
            if pending is None or pending.done.is_set():
                pending = self._pending = _Pending()
                self._call_soon_threadsafe(lambda: self._run(pending))
        if not pending.done.wait(self.timeout):
            with self._lock:
                self.timeouts += 1
            return None, f"the node did not answer within {self.timeout:g} s", time.monotonic() - started
        return pending.snapshot, pending.error, time.monotonic() - started

    def _run(self, pending: _Pending) -> None:
        """On the reactor thread."""
        try:
            pending.snapshot = self._build()
        except Exception as error:  # a bug here must not take the reactor down, nor hang scrapes
            log.exception("metrics snapshot failed")
            with self._lock:
                self.failures += 1
            pending.error = f"{type(error).__name__}: {error}"
        finally:
            pending.done.set()


class NodeCollector(Collector):
    """A prometheus-client collector: every scrape, a fresh snapshot turned into metric families."""

    def __init__(self, source: SnapshotSource) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        snapshot, error, waited = self.source.get()
        if error is not None:
            log.warning("metrics scrape without a snapshot", reason=error)
        return families(snapshot, waited, self.source.timeouts, self.source.failures)


# -- snapshot -> metric families (no I/O) ---------------------------------------------------


def _name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


def _gauge(suffix: str, doc: str, value: Any) -> GaugeMetricFamily | None:
    if not _is_number(value):
        return None
    return GaugeMetricFamily(_name(suffix), doc, value=float(value))


def _is_number(value: Any) -> bool:
    """A number or a flag (True is 1): what a sample may hold; None and text are left out."""
    return isinstance(value, (int, float))


class _Labelled:
    """A labelled family that leaves out samples without a numeric value."""

    def __init__(self, family: GaugeMetricFamily | CounterMetricFamily) -> None:
        self.family = family

    def add(self, labels: list[str], value: Any) -> None:
        if _is_number(value):
            self.family.add_metric([str(label) for label in labels], float(value))


def _gauges(suffix: str, doc: str, labels: list[str]) -> _Labelled:
    return _Labelled(GaugeMetricFamily(_name(suffix), doc, labels=labels))


def _counters(suffix: str, doc: str, labels: list[str]) -> _Labelled:
    # prometheus-client appends _total to a counter's samples
    return _Labelled(CounterMetricFamily(_name(suffix), doc, labels=labels))


def families(snapshot: Snapshot | None, waited: float = 0.0, timeouts: int = 0,
             failures: int = 0) -> list[Metric]:
    """The metric families of one snapshot (None: the node did not answer; only the scrape's own figures)."""
    result: list[Metric | None] = [
        _gauge("snapshot_ok", "1 if the node's reactor thread answered this scrape in time, else 0",
               snapshot is not None),
        _gauge("snapshot_seconds", "seconds this scrape waited for the node's snapshot", waited),
        CounterMetricFamily(_name("snapshot_timeouts"), "scrapes the node's reactor thread did not answer in time",
                            value=timeouts),
        CounterMetricFamily(_name("snapshot_failures"), "snapshots that failed on the reactor thread (a bug)",
                            value=failures),
    ]
    if snapshot is not None:
        result += _node(snapshot.status, snapshot.query.get("ha") or {})
        result += _queues(snapshot.query)
        result += _memory(snapshot.query.get("memory") or snapshot.status.get("memory") or {})
        result += _journal(snapshot.status.get("journal"))
        result += _logins(snapshot.status.get("logins"))
        result += _replication(snapshot.query.get("ha") or {})
        result += _dr(snapshot.query.get("replication") or snapshot.status.get("replication") or {})
    return [family for family in result if family is not None]


def _node(status: dict[str, Any], ha: dict[str, Any]) -> Iterator[Metric | None]:
    info = GaugeMetricFamily(_name("node_info"), "always 1: the node's id, version and address",
                             labels=["node_id", "version", "url"])
    info.add_metric([str(status.get("node_id", "")), str(status.get("version", "")), str(status.get("url", ""))], 1)
    yield info
    state = str(status.get("state", ""))
    states = GaugeMetricFamily(_name("node_state"), "1 for the node's current role, 0 for the others",
                               labels=["state"])
    known = [str(s) for s in State]
    for name in known + ([state] if state not in known else []):
        states.add_metric([name], 1.0 if name == state else 0.0)
    yield states
    term = status.get("term", ha.get("term"))
    yield _gauge("node_term", "the election term this node follows (HA members only)", term)
    if "halted" in status:
        yield _gauge("node_halted", "1 if the node stopped replication and client service after an illegal "
                     "transition", bool(status.get("halted")))
    if status.get("state") == "primary":
        yield _gauge("node_recovering", "1 while a new primary guards for its expected backups",
                     status.get("detail") == "recovering")
    yield _gauge("connections", "AMQP connections open on this node (clients and peers)", status.get("connections"))
    yield _gauge("node_uptime_seconds", "seconds since the node started", status.get("uptime"))
    members = GaugeMetricFamily(_name("cluster_member"), "always 1: a member of the cluster as this node knows "
                                "it, with its state (a primary's view of its backups: catchup or ready)",
                                labels=["node_id", "url", "state"])
    for member in ha.get("members") or []:
        members.add_metric([str(member.get("node_id", "")), str(member.get("url", "")),
                            str(member.get("state", ""))], 1.0)
    yield members


_QUEUE_COUNTERS = {
    "enqueued": "messages put on the queue",
    "dequeued": "messages removed from the queue for any reason (consumed, purged, expired, replicated dequeues)",
    "expired": "messages whose TTL ran out on the queue",
    "ring_dropped": "messages a ring queue dropped to make room",
    "rejected": "messages the queue refused (full, reject policy)",
    "dead_lettered": "messages that reached the queue's delivery limit (to its alternate exchange, or dropped)",
    "deduplicated": "messages accepted but not enqueued: the queue took their message-id within its dedup window",
    "replaced": "messages a newer one with the same last-value key replaced (a last-value queue)",
}


def _queues(query: dict[str, Any]) -> Iterator[Metric | None]:
    queues = query.get("queues") or []
    yield _gauge("queues", "queues on this node", len(queues))
    depth = _gauges("queue_depth", "messages on the queue (acquired ones included)", ["queue"])
    size = _gauges("queue_bytes", "bytes of the messages on the queue", ["queue"])
    acquired = _gauges("queue_acquired", "messages delivered to consumers and not yet settled", ["queue"])
    held = _gauges("queue_scheduled", "messages on the queue held back until their delivery time "
                   "(x-opt-delivery-time, x-opt-delivery-delay)", ["queue"])
    consumers = _gauges("queue_consumers", "consumers attached to the queue", ["queue"])
    counters = {stat: _counters(f"queue_{stat}", doc, ["queue"]) for stat, doc in _QUEUE_COUNTERS.items()}
    for queue in queues:
        labels = [queue.get("name", "")]
        depth.add(labels, queue.get("depth"))
        size.add(labels, queue.get("bytes"))
        acquired.add(labels, queue.get("acquired"))
        held.add(labels, queue.get("scheduled", 0))
        consumers.add(labels, queue.get("consumers"))
        stats = queue.get("stats") or {}
        for stat, family in counters.items():
            family.add(labels, stats.get(stat))
    yield from (f.family for f in (depth, size, acquired, held, consumers, *counters.values()))
    routed = _counters("exchange_routed", "messages the exchange routed to at least one queue", ["exchange"])
    dropped = _counters("exchange_dropped", "messages the exchange routed nowhere", ["exchange"])
    for exchange in query.get("exchanges") or []:
        routed.add([exchange.get("name", "")], exchange.get("routed"))
        dropped.add([exchange.get("name", "")], exchange.get("dropped"))
    yield routed.family
    yield dropped.family


def _memory(memory: dict[str, Any]) -> Iterator[Metric | None]:
    if not memory:
        return
    yield _gauge("memory_resident_bytes", "the node's resident memory at its last sample", memory.get("resident"))
    yield _gauge("memory_high_watermark_bytes", "above this resident size the memory alarm goes on",
                 memory.get("high_watermark"))
    yield _gauge("memory_low_watermark_bytes", "below this resident size the memory alarm goes off",
                 memory.get("low_watermark"))
    yield _gauge("memory_alarm", "1 while this node's own memory alarm is on", memory.get("alarm"))
    yield _gauge("memory_producers_blocked", "1 while producers get no credit (this node's alarm or a backup's)",
                 memory.get("producers_blocked"))
    peers = GaugeMetricFamily(_name("memory_peer_alarm"), "1 for each backup whose memory alarm holds this "
                              "primary's producers", labels=["peer"])
    for peer in memory.get("peers_in_alarm") or []:
        peers.add_metric([str(peer)], 1.0)
    yield peers
    yield _gauge("memory_heap_in_use_bytes", "malloc's heap in use", memory.get("heap_in_use"))
    yield _gauge("memory_heap_free_bytes", "malloc's free heap not given back to the system", memory.get("heap_free"))


def _journal(journal: dict[str, Any] | None) -> Iterator[Metric | None]:
    if not journal:
        return
    yield _gauge("journal_writing", "1 while the journal takes durable messages (0: disk full or failed)",
                 journal.get("writing"))
    yield _gauge("journal_damaged", "1 while this node lacks data its damaged journal lost (docs/durability.md): "
                 "not elected until it has caught up from a healthy primary", bool(journal.get("damaged")))
    yield _gauge("journal_file_bytes", "size of the journal file", journal.get("file_bytes"))
    for stat, doc in (("messages", "durable messages journaled"), ("writes", "journal writes"),
                      ("fsyncs", "journal fsyncs"), ("bytes_written", "bytes written to the journal"),
                      ("compactions", "journal compactions")):
        if _is_number(journal.get(stat)):
            yield CounterMetricFamily(_name(f"journal_{stat}"), doc, value=journal[stat])


def _logins(logins: dict[str, Any] | None) -> Iterator[Metric | None]:
    """Connections that have not authenticated, and what they cost (``security/logins.py``, docs/limits.md)."""
    if not logins:
        return
    yield _gauge("handshakes", "accepted connections still in TLS and SASL", logins.get("handshakes"))
    yield _gauge("throttled_sources", "source addresses whose connections wait after failed logins",
                 logins.get("throttled_sources"))
    yield _gauge("login_checks", "password checks and TLS handshake steps on the login pool or waiting for it",
                 logins.get("login_checks"))
    for stat, suffix, doc in (
            ("failed", "failed_logins", "logins refused for wrong credentials (wrong password, unknown user)"),
            ("held", "logins_held", "connections held unread for their source's delay (failed logins, TLS rate)"),
            ("busy", "logins_busy", "logins refused because the login pool was full (limit login_checks)")):
        if _is_number(logins.get(stat)):
            yield CounterMetricFamily(_name(suffix), doc, value=logins[stat])
    refused = _counters("handshakes_refused", "sockets closed at accept, by the limit they met", ["limit"])
    for limit, count in (logins.get("refused_at_accept") or {}).items():
        refused.add([limit], count)
    yield refused.family


def _replication(ha: dict[str, Any]) -> Iterator[Metric | None]:
    """What a primary knows of its backups (``ha/primary.py``); empty on other nodes."""
    lag = _gauges("backup_lag_messages", "messages on the queue the backup has not acknowledged (the whole queue "
                  "while it has no browser on it)", ["queue", "backup"])
    for queue, per_backup in (ha.get("lag") or {}).items():
        for backup, value in per_backup.items():
            lag.add([queue, backup], value)
    seconds = _gauges("backup_lag_seconds", "seconds since the oldest message on the queue the backup has not "
                      "acknowledged arrived (0: none; absent while it has no browser on the queue)",
                      ["queue", "backup"])
    for queue, per_backup in (ha.get("lag_seconds") or {}).items():
        for backup, value in per_backup.items():
            seconds.add([queue, backup], value)
    held = ha.get("acks_held") or {}
    guards = _gauges("backup_acks_held", "producer acknowledgements the backup's guard holds until it has the "
                     "messages", ["queue", "backup"])
    for queue, per_backup in (held.get("backups") or {}).items():
        for backup, value in per_backup.items():
            guards.add([queue, backup], value)
    quorum = _gauges("quorum_acks_held", "producer acknowledgements held while fewer than min_sync nodes hold "
                     "every message", ["queue"])
    for queue, value in (held.get("quorum") or {}).items():
        quorum.add([queue], value)
    not_storing = _gauges("backup_not_storing", "1 for each backup that left because its journal cannot write "
                          "(docs/durability.md)", ["backup"])
    for backup in ha.get("not_storing") or {}:
        not_storing.add([backup], 1)
    yield from (lag.family, seconds.family, guards.family, quorum.family, not_storing.family)
    if "acks_held" in ha:
        yield _gauge("refusing_min_sync", "1 while replicated messages are refused because fewer than min_sync nodes "
                     "can store them", held.get("refusing") is not None)


def _dr(replication: dict[str, Any]) -> Iterator[Metric | None]:
    """DR links (``hastandby/dr``): as a source (per replica it serves) and as a replica (per source)."""
    source_labels = ["queue", "replica", "mode"]
    s_lag = _gauges("dr_source_lag_messages", "messages the DR replica has not acknowledged", source_labels)
    s_seconds = _gauges("dr_source_lag_seconds", "seconds since the oldest message the DR replica has not "
                        "acknowledged arrived", source_labels)
    s_overflow = _gauges("dr_source_overflow_messages", "messages an enqueue-mode backlog dropped (ring) "
                         "before the replica had them", source_labels)
    s_state = GaugeMetricFamily(_name("dr_source_state"), "always 1: a DR link this node serves, with its state",
                                labels=[*source_labels, "state"])
    for link in replication.get("sources") or []:
        labels = [str(link.get("queue", "")), str(link.get("replica") or ""), str(link.get("mode", ""))]
        s_lag.add(labels, link.get("lag_messages"))
        s_seconds.add(labels, link.get("lag_seconds"))
        s_overflow.add(labels, link.get("overflow"))
        s_state.add_metric([*labels, str(link.get("state", ""))], 1.0)
    replica_labels = ["queue", "source", "mode"]
    r_lag = _gauges("dr_replica_lag_messages", "messages this replica lacks, as its source last reported",
                    replica_labels)
    r_seconds = _gauges("dr_replica_lag_seconds", "age of the oldest message this replica lacks, as its source "
                        "last reported", replica_labels)
    r_reported = _gauges("dr_replica_report_age_seconds", "seconds since the source's last status report",
                         replica_labels)
    r_received = _counters("dr_replica_received", "messages this replica received from its source", replica_labels)
    r_duplicates = _counters("dr_replica_duplicates_dropped", "messages received that the replica held already",
                             replica_labels)
    r_state = GaugeMetricFamily(_name("dr_replica_state"), "always 1: a DR replication into this node, with its "
                                "state", labels=[*replica_labels, "state"])
    for replica in replication.get("replicas") or []:
        labels = [str(replica.get("queue", "")), str(replica.get("source", "")), str(replica.get("mode", ""))]
        r_lag.add(labels, replica.get("lag_messages"))
        r_seconds.add(labels, replica.get("lag_seconds"))
        r_reported.add(labels, replica.get("reported_ago"))
        r_received.add(labels, replica.get("received"))
        r_duplicates.add(labels, replica.get("duplicates_dropped"))
        r_state.add_metric([*labels, str(replica.get("state", ""))], 1.0)
    yield from (s_lag.family, s_seconds.family, s_overflow.family, s_state,
                r_lag.family, r_seconds.family, r_reported.family, r_received.family, r_duplicates.family, r_state)


# -- serving ------------------------------------------------------------------------------


def registry_for(source: SnapshotSource) -> CollectorRegistry:
    """A registry of the node's collector and the process's own metrics (``process_*``, from /proc)."""
    registry = CollectorRegistry(auto_describe=False)  # no collect() at registration: the reactor is not running yet
    registry.register(NodeCollector(source))
    ProcessCollector(registry=registry)
    return registry


def serve_metrics(node: Any, listen: str) -> tuple[str, int]:
    """Serve ``node``'s metrics on ``listen`` (HOST:PORT) until the node stops; returns the bound address.

    Binds now (an address in use fails the start, OSError); the server thread
    answers scrapes as soon as the node's reactor runs.
    """
    from hastandby.broker.transport.address import split_hostport

    host, port = split_hostport(listen, default_port=9464)
    source = SnapshotSource(node.call_soon_threadsafe, lambda: take_snapshot(node))
    server, _thread = start_http_server(port, addr=host, registry=registry_for(source))
    bound = server.server_address[:2]

    def stop() -> None:  # on the reactor thread: shutdown() waits for the serving loop, so not here
        def close() -> None:
            server.shutdown()
            server.server_close()
        threading.Thread(target=close, name="metrics-stop", daemon=True).start()

    node.on_stop.append(stop)
    log.info("metrics served", url=f"http://{bound[0]}:{bound[1]}/metrics")
    return str(bound[0]), int(bound[1])
