"""How fast a backup catches up: a backup joining a primary that holds N messages.

In one invocation:

1. reference: a standalone node holding N 100-byte messages is drained by the
   C ``receive`` client; that consume rate is what catch-up is compared to;
2. catch-up: a primary holding N messages on an ``all`` queue; a backup is
   started and timed from process start to state ``backup`` (every message
   on its replica and acknowledged).  Progress is printed while it runs.

Nodes require authentication (``benchmarks/_auth.py``): the backup
authenticates to the primary as ``peer``, the C clients as ``app``.

Writes ``benchmarks/results/catchup-<UTC>.json``.

    python -m benchmarks.catchup [--messages 1000000]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hastandby.client import ManagementError

from . import _auth, cexamples
from ._proc import Service, free_port, python_env
from .ha_throughput import _request, _wait_answering, start_nodes
from .throughput import DEFAULT_OUT, LOOPBACK, REPO_ROOT, _check_receive, _check_send, host_info

CHUNK = 100_000


def fill(port: int, queue: str, messages: int) -> float:
    """Send ``messages`` with the C client in chunks; returns seconds taken."""
    started = time.monotonic()
    remaining = messages
    while remaining:
        chunk = min(CHUNK, remaining)
        _check_send(cexamples.run_send(LOOPBACK, port, queue, chunk, 100, 30 + chunk / 1000,
                                       env=_auth.users().client_environment()), chunk)
        remaining -= chunk
        print(f"  filled {messages - remaining:,}/{messages:,}", flush=True)
    return time.monotonic() - started


def reference_consume(messages: int, logs: Path) -> dict[str, Any]:
    (node,) = start_nodes(0, logs, "reference")
    try:
        port = node.port  # type: ignore[attr-defined]
        fill(port, "ref", messages)
        started = time.monotonic()
        _check_receive(cexamples.run_receive(LOOPBACK, port, "ref", messages, 60 + messages / 1000,
                                             env=_auth.users().client_environment()), messages)
        elapsed = time.monotonic() - started
    finally:
        node.stop()
    return {"seconds": elapsed, "msg_per_s": messages / elapsed}


def catch_up(messages: int, logs: Path) -> dict[str, Any]:
    ports = [free_port(), free_port()]
    brokers = ",".join(f"{LOOPBACK}:{p}" for p in ports)
    argv = [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", "--ha-cluster", "--brokers-url", brokers,
            *_auth.users().serve_arguments()]
    primary = Service("primary", argv + ["--listen", f"{LOOPBACK}:{ports[0]}"], logs / "primary.log",
                      cwd=REPO_ROOT, env=python_env())
    backup: Service | None = None
    try:
        _wait_answering(primary, ports[0])
        _request(ports[0], "PROMOTE")
        _request(ports[0], "CREATE", "queue", "big", {"arguments": {"qpid.replicate": "all"}})
        fill(ports[0], "big", messages)
        started = time.monotonic()
        backup = Service("backup", argv + ["--listen", f"{LOOPBACK}:{ports[1]}"], logs / "backup.log",
                         cwd=REPO_ROOT, env=python_env())
        state, depth, last_print = None, 0, 0.0
        while state != "backup":
            if time.monotonic() - started > 120 + messages / 1000:
                raise TimeoutError(f"backup not caught up: state {state}, replica depth {depth}")
            try:
                status = _request(ports[1], "STATUS")
                state = status["state"]
                replica = next((q for q in _request(ports[1], "QUERY")["queues"] if q["name"] == "big"), None)
                depth = replica["depth"] if replica else 0
            except ManagementError:
                pass
            now = time.monotonic()
            if now - last_print >= 1.0:
                print(f"  {now - started:5.1f} s  backup {state}, replica {depth:,}/{messages:,}", flush=True)
                last_print = now
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        return {"seconds_to_backup": elapsed, "msg_per_s": messages / elapsed,
                "backup_rss_mb": backup.rss_bytes() / 1e6, "primary_rss_mb": primary.rss_bytes() / 1e6}
    finally:
        if backup is not None:
            backup.stop()
        primary.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.catchup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    for name in ("send-bench", "receive-bench"):
        cexamples.build(name)
    started = datetime.now(UTC)
    logs = Path(tempfile.mkdtemp(prefix="catchup-logs-"))
    print(f"catch-up: {args.messages:,} x 100-byte messages; node logs in {logs}", flush=True)
    print("reference: standalone consume rate", flush=True)
    reference = reference_consume(args.messages, logs)
    print(f"reference: {reference['msg_per_s']:,.0f} msg/s consumed", flush=True)
    print("catch-up: backup joining a primary that holds them", flush=True)
    result = catch_up(args.messages, logs)
    ratio = result["msg_per_s"] / reference["msg_per_s"]
    print(f"catch-up: backup ready after {result['seconds_to_backup']:.1f} s = {result['msg_per_s']:,.0f} msg/s "
          f"(x{ratio:.2f} of the standalone consume rate); backup RSS {result['backup_rss_mb']:.0f} MB")
    report = {
        "benchmark": "catchup",
        "command": shlex.join([sys.executable, "-m", "benchmarks.catchup", *(sys.argv[1:] if argv is None else argv)]),
        "started_utc": started.isoformat(timespec="seconds"),
        "host": host_info(),
        "messages": args.messages,
        "reference_consume": reference,
        "catch_up": result,
        "ratio_to_consume": ratio,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"catchup-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
