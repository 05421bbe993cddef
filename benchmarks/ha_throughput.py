"""What hot standby costs: a standalone node vs a primary with 1 and 2 backups.

In one invocation, for each configuration in turn (alternating, so noise hits
all alike), a fresh set of nodes on loopback, an ``all``-replicated queue, and
the same proton C clients as ``benchmarks.throughput`` on 100-byte messages:
N sends then N receives, and concurrent send+receive.  With backups, a send
counts only once every backup holds the message (the primary accepts to the
producer only then), so the send figure is the price of replication.

Producer acknowledgement latency: a python-qpid-proton sender with one
message in flight at a time times send -> ``accepted``; p50 and p99.

Nodes require authentication (``benchmarks/_auth.py``): backups authenticate
to the primary as ``peer``, clients as ``app`` with PLAIN, management as
``admin``.

Prints msg/s per configuration and the ratio to standalone, writes JSON to
``benchmarks/results/ha-throughput-<UTC>.json``.

    python -m benchmarks.ha_throughput [--count 100000] [--runs 3] [--latency-messages 2000]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from hastandby.client import ManagementClient, ManagementError

from . import _auth, cexamples
from ._proc import Service, free_port, python_env
from .throughput import DEFAULT_OUT, FIGURES, LOOPBACK, PHASES, REPO_ROOT, Run, Settings, _measure, _progress, host_info

CONFIGURATIONS = {"standalone": 0, "primary+1": 1, "primary+2": 2}
READY_TIMEOUT = 60.0


def start_nodes(backups: int, logs: Path, tag: str) -> list[Service]:
    """A standalone node, or a primary plus ``backups`` caught-up backups."""
    ports = [free_port() for _ in range(backups + 1)]
    base = [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", *_auth.users().serve_arguments()]
    if backups == 0:
        argvs = [base + ["--listen", f"{LOOPBACK}:{ports[0]}"]]
    else:
        brokers = ",".join(f"{LOOPBACK}:{p}" for p in ports)
        argvs = [base + ["--listen", f"{LOOPBACK}:{p}", "--ha-cluster", "--brokers-url", brokers] for p in ports]
    services = [Service(f"node{i}", argv, logs / f"{tag}-node{i}.log", cwd=REPO_ROOT, env=python_env())
                for i, argv in enumerate(argvs)]
    try:
        for service, port in zip(services, ports):
            _wait_answering(service, port)
            service.port = port  # type: ignore[attr-defined]
        if backups:
            _request(ports[0], "PROMOTE")
            for port in ports[1:]:
                _wait_state(port, "backup")
    except BaseException:
        for service in services:
            service.stop()
        raise
    return services


def _request(port: int, operation: str, type: str = "", name: str = "", body: dict | None = None) -> Any:
    with ManagementClient(f"{LOOPBACK}:{port}", timeout=10, login=_auth.users().login()) as client:
        return client.request(operation, type, name, body)


def _wait_answering(service: Service, port: int) -> None:
    """Cluster nodes refuse plain clients until primary, so ask as an admin (management ping)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if not service.running():
            raise RuntimeError(f"{service.name} exited: {service.log_tail()}")
        try:
            _request(port, "PING")
            return
        except ManagementError:
            time.sleep(0.1)
    raise TimeoutError(f"{service.name} not answering on port {port}")


def _wait_state(port: int, state: str, timeout: float = READY_TIMEOUT) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if _request(port, "STATUS")["state"] == state:
                return time.monotonic() - started
        except ManagementError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"node on port {port} not {state} after {timeout:.0f} s")


class _LatencySender(MessagingHandler):
    """One message in flight: the time from send to 'accepted' is the acknowledgement latency."""

    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__()
        self.url, self.address, self.count = url, address, count
        self.latencies: list[float] = []
        self._sent_at = 0.0

    def on_start(self, event: Any) -> None:
        connection = event.container.connect(self.url, reconnect=False, **_auth.users().connect_options())
        event.container.create_sender(connection, self.address)

    def on_sendable(self, event: Any) -> None:
        if self._sent_at == 0.0 and len(self.latencies) < self.count:
            self._sent_at = time.perf_counter()
            event.sender.send(Message(body=b"x" * 100))

    def on_accepted(self, event: Any) -> None:
        self.latencies.append(time.perf_counter() - self._sent_at)
        self._sent_at = 0.0
        if len(self.latencies) >= self.count:
            event.connection.close()
        elif event.sender.credit:
            self.on_sendable(event)


def ack_latency(port: int, queue: str, count: int) -> dict[str, float]:
    sender = _LatencySender(f"amqp://{LOOPBACK}:{port}", queue, count)
    Container(sender).run()
    ordered = sorted(sender.latencies)
    if len(ordered) < count:
        raise RuntimeError(f"only {len(ordered)} of {count} latency messages were accepted")
    return {
        "p50_ms": ordered[len(ordered) // 2] * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


def measure(config: str, round_no: int, settings: Settings, latency_messages: int, logs: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    services = start_nodes(CONFIGURATIONS[config], logs, f"{config}-r{round_no}")
    primary = services[0]
    port = primary.port  # type: ignore[attr-defined]
    result: dict[str, Any] = {"config": config, "round": round_no, "runs": []}
    try:
        queues = {"send": f"q-{tag}", "receive": f"q-{tag}", "concurrent": f"c-{tag}"}
        for name in set(queues.values()) | {f"lat-{tag}"}:
            _request(port, "CREATE", "queue", name, {"arguments": {"qpid.replicate": "all"}})
        for figure in FIGURES:
            run = Run(round_no, config, figure, queues[figure], settings.count)
            _measure(run, primary, partial(PHASES[figure], settings, port, run.queue,
                                           _auth.users().client_environment()))
            _progress(run, settings.runs)
            result["runs"].append(asdict(run))
        result["ack_latency"] = ack_latency(port, f"lat-{tag}", latency_messages)
        lat = result["ack_latency"]
        print(f"round {round_no}/{settings.runs}  {config:<10} ack latency p50 {lat['p50_ms']:.2f} ms "
              f"p99 {lat['p99_ms']:.2f} ms", flush=True)
    finally:
        for service in services:
            service.stop()
    return result


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for config in CONFIGURATIONS:
        mine = [r for r in results if r["config"] == config]
        figures = {}
        for figure in FIGURES:
            rates = [run["msg_per_s"] for r in mine for run in r["runs"] if run["figure"] == figure and run["ok"]]
            figures[figure] = statistics.median(rates) if rates else None
        p50 = [r["ack_latency"]["p50_ms"] for r in mine if "ack_latency" in r]
        p99 = [r["ack_latency"]["p99_ms"] for r in mine if "ack_latency" in r]
        summary[config] = {"msg_per_s": figures, "ack_p50_ms": statistics.median(p50) if p50 else None,
                           "ack_p99_ms": statistics.median(p99) if p99 else None}
    base = summary["standalone"]["msg_per_s"]
    for config in CONFIGURATIONS:
        summary[config]["ratio_to_standalone"] = {
            figure: (summary[config]["msg_per_s"][figure] / base[figure]
                     if summary[config]["msg_per_s"][figure] and base[figure] else None)
            for figure in FIGURES
        }
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    print("\nmedian msg/s (ratio to standalone); producer ack latency p50/p99 ms")
    print(f"{'config':<12}" + "".join(f"{figure:>24}" for figure in FIGURES) + f"{'ack p50/p99':>18}")
    for config, row in summary.items():
        cells = "".join(
            f"{(row['msg_per_s'][f] or 0):>12,.0f} (x{(row['ratio_to_standalone'][f] or 0):.2f})".rjust(24)
            for f in FIGURES
        )
        latency = f"{row['ack_p50_ms'] or 0:.2f}/{row['ack_p99_ms'] or 0:.2f}"
        print(f"{config:<12}{cells}{latency:>18}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ha_throughput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-messages", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    settings = Settings(count=args.count, runs=args.runs, body_size=100, out=args.out, skip_rss=True,
                        rss_messages=1, targets=[])
    for name in ("send-bench", "receive-bench"):
        cexamples.build(name)
    started = datetime.now(UTC)
    logs = Path(tempfile.mkdtemp(prefix="ha-throughput-logs-"))
    print(f"ha throughput: {args.count:,} x 100-byte messages, {args.runs} rounds, node logs in {logs}", flush=True)
    results = [measure(config, round_no, settings, args.latency_messages, logs)
               for round_no in range(1, args.runs + 1) for config in CONFIGURATIONS]
    summary = summarize(results)
    print_summary(summary)
    report = {
        "benchmark": "ha_throughput",
        "command": shlex.join([sys.executable, "-m", "benchmarks.ha_throughput", *(sys.argv[1:] if argv is None else argv)]),
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": (datetime.now(UTC) - started).total_seconds(),
        "host": host_info(),
        "summary": summary,
        "rounds": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ha-throughput-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {path}")
    failed = any(not run["ok"] for r in results for run in r["runs"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
