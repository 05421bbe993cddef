"""DR replication lag and its cost at the source, per mode, on loopback and over a WAN-like link.

For each mode (``full``, ``enqueue``), in one invocation:

1. Source throughput, replication on vs off: the proton C ``send-bench``
   sends N 100-byte messages to a replicated queue and to a plain queue of
   the same source node, alternating for ``--runs`` rounds; the ratio of the
   medians is the price of asynchronous replication to producers.  Each
   round's own ratio is recorded too: on this shared machine a slow stretch
   moves single rounds by 0.2 either way, hence nine rounds by default.
2. Replication lag at a steady load of half the measured maximum.  A
   python-qpid-proton producer (its own process) sends pre-settled messages
   carrying their send time to the source; a receiver on the replica (a
   browser in full mode, a consumer in enqueue mode) records arrival - send
   for each.  First flat out: the rate at which messages reach the receiver
   is the maximum of this whole path on this machine.  Then paced at half
   of that, once over loopback, once through ``hastandby.testing.delay_proxy``
   adding 25 ms each way: lag p50/p99/max in ms.  (Step 1 also records the
   rate at which the replica had all of the C sender's messages.)

Nodes require authentication (``hastandby/testing/auth.py``): the replica
authenticates to the source as ``peer``, clients as ``app`` with PLAIN.

Prints the figures and writes ``results/dr-lag-<UTC>.json``.

    python -m benchmarks.dr_lag [--count 50000] [--runs 9] [--lag-seconds 10] [--delay-ms 25]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shlex
import statistics
import struct
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import AtMostOnce, Container, Copy

from hastandby.client import ManagementError
from hastandby.testing import auth as _auth
from hastandby.testing import cexamples, request
from hastandby.testing.processes import Service, free_port, python_env
from hastandby.testing.provenance import host_info
from spark_analysis.phases import nearest_rank

from .throughput import DEFAULT_OUT, LOOPBACK, REPO_ROOT

MODES = ("full", "enqueue")
READY_TIMEOUT = 60.0
PACE_TICK = 0.002  # seconds between the paced producer's bursts


def _start_node(name: str, logs: Path) -> Service:
    port = free_port()
    argv = [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", "--listen", f"{LOOPBACK}:{port}",
            *_auth.users().serve_arguments()]
    service = Service(name, argv, logs / f"{name}.log", cwd=REPO_ROOT, env=python_env())
    service.port = port  # type: ignore[attr-defined]
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            request(port, "PING")
            return service
        except ManagementError:
            if not service.running():
                raise RuntimeError(f"{name} exited: {service.log_tail()}") from None
            time.sleep(0.1)
    service.stop()
    raise TimeoutError(f"{name} not answering on port {port}")


def _replicate(replica_port: int, source: str, queue: str, mode: str) -> None:
    request(replica_port, "REPLICATE", "queue", queue, {"source": source, "mode": mode, "create": True})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        replicas = request(replica_port, "STATUS")["replication"]["replicas"]
        if any(r["queue"] == queue and r["state"] == "live" for r in replicas):
            return
        time.sleep(0.1)
    raise TimeoutError(f"replication of {queue} from {source} did not go live")


def _send_rate(port: int, queue: str, count: int) -> float:
    run = cexamples.run_send(LOOPBACK, port, queue, count, timeout=30 + count / 1000,
                             env=_auth.users().client_environment())
    if run.returncode != 0 or cexamples.sent_count(run) != count:
        raise RuntimeError(f"send-bench to {queue} failed: {run.stdout[-500:]}")
    return count / run.elapsed


def _wait_caught_up(source_port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        served = request(source_port, "STATUS")["replication"]["sources"]
        if served and all(r["lag_messages"] == 0 for r in served):
            return
        time.sleep(0.05)
    raise TimeoutError("the replica did not catch up")


STAMP_TEMPLATE = bytes(Message(body=0.0).encode())[:-8]
"""A message whose body is a double: the send time is patched into its last 8 bytes."""


class PacedProducer(MessagingHandler):
    """Sends ``count`` pre-settled, time-stamped messages at ``rate`` msg/s (raw bytes: a few us each)."""

    def __init__(self, url: str, rate: float, count: int, time_limit: float) -> None:
        super().__init__()
        self.url, self.rate, self.count, self.time_limit = url, rate, count, time_limit
        self.sent = 0
        self.started = 0.0
        self.sender: Any = None

    def on_start(self, event: Any) -> None:
        self.sender = event.container.create_sender(self.url, options=AtMostOnce())
        self.started = time.monotonic()
        event.container.schedule(PACE_TICK, self)

    def on_timer_task(self, event: Any) -> None:
        elapsed = time.monotonic() - self.started
        due = min(self.count, int(elapsed * self.rate))
        sender = self.sender
        while self.sent < due and sender.credit > 0:
            delivery = sender.delivery(b"%d" % self.sent)
            sender.send(STAMP_TEMPLATE + struct.pack(">d", time.time()))
            sender.advance()
            delivery.settle()
            self.sent += 1
        if self.sent < self.count and elapsed < self.time_limit:
            event.container.schedule(PACE_TICK, self)
        else:
            sender.connection.close()


class LagReceiver(MessagingHandler):
    """Records arrival - send time of each stamped message on the replica (browsing a full replica).

    Once its link is attached it starts the producer process; it stops when it
    has every message the producer sent, or at ``deadline``.
    """

    def __init__(self, url: str, browse: bool, count: int, start_producer: Callable[[], Any],
                 sent: Any, deadline: float) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.url, self.browse, self.count = url, browse, count
        self.start_producer, self.sent, self.deadline = start_producer, sent, deadline
        self.lags_ms: list[float] = []
        self.receiver: Any = None
        self.started_at = 0.0
        self.producer: Any = None

    def on_start(self, event: Any) -> None:
        self.receiver = event.container.create_receiver(self.url, options=[Copy()] if self.browse else None)
        self.receiver.flow(5000)
        event.container.schedule(0.1, self)

    def on_link_opened(self, event: Any) -> None:
        if event.link == self.receiver and self.producer is None:
            self.started_at = time.monotonic()
            self.producer = self.start_producer()

    def on_timer_task(self, event: Any) -> None:
        received = len(self.lags_ms)
        finished = self.sent.value >= 0 and received >= self.sent.value
        if finished or received >= self.count or time.monotonic() > self.deadline:
            self.receiver.connection.close()
        else:
            event.container.schedule(0.1, self)

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        if delivery.partial or not delivery.readable:
            return
        link = delivery.link
        data = link.recv(delivery.pending)
        link.advance()
        self.lags_ms.append((time.time() - struct.unpack(">d", data[-8:])[0]) * 1000.0)
        if not self.browse:
            delivery.update(delivery.ACCEPTED)
        delivery.settle()
        if link.credit < 2500:
            link.flow(5000 - link.credit)


def _produce(url: str, rate: float, count: int, time_limit: float, sent: Any) -> None:
    producer = PacedProducer(url, rate, count, time_limit)
    Container(producer).run()
    sent.value = producer.sent


def _lag(source_port: int, replica_port: int, queue: str, mode: str, rate: float, seconds: float,
         count: int | None = None) -> dict[str, Any]:
    """The producer runs in its own process so that neither side's Python delays the other's clock."""
    count = count or max(100, int(rate * seconds))
    context = multiprocessing.get_context("fork")
    sent = context.Value("q", -1)
    users = _auth.users()

    def start_producer() -> Any:
        process = context.Process(target=_produce, args=(users.url(f"{LOOPBACK}:{source_port}/{queue}"), rate,
                                                         count, seconds * 2 + 10, sent))
        process.start()
        return process

    receiver = LagReceiver(users.url(f"{LOOPBACK}:{replica_port}/{queue}"), mode == "full", count, start_producer,
                           sent, deadline=time.monotonic() + seconds * 3 + 40)
    try:
        Container(receiver).run()
    finally:
        if receiver.producer is not None:
            receiver.producer.join(30)
            if receiver.producer.is_alive():
                receiver.producer.kill()
    elapsed = time.monotonic() - receiver.started_at
    lags = sorted(receiver.lags_ms)
    if sent.value < 0 or len(lags) < sent.value:
        raise RuntimeError(f"{len(lags)} messages reached the replica of {sent.value} sent")
    return {
        "messages": len(lags),
        "target_rate": round(rate),
        "achieved_rate": round(len(lags) / elapsed),
        "lag_ms_p50": round(nearest_rank(lags, 50), 2),
        "lag_ms_p99": round(nearest_rank(lags, 99), 2),
        "lag_ms_max": round(lags[-1], 2),
    }


def measure_mode(mode: str, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    source = _start_node(f"{mode}-source", logs)
    replica = _start_node(f"{mode}-replica", logs)
    proxy: Service | None = None
    try:
        src, rep = source.port, replica.port  # type: ignore[attr-defined]
        for queue in ("plain", "q", "wan"):
            request(src, "CREATE", "queue", queue)
        _replicate(rep, f"{LOOPBACK}:{src}", "q", mode)
        on, off, replicated = [], [], []
        cpu: dict[str, list[float]] = {"source_without": [], "source_with": [], "replica_with": []}
        for round_no in range(1, args.runs + 1):
            before = source.cpu_seconds()
            off.append(_send_rate(src, "plain", args.count))
            cpu["source_without"].append((source.cpu_seconds() - before) / args.count * 1e6)
            before, before_replica = source.cpu_seconds(), replica.cpu_seconds()
            started = time.monotonic()
            on.append(_send_rate(src, "q", args.count))
            _wait_caught_up(src)
            replicated.append(args.count / (time.monotonic() - started))
            cpu["source_with"].append((source.cpu_seconds() - before) / args.count * 1e6)
            cpu["replica_with"].append((replica.cpu_seconds() - before_replica) / args.count * 1e6)
            print(f"[{mode}] round {round_no}/{args.runs}: send without replication {off[-1]:,.0f} msg/s "
                  f"(source cpu {cpu['source_without'][-1]:.1f} us/msg), with {on[-1]:,.0f} msg/s "
                  f"(source {cpu['source_with'][-1]:.1f} us/msg, replica {cpu['replica_with'][-1]:.1f} us/msg); "
                  f"the replica had them all at {replicated[-1]:,.0f} msg/s", flush=True)
            request(src, "PURGE", "queue", "plain")
            request(src, "PURGE", "queue", "q")
            _wait_caught_up(src)
            if mode == "enqueue":  # the replica keeps every message; the next round starts empty
                request(rep, "PURGE", "queue", "q")
        flat_out = _lag(src, rep, "q", mode, 1e9, args.lag_seconds, count=args.count)
        print(f"[{mode}] producer -> source -> replica -> consumer flat out: {flat_out['achieved_rate']:,} msg/s",
              flush=True)
        request(src, "PURGE", "queue", "q")  # a browser on a full replica would see them again
        _wait_caught_up(src)
        rate = args.rate or flat_out["achieved_rate"] / 2
        loopback = _lag(src, rep, "q", mode, rate, args.lag_seconds)
        print(f"[{mode}] lag on loopback at {loopback['achieved_rate']:,} msg/s: p50 {loopback['lag_ms_p50']} ms, "
              f"p99 {loopback['lag_ms_p99']} ms, max {loopback['lag_ms_max']} ms", flush=True)
        proxy_port = free_port()
        proxy = Service(f"{mode}-proxy", [sys.executable, "-m", "hastandby.testing.delay_proxy", "--listen",
                                          f"{LOOPBACK}:{proxy_port}", "--target", f"{LOOPBACK}:{src}",
                                          "--delay-ms", str(args.delay_ms)],
                        logs / f"{mode}-proxy.log", cwd=REPO_ROOT, env=python_env())
        proxy.wait_ready(LOOPBACK, proxy_port, connect_options=_auth.users().connect_options())
        _replicate(rep, f"{LOOPBACK}:{proxy_port}", "wan", mode)
        wan = _lag(src, rep, "wan", mode, rate, args.lag_seconds)
        print(f"[{mode}] lag through the {args.delay_ms:g} ms-each-way proxy at {wan['achieved_rate']:,} msg/s: "
              f"p50 {wan['lag_ms_p50']} ms, p99 {wan['lag_ms_p99']} ms, max {wan['lag_ms_max']} ms", flush=True)
        ratio = statistics.median(on) / statistics.median(off)
        paired = [w / wo for w, wo in zip(on, off)]
        print(f"[{mode}] source send rate with async replication: x{ratio:.2f} of without (median of each round's "
              f"own ratio x{statistics.median(paired):.2f}, rounds x{min(paired):.2f}-x{max(paired):.2f})", flush=True)
        return {"send_msg_per_s_without": off, "send_msg_per_s_with": on, "replicated_msg_per_s": replicated,
                "end_to_end_max_msg_per_s": flat_out["achieved_rate"],
                "cpu_us_per_msg": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
                "send_ratio": round(ratio, 3), "send_ratio_per_round": [round(r, 3) for r in paired],
                "lag_loopback": loopback, "lag_wan": wan}
    finally:
        for service in (proxy, replica, source):
            if service is not None:
                service.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50_000, help="messages per send-bench run")
    parser.add_argument("--runs", type=int, default=9, help="alternating rounds of with/without replication")
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
