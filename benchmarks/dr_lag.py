"""DR replication lag and its cost at the source, per mode, on loopback and over a WAN-like link.

For each mode (``full``, ``enqueue``), in one invocation:

1. Source throughput, replication on vs off: the proton C ``send-bench``
   sends N 100-byte messages to a replicated queue and to a plain queue of
   the same source node, alternating for ``--runs`` rounds; the ratio of the
   medians is the price of asynchronous replication to producers.
2. Replication lag at a steady load of half the measured maximum: the rate
   at which the replica received step 1's messages (from the first send to
   the source reporting no lag), halved.  A python-qpid-proton producer
   paces pre-settled messages carrying their send time; a receiver on the
   replica (a browser in full mode, a consumer in enqueue mode) records
   arrival - send for each.  Once over loopback, once through
   ``benchmarks.delay_proxy`` adding 25 ms each way.  p50/p99/max in ms.

Prints the figures and writes ``benchmarks/results/dr-lag-<UTC>.json``.

    python -m benchmarks.dr_lag [--count 50000] [--runs 3] [--lag-seconds 10] [--delay-ms 25]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import struct
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import AtMostOnce, Container, Copy

from hastandby.client import ManagementClient, ManagementError

from . import cexamples
from ._proc import Service, free_port, python_env
from .throughput import DEFAULT_OUT, LOOPBACK, REPO_ROOT, host_info

MODES = ("full", "enqueue")
READY_TIMEOUT = 60.0
PACE_TICK = 0.002  # seconds between the paced producer's bursts


def _request(port: int, operation: str, type: str = "", name: str = "", body: dict | None = None) -> Any:
    with ManagementClient(f"{LOOPBACK}:{port}", timeout=10) as client:
        return client.request(operation, type, name, body)


def _start_node(name: str, logs: Path) -> Service:
    port = free_port()
    argv = [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", "--listen", f"{LOOPBACK}:{port}"]
    service = Service(name, argv, logs / f"{name}.log", cwd=REPO_ROOT, env=python_env())
    service.port = port  # type: ignore[attr-defined]
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            _request(port, "PING")
            return service
        except ManagementError:
            if not service.running():
                raise RuntimeError(f"{name} exited: {service.log_tail()}") from None
            time.sleep(0.1)
    service.stop()
    raise TimeoutError(f"{name} not answering on port {port}")


def _replicate(replica_port: int, source: str, queue: str, mode: str) -> None:
    _request(replica_port, "REPLICATE", "queue", queue, {"source": source, "mode": mode, "create": True})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        replicas = _request(replica_port, "STATUS")["replication"]["replicas"]
        if any(r["queue"] == queue and r["state"] == "live" for r in replicas):
            return
        time.sleep(0.1)
    raise TimeoutError(f"replication of {queue} from {source} did not go live")


def _send_rate(port: int, queue: str, count: int) -> float:
    run = cexamples.run_send(LOOPBACK, port, queue, count, timeout=30 + count / 1000)
    if run.returncode != 0 or cexamples.sent_count(run) != count:
        raise RuntimeError(f"send-bench to {queue} failed: {run.stdout[-500:]}")
    return count / run.elapsed


def _wait_caught_up(source_port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        served = _request(source_port, "STATUS")["replication"]["sources"]
        if served and all(r["lag_messages"] == 0 for r in served):
            return
        time.sleep(0.05)
    raise TimeoutError("the replica did not catch up")


class LagProbe(MessagingHandler):
    """Paces ``count`` stamped messages into the source; times their arrival at the replica.

    Raw bytes both ways (a template message whose body is a double, the send
    time, patched in place; the receiver reads the last 8 bytes back), so the
    probe costs a few microseconds a message and measures the nodes, not itself.
    """

    def __init__(self, source: str, replica: str, queue: str, mode: str, rate: float, count: int,
                 time_limit: float) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.source, self.replica, self.queue, self.mode = source, replica, queue, mode
        self.rate, self.count, self.time_limit = rate, count, time_limit
        self.sent = 0
        self.lags_ms: list[float] = []
        self.started = 0.0
        self.sender: Any = None
        self.receiver: Any = None
        self._template = bytes(Message(body=0.0).encode())[:-8]

    def on_start(self, event: Any) -> None:
        container = event.container
        self.receiver = container.create_receiver(
            f"amqp://{self.replica}/{self.queue}", options=[Copy()] if self.mode == "full" else None)
        self.receiver.flow(5000)
        self.sender = container.create_sender(f"amqp://{self.source}/{self.queue}", options=AtMostOnce())
        self.started = time.monotonic()
        container.schedule(0.2, self)  # let both links attach first

    def on_timer_task(self, event: Any) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed > self.time_limit:
            self._finish()
            return
        due = min(self.count, int(max(0.0, elapsed - 0.2) * self.rate))
        sender, template = self.sender, self._template
        while self.sent < due and sender.credit > 0:
            delivery = sender.delivery(b"%d" % self.sent)
            sender.send(template + struct.pack(">d", time.time()))
            sender.advance()
            delivery.settle()
            self.sent += 1
        if self.sent < self.count:
            event.container.schedule(PACE_TICK, self)

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        link = delivery.link
        if link is not self.receiver and link != self.receiver:
            return
        if delivery.partial or not delivery.readable:
            return
        data = link.recv(delivery.pending)
        link.advance()
        self.lags_ms.append((time.time() - struct.unpack(">d", data[-8:])[0]) * 1000.0)
        if self.mode == "enqueue":
            delivery.update(delivery.ACCEPTED)
        delivery.settle()
        if link.credit < 2500:
            link.flow(5000 - link.credit)
        if len(self.lags_ms) >= self.count:
            self._finish()

    def _finish(self) -> None:
        for link in (self.sender, self.receiver):
            if link is not None:
                link.connection.close()


def _lag(source_port: int, replica_port: int, queue: str, mode: str, rate: float, seconds: float) -> dict[str, Any]:
    count = max(100, int(rate * seconds))
    probe = LagProbe(f"{LOOPBACK}:{source_port}", f"{LOOPBACK}:{replica_port}", queue, mode, rate, count,
                     time_limit=seconds * 3 + 30)
    started = time.monotonic()
    Container(probe).run()
    elapsed = time.monotonic() - started
    lags = sorted(probe.lags_ms)
    if len(lags) < count:
        raise RuntimeError(f"only {len(lags)} of {count} messages reached the replica")
    return {
        "messages": count,
        "target_rate": round(rate),
        "achieved_rate": round(probe.sent / max(elapsed - 0.2, 1e-9)),
        "lag_ms_p50": round(lags[len(lags) // 2], 2),
        "lag_ms_p99": round(lags[int(len(lags) * 0.99) - 1], 2),
        "lag_ms_max": round(lags[-1], 2),
    }


def measure_mode(mode: str, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    source = _start_node(f"{mode}-source", logs)
    replica = _start_node(f"{mode}-replica", logs)
    proxy: Service | None = None
    try:
        src, rep = source.port, replica.port  # type: ignore[attr-defined]
        for queue in ("plain", "q", "wan"):
            _request(src, "CREATE", "queue", queue)
        _replicate(rep, f"{LOOPBACK}:{src}", "q", mode)
        on, off, replicated = [], [], []
        for round_no in range(1, args.runs + 1):
            off.append(_send_rate(src, "plain", args.count))
            started = time.monotonic()
            on.append(_send_rate(src, "q", args.count))
            _wait_caught_up(src)
            replicated.append(args.count / (time.monotonic() - started))
            print(f"[{mode}] round {round_no}/{args.runs}: send without replication {off[-1]:,.0f} msg/s, "
                  f"with {on[-1]:,.0f} msg/s; the replica had them all at {replicated[-1]:,.0f} msg/s",
                  flush=True)
            _request(src, "PURGE", "queue", "plain")
            _request(src, "PURGE", "queue", "q")
            _wait_caught_up(src)
            if mode == "enqueue":  # the replica keeps every message; the next round starts empty
                _request(rep, "PURGE", "queue", "q")
        rate = args.rate or statistics.median(replicated) / 2
        loopback = _lag(src, rep, "q", mode, rate, args.lag_seconds)
        print(f"[{mode}] lag on loopback at {loopback['achieved_rate']:,} msg/s: p50 {loopback['lag_ms_p50']} ms, "
              f"p99 {loopback['lag_ms_p99']} ms, max {loopback['lag_ms_max']} ms", flush=True)
        proxy_port = free_port()
        proxy = Service(f"{mode}-proxy", [sys.executable, "-m", "benchmarks.delay_proxy", "--listen",
                                          f"{LOOPBACK}:{proxy_port}", "--target", f"{LOOPBACK}:{src}",
                                          "--delay-ms", str(args.delay_ms)],
                        logs / f"{mode}-proxy.log", cwd=REPO_ROOT, env=python_env())
        proxy.wait_ready(LOOPBACK, proxy_port)
        _replicate(rep, f"{LOOPBACK}:{proxy_port}", "wan", mode)
        wan = _lag(src, rep, "wan", mode, rate, args.lag_seconds)
        print(f"[{mode}] lag through the {args.delay_ms:g} ms-each-way proxy at {wan['achieved_rate']:,} msg/s: "
              f"p50 {wan['lag_ms_p50']} ms, p99 {wan['lag_ms_p99']} ms, max {wan['lag_ms_max']} ms", flush=True)
        ratio = statistics.median(on) / statistics.median(off)
        print(f"[{mode}] source send rate with async replication: x{ratio:.2f} of without", flush=True)
        return {"send_msg_per_s_without": off, "send_msg_per_s_with": on, "replicated_msg_per_s": replicated,
                "send_ratio": round(ratio, 3),
                "lag_loopback": loopback, "lag_wan": wan}
    finally:
        for service in (proxy, replica, source):
            if service is not None:
                service.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50_000, help="messages per send-bench run")
    parser.add_argument("--runs", type=int, default=3, help="alternating rounds of with/without replication")
    parser.add_argument("--lag-seconds", type=float, default=10.0, help="length of each steady-load lag run")
    parser.add_argument("--rate", type=float, help="steady load, msg/s (default: half the measured maximum)")
    parser.add_argument("--delay-ms", type=float, default=25.0, help="WAN delay each way, milliseconds")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    started = datetime.now(UTC)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dr-lag-") as tmp:
        for mode in MODES:
            results[mode] = measure_mode(mode, args, Path(tmp))
    report = {
        "benchmark": "dr_lag",
        "started": started.isoformat(),
        "command": shlex.join([sys.executable, "-m", "benchmarks.dr_lag", *(sys.argv[1:] if argv is None else argv)]),
        "settings": {"count": args.count, "runs": args.runs, "lag_seconds": args.lag_seconds, "rate": args.rate,
                     "delay_ms": args.delay_ms, "body_size": 100},
        "goals": {"lag_ms_p99_loopback_max": 50, "send_ratio_min": 0.8},
        "host": host_info(),
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"dr-lag-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    for mode, result in results.items():
        print(f"{mode:<8} send x{result['send_ratio']:.2f}   lag p99 loopback {result['lag_loopback']['lag_ms_p99']} ms"
              f"   through proxy {result['lag_wan']['lag_ms_p99']} ms")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
