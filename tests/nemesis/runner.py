"""One schedule from start to verdict: network, cluster, workload, ops, final phase, drain, checker, trace.

The phases, each bounded:

1. a network of namespaces, etcd and three nodes (holding a virtual IP if the schedule says so; each on an
   ext4 file system of its own if it has disk faults); the replicated queue;
2. the clients process (background load unless the schedule scripts its own; with a virtual IP, one more
   producer that knows only it);
3. the schedule's ops (``executor.py``), replica checks among them;
4. the final phase: heal every partition, resume frozen nodes, restart dead
   ones, wait for one primary with every other node its backup, compare the
   replicas once more;
5. the producers stop (settling what is in doubt, bounded), the consumers
   close, then a drain through every node's URL until nothing comes for a
   while, and the queue's depth on the primary afterwards (must be 0: the
   checker's precondition is a fully drained queue);
6. the total-queue checker over the history; the trace.

Whatever happens, the ``finally`` stops the clients, every node and etcd by
PID, unmounts the nodes' disks and detaches their loop devices (their data
dirs copied off first, for the logs), and deletes the network, in that order.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hastandby.client import ManagementClient, ManagementError
from hastandby.testing.checker import QueueVerdict, check_total_queue
from hastandby.testing.netns import Network
from hastandby.testing.netns_cluster import LEASE_TTL, QUEUE, Cluster
from hastandby.testing.netns_workload import History, Workload, drain
from spark_analysis import trace_schema as ts

from .executor import Executor
from .schedule import NODE_IDS, Schedule
from .trace import CHECKER, Trace, add_client_events, add_cluster_events

HOSTS = (*NODE_IDS, "etcd", "clients")


@dataclass(frozen=True)
class Settings:
    """Where a run puts its traces, and whether node logs are kept when nothing went wrong."""

    out: Path
    keep_logs: bool = False
    dedup_window: int = 0  # seconds: the queue is declared with x-dedup-window (docs/queues.md); 0: a plain queue

    @property
    def queue_kind(self) -> str:
        return "dedup" if self.dedup_window else "plain"

    @property
    def queue_arguments(self) -> dict[str, Any]:
        return {"x-dedup-window": self.dedup_window} if self.dedup_window else {}


def run_schedule(schedule: Schedule, run_id: str, settings: Settings) -> dict[str, Any]:
    """Run ``schedule`` on a fresh cluster; return its summary (the verdict's figures, checks, errors, paths)."""
    round_id = f"{run_id}-{schedule.name}" + ("-dedup" if settings.dedup_window else "")
    workdir = Path(tempfile.mkdtemp(prefix="nemesis-"))
    trace = Trace(round_id)
    started = time.time()
    error: str | None = None
    network: Network | None = None
    cluster: Cluster | None = None
    workload: Workload | None = None
    executor: Executor | None = None
    drained: dict[str, Any] = {}
    depth_after: int | None = None
    problems: list[str] = []
    t_teardown = None
    deduplicated: int | None = None
    try:
        network = Network(HOSTS)
        cluster = Cluster(network, list(NODE_IDS), workdir, cluster_name=round_id, virtual_ip=schedule.virtual_ip,
                          queue_arguments=settings.queue_arguments, disks=schedule.disks)
        cluster.start()
        workload = Workload(network["clients"], [n.url for n in cluster.nodes.values()], QUEUE, workdir,
                            cluster.users.client_environment())
        if schedule.load:
            workload.start_background(cluster.virtual_ip_url)
        trace.round_start(started, run_id, schedule, list(NODE_IDS), LEASE_TTL,
                          workload.offered_rate if schedule.load else 0.0, queue=QUEUE, cluster=round_id,
                          addresses={n.node_id: n.address for n in cluster.nodes.values()},
                          **({"virtual_ip": cluster.virtual_ip} if cluster.virtual_ip else {}))
        executor = Executor(cluster, network, workload, trace, random.Random(schedule.seed or schedule.name))
        executor.run(schedule.ops)
        primary = executor.undo_everything()
        if primary is None:
            error = f"the cluster did not settle after the schedule: {cluster.describe()}"
        else:
            executor.check(after="final")
        workload.finish()
        if cluster.primary() is None:  # nothing would answer the drain
            drained = {"received": 0, "complete": False, "skipped": "no primary"}
        else:
            live = [n.url for n in cluster.nodes.values() if n.running]
            drained = drain(live, QUEUE, workdir / "drain-history.jsonl", cluster.users.connect_options())
            depth_after = _depth(cluster)
            deduplicated = _deduplicated(cluster)
    except Exception as exc:  # noqa: BLE001 - the schedule fails with its error; the run goes on
        error = f"{type(exc).__name__}: {exc}"
    finally:  # also on KeyboardInterrupt: every process is stopped by PID, the network deleted
        t_teardown = time.time()
        if workload is not None:
            workload.stop()
        if cluster is not None:
            cluster.keep_etcd_log(workdir / "etcd.log")
            cluster.stop()
        if network is not None:
            network.close()
    if trace.start is None:  # failed before the load started
        trace.round_start(started, run_id, schedule, list(NODE_IDS), LEASE_TTL, 0.0, queue=QUEUE)
    history = History.read(workdir / "clients-history.jsonl", workdir / "drain-history.jsonl")
    crashed = [f"{e['c']}: {e.get('error')}" for e in history.events if e["e"] == "error"]
    if crashed and error is None:  # a client that cannot run the schedule is a defect of the test
        error = f"client failed: {'; '.join(crashed[:3])}"
    if workload is not None and workload.errors and error is None:
        error = f"clients process: {'; '.join(workload.errors[:3])}"
    verdict = check_total_queue(history.attempted, history.acknowledged, history.received)
    checks = executor.checks if executor is not None else []
    mismatches = sum(c["mismatches"] or 0 for c in checks)
    if cluster is not None:
        problems = add_cluster_events(trace, cluster, until=t_teardown)
        add_client_events(trace, history, started, {n.url: n.node_id for n in cluster.nodes.values()})
    complete = error is None and bool(drained.get("complete")) and depth_after == 0
    trace.line(time.time(), CHECKER, **verdict.counts(), replica_mismatches=mismatches,
               replica_checks=len(checks), drain_complete=complete, lost_ids=sorted(verdict.lost)[:20],
               unexpected_ids=sorted(verdict.unexpected)[:20])
    trace.line(time.time(), ts.TALLY, **{ts.SENT: verdict.attempted, ts.ACKNOWLEDGED: verdict.acknowledged,
                                        ts.RECEIVED: verdict.received, ts.LOST_ACKNOWLEDGED: len(verdict.lost),
                                        ts.DUPLICATED: verdict.duplicates})
    path = trace.write(settings.out / f"{round_id}{ts.TRACE_SUFFIX}")
    result = _summary(schedule, round_id, verdict, checks, mismatches, error, complete, drained, depth_after,
                      history, problems, executor, started, path)
    result["queue"] = settings.queue_kind
    result["dedup_window"] = settings.dedup_window
    result["deduplicated"] = deduplicated if settings.dedup_window else None
    # Which duplicates a re-send made (the id was attempted more than once: in doubt, or released) and which
    # a second delivery of one enqueued copy (attempted once): dedup can only remove the first kind.
    resent = {i for i, n in Counter(history.attempted).items() if n > 1}
    result["duplicated_resent"] = len(verdict.duplicated & resent)
    result["duplicated_redelivered"] = len(verdict.duplicated - resent)
    result["resent_ids"] = len(resent)
    result["disk_images"] = cluster.disks.images if cluster is not None and cluster.disks is not None else []
    result["logs"] = _keep_logs(result, settings, workdir, round_id)
    return result


def _deduplicated(cluster: Cluster) -> int | None:
    """The queue's ``deduplicated`` counts of every running node, summed: the re-sends each took as
    duplicates while it was primary (a backup never drops one; a node counts from its process start, so
    what a node killed later had counted is not in it).  None if no node answered."""
    total, answered = 0, False
    for node in cluster.nodes.values():
        if not node.running:
            continue
        try:
            with ManagementClient(node.address, timeout=5, login=cluster.admin) as client:
                queues = client.request("QUERY")["queues"]
        except ManagementError:
            continue
        stats = next((q.get("stats") or {} for q in queues if q["name"] == QUEUE), {})
        if stats.get("deduplicated") is not None:
            total, answered = total + int(stats["deduplicated"]), True
    return total if answered else None


def _depth(cluster: Cluster) -> int | None:
    """The queue's depth on the primary after the drain (None if there is no primary to ask)."""
    primary = cluster.primary()
    if primary is None:
        return None
    try:
        with ManagementClient(cluster.nodes[primary].address, timeout=5, login=cluster.admin) as client:
            queues = client.request("QUERY")["queues"]
    except ManagementError:
        return None
    return next((int(q["depth"]) for q in queues if q["name"] == QUEUE), None)


def _summary(schedule: Schedule, round_id: str, verdict: QueueVerdict, checks: list[dict[str, Any]],
             mismatches: int, error: str | None, complete: bool, drained: dict[str, Any], depth_after: int | None,
             history: History, problems: list[str], executor: Executor | None, started: float,
             trace_path: Path) -> dict[str, Any]:
    misplaced = sum(1 for c in checks if c.get("virtual_ip_misplaced"))
    violated = executor.violated if executor is not None else []
    ok = verdict.valid and mismatches == 0 and complete and not misplaced and not violated
    if not complete:
        status = "NO VERDICT"  # not drained: the lost figure counts acknowledged messages not received
    elif not verdict.valid:
        status = "INVALID"
    elif mismatches:
        status = "MISMATCH"
    elif violated:
        status = "VIOLATED"  # an assert op did not hold
    else:
        status = "VIP MISPLACED" if misplaced else "ok"
    return {
        "schedule": schedule.name,
        "seed": schedule.seed,
        "round": round_id,
        "faults": list(schedule.faults),
        "ops": [str(op) for op in schedule.ops],
        "ok": ok,
        "status": status,
        "valid": verdict.valid,
        "verdict": verdict.counts(),
        "verdict_text": str(verdict),
        "lost_ids": sorted(verdict.lost)[:50],
        "unexpected_ids": sorted(verdict.unexpected)[:50],
        "replica_mismatches": mismatches,
        "replica_checks": checks,
        "mismatched_checks": sum(1 for c in checks if c["mismatches"]),
        "virtual_ip_misplaced_checks": misplaced,
        "acknowledged_by_client": dict(sorted(Counter(i.rsplit("-", 1)[0] for i in set(history.acknowledged)).items())),
        "complete": complete,
        "drain": drained,
        "depth_after_drain": depth_after,
        "error": error,
        "skipped_ops": executor.skipped if executor is not None else [],
        "failed_ops": executor.failed if executor is not None else [],
        "timeout_ops": executor.timeouts if executor is not None else [],
        "violated": violated,
        "assertions": executor.assertions if executor is not None else [],
        "disks": schedule.disks,
        "client_events": {kind: history.count(kind) for kind in
                          ("in_doubt", "rejected", "released", "empty", "undecodable", "error", "link_error",
                           "container_restarted")},
        "node_problems": problems[:20],
        "duration_s": round(time.time() - started, 1),
        "trace": str(trace_path),
    }


def _keep_logs(result: dict[str, Any], settings: Settings, workdir: Path, round_id: str) -> str | None:
    """Copy the node, etcd and client logs (and the nodes' data dirs: journals, wiring) next to the traces
    if the schedule had a problem (or keep_logs)."""
    try:
        if result["ok"] and not settings.keep_logs:
            return None
        target = settings.out / "logs" / round_id
        target.mkdir(parents=True, exist_ok=True)
        for path in workdir.iterdir():
            if path.is_file():
                shutil.copy2(path, target / path.name)
            elif path.is_dir():
                shutil.copytree(path, target / path.name, dirs_exist_ok=True)
        return str(target)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
