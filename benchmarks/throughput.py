"""Throughput of hastandby against the proton C example broker, in one invocation.

    python -m benchmarks.throughput [--count N] [--runs R] [--body-size 100]
        [--out benchmarks/results/] [--skip-rss] [--rss-messages 1000000]
        [--targets c-broker,hastandby]

The machine is shared and noisy, so absolute rates mean little across runs;
what we report is the ratio hastandby / C broker taken in the same invocation,
with rounds alternating between the brokers (A B A B ...) so noise hits both
alike. Both are driven by the same C clients (see ``cexamples``): the
``send-bench`` and ``receive-bench`` variants with 100-byte binary bodies.

Figures per broker and round (a fresh broker process per round, a fresh queue
per figure): ``send`` (N messages into an empty queue), ``receive`` (drain
them), ``concurrent`` (a receiver and a sender of N messages at once). Each
figure is msg/s and broker CPU (user+system) microseconds per message. A
receiver must get exactly N messages, or the run is marked failed and is not
counted as a rate. Then, for hastandby only, the memory figure: RSS before and
after queueing ``--rss-messages`` messages on one queue.

hastandby requires authentication, as in production: it reads the run's users
file and the clients authenticate with PLAIN (``benchmarks/_auth.py``; once
per connection, nothing per message).  The C broker is the stock example and
takes the same clients without credentials.

Results: a table on stdout and JSON in ``--out`` (``throughput-<UTC>.json``
and ``throughput-latest.json``). Exit code 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from benchmarks import _auth, cexamples
from benchmarks._proc import LOOPBACK, Service, free_port, python_env

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results"

FIGURES = ("send", "receive", "concurrent")

MIN_RATE = 1000
"""msg/s below which a client is considered stuck: its timeout is 30 s + N / MIN_RATE."""

RSS_CHUNK = 100_000
"""Messages per sender process when filling the queue for the memory figure,
so each subprocess stays bounded in time."""

START_TIMEOUT = 30.0


@dataclass(frozen=True)
class Target:
    """A broker under test: how to start it on a port, and whether to take its memory figure.

    ``argv(host, port)`` takes the port as a string so the JSON can show the
    command with a ``PORT`` placeholder.
    """

    name: str
    label: str
    argv: Callable[[str, str], list[str]]
    cwd: Path
    env: dict[str, str] | None = None
    measure_rss: bool = False
    authenticated: bool = False
    """Clients must authenticate (``_auth``): hastandby; the C example broker takes anyone."""

    @property
    def client_env(self) -> dict[str, str] | None:
        """The C clients' credentials for this broker (``cexamples.Client``'s ``env``)."""
        return _auth.users().client_environment() if self.authenticated else None

    def start(self, host: str, port: int, log_path: Path) -> Service:
        """Start the broker and wait until it accepts AMQP connections (stops it on failure)."""
        service = Service(self.name, self.argv(host, str(port)), log_path, cwd=self.cwd, env=self.env)
        try:
            service.wait_ready(host, port, START_TIMEOUT,
                               _auth.users().connect_options() if self.authenticated else None)
        except BaseException:
            service.stop()
            raise
        return service


def _c_broker_argv(host: str, port: str) -> list[str]:
    return [str(cexamples.build("broker")), host, port]


def _hastandby_argv(host: str, port: str) -> list[str]:
    return [sys.executable, "-m", "hastandby", "serve", "--listen", f"{host}:{port}", "--log-format", "json",
            *_auth.users().serve_arguments()]


TARGETS: tuple[Target, ...] = (
    # cwd: broker.c loads ssl-certs/ relative to it (it still serves plain AMQP).
    Target("c-broker", "proton C example broker", _c_broker_argv, cwd=cexamples.EXAMPLES_DIR),
    Target("hastandby", "hastandby", _hastandby_argv, cwd=REPO_ROOT, env=python_env(), measure_rss=True,
           authenticated=True),
)
REFERENCE = TARGETS[0]
"""Ratios are every other target divided by this one."""


@dataclass
class Run:
    """One figure of one round for one target, as recorded in the JSON."""

    round: int
    target: str
    figure: str
    queue: str
    messages: int
    ok: bool = False
    error: str | None = None
    elapsed_s: float | None = None
    msg_per_s: float | None = None
    broker_cpu_s: float | None = None
    cpu_us_per_msg: float | None = None


@dataclass
class Settings:
    """Parameters of one invocation."""

    count: int
    runs: int
    body_size: int
    out: Path
    skip_rss: bool
    rss_messages: int
    targets: list[Target]

    @property
    def client_timeout(self) -> float:
        """Seconds after which a client of ``count`` messages counts as stuck and is killed."""
        return 30.0 + self.count / MIN_RATE


class ClientFailure(Exception):
    """A client exited badly, timed out, or moved a wrong number of messages."""


def _tail(text: str | bytes | None, lines: int = 5) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return " | ".join((text or "").strip().splitlines()[-lines:]) or "(no output)"


def _check_send(run: cexamples.ClientRun, count: int) -> None:
    """Raise ClientFailure unless the sender exited 0 with all ``count`` messages accepted."""
    sent = cexamples.sent_count(run)
    if run.returncode != 0 or sent != count:
        raise ClientFailure(f"send exit {run.returncode}, acknowledged {sent} of {count}: {_tail(run.stdout)}")


def _check_receive(run: cexamples.ClientRun, count: int) -> None:
    """Raise ClientFailure unless the receiver exited 0 with exactly ``count`` messages."""
    received = cexamples.received_count(run)
    if run.returncode != 0 or received != count:
        raise ClientFailure(f"receive exit {run.returncode}, received {received} of {count}: {_tail(run.stdout)}")


def _send(settings: Settings, port: int, queue: str, env: dict[str, str] | None) -> None:
    run = cexamples.run_send(LOOPBACK, port, queue, settings.count, settings.body_size, settings.client_timeout,
                             env=env)
    _check_send(run, settings.count)


def _receive(settings: Settings, port: int, queue: str, env: dict[str, str] | None) -> None:
    run = cexamples.run_receive(LOOPBACK, port, queue, settings.count, settings.client_timeout, env=env)
    _check_receive(run, settings.count)


def _concurrent(settings: Settings, port: int, queue: str, env: dict[str, str] | None) -> None:
    """Receiver first, so it is attached and waiting when the first message arrives."""
    receiver = cexamples.start_receive(LOOPBACK, port, queue, settings.count, env=env)
    sender: cexamples.Client | None = None
    try:
        sender = cexamples.start_send(LOOPBACK, port, queue, settings.count, settings.body_size, env=env)
        _check_send(sender.wait(settings.client_timeout), settings.count)
        _check_receive(receiver.wait(settings.client_timeout), settings.count)
    finally:
        receiver.kill()
        if sender is not None:
            sender.kill()


PHASES: dict[str, Callable[[Settings, int, str, dict[str, str] | None], None]] = {
    "send": _send,
    "receive": _receive,
    "concurrent": _concurrent,
}
"""How each figure is produced; "receive" drains the queue "send" filled."""


def _measure(run: Run, service: Service, action: Callable[[], None]) -> None:
    """Time ``action`` and charge the broker's CPU delta to ``run``; record any failure."""
    cpu_before = service.cpu_seconds()
    started = time.monotonic()
    try:
        action()
    except subprocess.TimeoutExpired as err:
        run.error = f"client timed out after {err.timeout:.0f} s: {_tail(err.output)}"
    except ClientFailure as err:
        run.error = str(err)
    elapsed = time.monotonic() - started
    if run.error is None and not service.running():
        run.error = f"broker exited: {service.log_tail()}"
    if run.error is not None:
        return
    run.ok = True
    run.elapsed_s = elapsed
    run.msg_per_s = run.messages / elapsed
    run.broker_cpu_s = service.cpu_seconds() - cpu_before
    run.cpu_us_per_msg = run.broker_cpu_s / run.messages * 1e6


def measure_round(target: Target, round_no: int, settings: Settings, logs: Path) -> list[Run]:
    """Start a fresh broker, produce every figure once, stop the broker."""
    tag = uuid.uuid4().hex[:8]
    queues = {"send": f"bench-queued-{tag}", "receive": f"bench-queued-{tag}", "concurrent": f"bench-concurrent-{tag}"}
    runs = {figure: Run(round_no, target.name, figure, queues[figure], settings.count) for figure in FIGURES}
    port = free_port()
    try:
        service = target.start(LOOPBACK, port, logs / f"{target.name}-round{round_no}.log")
    except (OSError, RuntimeError, TimeoutError) as err:
        for run in runs.values():
            run.error = f"broker did not start: {err}"
            _progress(run, settings.runs)
        return list(runs.values())
    try:
        for figure in FIGURES:
            run = runs[figure]
            if figure == "receive" and not runs["send"].ok:
                run.error = "not run: the send figure that fills its queue failed"
            else:
                _measure(run, service, partial(PHASES[figure], settings, port, run.queue, target.client_env))
            _progress(run, settings.runs)
    finally:
        service.stop()
    return list(runs.values())


def measure_memory(target: Target, settings: Settings, logs: Path) -> dict[str, Any]:
    """RSS of a fresh broker before and after queueing ``rss_messages`` messages on one queue."""
    result: dict[str, Any] = {
        "target": target.name,
        "messages": settings.rss_messages,
        "body_size": settings.body_size,
        "ok": False,
        "error": None,
    }
    queue = f"bench-rss-{uuid.uuid4().hex[:8]}"
    port = free_port()
    print(f"memory  {target.name:<10} queueing {settings.rss_messages:,} messages on {queue} ...", flush=True)
    try:
        service = target.start(LOOPBACK, port, logs / f"{target.name}-rss.log")
    except (OSError, RuntimeError, TimeoutError) as err:
        result["error"] = f"broker did not start: {err}"
        return result
    try:
        before = service.rss_bytes()
        started = time.monotonic()
        chunk_timeout = 30.0 + RSS_CHUNK / MIN_RATE
        remaining = settings.rss_messages
        while remaining > 0:
            chunk = min(RSS_CHUNK, remaining)
            run = cexamples.run_send(LOOPBACK, port, queue, chunk, settings.body_size, chunk_timeout,
                                     env=target.client_env)
            _check_send(run, chunk)
            remaining -= chunk
        after = service.rss_bytes()
        result.update(
            ok=True,
            elapsed_s=time.monotonic() - started,
            rss_before_mb=before / 1e6,
            rss_after_mb=after / 1e6,
            rss_bytes_per_message=(after - before) / settings.rss_messages,
        )
    except subprocess.TimeoutExpired as err:
        result["error"] = f"sender timed out after {err.timeout:.0f} s: {_tail(err.output)}"
    except ClientFailure as err:
        result["error"] = str(err)
    finally:
        service.stop()
    return result


def _progress(run: Run, rounds: int) -> None:
    head = f"round {run.round}/{rounds}  {run.target:<10} {run.figure:<10}"
    if run.ok:
        print(f"{head} {run.msg_per_s:>10,.0f} msg/s  broker cpu {run.cpu_us_per_msg:6.1f} us/msg", flush=True)
    else:
        print(f"{head} *** FAILED *** {run.error}", flush=True)


def summarize(runs: list[Run], targets: list[Target]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Medians per target and figure over the successful runs; ratios against REFERENCE."""
    medians: dict[str, Any] = {}
    for target in targets:
        medians[target.name] = {}
        for figure in FIGURES:
            mine = [r for r in runs if r.target == target.name and r.figure == figure]
            rates = [r.msg_per_s for r in mine if r.ok and r.msg_per_s is not None]
            cpu = [r.cpu_us_per_msg for r in mine if r.ok and r.cpu_us_per_msg is not None]
            medians[target.name][figure] = {
                "msg_per_s": statistics.median(rates) if rates else None,
                "msg_per_s_min": min(rates) if rates else None,
                "msg_per_s_max": max(rates) if rates else None,
                "cpu_us_per_msg": statistics.median(cpu) if cpu else None,
                "ok_runs": len(rates),
                "failed_runs": len(mine) - len(rates),
            }
    ratios: dict[str, Any] = {}
    if REFERENCE.name in medians:
        ref = medians[REFERENCE.name]
        for target in targets:
            if target is REFERENCE:
                continue
            ratios[f"{target.name}/{REFERENCE.name}"] = {
                figure: {
                    key: _ratio(medians[target.name][figure][key], ref[figure][key])
                    for key in ("msg_per_s", "cpu_us_per_msg")
                }
                for figure in FIGURES
            }
    return medians, ratios


def _ratio(mine: float | None, reference: float | None) -> float | None:
    return mine / reference if mine is not None and reference else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(medians: dict[str, Any], ratios: dict[str, Any], memory: list[dict[str, Any]]) -> None:
    """Print medians (msg/s, broker CPU us/msg) per figure, then ratios and the memory figure."""
    names = list(medians)
    print()
    print("median over successful runs: msg/s (broker cpu us/msg)")
    print(f"{'figure':<12}" + "".join(f"{name:>28}" for name in names) + "".join(f"{r:>32}" for r in ratios))
    for figure in FIGURES:
        cells = []
        for name in names:
            m = medians[name][figure]
            failed = f" [{m['failed_runs']} FAILED]" if m["failed_runs"] else ""
            cells.append(f"{_fmt(m['msg_per_s'], ',.0f')} ({_fmt(m['cpu_us_per_msg'], '.1f')}){failed}".rjust(28))
        for ratio in ratios.values():
            r = ratio[figure]
            cells.append(f"x{_fmt(r['msg_per_s'], '.2f')} (cpu x{_fmt(r['cpu_us_per_msg'], '.2f')})".rjust(32))
        print(f"{figure:<12}" + "".join(cells))
    for mem in memory:
        if mem["ok"]:
            print(
                f"memory {mem['target']}: RSS {mem['rss_before_mb']:.1f} MB -> {mem['rss_after_mb']:.1f} MB "
                f"with {mem['messages']:,} queued {mem['body_size']}-byte messages "
                f"({mem['rss_bytes_per_message']:.0f} bytes/message)"
            )
        else:
            print(f"memory {mem['target']}: *** FAILED *** {mem['error']}")


def host_info() -> dict[str, Any]:
    """What the figures depend on besides the code."""
    try:
        git = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", "HEAD"],
            check=False,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        commit = git.stdout.strip() if git.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        commit = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "memory_total_mb": psutil.virtual_memory().total / 1e6,
        "load_average": os.getloadavg(),
        "python": sys.version,
        "platform": platform.platform(),
        "git_commit": commit,
    }


def write_json(out: Path, report: dict[str, Any], started: datetime) -> Path:
    """Write the report as throughput-<UTC>.json and throughput-latest.json (atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"throughput-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    text = json.dumps(report, indent=2) + "\n"
    for target in (path, out / "throughput-latest.json"):
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, target)
    return path


def parse_args(argv: list[str] | None = None) -> Settings:
    """Command line to Settings; unknown targets and non-positive counts are usage errors."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="messages per figure (default 100000)")
    parser.add_argument("--runs", type=int, default=3, help="rounds per broker, alternating (default 3)")
    parser.add_argument("--body-size", type=int, default=100, help="message body bytes (default 100)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    parser.add_argument("--skip-rss", action="store_true", help="skip the memory figure")
    parser.add_argument(
        "--rss-messages", type=int, default=1_000_000, help="messages queued for the memory figure (default 1000000)"
    )
    parser.add_argument(
        "--targets",
        default=",".join(t.name for t in TARGETS),
        help=f"comma-separated brokers to measure (default all: {','.join(t.name for t in TARGETS)})",
    )
    args = parser.parse_args(argv)
    by_name = {t.name: t for t in TARGETS}
    unknown = [n for n in args.targets.split(",") if n not in by_name]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {list(by_name)}")
    if args.count < 1 or args.runs < 1 or args.body_size < 0 or args.rss_messages < 1:
        parser.error("--count, --runs and --rss-messages must be positive, --body-size not negative")
    return Settings(
        count=args.count,
        runs=args.runs,
        body_size=args.body_size,
        out=args.out,
        skip_rss=args.skip_rss,
        rss_messages=args.rss_messages,
        targets=[by_name[n] for n in args.targets.split(",")],
    )


def main(argv: list[str] | None = None) -> int:
    """Run every round and the memory figure, write the JSON, print the table; 1 if anything failed."""
    settings = parse_args(argv)
    started = datetime.now(UTC)
    command = [sys.executable, "-m", "benchmarks.throughput", *(sys.argv[1:] if argv is None else argv)]
    for name in ("broker", "send-bench", "receive-bench"):
        cexamples.build(name)  # compile before any clock runs
    logs = Path(tempfile.mkdtemp(prefix="throughput-logs-"))
    print(
        f"throughput: {settings.count:,} messages of {settings.body_size} bytes, {settings.runs} rounds, "
        f"brokers {', '.join(t.name for t in settings.targets)}; broker logs in {logs}",
        flush=True,
    )

    runs: list[Run] = []
    for round_no in range(1, settings.runs + 1):
        for target in settings.targets:
            runs.extend(measure_round(target, round_no, settings, logs))
    memory = [] if settings.skip_rss else [measure_memory(t, settings, logs) for t in settings.targets if t.measure_rss]

    medians, ratios = summarize(runs, settings.targets)
    failed = any(not r.ok for r in runs) or any(not m["ok"] for m in memory)
    report = {
        "benchmark": "throughput",
        "command": shlex.join(command),
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": (datetime.now(UTC) - started).total_seconds(),
        "host": host_info(),
        "parameters": {
            "count": settings.count,
            "runs": settings.runs,
            "body_size": settings.body_size,
            "rss_messages": None if settings.skip_rss else settings.rss_messages,
            "targets": {t.name: {"label": t.label, "argv": t.argv(LOOPBACK, "PORT")} for t in settings.targets},
            "reference": REFERENCE.name,
            "clients": ["send-bench", "receive-bench"],
            "client_timeout_s": settings.client_timeout,
        },
        "failed": failed,
        "runs": [vars(r) for r in runs],
        "medians": medians,
        "ratios": ratios,
        "memory": memory,
    }
    path = write_json(settings.out, report, started)
    print_table(medians, ratios, memory)
    print(f"\nresults: {path} (and {path.with_name('throughput-latest.json')})")
    if failed:
        print(f"\n*** SOME RUNS FAILED; see above and the broker logs in {logs} ***", flush=True)
        return 1
    shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
