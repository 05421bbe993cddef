"""What a client that cannot log in costs the node (issue 25): an authenticated producer under login floods.

    python -m benchmarks.auth_flood [--rounds 3] [--duration 5] [--rate 500] [--sockets 8]
        [--sources 1 | --fresh-sources] [--flood-nice 19] [--floods bad-plain,unknown-user,tls]
        [--baseline-tree PATH] [--out results/]

Per round, one fresh standalone node (a plain and a TLS listener, the run's
users and certificate: ``hastandby/testing/auth.py``, ``certs.py``) and one phase per flood
plus one without (``alone``), in an order that alternates round by round so
that noise from the shared machine hits all alike.  In each phase a
python-qpid-proton producer (``hastandby.testing.flood_clients produce``) sends 100-byte
messages one at a time, each waiting for ``accepted``, for ``--duration``
seconds, while a flood (``hastandby.testing.flood_clients flood``) offers ``--rate``
attempts per second from ``--sockets`` sockets, abandoning an attempt not
answered within its slot (sockets / rate seconds):

- ``bad-plain``: SASL PLAIN as ``app`` with a wrong password;
- ``unknown-user``: SASL PLAIN as a user the node does not have;
- ``tls``: a TLS handshake on the TLS port, then close.

Each flood phase's sockets come from source addresses of their own
(``127.0.P.1`` ... for phase P: ``--sources`` of them; ``--fresh-sources``:
a new address for every attempt, a distributed flood), so that one phase's
throttled sources do not help the next.  The flood runs at niceness
``--flood-nice`` (19): it stands in for an attacker's machine, and on a
small machine its own client-side TLS would otherwise take more CPU from
the producer than the node does.  Figures per phase: the producer's msg/s,
the node's CPU (user+system) per message over the producer's window, the
flood client's CPU, what the flood got (attempts, answers, refusals at
accept, abandoned), the node's ``logins`` status, and whether every
accepted message is on the queue afterwards (management ``QUERY``).  The
verdict: the producer's rate under each flood over its rate alone (ratio of
the medians over the rounds, and each round's own ratio); goal ``GOAL``.

Before/after (``--baseline-tree PATH``, e.g. ``git worktree add --detach
/tmp/base HEAD`` before a change): every round also runs on a node started
from that tree (cwd and ``PYTHONPATH`` the tree, the same interpreter), the
two trees alternating, with the same clients (this tree's).

Writes ``results/auth-flood-<UTC>.json`` (the command, host, trees,
every phase's figures, the summary).  Exit code 1 if a phase failed or a
message was lost (not for a missed goal: the table says that).
"""

from __future__ import annotations

import argparse
import json
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from hastandby.client import ManagementError
from hastandby.testing import auth as _auth
from hastandby.testing import fmt, interrupt_on_sigterm, median_or_none, ratio, request, wait_answering, write_report
from hastandby.testing.certs import make_certificates
from hastandby.testing.flood_clients import KINDS
from hastandby.testing.processes import LOOPBACK, Service, free_port, python_env
from hastandby.testing.provenance import host_info

from .trees import CURRENT, Tree, baseline_tree
from .throughput import DEFAULT_OUT, REPO_ROOT

ALONE = "alone"
GOAL = 0.8
"""Least producer rate under a flood over its rate alone that meets issue 25's goal."""
CLIENT_TIMEOUT = 60.0


def client_argv(role: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hastandby.testing.flood_clients", role, "--host", LOOPBACK, "--port", str(port), *extra]


def client_env() -> dict[str, str]:
    return {**python_env(), **_auth.users().client_environment()}


def _read_line(process: subprocess.Popen[str], timeout: float, what: str) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"{what}: no answer within {timeout:.0f} s (exit code {process.poll()})")
    return line.strip()


def _stop(process: subprocess.Popen[str] | None) -> None:
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(10)


def _client(role: str, port: int, log: Path, *extra: str) -> subprocess.Popen[str]:
    with open(log, "w") as stderr:  # the child has its own copy of the descriptor
        return subprocess.Popen(client_argv(role, port, *extra), cwd=REPO_ROOT, env=client_env(), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, text=True)


def run_phase(node: Service, port: int, tls_port: int, phase: str, phase_no: int, args: argparse.Namespace,
              logs: Path) -> dict[str, Any]:
    """One phase: the producer for ``--duration`` seconds, with ``phase``'s flood (or alone)."""
    queue = f"flood-{phase}-{uuid.uuid4().hex[:6]}"
    result: dict[str, Any] = {"phase": phase, "ok": False, "error": None}
    producer = flooder = None
    try:
        producer = _client("produce", port, logs / f"producer-{queue}.log", "--queue", queue,
                           "--duration", str(args.duration))
        if _read_line(producer, CLIENT_TIMEOUT, "producer") != "ready":
            raise RuntimeError("producer: did not say ready")
        if phase != ALONE:
            sources = [f"127.0.{phase_no}.{i + 1}" for i in range(args.sources)]
            flooder = _client("flood", tls_port if phase == "tls" else port, logs / f"flood-{queue}.log",
                              "--kind", phase, "--sockets", str(args.sockets), "--rate", str(args.rate),
                              "--nice", str(args.flood_nice), "--duration", str(args.duration + 30),
                              *[f"--source={s}" for s in sources], *(["--fresh-sources"] if args.fresh_sources else []))
            select.select([], [], [], 0.5)  # the flood under way before the producer's clock starts
        assert producer.stdin is not None
        cpu_before = node.cpu_seconds()
        flood_cpu_before = _cpu(flooder)
        producer.stdin.write("go\n")
        producer.stdin.flush()
        produced = json.loads(_read_line(producer, args.duration + CLIENT_TIMEOUT, "producer"))
        cpu = node.cpu_seconds() - cpu_before
        result["producer"] = produced
        result["node_cpu_us_per_message"] = cpu / max(1, produced["accepted"]) * 1e6
        result["node_cpu_share"] = cpu / produced["seconds"]
        if flooder is not None:
            result["flood_client_cpu_share"] = (_cpu(flooder) - flood_cpu_before) / produced["seconds"]
            out, _ = flooder.communicate("", timeout=CLIENT_TIMEOUT)
            result["flood"] = json.loads(out.strip().splitlines()[-1])
        queues = {q["name"]: q for q in request(port, "QUERY")["queues"]}
        result["lost"] = produced["accepted"] - queues.get(queue, {}).get("depth", 0)
        result["node_logins"] = request(port, "STATUS").get("logins")  # None on a tree without them
        request(port, "DELETE", "queue", queue)
        result["ok"] = result["lost"] == 0
        if result["lost"]:
            result["error"] = f"{result['lost']} accepted messages not on the queue"
    except (ManagementError, RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as error:
        result["error"] = f"{type(error).__name__}: {error}"
    finally:
        _stop(producer)
        _stop(flooder)
    return result


def _cpu(process: subprocess.Popen[str] | None) -> float:
    if process is None:
        return 0.0
    try:
        times = psutil.Process(process.pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(times.user + times.system)


def run_round(tree: Tree, round_no: int, phases: list[str], args: argparse.Namespace, certs: Any,
              logs: Path) -> list[dict[str, Any]]:
    port, tls_port = free_port(), free_port()
    argv = tree.serve_argv() + ["--listen", f"{LOOPBACK}:{port}", "--listen-tls", f"{LOOPBACK}:{tls_port}",
                                *certs.serve_arguments()]
    node = Service(f"{tree.name}-r{round_no}", argv, logs / f"{tree.name}-r{round_no}.log", cwd=tree.root,
                   env=tree.env())
    results = []
    try:
        wait_answering(node, port)
        for phase in phases:
            result = run_phase(node, port, tls_port, phase, 1 + ([ALONE, *KINDS].index(phase)), args, logs)
            result.update(tree=tree.name, round=round_no)
            results.append(result)
            print(_line(result, args.rounds), flush=True)
    finally:
        node.stop()
    return results


def _line(result: dict[str, Any], rounds: int) -> str:
    head = f"round {result['round']}/{rounds}  {result['tree']:<8} {result['phase']:<13}"
    if "producer" not in result:
        return f"{head} *** FAILED *** {result['error']}"
    text = (f"{head} producer {result['producer']['per_s']:8.1f} msg/s  node cpu "
            f"{result['node_cpu_us_per_message']:7.1f} us/msg ({result['node_cpu_share']:.2f} of a core)")
    flood = result.get("flood")
    if flood:
        text += (f"  flood {flood['attempts_per_s']:.0f}/s offered, {flood['answered_per_s']:.0f}/s answered, "
                 f"{flood['refused']} refused, {flood['abandoned']} abandoned (client "
                 f"{result['flood_client_cpu_share']:.2f} of a core)")
    if result["error"]:
        text += f"  *** {result['error']} ***"
    return text


def summarize(results: list[dict[str, Any]], tree: str, floods: list[str]) -> dict[str, Any]:
    mine = [r for r in results if r["tree"] == tree and "producer" in r]
    alone = {r["round"]: r["producer"]["per_s"] for r in mine if r["phase"] == ALONE}
    summary: dict[str, Any] = {}
    for phase in [ALONE, *floods]:
        rows = [r for r in mine if r["phase"] == phase]
        rates = [r["producer"]["per_s"] for r in rows]
        entry: dict[str, Any] = {
            "rounds": len(rows),
            "producer_per_s": median_or_none(rates),
            "node_cpu_us_per_message": median_or_none([r["node_cpu_us_per_message"] for r in rows]),
            "lost": sum(r.get("lost", 0) for r in rows),
        }
        if phase != ALONE:
            entry["ratio_to_alone"] = ratio(entry["producer_per_s"], median_or_none(list(alone.values())))
            entry["per_round_ratios"] = [ratio(r["producer"]["per_s"], alone.get(r["round"])) for r in rows]
            entry["flood_attempts_per_s"] = median_or_none([r["flood"]["attempts_per_s"] for r in rows if "flood" in r])
            entry["flood_answered_per_s"] = median_or_none([r["flood"]["answered_per_s"] for r in rows
                                                            if "flood" in r])
            entry["meets_goal"] = entry["ratio_to_alone"] is not None and entry["ratio_to_alone"] >= GOAL
        summary[phase] = entry
    return summary


def print_summary(name: str, summary: dict[str, Any]) -> None:
    print(f"\n{name}: medians over the rounds; ratio = producer under the flood / producer alone (goal >= {GOAL})")
    print(f"{'phase':<14}{'msg/s':>9}{'us/msg':>9}{'ratio':>8}  {'per round':<24}{'offered/s':>10}{'answered/s':>11}")
    for phase, row in summary.items():
        rounds = ", ".join(fmt(r, ".2f") for r in row.get("per_round_ratios", []))
        print(f"{phase:<14}{fmt(row['producer_per_s'], '.1f'):>9}{fmt(row['node_cpu_us_per_message'], '.1f'):>9}"
              f"{fmt(row.get('ratio_to_alone'), '.2f'):>8}  {rounds:<24}"
              f"{fmt(row.get('flood_attempts_per_s'), '.0f'):>10}{fmt(row.get('flood_answered_per_s'), '.0f'):>11}"
              f"{'  LOST ' + str(row['lost']) if row['lost'] else ''}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.auth_flood", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the phase order alternating (default 3)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of each phase's producer (default 5)")
    parser.add_argument("--rate", type=float, default=500.0, help="login attempts offered per second (default 500)")
    parser.add_argument("--sockets", type=int, default=8, help="the flood's sockets (default 8)")
    parser.add_argument("--sources", type=int, default=1,
                        help="distinct source addresses among the flood's sockets (default 1: one attacker)")
    parser.add_argument("--fresh-sources", action="store_true",
                        help="every attempt from an address not used before: a distributed flood, which no "
                             "per-source bound slows (instead of --sources)")
    parser.add_argument("--flood-nice", type=int, default=19,
                        help="the flood's niceness (default 19: it stands in for an attacker's machine, so its own "
                             "CPU should not be what slows the producer; 0 to share the CPU evenly)")
    parser.add_argument("--floods", default=",".join(KINDS), help=f"comma-separated, of {','.join(KINDS)}")
    parser.add_argument("--baseline-tree", type=Path, default=None, metavar="PATH",
                        help="also run every round on a node started from this tree, alternating")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    args = parser.parse_args(argv)
    args.floods = [f for f in args.floods.split(",") if f]
    if not args.floods or any(f not in KINDS for f in args.floods):
        parser.error(f"--floods: of {', '.join(KINDS)}")
    if args.rounds < 1 or args.duration <= 0 or args.rate <= 0 or not 1 <= args.sources <= args.sockets <= 250:
        parser.error("--rounds, --duration and --rate must be positive, 1 <= --sources <= --sockets <= 250")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join([sys.executable, "-m", "benchmarks.auth_flood", *(sys.argv[1:] if argv is None else argv)])
    trees = [CURRENT] + ([baseline_tree(args.baseline_tree)] if args.baseline_tree else [])
    started = datetime.now(UTC)
    host_at_start = host_info()
    trees_at_start = {tree.name: tree.describe() for tree in trees}
    logs = Path(tempfile.mkdtemp(prefix="auth-flood-logs-"))
    certs = make_certificates(logs / "pki")
    print(f"auth flood: {args.rounds} rounds of {args.duration:g} s phases; floods {', '.join(args.floods)} at "
          f"{args.rate:g} attempts/s from {args.sockets} sockets "
          f"({'a fresh source address each' if args.fresh_sources else f'{args.sources} source addresses'}); trees "
          f"{', '.join(t.name for t in trees)}; node logs in {logs}", flush=True)
    phases = [ALONE, *args.floods]
    results: list[dict[str, Any]] = []
    interrupted = False
    undo = interrupt_on_sigterm()
    try:
        for round_no in range(1, args.rounds + 1):
            order = phases if round_no % 2 else phases[::-1]
            for tree in (trees if round_no % 2 else trees[::-1]):
                results.extend(run_round(tree, round_no, order, args, certs, logs))
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: every process started was stopped; summarising what finished", flush=True)
    finally:
        undo()
    summaries = {tree.name: summarize(results, tree.name, args.floods) for tree in trees}
    for tree in trees:
        print_summary(f"{tree.name} ({trees_at_start[tree.name]['commit'][:7]})", summaries[tree.name])
    report: dict[str, Any] = {
        "benchmark": "auth_flood",
        "command": command,
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(UTC) - started).total_seconds(), 1),
        "interrupted": interrupted,
        "host": host_at_start,
        "trees": trees_at_start,
        "parameters": {"rounds": args.rounds, "duration_s": args.duration, "rate": args.rate,
                       "sockets": args.sockets, "sources": args.sources, "floods": args.floods, "goal": GOAL,
                       "flood_nice": args.flood_nice, "fresh_sources": args.fresh_sources,
                       "body_size": 100},
        "summary": summaries,
        "phases": results,
    }
    if len(trees) == 2:
        report["current_vs_baseline"] = {
            phase: ratio(summaries["current"][phase]["producer_per_s"], summaries["baseline"][phase]["producer_per_s"])
            for phase in phases}
        print("\ncurrent/baseline producer msg/s: " + ", ".join(
            f"{phase} {fmt(value, '.2f')}" for phase, value in report["current_vs_baseline"].items()))
    trees_at_end = {tree.name: tree.describe() for tree in trees}
    if trees_at_end != trees_at_start:
        report["node_code_changed_during_run"] = True
        print("WARNING: a tree's node code changed during the run", flush=True)
    path = write_report(args.out, "auth-flood", started, report)
    print(f"\nresults: {path}")
    failed = interrupted or any(not r["ok"] for r in results)
    if failed:
        print(f"*** SOME PHASES FAILED; node logs kept in {logs} ***", flush=True)
        return 1
    shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
