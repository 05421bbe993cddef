"""The command line: run random and/or fixed schedules, print a table, write the summary JSON.

Exit code 1 if any schedule lost or conjured a message, showed a replica
mismatch, had an assertion that did not hold, could not be completed (no
verdict: the cluster did not settle, or the drain did not empty the queue),
or the run was interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hastandby.testing.netns_workload import VIRTUAL_IP_PRODUCER
from hastandby.testing.paths import results_dir
from hastandby.testing.provenance import host_info, uncommitted_changes

from .runner import Settings, run_schedule
from .schedule import CANARIES, FAULT_KINDS, FIXED, Schedule, parse_faults, random_schedule


def _faults(text: str) -> tuple[str, ...]:
    try:
        return parse_faults(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _fixed(text: str) -> list[str]:
    names = list(FIXED) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FIXED and n not in CANARIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fixed schedule(s) {unknown}: use {', '.join(FIXED)} or all "
                                         f"(or a negative control, which must fail: {', '.join(CANARIES)})")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.nemesis",
                                description="Jepsen-style fault schedules against a hot-standby cluster: etcd and "
                                            "3 nodes in network namespaces (needs root), ordinary proton clients, "
                                            "a total-queue checker and replica comparisons.")
    p.add_argument("--schedules", type=int, default=None,
                   help="random schedules to run (default 1, or 0 with --fixed)")
    p.add_argument("--seed", type=int, help="seed of the first random schedule; schedule i uses seed+i "
                                            "(default: drawn and printed; replay one with --seed S --schedules 1)")
    p.add_argument("--faults", type=_faults, default=FAULT_KINDS,
                   help="comma-separated fault kinds random schedules draw from: kill (kill -9), all or kill9-all "
                        "(kill -9 of every node at once), stop (SIGSTOP), term (SIGTERM), promote, etcd (primary cut from etcd), backups (primary cut from its "
                        "backups), clients (clients cut from the primary); default all of these. Disk faults only "
                        "when named: rot (a node, or every node, down with bit rot in its journal before its "
                        "restart), ro or disk-read-only (a backup's file system fails, later it is repaired)")
    p.add_argument("--fixed", type=_fixed, default=[], metavar="NAMES|all",
                   help=f"run these fixed schedules first: {', '.join(FIXED)}; also the negative controls, which "
                        f"must fail (not in all): {', '.join(CANARIES)}")
    p.add_argument("--out", type=Path, help="trace directory (default results/nemesis-traces-<UTC>/)")
    p.add_argument("--results", type=Path, default=results_dir(), help="where the summary JSON goes")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep every schedule's node and client logs (default: only those with a problem)")
    p.add_argument("--queue", choices=("plain", "dedup", "both"), default="plain",
                   help="the workload's queue: plain (default), dedup (declared with x-dedup-window: a producer's "
                        "re-send of a message-id it already enqueued is accepted and not enqueued again), or both: "
                        "every schedule runs on a plain queue, then on a dedup queue (duplicates per schedule "
                        "with and without dedup)")
    p.add_argument("--dedup-window", type=int, default=DEDUP_WINDOW, metavar="SECONDS",
                   help=f"the dedup queue's x-dedup-window (default {DEDUP_WINDOW}: longer than a schedule)")
    return p


DEDUP_WINDOW = 600


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 1 <= args.dedup_window <= 86400:
        parser().error("--dedup-window must be 1 to 86400 seconds")
    count = args.schedules if args.schedules is not None else (0 if args.fixed else 1)
    if count < 0:
        parser().error("--schedules must not be negative")
    if os.geteuid() != 0:
        parser().error("needs root: every node, etcd and the clients run in network namespaces of their own")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    schedules: list[Schedule] = [FIXED.get(name) or CANARIES[name] for name in args.fixed]
    schedules += [random_schedule(seed + i, args.faults) for i in range(count)]
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    run_id = f"nemesis-{stamp}"
    out = args.out or results_dir() / f"nemesis-traces-{stamp}"
    kinds = {"plain": [0], "dedup": [args.dedup_window], "both": [0, args.dedup_window]}[args.queue]
    runs = [(schedule, Settings(out=out, keep_logs=args.keep_logs, dedup_window=window))
            for schedule in schedules for window in kinds]
    settings = runs[0][1] if runs else Settings(out=out, keep_logs=args.keep_logs)
    command = shlex.join([sys.executable, "-m", "tests.nemesis", *(sys.argv[1:] if argv is None else argv)])
    print(f"nemesis: {len(args.fixed)} fixed + {count} random schedules (seeds {seed}..{seed + count - 1}, "
          f"faults {','.join(args.faults)}; queue {args.queue}"
          + (f", x-dedup-window {args.dedup_window}" if args.queue != "plain" else "")
          + f"); traces in {settings.out}", flush=True)
    host_at_start, code_at_start = host_info(), uncommitted_changes()
    results: list[dict[str, Any]] = []
    interrupted = False
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None  # e.g. from `timeout`
    try:
        for index, (schedule, run_settings) in enumerate(runs, 1):
            print(f"[{index}/{len(runs)}] {schedule.name} ({run_settings.queue_kind} queue): {schedule}", flush=True)
            result = run_schedule(schedule, run_id, run_settings)
            results.append(result)
            print(_progress(result), flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: the schedule's processes and network were removed; summarising", flush=True)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print_table(results)
    report = {
        "benchmark": "nemesis",
        "command": command,
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(UTC) - started).total_seconds(), 1),
        "interrupted": interrupted,
        "first_seed": seed,
        "faults": list(args.faults),
        "queue": args.queue,
        "dedup_window": args.dedup_window if args.queue != "plain" else None,
        "duplicates_by_queue": duplicates_by_queue(results),
        "host": host_at_start,
        "node_code": code_at_start,
        "traces": str(settings.out),
        "schedules": results,
    }
    if uncommitted_changes() != code_at_start or host_info().get("git_commit") != host_at_start.get("git_commit"):
        report["node_code_changed_during_run"] = True
        print("WARNING: the node code changed during the run: schedules ran different code", flush=True)
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"nemesis-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nsummary: {path}\ntraces:  {settings.out}", flush=True)
    return 1 if interrupted or not results or any(not r["ok"] for r in results) else 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _progress(result: dict[str, Any]) -> str:
    v = result["verdict"]
    status = "ok" if result["ok"] else f"*** {result['status']} ***"
    dedup = f" ({result.get('duplicated_resent')} of them re-sent"
    dedup += (f", deduplicated {result['deduplicated']} by the nodes still running)"
              if result.get("queue") == "dedup" else ")")
    line = (f"    {status} in {result['duration_s']:.0f} s: acked {v['acknowledged']} lost {v['lost']} "
            f"unexpected {v['unexpected']} duplicated {v['duplicated']}{dedup} recovered {v['recovered']}, "
            f"replica mismatches {result['replica_mismatches']} in {len(result['replica_checks'])} checks"
            + (f", virtual IP misplaced in {result['virtual_ip_misplaced_checks']} (acked through it "
               f"{result['acknowledged_by_client'].get(VIRTUAL_IP_PRODUCER, 0)})"
               if any("virtual_ip_on" in c for c in result["replica_checks"]) else ""))
    notes = []
    if result["error"]:
        notes.append(f"error: {result['error']}")
    if not result["complete"]:
        notes.append(f"no verdict (lost counts acknowledged messages not received): drain {result['drain']}, "
                     f"depth after {result['depth_after_drain']}")
    if result["lost_ids"]:
        notes.append(f"lost: {', '.join(result['lost_ids'][:10])}")
    notes += [f"mismatch after {c['after']}: {'; '.join(c.get('diffs', []))[:300]}"
              for c in result["replica_checks"] if c.get("mismatches")]
    notes += [f"VIOLATED {s}" for s in result.get("violated", [])[:5]]
    notes += [f"skipped {s}" for s in result["skipped_ops"][:5]]
    notes += [f"FAILED {s}" for s in result["failed_ops"][:5]]
    notes += [f"timeout {s}" for s in result.get("timeout_ops", [])[:5]]
    notes += [f"node: {p[:200]}" for p in result["node_problems"][:3]]
    if result["logs"]:
        notes.append(f"logs: {result['logs']}")
    return "\n".join([line, *(f"      {n}" for n in notes)])


def duplicates_by_queue(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per queue kind (plain, dedup): schedules, ids received more than once, per schedule, and what else
    bears on it (the producers' in-doubt re-sends, acknowledged, lost)."""
    figures: dict[str, dict[str, Any]] = {}
    for r in results:
        f = figures.setdefault(r.get("queue", "plain"), {"schedules": 0, "duplicated": 0, "duplicates": 0,
                                                          "in_doubt": 0, "acknowledged": 0, "lost": 0,
                                                          "deduplicated": 0, "duplicated_resent": 0,
                                                          "duplicated_redelivered": 0})
        v = r["verdict"]
        f["schedules"] += 1
        for key in ("duplicated", "duplicates", "acknowledged", "lost"):
            f[key] += int(v[key])
        f["in_doubt"] += int(r["client_events"].get("in_doubt", 0))
        f["deduplicated"] += int(r.get("deduplicated") or 0)
        f["duplicated_resent"] += int(r.get("duplicated_resent") or 0)
        f["duplicated_redelivered"] += int(r.get("duplicated_redelivered") or 0)
    for f in figures.values():
        f["per_schedule"] = round(f["duplicated"] / f["schedules"], 2)
    return figures


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"\n{'schedule':<38}{'queue':>6}{'seed':>8}{'acked':>7}{'lost':>6}{'unexp':>6}{'dup':>6}{'resent':>7}"
          f"{'dedup':>6}"
          f"{'replica':>8}  {'status':<13} faults")
    for r in results:
        v = r["verdict"]
        deduplicated = r.get("deduplicated")
        print(f"{r['schedule']:<38}{r.get('queue', 'plain'):>6}{r['seed'] if r['seed'] is not None else '-':>8}"
              f"{v['acknowledged']:>7}{v['lost']:>6}{v['unexpected']:>6}{v['duplicated']:>6}"
              f"{r.get('duplicated_resent', '-'):>7}{deduplicated if deduplicated is not None else '-':>6}"
              f"{r['replica_mismatches']:>8}  {r['status']:<13} {','.join(r['faults'])}")
    by_queue = duplicates_by_queue(results)
    if len(by_queue) > 1 or "dedup" in by_queue:
        print("duplicates per schedule: " + "; ".join(
            f"{kind} queue {f['duplicated']} in {f['schedules']} schedules ({f['per_schedule']:.1f} per schedule; "
            f"of a re-send {f['duplicated_resent']}, delivered twice {f['duplicated_redelivered']}; "
            f"{f['in_doubt']} in doubt, {f['acknowledged']} acknowledged, {f['lost']} lost)"
            for kind, f in by_queue.items()))
    bad = sum(1 for r in results if not r["ok"])
    print(f"{len(results)} schedules, {bad} with a problem (INVALID: lost or unexpected messages; MISMATCH: a "
          "backup's copy differs; NO VERDICT: not drained, e.g. no primary after the schedule; VIOLATED: an assert "
          "op did not hold; VIP MISPLACED: the virtual IP on another node than the primary at a check)")
