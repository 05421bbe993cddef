"""What hot standby costs: a standalone node vs a primary with 1 and 2 backups.

In one invocation, for each configuration in turn (alternating, so noise hits
all alike), a fresh set of nodes on loopback, an ``all``-replicated queue, and
the same proton C clients as ``benchmarks.throughput`` on 100-byte messages:
N sends then N receives, and concurrent send+receive.  With backups, a send
counts only once every backup holds the message (the primary accepts to the
producer only then), so the send figure is the price of replication.

Producer acknowledgement latency: a python-qpid-proton sender with one
message in flight at a time times send -> ``accepted``; p50 and p99.

Nodes require authentication (``hastandby/testing/auth.py``): backups authenticate
to the primary as ``peer``, clients as ``app`` with PLAIN, management as
``admin``.

Prints msg/s per configuration and the ratio to standalone, and CPU per
message of the primary (``cpu_us_per_msg``: its one core is what limits a
cluster) and of every node (``cluster_cpu_us_per_msg``); writes JSON to
``results/ha-throughput-<UTC>.json``.

Before/after (``--baseline-tree PATH``, e.g. a ``git worktree`` of an older
commit): in the same invocation every configuration is measured as well on
nodes started from that tree (``python -m hastandby serve`` with cwd and
``PYTHONPATH`` the tree, the same interpreter), alternating baseline and
current runs, and the current/baseline ratios of every figure are printed
and recorded.  Each tree gets the node arguments it accepts: a tree whose
``serve --help`` has no ``--users-file`` has no authentication, so its nodes
run without it (clients and management connect with SASL ANONYMOUS) while
the current nodes require it as always; the output says so.

    python -m benchmarks.ha_throughput [--count 100000] [--runs 3] [--latency-messages 2000]
        [--baseline-tree PATH | --journal-baseline]

What a journal costs messages that are not durable (``--journal-baseline``,
issue 14): the same comparison, the baseline being this tree's nodes as
above and the current ones the same nodes each with a ``--data-dir`` (a
journal) and every queue declared durable; the messages are not durable, so
nothing of them is written, and the ratios show what the journal's presence
costs them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
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

from hastandby.client import ManagementError
from hastandby.testing import auth as _auth
from hastandby.testing import cexamples, interrupt_on_sigterm, ratio, request, wait_answering, wait_state
from hastandby.testing.processes import Service, free_port
from hastandby.testing.provenance import host_info
from spark_analysis.phases import nearest_rank

from .trees import CURRENT, Tree, baseline_tree
from .throughput import (
    DEFAULT_OUT,
    FIGURES,
    LOOPBACK,
    PHASES,
    REPO_ROOT,
    ClientFailure,
    Run,
    Settings,
    measure_phase,
    print_run,
)

CONFIGURATIONS = {"standalone": 0, "primary+1": 1, "primary+2": 2}
LATENCY_TIMEOUT = 30.0
"""Seconds the ack latency figure may take beyond 50 ms per message before it counts as stuck."""
GOAL_TOLERANCE = 0.05
"""Issues 11 and 14: current within 5 % of the baseline (msg/s >= 0.95x, ack latency <= 1.05x)."""


def start_nodes(backups: int, logs: Path, tag: str, tree: Tree = CURRENT) -> list[Service]:
    """A standalone node, or a primary plus ``backups`` caught-up backups, started from ``tree``."""
    ports = [free_port() for _ in range(backups + 1)]
    base = tree.serve_argv()
    if backups == 0:
        argvs = [base + ["--listen", f"{LOOPBACK}:{ports[0]}"]]
    else:
        brokers = ",".join(f"{LOOPBACK}:{p}" for p in ports)
        argvs = [base + ["--listen", f"{LOOPBACK}:{p}", "--ha-cluster", "--brokers-url", brokers] for p in ports]
    if tree.journal:
        argvs = [argv + ["--data-dir", str(logs / f"{tag}-data" / f"node{i}")] for i, argv in enumerate(argvs)]
    services = [Service(f"node{i}", argv, logs / f"{tag}-node{i}.log", cwd=tree.root, env=tree.env())
                for i, argv in enumerate(argvs)]
    login = tree.login()
    try:
        for service, port in zip(services, ports):
            wait_answering(service, port, login=login)
            service.port = port  # type: ignore[attr-defined]
        if backups:
            request(ports[0], "PROMOTE", login=login)
            for port in ports[1:]:
                wait_state(port, "backup", login=login)
    except BaseException:
        for service in services:
            service.stop()
        raise
    return services


class LatencySender(MessagingHandler):
    """One message in flight: the time from send to 'accepted' is the acknowledgement latency."""

    def __init__(self, url: str, address: str, count: int, connect_options: dict[str, Any] | None = None,
                 timeout: float | None = None) -> None:
        super().__init__()
        self.url, self.address, self.count = url, address, count
        self.connect_options = _auth.users().connect_options() if connect_options is None else connect_options
        self.timeout = timeout
        self.timed_out = False
        self.latencies: list[float] = []
        self._sent_at = 0.0

    def on_start(self, event: Any) -> None:
        if self.timeout is not None:
            event.container.schedule(self.timeout, self)
        connection = event.container.connect(self.url, reconnect=False, **self.connect_options)
        event.container.create_sender(connection, self.address)

    def on_timer_task(self, event: Any) -> None:
        self.timed_out = True
        event.container.stop()

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


def ack_latency(port: int, queue: str, count: int, connect_options: dict[str, Any] | None = None,
                timeout: float | None = None) -> dict[str, float]:
    """p50/p99/max of send -> accepted, one message in flight; ``timeout`` default 30 s + 50 ms per message."""
    timeout = LATENCY_TIMEOUT + 0.05 * count if timeout is None else timeout
    sender = LatencySender(f"amqp://{LOOPBACK}:{port}", queue, count, connect_options, timeout)
    Container(sender).run()
    ordered = sorted(sender.latencies)
    if len(ordered) < count:
        why = f" (stopped after {timeout:.0f} s)" if sender.timed_out else ""
        raise RuntimeError(f"only {len(ordered)} of {count} latency messages were accepted{why}")
    return {
        "p50_ms": nearest_rank(ordered, 50) * 1e3,
        "p99_ms": nearest_rank(ordered, 99) * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


def measure(config: str, round_no: int, settings: Settings, latency_messages: int, logs: Path,
            tree: Tree = CURRENT, label: str | None = None) -> dict[str, Any]:
    """One round of one configuration on fresh nodes from ``tree``; a failure is recorded, not raised."""
    tag = uuid.uuid4().hex[:8]
    label = label or config
    result: dict[str, Any] = {"config": config, "tree": tree.name, "round": round_no, "runs": [], "error": None}
    queues = {"send": f"q-{tag}", "receive": f"q-{tag}", "concurrent": f"c-{tag}"}
    runs = {figure: Run(round_no, label, figure, queues[figure], settings.count) for figure in FIGURES}
    services: list[Service] = []
    nodes_tag = f"{tree.name}-{config}-r{round_no}"
    try:
        services = start_nodes(CONFIGURATIONS[config], logs, nodes_tag, tree)
        primary = services[0]
        port = primary.port  # type: ignore[attr-defined]
        declared = {"durable": True} if tree.journal else {}
        for name in set(queues.values()) | {f"lat-{tag}"}:
            request(port, "CREATE", "queue", name, {**declared, "arguments": {"qpid.replicate": "all"}},
                     login=tree.login())
        for figure in FIGURES:
            run = runs[figure]
            if figure == "receive" and not runs["send"].ok:
                run.error = "not run: the send figure that fills its queue failed"
            else:
                cluster_before = sum(service.cpu_seconds() for service in services)
                measure_phase(run, primary, partial(PHASES[figure], settings, port, run.queue, tree.client_environment()))
                if run.ok:
                    spent = sum(service.cpu_seconds() for service in services) - cluster_before
                    run.cluster_cpu_us_per_msg = spent / run.messages * 1e6
            print_run(run, settings.runs)
        result["ack_latency"] = ack_latency(port, f"lat-{tag}", latency_messages, tree.connect_options())
        lat = result["ack_latency"]
        print(f"round {round_no}/{settings.runs}  {label:<10} ack latency p50 {lat['p50_ms']:.2f} ms "
              f"p99 {lat['p99_ms']:.2f} ms", flush=True)
    except (ManagementError, ClientFailure, RuntimeError, TimeoutError, OSError) as error:
        result["error"] = f"{type(error).__name__}: {error}"
        print(f"round {round_no}/{settings.runs}  {label:<10} *** FAILED *** {result['error']}", flush=True)
    finally:
        for service in services:
            service.stop()
        shutil.rmtree(logs / f"{nodes_tag}-data", ignore_errors=True)
    for run in runs.values():
        if not run.ok and run.error is None:
            run.error = result["error"] or "not run"
    result["runs"] = [asdict(run) for run in runs.values()]
    return result


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(results: list[dict[str, Any]], tree: str = CURRENT.name) -> dict[str, Any]:
    """Medians per configuration of one tree's rounds: msg/s and primary CPU per figure, ack latency."""
    summary: dict[str, Any] = {}
    for config in CONFIGURATIONS:
        mine = [r for r in results if r["config"] == config and r.get("tree", CURRENT.name) == tree]
        figures, cpu, cluster_cpu = {}, {}, {}
        for figure in FIGURES:
            ok = [run for r in mine for run in r["runs"] if run["figure"] == figure and run["ok"]]
            figures[figure] = _median([run["msg_per_s"] for run in ok])
            cpu[figure] = _median([run["cpu_us_per_msg"] for run in ok])
            cluster_cpu[figure] = _median([run["cluster_cpu_us_per_msg"] for run in ok
                                           if run.get("cluster_cpu_us_per_msg") is not None])
        summary[config] = {"msg_per_s": figures, "cpu_us_per_msg": cpu, "cluster_cpu_us_per_msg": cluster_cpu,
                           "ack_p50_ms": _median([r["ack_latency"]["p50_ms"] for r in mine if "ack_latency" in r]),
                           "ack_p99_ms": _median([r["ack_latency"]["p99_ms"] for r in mine if "ack_latency" in r])}
    base = summary["standalone"]["msg_per_s"]
    for config in CONFIGURATIONS:
        summary[config]["ratio_to_standalone"] = {
            figure: ratio(summary[config]["msg_per_s"][figure], base[figure]) for figure in FIGURES
        }
    return summary


def _figures(result: dict[str, Any]) -> dict[str, float | None]:
    """One round's msg/s per figure, and its ack latency p50/p99, under the comparison's keys."""
    values: dict[str, float | None] = {
        figure: next((run["msg_per_s"] for run in result["runs"] if run["figure"] == figure and run["ok"]), None)
        for figure in FIGURES
    }
    latency = result.get("ack_latency") or {}
    values["ack_p50_ms"], values["ack_p99_ms"] = latency.get("p50_ms"), latency.get("p99_ms")
    return values


COMPARED = (*FIGURES, "ack_p50_ms", "ack_p99_ms")


def compare(results: list[dict[str, Any]], current: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """current/baseline: of the medians, and per round (the two runs of a configuration in one round).

    Goals (issues 11 and 14): msg/s ratios >= 1 - GOAL_TOLERANCE, ack latency ratios <= 1 + GOAL_TOLERANCE.
    """
    comparison: dict[str, Any] = {}
    for config in CONFIGURATIONS:
        cur, base = current[config], baseline[config]
        medians = {figure: ratio(cur["msg_per_s"][figure], base["msg_per_s"][figure]) for figure in FIGURES}
        medians["ack_p50_ms"] = ratio(cur["ack_p50_ms"], base["ack_p50_ms"])
        medians["ack_p99_ms"] = ratio(cur["ack_p99_ms"], base["ack_p99_ms"])
        medians["cpu_us_per_msg"] = {figure: ratio(cur["cpu_us_per_msg"][figure], base["cpu_us_per_msg"][figure])
                                     for figure in FIGURES}
        per_round: dict[str, list[float]] = {key: [] for key in COMPARED}
        rounds = sorted({r["round"] for r in results})
        for round_no in rounds:
            pair = {r["tree"]: _figures(r) for r in results if r["config"] == config and r["round"] == round_no}
            if CURRENT.name in pair and "baseline" in pair:
                for key in COMPARED:
                    value = ratio(pair[CURRENT.name][key], pair["baseline"][key])
                    if value is not None:
                        per_round[key].append(value)
        within = {key: (None if medians[key] is None else
                        medians[key] >= 1 - GOAL_TOLERANCE if key in FIGURES else medians[key] <= 1 + GOAL_TOLERANCE)
                      for key in COMPARED}
        comparison[config] = {"ratio_of_medians": medians, "per_round": per_round,
                              "within_5_percent": within}
    return comparison


def print_summary(summary: dict[str, Any], title: str = "") -> None:
    print(f"\n{title}median msg/s (ratio to standalone); producer ack latency p50/p99 ms")
    print(f"{'config':<12}" + "".join(f"{figure:>24}" for figure in FIGURES) + f"{'ack p50/p99':>18}")
    for config, row in summary.items():
        cells = "".join(
            f"{(row['msg_per_s'][f] or 0):>12,.0f} (x{(row['ratio_to_standalone'][f] or 0):.2f})".rjust(24)
            for f in FIGURES
        )
        latency = f"{row['ack_p50_ms'] or 0:.2f}/{row['ack_p99_ms'] or 0:.2f}"
        print(f"{config:<12}{cells}{latency:>18}")
    print("median CPU us/msg, the primary's / every node's: " + "; ".join(
        f"{config} " + " ".join(f"{f} {_us(row['cpu_us_per_msg'][f])}/{_us(row['cluster_cpu_us_per_msg'][f])}"
                                for f in FIGURES)
        for config, row in summary.items()))


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cell(value: float | None, spread: list[float], within: bool | None) -> str:
    if value is None:
        return "-"
    text = f"x{value:.3f}"
    if spread:
        text += f" [{min(spread):.2f}-{max(spread):.2f}]"
    return text + (" ok" if within else " OUT")


def print_comparison(comparison: dict[str, Any], baseline: Tree) -> None:
    print("\ncurrent/baseline, ratio of medians [per-round ratios min-max], then whether within 5 % "
          "(msg/s >= x0.95, ack latency <= x1.05)")
    print(f"{'config':<12}" + "".join(f"{key:>27}" for key in COMPARED))
    for config, row in comparison.items():
        print(f"{config:<12}" + "".join(
            f"{_cell(row['ratio_of_medians'][key], row['per_round'][key], row['within_5_percent'][key]):>27}"
            for key in COMPARED))
    print("primary CPU us/msg, current/baseline: " + "; ".join(
        f"{config} " + " ".join(f"{f} {fmt_ratio(row['ratio_of_medians']['cpu_us_per_msg'][f])}" for f in FIGURES)
        for config, row in comparison.items()))
    if not baseline.authenticated:
        print(f"NOTE: the baseline ({baseline.root}) has no authentication: its nodes run without it and its "
              f"clients connect anonymously; the current nodes require it (clients PLAIN, once per connection).")


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def _short(commit: str | None) -> str:
    """A tree's commit, short; a tree unpacked with ``git archive`` is no repository and has none."""
    return commit[:7] if commit else "an unversioned tree"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ha_throughput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-messages", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--baseline-tree", type=Path, default=None, metavar="PATH",
                        help="also measure nodes started from this source tree (e.g. a git worktree of an older "
                             "commit), alternating with the current ones, and report current/baseline ratios")
    parser.add_argument("--journal-baseline", action="store_true",
                        help="what a journal costs messages that are not durable: the current nodes get a "
                             "--data-dir and durable queues, and the baseline is the same tree without them")
    args = parser.parse_args(argv)
    if args.baseline_tree and args.journal_baseline:
        parser.error("--baseline-tree and --journal-baseline are two different baselines: choose one")
    settings = Settings(count=args.count, runs=args.runs, body_size=100, out=args.out, skip_rss=True,
                        rss_messages=1, targets=[])
    current = CURRENT
    if args.journal_baseline:
        current, baseline = Tree("current", REPO_ROOT, journal=True), Tree("baseline", REPO_ROOT, baseline=True)
    else:
        baseline = baseline_tree(args.baseline_tree) if args.baseline_tree else None
    for name in ("send-bench", "receive-bench"):
        cexamples.build(name)
    started = datetime.now(UTC)
    host_at_start = host_info()
    trees_at_start = {tree.name: tree.describe() for tree in (current, baseline) if tree}
    logs = Path(tempfile.mkdtemp(prefix="ha-throughput-logs-"))
    print(f"ha throughput: {args.count:,} x 100-byte messages, {args.runs} rounds, node logs in {logs}", flush=True)
    if args.journal_baseline:
        print("baseline: these nodes without --data-dir; current: the same with --data-dir and durable queues, "
              "the messages not durable; alternating baseline and current runs", flush=True)
    elif baseline:
        info = trees_at_start["baseline"]
        print(f"baseline: {baseline.root} at {_short(info['commit'])} "
              f"({'with' if baseline.authenticated else 'WITHOUT'} authentication), against current "
              f"{trees_at_start['current']['commit'][:7]} (authentication required); "
              f"alternating baseline and current runs", flush=True)
    results: list[dict[str, Any]] = []
    interrupted = False
    interrupt_on_sigterm()
    try:
        pair = 0
        for round_no in range(1, args.runs + 1):
            for config in CONFIGURATIONS:
                if baseline is None:
                    results.append(measure(config, round_no, settings, args.latency_messages, logs))
                    continue
                order = (baseline, current) if pair % 2 == 0 else (current, baseline)
                pair += 1
                for tree in order:
                    results.append(measure(config, round_no, settings, args.latency_messages, logs, tree,
                                           label=f"{config}@{tree.name[:4]}"))
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: the nodes started were stopped; summarising what finished", flush=True)
    summary = summarize(results)
    report: dict[str, Any] = {
        "benchmark": "ha_throughput",
        "command": shlex.join([sys.executable, "-m", "benchmarks.ha_throughput", *(sys.argv[1:] if argv is None else argv)]),
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": (datetime.now(UTC) - started).total_seconds(),
        "interrupted": interrupted,
        "host": host_at_start,
        "parameters": {"count": args.count, "runs": args.runs, "latency_messages": args.latency_messages,
                       "body_size": 100, "client_timeout_s": settings.client_timeout},
        "trees": trees_at_start,
        "summary": summary,
    }
    if baseline:
        baseline_summary = summarize(results, "baseline")
        print_summary(baseline_summary, f"baseline {_short(trees_at_start['baseline']['commit'])} "
                                        f"({'with' if baseline.authenticated else 'without'} authentication): ")
        print_summary(summary, f"current {trees_at_start['current']['commit'][:7]} (authentication required"
                               f"{', a journal, durable queues' if current.journal else ''}): ")
        comparison = compare(results, summary, baseline_summary)
        print_comparison(comparison, baseline)
        report["baseline_summary"] = baseline_summary
        report["current_vs_baseline"] = comparison
        report["goal"] = {"tolerance": GOAL_TOLERANCE,
                          "rule": "msg/s ratio current/baseline >= 0.95; ack latency ratio <= 1.05 (ratio of medians)",
                          "baseline_authentication": baseline.authenticated,
                          "current_authentication": True, "current_journal": current.journal}
    else:
        print_summary(summary)
    report["rounds"] = results
    trees_at_end = {tree.name: tree.describe() for tree in (current, baseline) if tree}
    if trees_at_end != trees_at_start:
        report["node_code_changed_during_run"] = trees_at_end
        print("WARNING: a tree's node code changed during the run; rounds before and after ran different code",
              flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ha-throughput-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {path}")
    failed = interrupted or any(r["error"] or not all(run["ok"] for run in r["runs"]) for r in results)
    if failed:
        print(f"*** SOME FIGURES FAILED; node logs kept in {logs} ***", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
