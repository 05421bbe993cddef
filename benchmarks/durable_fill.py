"""Repeated durable fills of a lone HA primary: the check for a producer that stopped for good.

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
A send that has not finished within ``--stall`` seconds is a stall: before the
client is killed the tool prints the sockets of the node's port (``ss``), the
client's threads (``gdb``, when there is one), the node's STATUS journal and
memory parts and the queue, and the node's Python stacks (``py-spy``, when
installed); then it stops.  Every process is stopped by PID.

    python -m benchmarks.durable_fill [--iterations 8] [--chunks 12] [--count 100000] [--stall 40]

Exits 1 on a stall, 0 when every chunk finished.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import _auth, cexamples
from ._proc import Service, free_port, python_env
from .ha_throughput import _request, _wait_answering
from .throughput import LOOPBACK, REPO_ROOT

QUEUE = "durable"


def diagnose(port: int, client: cexamples.Client, node: Service) -> None:
    """What the node and the client are doing, printed while both still run."""
    print("ss -tnoi, the node's port:", flush=True)
    lines = subprocess.run(["ss", "-tnoi"], capture_output=True, text=True).stdout.splitlines()
    for at, line in enumerate(lines):
        if f":{port} " in line:
            print(line, *lines[at + 1:at + 2], sep="\n", flush=True)
    if shutil.which("gdb"):
        threads = subprocess.run(["gdb", "-p", str(client.process.pid), "-batch", "-ex", "thread apply all bt"],
                                 capture_output=True, text=True, timeout=60).stdout
        print("client threads (gdb):", *[line for line in threads.splitlines() if line.startswith(("#", "Thread"))],
              sep="\n", flush=True)
    status = _request(port, "STATUS")
    queue = next(q for q in _request(port, "QUERY")["queues"] if q["name"] == QUEUE)
    print(json.dumps({"journal": status.get("journal"), "memory": status.get("memory"), "queue_depth": queue["depth"],
                      "queue_stats": queue["stats"]}), flush=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if Path(spy).exists():
        subprocess.run([spy, "dump", "--pid", str(node.pid)], timeout=60)


def iteration(number: int, args: argparse.Namespace, logs: Path) -> bool:
    """One fresh primary and its chunks; False on a stall."""
    data = Path(tempfile.mkdtemp(prefix="durable-fill-data-"))
    ports = [free_port(), free_port()]
    argv = [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", "--ha-cluster",
            "--brokers-url", ",".join(f"{LOOPBACK}:{p}" for p in ports), *_auth.users().serve_arguments(),
            "--listen", f"{LOOPBACK}:{ports[0]}", "--data-dir", str(data)]
    node = Service(f"primary-{number}", argv, logs / f"primary-{number}.log", cwd=REPO_ROOT, env=python_env())
    client: cexamples.Client | None = None
    try:
        _wait_answering(node, ports[0])
        _request(ports[0], "PROMOTE")
        _request(ports[0], "CREATE", "queue", QUEUE, {"durable": True, "arguments": {"qpid.replicate": "all"}})
        env = {**_auth.users().client_environment(), "HASTANDBY_DURABLE": "1"}
        for chunk in range(args.chunks):
            started = time.monotonic()
            client = cexamples.start_send(LOOPBACK, ports[0], QUEUE, args.count, 100, env=env)
            while client.process.poll() is None and time.monotonic() - started < args.stall:
                time.sleep(0.2)
            if client.process.poll() is None:
                print(f"iteration {number} chunk {chunk}: STALL after {args.stall:g} s", flush=True)
                diagnose(ports[0], client, node)
                return False
            run = client.wait(10)
            if run.returncode != 0:
                raise RuntimeError(f"send-bench exited {run.returncode}: {run.stdout[-500:]}")
            print(f"iteration {number} chunk {chunk}: {time.monotonic() - started:.1f} s", flush=True)
        return True
    finally:
        if client is not None:
            client.kill()
        node.stop()
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=12)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--stall", type=float, default=40.0, help="seconds a send may take before it is a stall")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="durable-fill-logs-"))
    print(f"durable fill: {args.iterations} x {args.chunks} x {args.count:,} durable messages; node logs in {logs}",
          flush=True)
    for number in range(args.iterations):
        if not iteration(number, args, logs):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
