"""A network cut, as clients meet it: what a URL-list client's settings cost it when the primary is cut off, and
how long a backup cut off from the primary holds producers.  ``python -m benchmarks.client_cut``.

Needs root and ``ip``: etcd, three nodes and the clients each run in a network namespace of their own (the
nemesis network, ``hastandby/testing/netns.py``), where a cut drops packets silently, as a failed switch
or a partition does: connections stall, no reset comes back, a new connect hangs in SYN_SENT.

``--cut primary``: a producer (``hastandby.testing.numbered_client`` in the clients' namespace, the URL list with
the primary first, as an application lists the node it knows best) sends RATE messages a second; then the
primary is cut from everything (clients, backups, etcd).  It loses its lease and steps down, a backup is
elected after the lease TTL, and the producer must notice its connection is dead and find the new primary
without sitting on the cut one.  Measured: the time from the cut to the producer's first acknowledgement
from the new primary, for each client setting of ``CLIENTS``.

``--cut backup``: the same producer with the numbered client's defaults; one backup is cut from the primary
only (both still reach etcd).  The primary holds every producer's acknowledgement until it gives that
backup up (docs/lifecycle.md section 11).  Measured: the producer's longest time without an acknowledgement
from the cut on, and from the primary's log when it saw the backup gone and when etcd confirmed the sync set
without it.  ``--node-heartbeat`` sets the nodes' ``serve --heartbeat``.

Each round runs on a fresh etcd and fresh nodes (the network stays): a round must not inherit what an
earlier cut left behind.  Settings alternate round by round.  One line per round, a summary at the end, the JSON in
``--results`` (``client-cut-<UTC>.json``), and the logs (nodes, etcd, each round's client history) left in
a temporary directory, whose path is printed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hastandby.testing.netns import Network
from hastandby.testing.netns_cluster import QUEUE, Cluster
from hastandby.testing.netns_workload import History, Workload
from hastandby.testing.nodes import read_node_log
from hastandby.testing.provenance import host_info

from .throughput import DEFAULT_OUT

NODE_IDS = ("n1", "n2", "n3")
HOSTS = (*NODE_IDS, "etcd", "clients")
RATE = 100.0  # messages a second from the producer
WARM_ACKS = 50  # acknowledgements before the cut: the producer is attached and flowing
WARM_TIMEOUT = 30.0
BACKUP_HOLD = 10.0  # seconds a backup stays cut: past any heartbeat this benchmark is meant for


@dataclass(frozen=True)
class ClientSetting:
    """How the producer connects: one row of the ``--cut primary`` table."""

    name: str
    heartbeat: float  # proton's idle timeout, s (0: none)
    connect_timeout: float  # bound on each attempt at one URL, s (0: none: proton's default)
    proton_backoff: bool  # proton's default reconnect delays (0, 0.1, 0.2, ... 10 s) instead of a fixed 0.1 s
    keep_order: bool  # the list as given (proton starts it again at its first URL after every open)

    def options(self) -> tuple[str, ...]:
        return ("--heartbeat", f"{self.heartbeat:g}", "--connect-timeout", f"{self.connect_timeout:g}",
                *(("--proton-backoff",) if self.proton_backoff else ()),
                *(("--keep-order",) if self.keep_order else ()))


CLIENTS = {c.name: c for c in (
    ClientSetting("proton-defaults", 0, 0, True, True),
    ClientSetting("heartbeat", 1, 0, True, True),
    ClientSetting("heartbeat+connect-timeout", 1, 2, True, True),
    ClientSetting("heartbeat+connect-timeout+fixed-delay", 1, 2, False, True),
    ClientSetting("numbered-client", 1, 2, False, False),  # the previous row with the list rotated
)}


class RoundError(RuntimeError):
    """The round could not be run as planned (no warm producer, no settled cluster)."""


def _address(url: str) -> str:
    return url.split("://", 1)[-1].rsplit("@", 1)[-1]


def _log_times(path: Path, events: tuple[str, ...]) -> dict[str, float]:
    """time.time() of the first occurrence of each ``event`` (a prefix of the message) in a node's JSON log."""
    found: dict[str, float] = {}
    for line in read_node_log(path):
        for event in events:
            if event not in found and str(line["event"]).startswith(event):
                found[event] = line["_t"]
    return found


def _transport_errors(events: list[dict[str, Any]], kind: str) -> int:
    """Transport errors of ``kind``; proton reports each twice, the second time without the connection's URL."""
    return sum(1 for e in events if e["e"] == "transport_error" and e.get("url") and kind in e.get("detail", ""))


class Bench:
    """One network for the whole run; each round on a cluster of its own, so that no round inherits what an
    earlier cut left behind (a node whose connection to etcd still waits out TCP's retransmission back-off)."""

    def __init__(self, workdir: Path, serve_options: tuple[str, ...]) -> None:
        self.workdir = workdir
        self.serve_options = serve_options
        self.network: Network | None = None

    def start(self) -> None:
        self.network = Network(HOSTS)

    def stop(self) -> None:
        if self.network is not None:
            self.network.close()

    @contextmanager
    def _cluster(self, name: str) -> Iterator[tuple[Network, Cluster, Path]]:
        """A fresh etcd and nodes for round ``name`` (stopped at the end, whatever happens); its directory."""
        assert self.network is not None
        directory = self.workdir / name
        directory.mkdir()
        cluster = Cluster(self.network, list(NODE_IDS), directory, cluster_name=f"cut-{name}",
                          serve_options=self.serve_options)
        try:
            cluster.start()
            yield self.network, cluster, directory
        finally:
            self.network.heal_all()  # first: a node stops sooner when it can reach etcd
            cluster.stop()

    @staticmethod
    def _producer(network: Network, cluster: Cluster, directory: Path, options: tuple[str, ...]) -> Workload:
        """A producer in the clients' namespace, the URL list with the primary first, flowing."""
        primary = cluster.nodes[str(cluster.primary())]
        urls = [primary.url] + [n.url for n in cluster.nodes.values() if n is not primary]
        workload = Workload(network["clients"], urls, QUEUE, directory, cluster.users.client_environment(), options)
        workload.command(f"producer p {RATE:g}")
        if not workload.wait(lambda: int(workload.client("p").get("acked") or 0) >= WARM_ACKS, WARM_TIMEOUT):
            workload.stop()
            raise RoundError(f"the producer had {workload.client('p').get('acked')} acknowledgements after "
                             f"{WARM_TIMEOUT:g} s ({workload.log_tail()})")
        return workload

    def cut_primary(self, name: str, setting: ClientSetting, limit: float) -> dict[str, Any]:
        with self._cluster(name) as (network, cluster, directory):
            primary = str(cluster.primary())
            cut_address = cluster.nodes[primary].address
            workload = self._producer(network, cluster, directory, setting.options())
            try:
                cut_at = time.time()
                network.cut([(primary, host) for host in HOSTS if host != primary])

                def moved_on() -> bool:
                    last = workload.client("p").get("last_ack")
                    return bool(last) and last[0] > cut_at and _address(last[1]) != cut_address
                reached = workload.wait(moved_on, limit)
            finally:
                workload.stop()
        events = [e for e in History.read(workload.history_path).events if e["t"] > cut_at]
        acks = [e for e in events if e["e"] == "accepted" and _address(e.get("url", "")) != cut_address]
        return {
            "round": name, "cut": "primary", "client": setting.name, "cut_node": primary,
            "reached": reached, "gap_s": round(acks[0]["t"] - cut_at, 3) if reached and acks else None,
            "limit_s": limit,
            "connect_timeouts": _transport_errors(events, "connect-timeout"),
            "idle_timeouts": _transport_errors(events, "idle-timeout"),
            "path": [_address(e["url"]) for e in events if e["e"] == "connected"],
        }

    def cut_backup(self, name: str) -> dict[str, Any]:
        with self._cluster(name) as (network, cluster, directory):
            primary = str(cluster.primary())
            backup = sorted(cluster.backups())[0]
            workload = self._producer(network, cluster, directory, ())
            try:
                cut_at = time.time()
                network.cut([(primary, backup)])
                time.sleep(BACKUP_HOLD)
            finally:
                workload.stop()
            log_path = cluster.nodes[primary].log_path
        times = [cut_at] + [e["t"] for e in History.read(workload.history_path).events
                            if e["e"] == "accepted" and cut_at < e["t"] <= cut_at + BACKUP_HOLD]
        gaps = [(b - a, b) for a, b in zip(times, times[1:])]
        stall, released_at = max(gaps) if gaps else (BACKUP_HOLD, None)
        seen = _log_times(log_path, ("backup disconnected", "backup out of the sync set"))
        return {
            "round": name, "cut": "backup", "primary": primary, "cut_node": backup,
            "stall_s": round(stall, 3),
            "released_after_s": round(released_at - cut_at, 3) if released_at is not None else None,
            "primary_saw_it_gone_s": round(seen["backup disconnected"] - cut_at, 3)
            if "backup disconnected" in seen else None,
            "sync_set_without_it_s": round(seen["backup out of the sync set"] - cut_at, 3)
            if "backup out of the sync set" in seen else None,
        }


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "max": None}
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name in CLIENTS:
        rows = [r for r in results if r.get("client") == name]
        if rows:
            summary[name] = {"rounds": len(rows), "reached": sum(1 for r in rows if r["reached"]),
                             **_percentiles([r["gap_s"] for r in rows if r["gap_s"] is not None])}
    backups = [r for r in results if r["cut"] == "backup"]
    if backups:
        summary["backup-cut"] = {"rounds": len(backups), **_percentiles([r["stall_s"] for r in backups]),
                                 "saw_it_gone": _percentiles([r["primary_saw_it_gone_s"] for r in backups
                                                              if r["primary_saw_it_gone_s"] is not None])}
    return summary


def _line(result: dict[str, Any]) -> str:
    if result.get("error"):
        return f"{result['round']}: ERROR {result['error']}"
    if result["cut"] == "backup":
        return (f"{result['round']}: backup {result['cut_node']} cut from primary {result['primary']}: producer "
                f"stalled {result['stall_s']:.2f} s (released {result['released_after_s']} s after the cut; the "
                f"primary saw it gone at {result['primary_saw_it_gone_s']} s, sync set without it at "
                f"{result['sync_set_without_it_s']} s)")
    gap = f"{result['gap_s']:.2f} s" if result["gap_s"] is not None else f"none within {result['limit_s']:g} s"
    return (f"{result['round']}: {result['client']:<40} first ack from the new primary after {gap} "
            f"(connect timeouts {result['connect_timeouts']}, idle timeouts {result['idle_timeouts']}, "
            f"path {' > '.join(result['path']) or '-'})")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.client_cut", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cut", choices=("primary", "backup"), default="primary")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per client setting (--cut backup: rounds)")
    parser.add_argument("--clients", default=",".join(CLIENTS),
                        help=f"--cut primary: comma-separated settings of {', '.join(CLIENTS)}")
    parser.add_argument("--limit", type=float, default=40.0,
                        help="--cut primary: seconds a round waits for the producer to reach the new primary")
    parser.add_argument("--node-heartbeat", type=float, help="the nodes' serve --heartbeat (default: theirs)")
    parser.add_argument("--results", type=Path, default=DEFAULT_OUT, help="where the summary JSON goes")
    args = parser.parse_args(argv)
    settings = [CLIENTS[name] for name in args.clients.split(",") if name]
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    workdir = Path(tempfile.mkdtemp(prefix="client-cut-"))
    serve_options = ("--heartbeat", f"{args.node_heartbeat:g}") if args.node_heartbeat is not None else ()
    bench = Bench(workdir, serve_options)
    results: list[dict[str, Any]] = []
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C: every process stopped, namespaces deleted
    try:
        bench.start()
        for index in range(1, args.rounds + 1):
            for setting in (settings if args.cut == "primary" else [None]):
                name = f"r{index}-{setting.name if setting else 'backup'}"
                try:
                    result = (bench.cut_primary(name, setting, args.limit) if setting is not None
                              else bench.cut_backup(name))
                except RoundError as error:
                    result = {"round": name, "cut": args.cut, "client": setting.name if setting else None,
                              "error": str(error), "reached": False, "gap_s": None, "stall_s": None}
                results.append(result)
                print(_line(result), flush=True)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        bench.stop()
    summary = summarize([r for r in results if not r.get("error")])
    print(json.dumps(summary, indent=2))
    report = {
        "benchmark": "client_cut",
        "command": shlex.join([sys.executable, "-m", "benchmarks.client_cut",
                               *(sys.argv[1:] if argv is None else argv)]),
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(UTC) - started).total_seconds(), 1),
        "interrupted": interrupted,
        "host": host_info(),
        "settings": {"cut": args.cut, "rounds": args.rounds, "rate_msg_s": RATE, "limit_s": args.limit,
                     "node_heartbeat_s": args.node_heartbeat, "backup_hold_s": BACKUP_HOLD,
                     "clients": {s.name: s.options() for s in settings}},
        "summary": summary,
        "rounds": results,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"client-cut-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {path}\nlogs (nodes, etcd, each round's client history): {workdir}")
    return 1 if interrupted or any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
