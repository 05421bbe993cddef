"""Throughput of hastandby against the proton C example broker, in one invocation.

    python -m benchmarks.throughput [--count N] [--runs R] [--body-size 100]
        [--out results/] [--skip-rss] [--rss-messages 1000000]
        [--targets c-broker,hastandby] [--queue-kinds plain,priority,scheduled]
        [--baseline-tree PATH]

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
file and the clients authenticate with PLAIN (``hastandby/testing/auth.py``; once
per connection, nothing per message).  The C broker is the stock example and
takes the same clients without credentials.

Queue kinds (``--queue-kinds``, issue 28): hastandby's figures are taken on
each kind of queue in every round, one after the other on the same broker
process: ``plain`` (what the figures always were: a queue the sender's attach
makes), ``priority`` (declared with ``qpid.priorities`` 10; ``send-bench``
gives message i header priority i % 10, so every level is used and
interleaved), ``scheduled`` (a plain queue; 90 of every 100 messages carry
``x-opt-delivery-delay`` 100 ms: held back, then delivered in due order; the
``receive`` figure drains them as they come due), and with the other
features ``dedup`` (``x-dedup-window`` 300; every message has its own
message-id, as send-bench numbers them), ``lvq`` (``qpid.last_value_queue_key``;
the messages have no such property, so the cost of looking), ``groups``
(``qpid.group_header_key``; all in the group ``qpid.no-group``) and
``delivery-limit`` (``x-delivery-limit`` 5 with a single active consumer).
The C broker measures ``plain`` only.

Before/after (``--baseline-tree PATH``: a tree of an older commit, e.g.
``git archive REV | tar -x -C build/NAME``): a third target, ``baseline``,
hastandby run from that tree (the same interpreter, the tree first on
``sys.path``), alternating with the others in every round, on ``plain``
queues; the report adds current/baseline ratios of msg/s and CPU per message
(medians, and per round).

Results: a table on stdout and JSON in ``--out`` (``throughput-<UTC>.json``
and ``throughput-latest.json``). Exit code 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
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


from hastandby.client import ManagementClient
from hastandby.testing import auth as _auth
from hastandby.testing import cexamples, fmt, output_tail, ratio
from hastandby.testing.paths import repo, results_dir
from hastandby.testing.processes import LOOPBACK, Service, free_port, python_env
from hastandby.testing.provenance import host_info

from .trees import baseline_tree

REPO_ROOT = repo()  # the checkout's root: the nodes' and clients' cwd
DEFAULT_OUT = results_dir()  # every benchmark's default --out/--results: results/ at the checkout's root (ignored)

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
    features: bool = False
    """It has the queue features of ``QUEUE_KINDS`` (this tree's hastandby): measured on every kind asked for."""

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
           authenticated=True, features=True),
)
REFERENCE = TARGETS[0]
"""Ratios are every other target divided by this one."""


def baseline_target(root: Path) -> Target:
    """hastandby from an older tree (``--baseline-tree``): ``python -m hastandby`` run in it, so it imports
    the tree's package first (checked by ``trees.baseline_tree``), with the same users and those of
    our options its ``serve`` knows."""
    tree = baseline_tree(root)
    serve = tree.serve_argv()

    def argv(host: str, port: str) -> list[str]:
        return [*serve, "--listen", f"{host}:{port}"]

    return Target("baseline", f"hastandby at {tree.root}", argv, cwd=tree.root, env=tree.env(),
                  authenticated=tree.authenticated)


QUEUE_KINDS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "plain": ({}, {}),
    "priority": ({"qpid.priorities": 10}, {"HASTANDBY_PRIORITIES": "10"}),
    "scheduled": ({}, {"HASTANDBY_DELAY_MS": "100", "HASTANDBY_DELAYED_PERCENT": "90"}),
    "dedup": ({"x-dedup-window": 300}, {}),
    "lvq": ({"qpid.last_value_queue_key": "sym"}, {}),
    "groups": ({"qpid.group_header_key": "grp"}, {}),
    "delivery-limit": ({"x-delivery-limit": 5, "x-single-active-consumer": True}, {}),
}
"""Per queue kind (``--queue-kinds``): the queue's arguments (declared before the figure; none: the sender's
attach makes it, as always) and what ``send-bench`` is told in its environment (``cexamples``)."""


@dataclass
class Run:
    """One figure of one round for one target, as recorded in the JSON."""

    round: int
    target: str
    figure: str
    queue: str
    messages: int
    kind: str = "plain"
    ok: bool = False
    error: str | None = None
    elapsed_s: float | None = None
    msg_per_s: float | None = None
    broker_cpu_s: float | None = None
    cpu_us_per_msg: float | None = None
    cluster_cpu_us_per_msg: float | None = None  # every node of a cluster (ha_throughput); the primary's is above


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
    queue_kinds: tuple[str, ...] = ("plain",)
    baseline: Target | None = None

    def kinds(self, target: Target) -> tuple[str, ...]:
        return self.queue_kinds if target.features else ("plain",)

    @property
    def client_timeout(self) -> float:
        """Seconds after which a client of ``count`` messages counts as stuck and is killed."""
        return 30.0 + self.count / MIN_RATE


class ClientFailure(Exception):
    """A client exited badly, timed out, or moved a wrong number of messages."""


def check_send(run: cexamples.ClientRun, count: int) -> None:
    """Raise ClientFailure unless the sender exited 0 with all ``count`` messages accepted."""
    sent = cexamples.sent_count(run)
    if run.returncode != 0 or sent != count:
        raise ClientFailure(f"send exit {run.returncode}, acknowledged {sent} of {count}: {output_tail(run.stdout)}")


def check_receive(run: cexamples.ClientRun, count: int) -> None:
    """Raise ClientFailure unless the receiver exited 0 with exactly ``count`` messages."""
    received = cexamples.received_count(run)
    if run.returncode != 0 or received != count:
        raise ClientFailure(f"receive exit {run.returncode}, received {received} of {count}: {output_tail(run.stdout)}")


def _send(settings: Settings, port: int, queue: str, env: dict[str, str] | None) -> None:
    run = cexamples.run_send(LOOPBACK, port, queue, settings.count, settings.body_size, settings.client_timeout,
                             env=env)
    check_send(run, settings.count)


def _receive(settings: Settings, port: int, queue: str, env: dict[str, str] | None) -> None:
    run = cexamples.run_receive(LOOPBACK, port, queue, settings.count, settings.client_timeout, env=env)
    check_receive(run, settings.count)


def _concurrent(settings: Settings, port: int, queue: str, env: dict[str, str] | None) -> None:
    """Receiver first, so it is attached and waiting when the first message arrives."""
    receiver = cexamples.start_receive(LOOPBACK, port, queue, settings.count, env=env)
    sender: cexamples.Client | None = None
    try:
        sender = cexamples.start_send(LOOPBACK, port, queue, settings.count, settings.body_size, env=env)
        check_send(sender.wait(settings.client_timeout), settings.count)
        check_receive(receiver.wait(settings.client_timeout), settings.count)
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


def measure_phase(run: Run, service: Service, action: Callable[[], None]) -> None:
    """Time ``action`` and charge the broker's CPU delta to ``run``; record any failure."""
    cpu_before = service.cpu_seconds()
    started = time.monotonic()
    try:
        action()
    except subprocess.TimeoutExpired as err:
        run.error = f"client timed out after {err.timeout:.0f} s: {output_tail(err.output)}"
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
    """Start a fresh broker, produce every figure once on each of its queue kinds, stop the broker."""
    tag = uuid.uuid4().hex[:8]
    kinds = settings.kinds(target)
    everything: list[Run] = []
    for kind in kinds:
        suffix = "" if kind == "plain" else f"-{kind}"
        queues = {"send": f"bench-queued{suffix}-{tag}", "receive": f"bench-queued{suffix}-{tag}",
                  "concurrent": f"bench-concurrent{suffix}-{tag}"}
        everything += [Run(round_no, target.name, figure, queues[figure], settings.count, kind) for figure in FIGURES]
    port = free_port()
    try:
        service = target.start(LOOPBACK, port, logs / f"{target.name}-round{round_no}.log")
    except (OSError, RuntimeError, TimeoutError) as err:
        for run in everything:
            run.error = f"broker did not start: {err}"
            print_run(run, settings.runs)
        return everything
    try:
        for kind in kinds:
            runs = {r.figure: r for r in everything if r.kind == kind}
            arguments, client_extra = QUEUE_KINDS[kind]
            env = {**(target.client_env or {}), **client_extra} if client_extra else target.client_env
            try:
                if arguments:
                    _declare(port, {runs["send"].queue, runs["concurrent"].queue}, arguments)
            except Exception as err:  # noqa: BLE001 - a queue that cannot be declared fails its figures
                for run in runs.values():
                    run.error = f"queue not declared: {err}"
                    print_run(run, settings.runs)
                continue
            for figure in FIGURES:
                run = runs[figure]
                if figure == "receive" and not runs["send"].ok:
                    run.error = "not run: the send figure that fills its queue failed"
                else:
                    measure_phase(run, service, partial(PHASES[figure], settings, port, run.queue, env))
                print_run(run, settings.runs)
    finally:
        service.stop()
    return everything


def _declare(port: int, queues: set[str], arguments: dict[str, Any]) -> None:
    """Declare ``queues`` with ``arguments`` (as admin) before a queue kind's figures."""
    with ManagementClient(f"{LOOPBACK}:{port}", timeout=10, login=_auth.users().login(_auth.ADMIN)) as client:
        for queue in sorted(queues):
            client.request("CREATE", "queue", queue, {"arguments": arguments})


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
            check_send(run, chunk)
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
        result["error"] = f"sender timed out after {err.timeout:.0f} s: {output_tail(err.output)}"
    except ClientFailure as err:
        result["error"] = str(err)
    finally:
        service.stop()
    return result


def print_run(run: Run, rounds: int) -> None:
    kind = "" if run.kind == "plain" else f" [{run.kind}]"
    head = f"round {run.round}/{rounds}  {run.target:<10} {run.figure:<10}{kind}"
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
                    key: ratio(medians[target.name][figure][key], ref[figure][key])
                    for key in ("msg_per_s", "cpu_us_per_msg")
                }
                for figure in FIGURES
            }
    return medians, ratios


def summarize_kinds(runs: list[Run], targets: list[Target]) -> dict[str, Any]:
    """Medians per target, queue kind and figure (msg/s, CPU us/msg), each kind's beside the same target's
    plain queue of the same rounds (``vs_plain``: ratios of medians)."""
    result: dict[str, Any] = {}
    for target in targets:
        kinds = sorted({r.kind for r in runs if r.target == target.name}, key=list(QUEUE_KINDS).index)
        mine: dict[str, Any] = {}
        for kind in kinds:
            mine[kind] = {}
            for figure in FIGURES:
                done = [r for r in runs if r.target == target.name and r.kind == kind and r.figure == figure]
                rates = [r.msg_per_s for r in done if r.ok and r.msg_per_s is not None]
                cpu = [r.cpu_us_per_msg for r in done if r.ok and r.cpu_us_per_msg is not None]
                mine[kind][figure] = {"msg_per_s": statistics.median(rates) if rates else None,
                                      "cpu_us_per_msg": statistics.median(cpu) if cpu else None,
                                      "cpu_us_per_msg_min": min(cpu) if cpu else None,
                                      "cpu_us_per_msg_max": max(cpu) if cpu else None,
                                      "ok_runs": len(rates), "failed_runs": len(done) - len(rates)}
        for kind in kinds:
            for figure in FIGURES:
                plain, this = mine.get("plain", {}).get(figure, {}), mine[kind][figure]
                this["vs_plain"] = {key: ratio(this[key], plain.get(key)) for key in ("msg_per_s", "cpu_us_per_msg")}
        result[target.name] = mine
    return result


def compare_baseline(runs: list[Run]) -> dict[str, Any]:
    """hastandby/baseline on plain queues: ratios of the medians, and per round (the two brokers of a round
    ran one right after the other)."""
    result: dict[str, Any] = {}
    for figure in FIGURES:
        pick = {name: {r.round: r for r in runs if r.target == name and r.kind == "plain" and r.figure == figure
                       and r.ok} for name in ("hastandby", "baseline")}
        entry: dict[str, Any] = {}
        for key in ("msg_per_s", "cpu_us_per_msg"):
            cur = [getattr(r, key) for r in pick["hastandby"].values()]
            base = [getattr(r, key) for r in pick["baseline"].values()]
            rounds = sorted(set(pick["hastandby"]) & set(pick["baseline"]))
            entry[key] = {
                "current": statistics.median(cur) if cur else None,
                "baseline": statistics.median(base) if base else None,
                "ratio_of_medians": ratio(statistics.median(cur) if cur else None,
                                           statistics.median(base) if base else None),
                "per_round": [ratio(getattr(pick["hastandby"][n], key), getattr(pick["baseline"][n], key))
                              for n in rounds],
            }
        result[figure] = entry
    return result


def print_kinds(by_kind: dict[str, Any], baseline: dict[str, Any] | None) -> None:
    for target, kinds in by_kind.items():
        if len(kinds) < 2:
            continue
        print(f"\n{target} by queue kind: msg/s (broker cpu us/msg), and against its plain queue")
        print(f"{'kind':<16}" + "".join(f"{figure:>36}" for figure in FIGURES))
        for kind, figures in kinds.items():
            cells = []
            for figure in FIGURES:
                m = figures[figure]
                vs = m["vs_plain"]
                failed = f" [{m['failed_runs']} FAILED]" if m["failed_runs"] else ""
                cells.append((f"{fmt(m['msg_per_s'], ',.0f')} ({fmt(m['cpu_us_per_msg'], '.1f')}) "
                              f"x{fmt(vs['msg_per_s'], '.2f')}/cpu x{fmt(vs['cpu_us_per_msg'], '.2f')}{failed}").rjust(36))
            print(f"{kind:<16}" + "".join(cells))
    if baseline:
        print("\nplain queues, hastandby/baseline: ratio of medians [per round]")
        for figure, entry in baseline.items():
            parts = []
            for key, label in (("cpu_us_per_msg", "cpu us/msg"), ("msg_per_s", "msg/s")):
                e = entry[key]
                rounds = ", ".join(fmt(r, ".2f") for r in e["per_round"])
                parts.append(f"{label} {fmt(e['current'], ',.1f')} vs {fmt(e['baseline'], ',.1f')}: "
                             f"x{fmt(e['ratio_of_medians'], '.2f')} [{rounds}]")
            print(f"  {figure:<11} " + "; ".join(parts))


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
            cells.append(f"{fmt(m['msg_per_s'], ',.0f')} ({fmt(m['cpu_us_per_msg'], '.1f')}){failed}".rjust(28))
        for by_figure in ratios.values():
            r = by_figure[figure]
            cells.append(f"x{fmt(r['msg_per_s'], '.2f')} (cpu x{fmt(r['cpu_us_per_msg'], '.2f')})".rjust(32))
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
        "--queue-kinds", default="plain",
        help=f"comma-separated queue kinds hastandby is measured on, each beside the others in every round: "
             f"{', '.join(QUEUE_KINDS)} (default plain)")
    parser.add_argument(
        "--baseline-tree", type=Path, default=None, metavar="PATH",
        help="also run hastandby from this tree (e.g. `git archive REV | tar -x -C build/NAME`), alternating "
             "with the others, on plain queues, and report current/baseline ratios")
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
    kinds = tuple(k.strip() for k in args.queue_kinds.split(",") if k.strip())
    if not kinds or any(k not in QUEUE_KINDS for k in kinds):
        parser.error(f"--queue-kinds: choose from {', '.join(QUEUE_KINDS)}")
    if "plain" not in kinds:
        kinds = ("plain", *kinds)  # every kind is reported beside the plain queue of the same rounds
    baseline = baseline_target(args.baseline_tree) if args.baseline_tree else None
    if args.count < 1 or args.runs < 1 or args.body_size < 0 or args.rss_messages < 1:
        parser.error("--count, --runs and --rss-messages must be positive, --body-size not negative")
    return Settings(
        count=args.count,
        runs=args.runs,
        body_size=args.body_size,
        out=args.out,
        skip_rss=args.skip_rss,
        rss_messages=args.rss_messages,
        targets=[by_name[n] for n in args.targets.split(",")] + ([baseline] if baseline else []),
        queue_kinds=kinds,
        baseline=baseline,
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

    medians, ratios = summarize([r for r in runs if r.kind == "plain"], settings.targets)
    by_kind = summarize_kinds(runs, settings.targets)
    baseline = compare_baseline(runs) if settings.baseline is not None else None
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
            "queue_kinds": {k: {"arguments": QUEUE_KINDS[k][0], "send_bench_env": QUEUE_KINDS[k][1]}
                            for k in settings.queue_kinds},
            "baseline_tree": str(settings.baseline.cwd) if settings.baseline else None,
        },
        "failed": failed,
        "runs": [vars(r) for r in runs],
        "medians": medians,
        "ratios": ratios,
        "by_queue_kind": by_kind,
        "baseline": baseline,
        "memory": memory,
    }
    path = write_json(settings.out, report, started)
    print_table(medians, ratios, memory)
    print_kinds(by_kind, baseline)
    print(f"\nresults: {path} (and {path.with_name('throughput-latest.json')})")
    if failed:
        print(f"\n*** SOME RUNS FAILED; see above and the broker logs in {logs} ***", flush=True)
        return 1
    shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
