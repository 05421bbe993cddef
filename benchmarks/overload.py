"""Overload (issue 13's goal figures): the memory high watermark at full speed, and 10,000 idle connections.

    python -m benchmarks.overload [--parts watermark,idle] [--watermark 256MB] [--body-size 1024]
        [--messages N] [--slack 32MB] [--hold 2] [--consumer-batch 0] [--recovery-fraction 0.8]
        [--idle-connections 10000] [--parallel 8] [--count 100000] [--runs 3] [--idle-seconds 5]
        [--out results/]

``watermark``
    A node with ``--memory-high-watermark``; the C ``send-bench`` sends
    ``--messages`` messages of ``--body-size`` bytes at full speed (default:
    twice the watermark in message bodies) with no consumer.  The node's
    resident size is read from ``/proc/PID/statm`` every 50 ms: its peak must
    stay within the watermark plus ``--slack`` (the credit producers already
    hold, up to 1,000 messages per link, plus what arrives between two of the
    node's 0.1 s samples and its buffers).  Once producers are held (the
    enqueue counter stands still) for ``--hold`` seconds, the C
    ``receive-bench`` drains every message: one run, which grants its whole
    count as credit at once, or with ``--consumer-batch N`` successive runs
    of N (so the node cannot push more than N ahead of the
    acknowledgements).  If the queue stays empty with producers still held
    for 15 s, the alarm is reported as stuck and the run ends there.  A timeline of the queue's
    enqueue counter (a management QUERY every 100 ms on one open connection,
    timed at the middle of each request) gives the producer's rate before
    the alarm, its rate after the alarm clears (the node's own log line,
    which is timestamped) and the recovery the issue sets a goal for: once
    the consumer has caught up (no more than ``CAUGHT_UP_DEPTH`` queued),
    how long until the producer sends at ``--recovery-fraction`` (default
    0.8) of a reference rate, sustained over 0.5 s (goal: within 1 s).  The
    reference is the same producer with the consumer alongside and no alarm,
    measured first on the same node: the rate before the alarm had no
    consumer to share the node with.  Every message the sender had
    acknowledged must be received (the C clients' counts) and the queue
    must end empty.
``idle``
    Two nodes with the same options (``--heartbeat 0``, ``--limit
    connections=N+10``, ``--limit connections_per_user=N+10``): one holds
    ``--idle-connections`` authenticated connections opened by a helper
    process (this module run with ``--hold-connections``: raw sockets, PLAIN
    by ``hastandby.security.sasl.SaslClient``, an AMQP open from a bare
    ``proton.Transport``, then never read), the other none.  The C
    ``send-bench`` (``--count`` 100-byte messages) runs against each in
    turn, alternating for ``--runs`` rounds: the rate with the idle
    connections against without (goal: no more than 10 % slower), the
    node's CPU per message, and the node's CPU while nothing runs.  Also:
    how long opening them took, the node's resident size with them, and
    the refusal beyond the limit (the helper opens connections until one is
    refused; 10 fit above the idle ones).

Nodes require authentication (``hastandby/testing/auth.py``).  Prints a table per part and
writes ``results/overload-<UTC>.json`` (command line, host, the
working tree's uncommitted node changes, parameters, figures, timelines).
Exit code 1 if a figure could not be taken or messages were lost.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue as queue_module
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from hastandby.broker.admission.memory import LOW_FRACTION, parse_watermark
from hastandby.client import ManagementClient, ManagementError
from hastandby.testing import auth as _auth
from hastandby.testing import cexamples, fmt, interrupt_on_sigterm, median_or_none, output_tail, ratio, write_report
from hastandby.testing.processes import Service, free_port, python_env
from hastandby.testing.provenance import host_info, uncommitted_changes
from hastandby.testing.waiting import wait_until
from spark_analysis.phases import nearest_rank

from .security import (
    PlainSaslClient,
    RawConnection,
    RawConnectionError,
)
from .throughput import (
    DEFAULT_OUT,
    LOOPBACK,
    MIN_RATE,
    PHASES,
    REPO_ROOT,
    Run,
    Settings,
    measure_phase,
    print_run,
)

PARTS = ("watermark", "idle")
MiB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
RSS_INTERVAL = 0.05  # seconds between reads of the node's /proc/PID/statm
QUERY_INTERVAL = 0.1  # seconds between management QUERYs for the enqueue timeline
RECOVERY_WINDOW = 0.5  # seconds the producer's rate must hold to count as recovered
RECOVERY_GOAL_S = 1.0  # from the consumer catching up to the producer at the fraction of the reference rate
CAUGHT_UP_DEPTH = 2_000  # queued messages (two producer windows) at or below which the consumer has caught up
IDLE_GOAL = 0.9  # least rate with idle connections / without
STUCK_AFTER = 15.0  # seconds of an empty queue with producers still held after which the alarm is taken as stuck
EXTRA_CONNECTIONS = 10  # the connection limits stand this far above the idle connections
READY_TIMEOUT = 60.0
ALARM_EVENT = "memory alarm: producers get no more credit"
CLEAR_EVENT = "memory alarm cleared: credit flows again"


def start_node(name: str, logs: Path, *extra: str) -> tuple[Service, int]:
    port = free_port()
    argv = [sys.executable, "-m", "hastandby", "serve", "--listen", f"{LOOPBACK}:{port}", "--log-format", "json",
            *_auth.users().serve_arguments(), *extra]
    service = Service(name, argv, logs / f"{name}.log", cwd=REPO_ROOT, env=python_env())
    try:
        service.wait_ready(LOOPBACK, port, READY_TIMEOUT, _auth.users().connect_options())
    except BaseException:
        service.stop()
        raise
    return service, port


def management(port: int) -> ManagementClient:
    return ManagementClient(f"{LOOPBACK}:{port}", timeout=10, login=_auth.users().login())


def statm_rss(pid: int) -> int:
    """Resident bytes of one process, from /proc/PID/statm (what the node itself samples, for itself)."""
    with open(f"/proc/{pid}/statm", "rb") as statm:
        return int(statm.read().split()[1]) * PAGE


def log_events(path: Path, *events: str) -> list[tuple[float, str]]:
    """(epoch seconds, event) of the node's JSON log lines with one of ``events``."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") in events and "timestamp" in record:
            stamp = datetime.fromisoformat(str(record["timestamp"]))
            found.append((stamp.timestamp(), str(record["event"])))
    return found


# -- part watermark ----------------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Calls ``sample()`` every ``interval`` s until stopped; keeps (wall time, value) pairs and the first error."""

    def __init__(self, interval: float, sample: Any) -> None:
        super().__init__(daemon=True)
        self.interval, self.sample = interval, sample
        self.samples: list[tuple[float, Any]] = []
        self.error: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._stop_event.is_set():
            try:
                self.samples.append(self.sample())
            except Exception as error:  # noqa: BLE001 - a sampler must not die silently; the figure says why
                self.error = self.error or f"{type(error).__name__}: {error}"
            next_at += self.interval
            self._stop_event.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


def _query_sample(client: ManagementClient, queue: str) -> dict[str, Any]:
    before = time.time()
    reply = client.request("QUERY")
    after = time.time()
    mine = next((q for q in reply.get("queues", []) if q.get("name") == queue), None)
    stats = (mine or {}).get("stats", {})
    memory = reply.get("memory", {})
    return {"t": (before + after) / 2, "request_ms": (after - before) * 1e3,
            "enqueued": stats.get("enqueued", 0), "dequeued": stats.get("dequeued", 0),
            "depth": (mine or {}).get("depth", 0), "resident": memory.get("resident"),
            "alarm": memory.get("alarm"), "blocked": memory.get("producers_blocked"),
            "heap_in_use": memory.get("heap_in_use"), "heap_free": memory.get("heap_free")}


def enqueued_at(timeline: list[dict[str, Any]], t: float) -> float:
    """The enqueue counter at wall time ``t``, interpolated between QUERY samples."""
    if not timeline or t <= timeline[0]["t"]:
        return timeline[0]["enqueued"] if timeline else 0.0
    for a, b in itertools.pairwise(timeline):
        if a["t"] <= t <= b["t"]:
            span = b["t"] - a["t"]
            return a["enqueued"] + (b["enqueued"] - a["enqueued"]) * ((t - a["t"]) / span if span else 1.0)
    return timeline[-1]["enqueued"]


class Consumer(threading.Thread):
    """Drains ``total`` messages with the C ``receive-bench``: one run, or successive runs of ``batch`` each.

    ``receive-bench`` grants its whole count as credit at once; ``batch``
    bounds what the node may push to it ahead of its acknowledgements.
    """

    def __init__(self, port: int, queue: str, total: int, batch: int, env: dict[str, str], timeout: float) -> None:
        super().__init__(daemon=True)
        self.port, self.queue, self.total, self.batch, self.env, self.timeout = port, queue, total, batch, env, timeout
        self.received = 0
        self.error: str | None = None
        self.done = False
        self._client: cexamples.Client | None = None
        self._stopped = False

    def run(self) -> None:
        try:
            while self.received < self.total and not self._stopped:
                count = min(self.batch or self.total, self.total - self.received)
                self._client = cexamples.start_receive(LOOPBACK, self.port, self.queue, count, env=self.env)
                try:
                    run = self._client.wait(self.timeout)
                except subprocess.TimeoutExpired as error:
                    self.error = f"receive-bench timed out after {error.timeout:.0f} s: {output_tail(error.output)}"
                    return
                got = cexamples.received_count(run)
                if run.returncode != 0 or got != count:
                    self.error = f"receive-bench exit {run.returncode}, {got} of {count}: {output_tail(run.stdout)}"
                    return
                self.received += count
        finally:
            self.done = True

    def stop(self) -> None:
        """Kill the running ``receive-bench`` (by its PID, from this thread: ``run`` collects it) and wait."""
        self._stopped = True
        client = self._client
        if client is not None and client.process.poll() is None:
            client.process.kill()
        if self.is_alive():
            self.join(30)


def _concurrent_reference(client: ManagementClient, port: int, count: int, batch: int, env: dict[str, str],
                          body_size: int, timeout: float) -> dict[str, Any]:
    """The producer's rate with the same consumer draining alongside and no alarm (the queue stays short):
    what the node can give a producer while it also serves the consumer, the fair level to recover to."""
    queue = f"ref-{uuid.uuid4().hex[:8]}"
    client.request("CREATE", "queue", queue)
    consumer = Consumer(port, queue, count, batch, env, timeout)
    consumer.start()
    sender = cexamples.start_send(LOOPBACK, port, queue, count, body_size, env=env)
    try:
        sent = sender.wait(timeout)
        consumer.join(timeout)
    finally:
        sender.kill()
        consumer.stop()
    ok = sent.returncode == 0 and cexamples.sent_count(sent) == count and consumer.received == count
    return {"messages": count, "ok": ok, "producer_msg_per_s": count / sent.elapsed if ok else None,
            "error": None if ok else f"sender: {output_tail(sent.stdout)}; consumer: {consumer.error}"}


def _wait_for_both(result: dict[str, Any], sender: cexamples.Client, receiver: Consumer, timeline: Sampler,
                   timeout: float) -> None:
    """Until the sender and the consumer are done; not past ``timeout``, nor once the alarm stays on for
    ``STUCK_AFTER`` s with the queue empty (producers held, nothing left to free: it will not clear)."""
    deadline = time.monotonic() + timeout
    empty_and_held_since = None
    while time.monotonic() < deadline:
        if sender.process.poll() is not None and receiver.done:
            return
        last = timeline.samples[-1] if timeline.samples else None
        if last is not None and last["blocked"] and last["depth"] == 0 and last["enqueued"]:
            empty_and_held_since = empty_and_held_since or time.monotonic()
            if time.monotonic() - empty_and_held_since > STUCK_AFTER:
                result["stuck"] = {key: last[key] for key in ("resident", "heap_in_use", "heap_free", "enqueued")}
                result["problems"].append(
                    f"the alarm did not clear: the queue has been empty for {STUCK_AFTER:.0f} s with producers "
                    f"held, the node resident at {last['resident'] / MiB:.0f} MiB (low watermark "
                    f"{result['low_watermark_bytes'] / MiB:.0f} MiB); {last['enqueued']:,} of "
                    f"{result['messages']:,} sent")
                return
        else:
            empty_and_held_since = None
        time.sleep(0.1)
    result["problems"].append(f"the sender and consumer were not done within {timeout:.0f} s")


def analyse_watermark(result: dict[str, Any], timeline: list[dict[str, Any]], alarms: list[tuple[float, str]],
                      consumer_started: float, fraction: float) -> None:
    """Rates before the alarm and after it clears, from the enqueue timeline and the node's alarm log lines."""
    raised = [t for t, event in alarms if event == ALARM_EVENT]
    cleared = [t for t, event in alarms if event == CLEAR_EVENT and t >= consumer_started]
    result["alarms_raised"] = len(raised)
    if not raised:
        result["problems"].append("the memory alarm was never raised: more --messages, or a lower --watermark")
        return
    t_alarm = raised[0]
    started = next((s["t"] for s in timeline if s["enqueued"] > 0), None)
    if started is None or t_alarm - started < 0.2:
        result["problems"].append("too short a run before the alarm to take the producer's rate")
        return
    before = (enqueued_at(timeline, t_alarm) - enqueued_at(timeline, started)) / (t_alarm - started)
    result["rate_before_alarm"] = before
    result["enqueued_at_alarm"] = enqueued_at(timeline, t_alarm)
    result["seconds_to_alarm"] = t_alarm - started
    if not cleared:
        if "stuck" not in result:
            result["problems"].append("the alarm never cleared after the consumer started")
        return
    t_clear = cleared[0]
    result["held_s"] = t_clear - t_alarm
    result["consumer_to_clear_s"] = t_clear - consumer_started
    end = timeline[-1]["t"]
    total = result["messages"]
    result["rate_first_second_after_clear"] = (
        (enqueued_at(timeline, t_clear + 1.0) - enqueued_at(timeline, t_clear)) if t_clear + 1.0 <= end else None)
    finished = next((s["t"] for s in timeline if s["enqueued"] >= total), None)
    if finished is not None and finished > t_clear:  # the rest of the run, the consumer draining alongside
        result["rate_after_clear"] = (total - enqueued_at(timeline, t_clear)) / (finished - t_clear)
    result["recovered_after_s"], result["rate_when_recovered"], note = _recovery(
        timeline, t_clear, fraction * before, total)
    if note:
        result["notes"].append(f"{note} {fraction:.0%} of the rate before the alarm")
    reference = (result.get("concurrent_reference") or {}).get("producer_msg_per_s")
    if reference:
        result["recovered_after_s_vs_concurrent"], _, note = _recovery(timeline, t_clear, fraction * reference, total)
        if note:
            result["notes"].append(f"{note} {fraction:.0%} of the rate with a consumer and no alarm")
        caught_up = next((s["t"] for s in timeline if s["t"] >= t_clear and s["depth"] <= CAUGHT_UP_DEPTH), None)
        if caught_up is None:
            result["problems"].append("the consumer never caught up with the producer after the clear")
            return
        result["consumer_caught_up_after_clear_s"] = caught_up - t_clear
        result["recovered_after_catch_up_s"], result["rate_when_recovered_after_catch_up"], note = _recovery(
            timeline, caught_up, fraction * reference, total)
        if note:
            result["notes"].append(f"after the catch-up, {note} {fraction:.0%} of the rate with a consumer")


def _recovery(timeline: list[dict[str, Any]], t_clear: float, threshold: float,
              total: int) -> tuple[float | None, float | None, str | None]:
    """Seconds from ``t_clear`` to the first moment from which the producer sends at ``threshold`` msg/s or more
    for RECOVERY_WINDOW; with the rate then, or a note saying why there is none."""
    end = timeline[-1]["t"]
    for sample in timeline:
        t = max(sample["t"], t_clear)
        if sample["t"] < t_clear - QUERY_INTERVAL or t + RECOVERY_WINDOW > end:
            continue
        if enqueued_at(timeline, t + RECOVERY_WINDOW) >= total:
            return None, None, "the producer finished before it reached"
        rate = (enqueued_at(timeline, t + RECOVERY_WINDOW) - enqueued_at(timeline, t)) / RECOVERY_WINDOW
        if rate >= threshold:
            return t - t_clear, rate, None
    return None, None, "the producer's rate never came back to"


def watermark_part(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    high = parse_watermark(args.watermark)
    messages = args.messages or 2 * high // max(1, args.body_size)
    result: dict[str, Any] = {"watermark_bytes": high, "low_watermark_bytes": int(high * LOW_FRACTION),
                              "slack_bytes": args.slack, "body_size": args.body_size, "messages": messages,
                              "recovery_fraction": args.recovery_fraction, "hold_s": args.hold,
                              "consumer_batch": args.consumer_batch, "ok": False, "problems": [], "notes": []}
    queue = f"wm-{uuid.uuid4().hex[:8]}"
    env = _auth.users().client_environment()
    timeout = 60.0 + messages / MIN_RATE
    print(f"watermark {args.watermark} ({high / MiB:.0f} MiB): {messages:,} x {args.body_size}-byte messages, "
          f"no consumer until held", flush=True)
    service, port = start_node("watermark", logs, "--memory-high-watermark", args.watermark)
    sender = receiver = None
    rss = timeline = None
    client = None
    try:
        result["rss_at_start"] = statm_rss(service.pid)
        client = management(port)
        client.request("CREATE", "queue", queue)
        rss = Sampler(RSS_INTERVAL, lambda: (time.time(), statm_rss(service.pid)))
        timeline = Sampler(QUERY_INTERVAL, partial(_query_sample, client, queue))
        rss.start()
        timeline.start()
        sender = cexamples.start_send(LOOPBACK, port, queue, messages, args.body_size, env=env)

        def held() -> bool:
            recent = timeline.samples[-1] if timeline.samples else None
            return sender.process.poll() is not None or bool(recent and recent["blocked"])
        if not wait_until(held, timeout):
            raise RuntimeError(f"no memory alarm within {timeout:.0f} s")
        if sender.process.poll() is not None:
            raise RuntimeError(f"the sender finished before the alarm (exit {sender.process.returncode}): "
                               "more --messages, or a lower --watermark")

        def standing_still() -> bool:
            window = [s for s in timeline.samples if s["t"] >= time.time() - 1.0]
            return len(window) >= 5 and window[-1]["enqueued"] == window[0]["enqueued"]
        if not wait_until(standing_still, 30):
            result["problems"].append("the enqueue counter kept moving for 30 s after the alarm")
        stalled = timeline.samples[-1]["enqueued"]
        time.sleep(args.hold)
        result["enqueued_while_held"] = timeline.samples[-1]["enqueued"] - stalled
        result["enqueued_when_held"] = stalled
        result["consumer_started"] = time.time()
        receiver = Consumer(port, queue, messages, args.consumer_batch, env, timeout)
        receiver.start()
        _wait_for_both(result, sender, receiver, timeline, timeout)
        if sender.process.poll() is None:
            sender.process.kill()  # stuck or late: the problem is recorded; its count is what it printed
        sent = sender.wait(10)
        receiver.stop()
        result["sent_acknowledged"] = cexamples.sent_count(sent)
        result["received"] = receiver.received
        if sent.returncode != 0 or result["sent_acknowledged"] != messages:
            result["problems"].append(f"sender exit {sent.returncode}: {output_tail(sent.stdout)}")
        if receiver.error or receiver.received != messages:
            result["problems"].append(f"receiver: {receiver.received:,} of {messages:,} received; {receiver.error}")
        time.sleep(3 * QUERY_INTERVAL)  # a last sample or two after the end
        if not result["problems"]:
            result["concurrent_reference"] = _concurrent_reference(client, port, messages // 4, args.consumer_batch,
                                                                   env, args.body_size, timeout)
            if not result["concurrent_reference"]["ok"]:
                result["problems"].append(f"reference run: {result['concurrent_reference']['error']}")
    except subprocess.TimeoutExpired as error:
        result["problems"].append(f"a client timed out after {error.timeout:.0f} s: {output_tail(error.output)}")
    except (RuntimeError, ManagementError, OSError) as error:
        result["problems"].append(f"{type(error).__name__}: {error}")
    finally:
        for sampler in (rss, timeline):
            if sampler is not None:
                sampler.stop()
        if sender is not None:
            sender.kill()
        if receiver is not None:
            receiver.stop()
        final = None
        if client is not None:
            try:
                final = _query_sample(client, queue)
            except ManagementError:
                pass
            client.close()
        service.stop()
    for sampler, name in ((rss, "rss"), (timeline, "query")):
        if sampler is not None and sampler.error:
            result["problems"].append(f"{name} sampler: {sampler.error}")
    if final is not None:
        result["depth_at_end"] = final["depth"]
        result["enqueued_at_end"], result["dequeued_at_end"] = final["enqueued"], final["dequeued"]
        if final["depth"] != 0:
            result["problems"].append(f"{final['depth']} messages left on the queue")
    samples = timeline.samples if timeline is not None else []
    rss_samples = rss.samples if rss is not None else []
    if rss_samples:
        # The goal is about the producer alone (until the consumer starts); the drain's own peak is kept apart.
        consumer_at = result.get("consumer_started", float("inf"))
        alone = [v for t, v in rss_samples if t < consumer_at]
        result["peak_rss"] = max(alone) if alone else None
        result["peak_rss_whole_run"] = max(v for _, v in rss_samples)
        if result["peak_rss"] is not None:
            result["peak_over_watermark_bytes"] = result["peak_rss"] - high
            result["peak_within_goal"] = result["peak_rss"] <= high + args.slack
    if samples and "consumer_started" in result:
        analyse_watermark(result, samples, log_events(service.log_path, ALARM_EVENT, CLEAR_EVENT),
                          result["consumer_started"], args.recovery_fraction)
        recovered = result.get("recovered_after_catch_up_s")
        result["recovery_within_goal"] = recovered is not None and recovered <= RECOVERY_GOAL_S
    t0 = samples[0]["t"] if samples else 0.0
    result["query_ms_p50"] = nearest_rank([s["request_ms"] for s in samples], 50)
    result["timeline"] = [{**s, "t": round(s["t"] - t0, 3)} for s in samples]
    result["rss_timeline"] = [(round(t - t0, 3), v) for t, v in rss_samples]
    result["t0_epoch"] = t0
    result["ok"] = not result["problems"]
    return result


def print_watermark(r: dict[str, Any]) -> None:
    print(f"\nmemory high watermark {r['watermark_bytes'] / MiB:.0f} MiB (low {r['low_watermark_bytes'] / MiB:.0f} MiB), "
          f"{r['messages']:,} x {r['body_size']} bytes, no consumer until held")
    peak = r.get("peak_rss")
    if peak is not None:
        verdict = "met" if r.get("peak_within_goal") else "MISSED"
        print(f"  peak resident          {peak / MiB:8.1f} MiB with the producer alone "
              f"({(peak - r['watermark_bytes']) / MiB:+.1f} MiB over the watermark; goal within "
              f"+{r['slack_bytes'] / MiB:.0f} MiB: {verdict}); {r['rss_at_start'] / MiB:.1f} MiB at start, "
              f"{r['peak_rss_whole_run'] / MiB:.1f} MiB at most while draining too")
    if "rate_before_alarm" in r:
        print(f"  before the alarm       {r['rate_before_alarm']:10,.0f} msg/s for {r['seconds_to_alarm']:.1f} s "
              f"({r['enqueued_at_alarm']:,.0f} queued); {fmt(r.get('enqueued_while_held'), ',')} more in the "
              f"{r['hold_s']:.0f} s held before the consumer started")
    if "consumer_to_clear_s" in r:
        print(f"  alarm cleared          {r['consumer_to_clear_s']:.2f} s after the consumer started "
              f"({r['held_s']:.1f} s after it was raised); {r['alarms_raised']} alarm(s) in all")
        first = r.get("rate_first_second_after_clear")
        print(f"  back to {r['recovery_fraction']:.0%} of the rate  "
              f"{fmt(r.get('recovered_after_s'), '.2f')} s after the clear (the rate before the alarm, "
              f"without a consumer); {fmt(first, ',.0f')} msg/s in the first second, "
              f"{fmt(r.get('rate_after_clear'), ',.0f')} msg/s from the clear to the last message "
              f"(the consumer draining alongside)")
    print(f"  messages               {fmt(r.get('sent_acknowledged'), ',')} acknowledged, "
          f"{fmt(r.get('received'), ',')} received (C clients' counts); the node: "
          f"{fmt(r.get('enqueued_at_end'), ',')} in, {fmt(r.get('dequeued_at_end'), ',')} out, "
          f"{r.get('depth_at_end', '-')} left; QUERY p50 {fmt(r.get('query_ms_p50'), '.1f')} ms")
    reference = r.get("concurrent_reference")
    if reference:
        print(f"  reference              {fmt(reference['producer_msg_per_s'], ',.0f')} msg/s: the producer with the "
              f"consumer alongside and no alarm ({reference['messages']:,} messages); back to "
              f"{r['recovery_fraction']:.0%} of that {fmt(r.get('recovered_after_s_vs_concurrent'), '.2f')} s "
              f"after the clear")
        verdict = "met" if r.get("recovery_within_goal") else "MISSED"
        print(f"  recovery               the consumer caught up (<= {CAUGHT_UP_DEPTH:,} queued) "
              f"{fmt(r.get('consumer_caught_up_after_clear_s'), '.2f')} s after the clear; the producer at "
              f"{r['recovery_fraction']:.0%} of the reference {fmt(r.get('recovered_after_catch_up_s'), '.2f')} s "
              f"after that (goal <= {RECOVERY_GOAL_S:.0f} s: {verdict})")
    for note in r["notes"]:
        print(f"  note: {note}")
    for problem in r["problems"]:
        print(f"  *** {problem}")


# -- part idle: connections held open by a helper process --------------------------------------------


def raise_fd_limit(needed: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit (children inherit it); error if under ``needed``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft < needed:
        raise RuntimeError(f"{needed} file descriptors needed, the limit is {soft} (ulimit -n)")
    return soft


def hold_connections(port: int, count: int, parallel: int) -> int:
    """The helper process: open ``count`` PLAIN connections, report, then obey stdin ("probe N", "close")."""
    raise_fd_limit(count + 100)
    user, password = os.environ["HASTANDBY_USER"], os.environ["HASTANDBY_PASSWORD"]
    held: list[Any] = []
    lock = threading.Lock()
    failures: list[str] = []

    def say(**fields: Any) -> None:
        print(json.dumps(fields), flush=True)

    def open_one(index: int) -> None:
        if failures:
            return
        try:
            connection = RawConnection(LOOPBACK, port, PlainSaslClient(user, password, hostname="localhost"),
                                       container=f"idle-{index}")
        except (RawConnectionError, OSError) as error:
            failures.append(f"connection {index}: {type(error).__name__}: {error}")
            return
        with lock:
            held.append(connection.sock)  # only the socket: the engine is never needed again
            if len(held) % 1000 == 0:
                say(event="progress", opened=len(held), elapsed_s=time.monotonic() - started)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(open_one, range(count)))
    say(event="opened", opened=len(held), elapsed_s=time.monotonic() - started, failures=failures[:5])
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["probe"]:
            opened, refused = 0, None
            for index in range(int(words[1])):
                try:
                    connection = RawConnection(LOOPBACK, port, PlainSaslClient(user, password, hostname="localhost"),
                                               container=f"probe-{index}")
                    connection.linger(0.3)  # a refused connection is opened, then closed at once
                except (RawConnectionError, OSError) as error:
                    refused = str(error)
                    break
                held.append(connection.sock)
                opened += 1
            say(event="probe", opened=opened, refused=refused)
        elif words[:1] == ["close"]:
            break
    for sock in held:
        sock.close()
    say(event="closed", closed=len(held))
    return 0


class Holder:
    """The helper process holding idle connections, and the lines it reports (read by a thread)."""

    def __init__(self, port: int, count: int, parallel: int, logs: Path) -> None:
        argv = [sys.executable, "-m", "benchmarks.overload", "--hold-connections", "--port", str(port),
                "--idle-connections", str(count), "--parallel", str(parallel)]
        self.stderr = open(logs / "holder.stderr", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(argv, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, text=True,
                                        env={**python_env(), **_auth.users().client_environment()})
        self.lines: queue_module.Queue[dict[str, Any]] = queue_module.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                continue

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the connection holder did not report {event!r} within {timeout:.0f} s")
            try:
                line = self.lines.get(timeout=min(remaining, 1.0))
            except queue_module.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the connection holder exited ({self.process.returncode}) before "
                                       f"{event!r}") from None
                continue
            if line.get("event") == event:
                return line
            if line.get("event") == "progress":
                print(f"  idle connections: {line['opened']:,} open after {line['elapsed_s']:.1f} s", flush=True)

    def tell(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is None:
            try:
                self.tell("close")
                self.process.stdin.close()  # type: ignore[union-attr]
                self.process.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout)
        self.stderr.close()


def idle_part(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    count = args.idle_connections
    limit = count + EXTRA_CONNECTIONS
    raise_fd_limit(count + 200)  # the node inherits it
    options = ["--heartbeat", "0", "--limit", f"connections={limit}", "--limit", f"connections_per_user={limit}"]
    result: dict[str, Any] = {"idle_connections": count, "limit": limit, "node_options": options,
                              "count": args.count, "ok": False, "problems": [], "runs": []}
    settings = Settings(count=args.count, runs=args.runs, body_size=100, out=args.out, skip_rss=True,
                        rss_messages=1, targets=[])
    print(f"\nidle connections: {count:,} on one node (limit {limit}), a producer of {args.count:,} x 100 bytes "
          f"against it and against a node without, {args.runs} rounds", flush=True)
    nodes: dict[str, tuple[Service, int]] = {}
    holder = None
    try:
        for name in ("bare", "idle"):
            nodes[name] = start_node(f"idle-part-{name}", logs, *options)
        idle_service, idle_port = nodes["idle"]
        result["rss_before"] = statm_rss(idle_service.pid)
        cpu_before = idle_service.cpu_seconds()
        holder = Holder(idle_port, count, args.parallel, logs)
        opened = holder.expect("opened", 60.0 + count * 0.05)
        result["opened"] = opened["opened"]
        result["open_elapsed_s"] = opened["elapsed_s"]
        result["open_node_cpu_ms_per_connection"] = (idle_service.cpu_seconds() - cpu_before) / max(1, count) * 1e3
        if opened["failures"] or opened["opened"] != count:
            result["problems"].append(f"{count - opened['opened']} connections failed: {opened['failures']}")
        print(f"  {opened['opened']:,} idle connections open in {opened['elapsed_s']:.1f} s "
              f"({result['open_node_cpu_ms_per_connection']:.2f} ms node CPU each)", flush=True)
        with management(idle_port) as client:
            result["node_connections"] = client.request("STATUS")["connections"]
        time.sleep(1.0)
        result["rss_with_idle"] = statm_rss(idle_service.pid)
        for name, (service, _) in nodes.items():  # what a node does with nothing to do
            before = service.cpu_seconds()
            time.sleep(args.idle_seconds)
            result[f"cpu_percent_at_rest_{name}"] = (service.cpu_seconds() - before) / args.idle_seconds * 100
        for round_no in range(1, args.runs + 1):
            for name in (("bare", "idle") if round_no % 2 else ("idle", "bare")):
                service, port = nodes[name]
                queue = f"p-{uuid.uuid4().hex[:8]}"
                run = Run(round_no, name, "send", queue, args.count)
                measure_phase(run, service, partial(PHASES["send"], settings, port, queue,
                                               _auth.users().client_environment()))
                print_run(run, args.runs)
                result["runs"].append(vars(run))
                with management(port) as client:
                    client.request("DELETE", "queue", queue)
        holder.tell(f"probe {EXTRA_CONNECTIONS + 5}")
        probe = holder.expect("probe", 60.0)
        result["probe"] = probe
        if probe["refused"] is None:
            result["problems"].append(f"no refusal after {probe['opened']} connections above {count}")
        print(f"  beyond the limit: {probe['opened']} more opened, then refused: {probe['refused']}", flush=True)
    except (RuntimeError, TimeoutError, ManagementError, OSError) as error:
        result["problems"].append(f"{type(error).__name__}: {error}")
    finally:
        if holder is not None:
            holder.stop()
        for service, _ in nodes.values():
            service.stop()
    rates = {name: [r["msg_per_s"] for r in result["runs"] if r["target"] == name and r["ok"]]
             for name in ("bare", "idle")}
    cpu = {name: [r["cpu_us_per_msg"] for r in result["runs"] if r["target"] == name and r["ok"]]
           for name in ("bare", "idle")}
    result["medians"] = {name: {"msg_per_s": median_or_none(rates[name]), "cpu_us_per_msg": median_or_none(cpu[name])}
                         for name in rates}
    result["ratio_idle_to_bare"] = ratio(result["medians"]["idle"]["msg_per_s"], result["medians"]["bare"]["msg_per_s"])
    result["goal_met"] = result["ratio_idle_to_bare"] is not None and result["ratio_idle_to_bare"] >= IDLE_GOAL
    failed = [r for r in result["runs"] if not r["ok"]]
    if failed:
        result["problems"].append(f"{len(failed)} producer runs failed")
    result["ok"] = not result["problems"]
    return result


def print_idle(r: dict[str, Any]) -> None:
    print(f"\nidle connections: {r.get('opened', 0):,} of {r['idle_connections']:,} held open "
          f"(limit {r['limit']}, --heartbeat 0)")
    if "open_elapsed_s" in r:
        print(f"  opening them           {r['open_elapsed_s']:.1f} s ({r['open_elapsed_s'] / max(1, r['opened']) * 1e3:.2f} "
              f"ms each, {r['open_node_cpu_ms_per_connection']:.2f} ms node CPU each); node reports "
              f"{r.get('node_connections', '-')} connections")
    if "rss_with_idle" in r:
        per = (r["rss_with_idle"] - r["rss_before"]) / max(1, r["opened"])
        print(f"  node resident          {r['rss_before'] / MiB:.1f} MiB -> {r['rss_with_idle'] / MiB:.1f} MiB "
              f"({per / 1e3:.1f} kB per connection)")
    if "cpu_percent_at_rest_idle" in r:
        print(f"  node CPU at rest       {r['cpu_percent_at_rest_idle']:.1f} % with them, "
              f"{r['cpu_percent_at_rest_bare']:.1f} % without")
    m = r["medians"]
    verdict = "met" if r["goal_met"] else "MISSED"
    print(f"  producer (median)      {fmt(m['idle']['msg_per_s'], ',.0f')} msg/s "
          f"({fmt(m['idle']['cpu_us_per_msg'], '.1f')} us/msg) with, {fmt(m['bare']['msg_per_s'], ',.0f')} msg/s "
          f"({fmt(m['bare']['cpu_us_per_msg'], '.1f')} us/msg) without: x{fmt(r['ratio_idle_to_bare'], '.2f')} "
          f"(goal >= {IDLE_GOAL}: {verdict})")
    if "probe" in r:
        print(f"  beyond the limit       {r['probe']['opened']} more opened, then: {r['probe']['refused']}")
    for problem in r["problems"]:
        print(f"  *** {problem}")


# -- main ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)} (default all)")
    parser.add_argument("--watermark", default="256MB", help="the node's --memory-high-watermark (default 256MB)")
    parser.add_argument("--body-size", type=int, default=1024, help="watermark part: message bytes (default 1024)")
    parser.add_argument("--messages", type=int, default=0,
                        help="watermark part: messages sent (default: twice the watermark in bodies)")
    parser.add_argument("--slack", default="32MB", help="watermark part: allowed peak above the watermark (32MB)")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds producers stay held before the consumer")
    parser.add_argument("--consumer-batch", type=int, default=0,
                        help="watermark part: drain with successive receive-bench runs of this many messages "
                             "(default 0: one run taking them all; it grants its whole count as credit at once)")
    parser.add_argument("--recovery-fraction", type=float, default=0.8,
                        help="share of the rate before the alarm that counts as recovered (default 0.8)")
    parser.add_argument("--idle-connections", type=int, default=10_000, help="idle part: connections held (10000)")
    parser.add_argument("--parallel", type=int, default=8, help="idle part: connections opened at once (default 8)")
    parser.add_argument("--count", type=int, default=100_000, help="idle part: producer messages per run (100000)")
    parser.add_argument("--runs", type=int, default=3, help="idle part: producer rounds, alternating (default 3)")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="idle part: seconds of node CPU at rest")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    parser.add_argument("--hold-connections", action="store_true", help=argparse.SUPPRESS)  # the helper process
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hold_connections:
        return args
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown or not args.parts:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    try:
        parse_watermark(args.watermark)
        args.slack = parse_watermark(args.slack)
    except ValueError as error:
        parser.error(str(error))
    if (min(args.body_size, args.idle_connections, args.parallel, args.count, args.runs) < 1
            or min(args.messages, args.consumer_batch) < 0):
        parser.error("sizes and counts must be positive")
    if not 0 < args.recovery_fraction <= 1:
        parser.error("--recovery-fraction is a share: 0 < F <= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.hold_connections:
        return hold_connections(args.port, args.idle_connections, args.parallel)
    command = shlex.join([sys.executable, "-m", "benchmarks.overload", *(sys.argv[1:] if argv is None else argv)])
    cexamples.build("send-bench")
    cexamples.build("receive-bench")
    started = datetime.now(UTC)
    host_at_start, code_at_start = host_info(), uncommitted_changes()
    logs = Path(tempfile.mkdtemp(prefix="overload-logs-"))
    print(f"overload: parts {', '.join(args.parts)}; node logs in {logs}", flush=True)
    report: dict[str, Any] = {
        "benchmark": "overload",
        "command": command,
        "started_utc": started.isoformat(timespec="seconds"),
        "host": host_at_start,
        "node_code": code_at_start,
        "parameters": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()
                       if key not in ("hold_connections", "port")},
        "goals": {"peak_rss": "watermark + slack", "recovery_s": RECOVERY_GOAL_S, "idle_ratio": IDLE_GOAL},
    }
    interrupted = False
    undo = interrupt_on_sigterm()
    try:
        if "watermark" in args.parts:
            report["watermark"] = watermark_part(args, logs)
            print_watermark(report["watermark"])
        if "idle" in args.parts:
            report["idle"] = idle_part(args, logs)
            print_idle(report["idle"])
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: every process started was stopped", flush=True)
    finally:
        undo()
    report["interrupted"] = interrupted
    report["duration_s"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    failed = interrupted or any(not report[part]["ok"] for part in PARTS if part in report)
    report["failed"] = failed
    if host_info().get("git_commit") != host_at_start.get("git_commit") or uncommitted_changes() != code_at_start:
        report["node_code_changed_during_run"] = True
        print("WARNING: the node code changed during the run", flush=True)
    path = write_report(args.out, "overload", started, report)
    print(f"\nresults: {path}")
    if failed:
        print(f"*** NOT EVERY FIGURE WAS TAKEN, OR MESSAGES WERE LOST; see above and the node logs in {logs} ***",
              flush=True)
        return 1
    shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
