"""How fast a backup catches up: a backup joining a primary that holds N messages, and one restarted on its journal.

In one invocation (``--parts memory,restart``, both by default):

``memory``
    1. reference: a standalone node holding N 100-byte messages is drained by
       the C ``receive`` client; that consume rate is what catch-up is compared to;
    2. catch-up: a primary holding N messages on an ``all`` queue; a backup is
       started and timed from process start to state ``backup`` (every message
       on its replica and acknowledged).  Progress is printed while it runs.
       Goal: 1,000,000 messages in under 3 s (judged at that size only).

``restart``
    both nodes with a ``--data-dir`` (so they keep a journal), a durable queue
    (``{"durable": true}``, ``qpid.replicate=all``) filled with N durable
    100-byte messages (``HASTANDBY_DURABLE``, see ``cexamples``);

    1. full catch-up: a backup with an empty data dir, timed as above;
    2. kill -9 of that backup (by PID), restart on the same data dir, timed
       from the spawn to state ``backup`` again, split by the node's own
       timestamped ``journal recovered`` log line into recovering its journal
       and catching up after it; the messages the primary still had to send
       come from its ``backup caught up on queue`` log line for the queue.

    Steps 1 and 2 run ``--rounds`` times (3 by default; the backup's data dir
    is emptied before each), the primary filled once.  Goals: the restarted
    backup is sent under 1 % of what it holds; the whole restart (spawn to
    ready) takes under 20 % of the full catch-up time (spawn to ready with an
    empty data dir), judged on the median of the rounds' ratios.  The
    catch-up after journal recovery is reported against the same 20 % as well.

Nodes require authentication (``hastandby/testing/auth.py``): the backup
authenticates to the primary as ``peer``, the C clients as ``app``.

Writes ``results/catchup-<UTC>.json``.

    python -m benchmarks.catchup [--messages 1000000] [--parts memory,restart] [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

from hastandby.client import ManagementClient, ManagementError
from hastandby.testing import auth as _auth
from hastandby.testing import cexamples, request, wait_answering
from hastandby.testing.processes import Service, free_port, python_env
from hastandby.testing.provenance import host_info

from .ha_throughput import start_nodes
from .throughput import DEFAULT_OUT, LOOPBACK, REPO_ROOT, check_receive, check_send

CHUNK = 100_000
DURABLE_QUEUE = "durable"


def fill(port: int, queue: str, messages: int, durable: bool = False) -> float:
    """Send ``messages`` with the C client in chunks; returns seconds taken.

    ``durable``: with the header's ``durable=true`` (``HASTANDBY_DURABLE``, see ``cexamples``).
    """
    started = time.monotonic()
    remaining = messages
    env = _auth.users().client_environment()
    if durable:
        env["HASTANDBY_DURABLE"] = "1"
    while remaining:
        chunk = min(CHUNK, remaining)
        check_send(cexamples.run_send(LOOPBACK, port, queue, chunk, 100, 30 + chunk / 1000, env=env), chunk)
        remaining -= chunk
        print(f"  filled {messages - remaining:,}/{messages:,}", flush=True)
    return time.monotonic() - started


def reference_consume(messages: int, logs: Path) -> dict[str, Any]:
    (node,) = start_nodes(0, logs, "reference")
    try:
        port = node.port  # type: ignore[attr-defined]
        fill(port, "ref", messages)
        started = time.monotonic()
        check_receive(cexamples.run_receive(LOOPBACK, port, "ref", messages, 60 + messages / 1000,
                                             env=_auth.users().client_environment()), messages)
        elapsed = time.monotonic() - started
    finally:
        node.stop()
    return {"seconds": elapsed, "msg_per_s": messages / elapsed}


def wait_backup(backup: Service, port: int, queue: str, messages: int, started: float) -> float:
    """Poll the backup on ``port`` until its state is ``backup``; seconds since ``started`` (monotonic).

    STATUS every 10 ms on one management connection, opened once the node
    listens and again only if it breaks: opening one costs a client tens of
    milliseconds (its SSL domains load the CA store), which a fresh
    connection per poll added to every figure.  Prints progress (state,
    replica depth of ``queue``) once a second; bounded by 120 s + 1 ms per
    message; raises if the backup process exits.
    """
    state, depth, last_print = None, 0, 0.0
    client: ManagementClient | None = None
    try:
        while state != "backup":
            if time.monotonic() - started > 120 + messages / 1000:
                raise TimeoutError(f"backup not caught up: state {state}, replica depth {depth}")
            if not backup.running():
                raise RuntimeError(f"{backup.name} exited: {backup.log_tail()}")
            try:
                if client is None:
                    client = ManagementClient(f"{LOOPBACK}:{port}", timeout=10, login=_auth.users().login())
                state = client.request("STATUS")["state"]
            except ManagementError:
                if client is not None:
                    client.close()
                client = None
            now = time.monotonic()
            if now - last_print >= 1.0:
                try:
                    replica = next((q for q in request(port, "QUERY")["queues"] if q["name"] == queue), None)
                    depth = replica["depth"] if replica else 0
                except ManagementError:
                    pass
                print(f"  {now - started:5.1f} s  backup {state}, replica {depth:,}/{messages:,}", flush=True)
                last_print = now
            if state != "backup":
                time.sleep(0.01)
        return time.monotonic() - started
    finally:
        if client is not None:
            client.close()


def catch_up(messages: int, logs: Path) -> dict[str, Any]:
    ports = [free_port(), free_port()]
    brokers = ",".join(f"{LOOPBACK}:{p}" for p in ports)
    argv = [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", "--ha-cluster", "--brokers-url", brokers,
            *_auth.users().serve_arguments()]
    primary = Service("primary", argv + ["--listen", f"{LOOPBACK}:{ports[0]}"], logs / "primary.log",
                      cwd=REPO_ROOT, env=python_env())
    backup: Service | None = None
    try:
        wait_answering(primary, ports[0])
        request(ports[0], "PROMOTE")
        request(ports[0], "CREATE", "queue", "big", {"arguments": {"qpid.replicate": "all"}})
        fill(ports[0], "big", messages)
        started = time.monotonic()
        backup = Service("backup", argv + ["--listen", f"{LOOPBACK}:{ports[1]}"], logs / "backup.log",
                         cwd=REPO_ROOT, env=python_env())
        elapsed = wait_backup(backup, ports[1], "big", messages, started)
        return {"seconds_to_backup": elapsed, "msg_per_s": messages / elapsed,
                "backup_rss_mb": backup.rss_bytes() / 1e6, "primary_rss_mb": primary.rss_bytes() / 1e6}
    finally:
        if backup is not None:
            backup.stop()
        primary.stop()


def log_events(path: Path, event: str, **fields: Any) -> list[dict[str, Any]]:
    """A node's JSON log records named ``event`` (with these field values), in order."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event and all(
                record.get(k) == v for k, v in fields.items()):
            found.append(record)
    return found


def wait_event(path: Path, event: str, count: int, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
    """The ``count``-th record named ``event`` in the log at ``path``, waiting up to ``timeout`` s for it."""
    deadline = time.monotonic() + timeout
    while True:
        found = log_events(path, event, **fields)
        if len(found) >= count:
            return found[count - 1]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {event!r} record #{count} {fields} in {path} after {timeout} s")
        time.sleep(0.05)


def log_time(record: dict[str, Any]) -> float:
    """A log record's timestamp (ISO, UTC) as seconds since the epoch."""
    return datetime.fromisoformat(record["timestamp"]).timestamp()


def node_timeline(path: Path, wall: float) -> dict[str, float | None]:
    """Seconds from ``wall`` (the process's spawn, epoch) to the node's own log lines of its start.

    ``wiring_loaded``: durable wiring read (the interpreter and imports are done); ``journal_recovered``: the
    journal read back, compacted and its messages on the queues; ``serving``: listening; ``backup``: its
    state change to ``backup`` (every replicated queue caught up).  None where the line is missing.
    """
    marks: dict[str, float | None] = dict.fromkeys(("wiring_loaded", "journal_recovered", "serving", "backup"))
    for key, event in (("wiring_loaded", "durable wiring loaded"), ("journal_recovered", "journal recovered"),
                       ("serving", "node serving")):
        found = log_events(path, event)
        marks[key] = log_time(found[0]) - wall if found else None
    ready = [r for r in log_events(path, "state change") if str(r.get("now", "")).startswith("backup")]
    marks["backup"] = log_time(ready[0]) - wall if ready else None
    return marks


def restart(messages: int, logs: Path, data: Path, rounds: int) -> dict[str, Any]:
    """Durable messages: ``rounds`` times, the full catch-up of a new backup, then kill -9 of it and its restart
    on its journal; the primary is filled once.

    One round's ratio hangs on how long that round's full catch-up happened
    to take (5.98 to 8.71 s in four runs on one day), so the goals are judged
    on the median of the rounds' ratios.
    """
    ports = [free_port(), free_port()]
    brokers = ",".join(f"{LOOPBACK}:{p}" for p in ports)
    argv = [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", "--ha-cluster", "--brokers-url", brokers,
            *_auth.users().serve_arguments()]
    argvs = [argv + ["--listen", f"{LOOPBACK}:{port}", "--data-dir", str(data / name)]
             for port, name in zip(ports, ("primary", "backup"))]
    primary_log = logs / "durable-primary.log"
    primary = Service("durable-primary", argvs[0], primary_log, cwd=REPO_ROOT, env=python_env())
    try:
        wait_answering(primary, ports[0])
        request(ports[0], "PROMOTE")
        request(ports[0], "CREATE", "queue", DURABLE_QUEUE,
                 {"durable": True, "arguments": {"qpid.replicate": "all"}})
        fill(ports[0], DURABLE_QUEUE, messages, durable=True)
        journaled = request(ports[0], "STATUS")["journal"]["messages"]
        print(f"  primary journal: {journaled:,} messages", flush=True)
        results = []
        for number in range(1, rounds + 1):
            shutil.rmtree(data / "backup", ignore_errors=True)
            results.append(restart_round(number, rounds, argvs[1], ports, messages, logs, primary_log))
    finally:
        primary.stop()
    ratios = [r["whole_restart_to_full"] for r in results]
    after = [r["after_recovery_to_full"] for r in results]
    return {"primary_journal_messages": journaled, "rounds": results,
            "whole_restart_to_full": median(ratios), "after_recovery_to_full": median(after),
            "full_seconds_median": median(r["full"]["seconds_to_backup"] for r in results),
            "restart_seconds_median": median(r["restart"]["seconds_to_backup"] for r in results),
            "sent": sum(r["restart"]["primary_log"]["sent"] for r in results),
            "held": sum(r["restart"]["primary_log"]["backup_held"] for r in results)}


def restart_round(number: int, rounds: int, argv: list[str], ports: list[int], messages: int, logs: Path,
                  primary_log: Path) -> dict[str, Any]:
    """One round: a backup with an empty data dir catches up in full, is killed -9 and restarted on its journal."""
    print(f"restart round {number}/{rounds}: full catch-up of a new backup (empty data dir)", flush=True)
    wall = time.time()
    started = time.monotonic()
    backup = Service(f"durable-backup-{number}", argv, logs / f"durable-backup-{number}.log", cwd=REPO_ROOT,
                     env=python_env())
    try:
        full_seconds = wait_backup(backup, ports[1], DURABLE_QUEUE, messages, started)
        full_logged = node_timeline(backup.log_path, wall)
        full_event = wait_event(primary_log, "backup caught up on queue", 2 * number - 1, queue=DURABLE_QUEUE)
        backup_journal = request(ports[1], "STATUS")["journal"]
        full = {"seconds_to_backup": full_seconds, "msg_per_s": messages / full_seconds,
                "primary_log": {k: full_event[k] for k in ("backup_held", "skipped", "sent")},
                "backup_journal_messages": backup_journal["messages"],
                "backup_journal_file_bytes": backup_journal["file_bytes"],
                "backup_rss_mb": backup.rss_bytes() / 1e6,
                "logged": full_logged}
        print(f"  full catch-up {full_seconds:.2f} s ({messages / full_seconds:,.0f} msg/s), "
              f"primary sent {full_event['sent']:,}; backup journal {backup_journal['messages']:,} messages",
              flush=True)

        print(f"  kill -9 of the backup (PID {backup.pid}), restart on its data dir", flush=True)
        os.kill(backup.pid, signal.SIGKILL)
        backup.popen.wait(10)
        restart_log = logs / f"durable-backup-{number}-restart.log"
        wall = time.time()
        started = time.monotonic()
        backup = Service(f"durable-backup-{number}-restarted", argv, restart_log, cwd=REPO_ROOT, env=python_env())
        restart_seconds = wait_backup(backup, ports[1], DURABLE_QUEUE, messages, started)
        restart_logged = node_timeline(restart_log, wall)
        lag = (request(ports[0], "QUERY").get("ha") or {}).get("lag", {}).get(DURABLE_QUEUE, {})
        recovered = wait_event(restart_log, "journal recovered", 1)
        caught_up = wait_event(primary_log, "backup caught up on queue", 2 * number, queue=DURABLE_QUEUE)
        depth = next(q["depth"] for q in request(ports[1], "QUERY")["queues"] if q["name"] == DURABLE_QUEUE)
        recover_seconds = log_time(recovered) - wall
        after = restart_seconds - recover_seconds
        held = caught_up["backup_held"]
        result = {
            "full": full,
            "restart": {
                "seconds_to_backup": restart_seconds,
                "journal_recovered_seconds": recover_seconds,
                "catch_up_after_recovery_seconds": after,
                "primary_logged_caught_up_seconds": log_time(caught_up) - wall,
                "journal_recovered": {k: recovered.get(k) for k in ("messages", "queues", "clean_shutdown", "orphans")},
                "primary_log": {k: caught_up[k] for k in ("backup_held", "skipped", "sent")},
                "replica_depth": depth,
                "primary_lag_at_ready": lag,
                "backup_rss_mb": backup.rss_bytes() / 1e6,
                "logged": restart_logged,
            },
            "sent_fraction": caught_up["sent"] / held if held else None,
            "whole_restart_to_full": restart_seconds / full_seconds,
            "after_recovery_to_full": after / full_seconds,
        }
        if full_logged["backup"] and restart_logged["backup"] and restart_logged["journal_recovered"] is not None:
            result["logged_whole_restart_to_full"] = restart_logged["backup"] / full_logged["backup"]
            result["logged_after_recovery_to_full"] = (
                (restart_logged["backup"] - restart_logged["journal_recovered"]) / full_logged["backup"])
        print(f"  ready after {restart_seconds:.2f} s = {result['whole_restart_to_full']:.1%} of the full catch-up: "
              f"journal recovered at {recover_seconds:.2f} s ({recovered.get('messages', 0):,} messages), catch-up "
              f"after it {after:.2f} s; primary: held {held:,}, skipped {caught_up['skipped']:,}, "
              f"sent {caught_up['sent']:,}", flush=True)
        print("  the restarted node's own log, seconds from its spawn: " + ", ".join(
            f"{key} {value:.2f}" for key, value in restart_logged.items() if value is not None)
            + f" (full catch-up: backup at {full_logged['backup'] or float('nan'):.2f})", flush=True)
        return result
    finally:
        backup.stop()


PARTS = ("memory", "restart")
MEMORY_GOAL_SECONDS_PER_MILLION = 3.0  # a backup holds 1,000,000 in-memory messages within 3 s
RESTART_SENT_GOAL = 0.01  # a restarted backup gets under 1 % of what it holds again ...
RESTART_TIME_GOAL = 0.20  # ... and is ready in under 20 % of the full catch-up time


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.catchup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="memory (reference + in-memory catch-up), restart (durable: full catch-up, then kill -9 "
                             "and restart of the backup)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="restart: full catch-up and restart this many times, judged on the median")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {','.join(PARTS)}")
    for name in ("send-bench", "receive-bench"):
        cexamples.build(name)
    started = datetime.now(UTC)
    logs = Path(tempfile.mkdtemp(prefix="catchup-logs-"))
    print(f"catch-up: {args.messages:,} x 100-byte messages; node logs in {logs}", flush=True)
    report: dict[str, Any] = {
        "benchmark": "catchup",
        "command": shlex.join([sys.executable, "-m", "benchmarks.catchup", *(sys.argv[1:] if argv is None else argv)]),
        "started_utc": started.isoformat(timespec="seconds"),
        "host": host_info(),
        "messages": args.messages,
        "parts": parts,
    }
    goals: dict[str, Any] = {}
    if "memory" in parts:
        print("reference: standalone consume rate", flush=True)
        reference = reference_consume(args.messages, logs)
        print(f"reference: {reference['msg_per_s']:,.0f} msg/s consumed", flush=True)
        print("catch-up: backup joining a primary that holds them", flush=True)
        result = catch_up(args.messages, logs)
        ratio = result["msg_per_s"] / reference["msg_per_s"]
        print(f"catch-up: backup ready after {result['seconds_to_backup']:.1f} s = {result['msg_per_s']:,.0f} msg/s "
              f"(x{ratio:.2f} of the standalone consume rate); backup RSS {result['backup_rss_mb']:.0f} MB")
        report.update({"reference_consume": reference, "catch_up": result, "ratio_to_consume": ratio})
        # Judged at 1,000,000 only: the node's start (about 1 s here) does not scale with the messages.
        goals["memory_catch_up_seconds"] = {
            "goal": f"in-memory catch-up of 1,000,000 messages under {MEMORY_GOAL_SECONDS_PER_MILLION:g} s",
            "value": result["seconds_to_backup"], "limit": MEMORY_GOAL_SECONDS_PER_MILLION,
            "met": result["seconds_to_backup"] < MEMORY_GOAL_SECONDS_PER_MILLION
            if args.messages == 1_000_000 else None}
    if "restart" in parts:
        print("restart: durable queue, --data-dir on both nodes; filling the primary with durable messages",
              flush=True)
        data = Path(tempfile.mkdtemp(prefix="catchup-data-"))
        try:
            durable = restart(args.messages, logs, data, args.rounds)
        finally:
            shutil.rmtree(data, ignore_errors=True)
        sent, held = durable["sent"], durable["held"]
        report["restart"] = durable
        goals["restart_sent_fraction"] = {
            "goal": f"a restarted backup is sent under {RESTART_SENT_GOAL:.0%} of what it holds",
            "value": sent / held if held else None, "limit": RESTART_SENT_GOAL,
            "met": held > 0 and sent < RESTART_SENT_GOAL * held}
        goals["restart_time_fraction"] = {
            "goal": f"restart to ready (process start, journal recovery, catch-up) under {RESTART_TIME_GOAL:.0%} "
                    f"of the full catch-up time (process start to ready, empty data dir); median of the rounds",
            "value": durable["whole_restart_to_full"], "limit": RESTART_TIME_GOAL,
            "met": durable["whole_restart_to_full"] < RESTART_TIME_GOAL}
        goals["restart_after_recovery_time_fraction"] = {
            "goal": f"catch-up after journal recovery under {RESTART_TIME_GOAL:.0%} of the full catch-up time "
                    f"(reported next to the whole restart; the journal's recovery left out)",
            "value": durable["after_recovery_to_full"], "limit": RESTART_TIME_GOAL,
            "met": durable["after_recovery_to_full"] < RESTART_TIME_GOAL}
    report["goals"] = goals
    print("goals:")
    if "memory_catch_up_seconds" in goals:
        g = goals["memory_catch_up_seconds"]
        verdict = "not judged (the goal is for 1,000,000)" if g["met"] is None else _verdict(g["met"])
        print(f"  in-memory catch-up of {args.messages:,}: {g['value']:.2f} s, goal 1,000,000 under 3 s: {verdict}")
    if "restart_sent_fraction" in goals:
        g = goals["restart_sent_fraction"]
        value = "n/a (held nothing)" if g["value"] is None else f"{g['value']:.4%}"
        print(f"  restart: sent {value} of what the backup held, goal < 1 %: {_verdict(g['met'])}")
        durable = report["restart"]
        g = goals["restart_time_fraction"]
        each = ", ".join(f"{r['whole_restart_to_full']:.1%}" for r in durable["rounds"])
        print(f"  restart: whole restart median {durable['restart_seconds_median']:.2f} s; median ratio {g['value']:.1%} "
              f"(rounds {each}) of the full catch-up (median {durable['full_seconds_median']:.2f} s), goal < 20 %: "
              f"{_verdict(g['met'])}")
        g = goals["restart_after_recovery_time_fraction"]
        print(f"  restart: catch-up after journal recovery, median ratio {g['value']:.1%} of the full catch-up, "
              f"goal < 20 %: {_verdict(g['met'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"catchup-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
