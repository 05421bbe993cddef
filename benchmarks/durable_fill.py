"""Repeated durable fills of an HA primary, lone or with backups: the check for a producer that stopped for good.

``benchmarks.catchup``'s restart part fills a primary (``--ha-cluster``,
``--data-dir``, promoted with no backup running) with 1,000,000 durable
messages by running the C ``send-bench`` for 100,000 at a time.  About one
such chunk in 15 to 150 never finished: the node had taken a few hundred to
93,000 of its messages and journaled every one, nothing was logged, and node
and client both waited.  The node's link held 971 complete deliveries behind
its current one: ``IncomingLink`` read only the delivery an event named, and
only the current delivery can be read (fixed in ``IncomingLink.on_delivery``).

Each iteration starts a fresh primary, creates a durable ``qpid.replicate=all``
queue and runs ``--chunks`` sends of ``--count`` durable 100-byte messages.
With ``--backups N`` the primary has N backups (each with its own data dir),
started once the queue exists and caught up before the first send: the
primary accepts a message only once every backup stored it, so the backups'
replicating receivers (``ha/replicator.py``) are on the path of every
send, and a batch they leave unread stalls the producer just the same.  After
the last chunk every backup's replica must hold what the primary holds.

A send that has not finished within ``--stall`` seconds is a stall: before the
client is killed the tool prints the sockets of the primary's port (``ss``),
the client's threads (``gdb``, when there is one), each node's STATUS journal
and memory parts and the queue, and each node's Python stacks (``py-spy``,
when installed); then it stops.  Every process is stopped by PID, also on
SIGTERM (``timeout``) or Ctrl-C.

    python -m benchmarks.durable_fill [--iterations 8] [--chunks 12] [--count 100000] [--stall 40] [--backups 0]

Prints each chunk's seconds and a summary (chunks, stalls, chunk seconds,
msg/s).  Exits 1 on a stall or a replica that differs, 0 when every chunk
finished.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from hastandby.testing import auth as _auth
from hastandby.testing import cexamples, interrupt_on_sigterm, request, wait_answering, wait_state
from hastandby.testing.processes import Service, free_port, python_env
from hastandby.testing.waiting import wait_until

from .throughput import LOOPBACK, REPO_ROOT

QUEUE = "durable"
REPLICA_TIMEOUT = 30.0
"""Seconds after the last chunk for every replica to hold what the primary holds."""


def _depth(port: int) -> int:
    return int(next(q for q in request(port, "QUERY")["queues"] if q["name"] == QUEUE)["depth"])


def diagnose(ports: list[int], client: cexamples.Client, nodes: list[Service]) -> None:
    """What the nodes and the client are doing, printed while all still run (``ports[0]``: the primary)."""
    print("ss -tnoi, the primary's port:", flush=True)
    lines = subprocess.run(["ss", "-tnoi"], capture_output=True, text=True).stdout.splitlines()
    for at, line in enumerate(lines):
        if f":{ports[0]} " in line:
            print(line, *lines[at + 1:at + 2], sep="\n", flush=True)
    if shutil.which("gdb"):
        threads = subprocess.run(["gdb", "-p", str(client.process.pid), "-batch", "-ex", "thread apply all bt"],
                                 capture_output=True, text=True, timeout=60).stdout
        print("client threads (gdb):", *[line for line in threads.splitlines() if line.startswith(("#", "Thread"))],
              sep="\n", flush=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    for node, port in zip(nodes, ports):
        try:
            status = request(port, "STATUS")
            queue = next((q for q in request(port, "QUERY")["queues"] if q["name"] == QUEUE), None)
            print(json.dumps({"node": node.name, "state": status.get("state"), "journal": status.get("journal"),
                              "memory": status.get("memory"), "queue_depth": queue and queue["depth"],
                              "queue_stats": queue and queue["stats"]}), flush=True)
        except Exception as error:  # noqa: BLE001 - a diagnosis goes on past a node that does not answer
            print(f"{node.name}: no STATUS/QUERY answer ({type(error).__name__}: {error})", flush=True)
        if Path(spy).exists():
            print(f"{node.name} (PID {node.pid}) Python stacks:", flush=True)
            subprocess.run([spy, "dump", "--pid", str(node.pid)], timeout=60)


def iteration(number: int, args: argparse.Namespace, logs: Path, seconds: list[float]) -> str | None:
    """One fresh primary (and ``--backups`` backups) and its chunks, each chunk's seconds appended to
    ``seconds``; None when all went well, else what went wrong: "stall" or "replica differs"."""
    data = Path(tempfile.mkdtemp(prefix="durable-fill-data-"))
    ports = [free_port() for _ in range(max(2, args.backups + 1))]  # a lone primary still names a peer
    argv = [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", "--ha-cluster",
            "--brokers-url", ",".join(f"{LOOPBACK}:{p}" for p in ports), *_auth.users().serve_arguments()]

    def start(name: str, index: int) -> Service:
        return Service(f"{name}-{number}", [*argv, "--listen", f"{LOOPBACK}:{ports[index]}",
                                             "--data-dir", str(data / name)],
                       logs / f"{name}-{number}.log", cwd=REPO_ROOT, env=python_env())

    nodes = [start("primary", 0)]
    client: cexamples.Client | None = None
    try:
        wait_answering(nodes[0], ports[0])
        request(ports[0], "PROMOTE")
        request(ports[0], "CREATE", "queue", QUEUE, {"durable": True, "arguments": {"qpid.replicate": "all"}})
        for index in range(1, args.backups + 1):
            nodes.append(start(f"backup{index}", index))
        for node, port in zip(nodes[1:], ports[1:]):
            wait_answering(node, port)
            wait_state(port, "backup")
        env = {**_auth.users().client_environment(), "HASTANDBY_DURABLE": "1"}
        for chunk in range(args.chunks):
            started = time.monotonic()
            client = cexamples.start_send(LOOPBACK, ports[0], QUEUE, args.count, 100, env=env)
            while client.process.poll() is None and time.monotonic() - started < args.stall:
                time.sleep(0.2)
            if client.process.poll() is None:
                print(f"iteration {number} chunk {chunk}: STALL after {args.stall:g} s", flush=True)
                diagnose(ports[:len(nodes)], client, nodes)
                return "stall"
            run = client.wait(10)
            if run.returncode != 0:
                raise RuntimeError(f"send-bench exited {run.returncode}: {run.stdout[-500:]}")
            elapsed = time.monotonic() - started
            seconds.append(elapsed)
            print(f"iteration {number} chunk {chunk}: {elapsed:.1f} s", flush=True)
        if args.backups:
            held = _depth(ports[0])
            if not wait_until(lambda: all(_depth(port) == held for port in ports[1:len(nodes)]), REPLICA_TIMEOUT,
                              step=0.5):
                depths = {node.name: _depth(port) for node, port in zip(nodes, ports)}
                print(f"iteration {number}: REPLICA DIFFERS after {REPLICA_TIMEOUT:g} s: {depths}", flush=True)
                return "replica differs"
            print(f"iteration {number}: primary and {args.backups} backup(s) hold {held:,} messages", flush=True)
        return None
    finally:
        if client is not None:
            client.kill()
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(data, ignore_errors=True)


def summary(seconds: list[float], failure: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """The run's figures: chunks finished, stalls, and the chunks' seconds and rates."""
    figures: dict[str, Any] = {"backups": args.backups, "count": args.count, "chunks_finished": len(seconds),
                               "stalls": int(failure == "stall"), "failure": failure}
    if seconds:
        figures.update({
            "chunk_seconds": {"min": round(min(seconds), 2), "median": round(statistics.median(seconds), 2),
                              "max": round(max(seconds), 2)},
            "msg_per_s": {"median_chunk": round(args.count / statistics.median(seconds)),
                          "slowest_chunk": round(args.count / max(seconds)),
                          "overall": round(args.count * len(seconds) / sum(seconds))},
        })
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=12)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--stall", type=float, default=40.0, help="seconds a send may take before it is a stall")
    parser.add_argument("--backups", type=int, default=0, choices=range(0, 4), metavar="{0..3}",
                        help="backups of the primary (0: a lone primary); each send then waits on their replicators")
    args = parser.parse_args()
    interrupt_on_sigterm()
    logs = Path(tempfile.mkdtemp(prefix="durable-fill-logs-"))
    print(f"durable fill: {args.iterations} x {args.chunks} x {args.count:,} durable messages, primary with "
          f"{args.backups} backup(s); node logs in {logs}", flush=True)
    seconds: list[float] = []
    failure: str | None = "interrupted"
    try:
        for number in range(args.iterations):
            failure = iteration(number, args, logs, seconds)
            if failure is not None:
                break  # a stall is at most one per run: its state is what there is to see
    finally:
        print("summary:", json.dumps(summary(seconds, failure, args)), flush=True)
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
