"""One schedule's trace, in the failover-trace format (``docs/failover-traces.md``) with the nemesis events.

A nemesis trace is a valid version-1 trace, so that the dashboards' reader
takes it as it is: one ``round_start`` (fault ``nemesis``), exactly one
``fault_injected`` (the schedule's first fault), exactly one ``tally``, the
events the v1 analysis reads (elections, promotions, reconnects, ``acks``),
and ``round_end``.  What v1 has no words for goes into events a v1 reader
ignores (unknown events are ignored): ``nemesis`` (one per op, with ``op``
and ``node``), ``replica_check`` (one per replica comparison), ``checker``
(the total-queue verdict), ``node_state`` (what the status pollers saw) and
``node_log`` (warnings and errors the nodes logged).  The names of the v1
events and fields come from ``spark_analysis.trace_schema``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hastandby.testing.netns_cluster import Cluster
from hastandby.testing.netns_workload import History
from hastandby.testing.nodes import read_node_log
from spark_analysis import trace_schema as ts

FAULT_NEMESIS = "nemesis"  # round_start's `fault` of a nemesis trace
NEMESIS = "nemesis"  # one op: op, node, target, result, t_end, ...
REPLICA_CHECK = "replica_check"  # primary, backups, mismatches, missing, differing, extra, diffs
CHECKER = "checker"  # the total-queue verdict's counts, replica_mismatches, lost_ids
NODE_STATE = "node_state"  # a node's STATUS changed: node, state, detail, term, primary
NODE_LOG = "node_log"  # a warning or error a node logged: node, level, message, fields
HARNESS = "harness"
SAMPLE = 20  # ids listed in a checker line
NODE_LOG_LIMIT = 200  # node_log lines per node (a partition makes some nodes log every second)


class Trace:
    """The lines of one schedule's trace, collected as it runs and written at the end."""

    def __init__(self, round_id: str) -> None:
        self.round_id = round_id
        self.start: dict[str, Any] | None = None
        self.lines: list[dict[str, Any]] = []
        self.t_fault: float | None = None
        self.faulted_node: str | None = None

    def line(self, t: float, event: str, src: str = HARNESS, **fields: Any) -> dict[str, Any]:
        line = {ts.ROUND: self.round_id, ts.T: round(t, 6), ts.EVENT: event, ts.SRC: src, **fields}
        self.lines.append(line)
        return line

    def round_start(self, t: float, run_id: str, schedule: Any, node_ids: list[str], lease_ttl: float,
                    load_msg_s: float, **extra: Any) -> None:
        self.start = {ts.ROUND: self.round_id, ts.T: round(t, 6), ts.EVENT: ts.ROUND_START, ts.SRC: HARNESS,
                      ts.SCHEMA: ts.SCHEMA_VERSION, ts.RUN: run_id, ts.FAULT: FAULT_NEMESIS,
                      ts.LEASE_TTL_S: float(lease_ttl), ts.NODES: len(node_ids), ts.NODE_IDS: node_ids,
                      ts.LOAD_MSG_S: float(load_msg_s), "schedule": schedule.name, "seed": schedule.seed,
                      "faults": list(schedule.faults), "ops": [str(op) for op in schedule.ops], **extra}

    def nemesis(self, t: float, op: str, node: str | None, result: str, t_end: float, **fields: Any) -> None:
        """One op; the first fault that took effect is also the round's ``fault_injected``."""
        self.line(t, NEMESIS, op=op, node=node, result=result, t_end=round(t_end, 6), **fields)
        if self.t_fault is None and result == "ok" and op in FAULT_OPS:
            self.t_fault, self.faulted_node = t, node
            self.line(t, ts.FAULT_INJECTED, **{ts.NODE: node}, op=op,
                      **({ts.PID: fields["pid"]} if isinstance(fields.get("pid"), int) else {}))

    def write(self, path: Path) -> Path:
        """Round start first, round end last, the rest in time order."""
        assert self.start is not None, "round_start not written"
        end = {ts.ROUND: self.round_id, ts.T: round(max([self.start[ts.T], *(x[ts.T] for x in self.lines)]), 6),
               ts.EVENT: ts.ROUND_END, ts.SRC: HARNESS}
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as out:
            for line in [self.start, *sorted(self.lines, key=lambda x: x[ts.T]), end]:
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
        return path


FAULT_OPS = ("kill9", "kill9-all", "sigstop", "sigterm", "partition", "promote", "disk-fail", "rot")


def add_cluster_events(trace: Trace, cluster: Cluster, until: float) -> list[str]:
    """Elections, promotions, backups (from the node logs) and STATUS changes; returns node problems."""
    problems: list[str] = []
    for node in cluster.nodes.values():
        for seen in node.poller.history:
            if seen.t < until:
                status = seen.status or {}
                trace.line(seen.t, NODE_STATE, **{ts.NODE: node.node_id}, state=status.get("state"),
                           detail=status.get("detail"), term=status.get("term"), primary=status.get("primary"))
        logged = 0
        for entry in read_node_log(node.log_path):
            t, name = entry["_t"], entry["event"]
            if t >= until:
                break
            if name == "won election" and "term" in entry:
                trace.line(t, ts.ELECTION_WON, node.node_id, **{ts.NODE: node.node_id, ts.TERM: int(entry["term"])})
            elif name == "state change":
                before, now = str(entry.get("previous", "")), str(entry.get("now", ""))
                if now.startswith("primary") and not before.startswith("primary"):
                    trace.line(t, ts.PROMOTED, node.node_id, **{ts.NODE: node.node_id}, now=now,
                               trigger=entry.get("trigger"))
                elif before.startswith("primary") and not now.startswith("primary"):
                    trace.line(t, "stepped_down", node.node_id, **{ts.NODE: node.node_id}, now=now,
                               trigger=entry.get("trigger"))
            elif name == "backup connected" and entry.get("backup"):
                trace.line(t, ts.BACKUP_REATTACHED, node.node_id, **{ts.NODE: str(entry["backup"])}, to=node.node_id)
            elif name == "backup ready" and entry.get("backup"):
                trace.line(t, ts.BACKUP_CAUGHT_UP, node.node_id, **{ts.NODE: str(entry["backup"])}, to=node.node_id)
            level = entry.get("level")
            if level in ("warning", "error", "critical") and logged < NODE_LOG_LIMIT:
                logged += 1
                fields = {k: v for k, v in entry.items() if k not in ("event", "timestamp", "_t", "level")}
                trace.line(t, NODE_LOG, node.node_id, **{ts.NODE: node.node_id}, level=level, message=name,
                           fields=fields)
                if level != "warning" or "lineage" in name or "diverged" in name:
                    problems.append(f"{node.node_id} {entry['timestamp']} {level}: {name} {json.dumps(fields)}")
    return problems


def add_client_events(trace: Trace, history: History, t0: float, node_of: dict[str, str]) -> None:
    """Reconnects, ``acks`` per 100 ms from t0, and the first acceptance after the first fault.

    The first acceptance after the fault counts only on a URL that names a
    node: one through the virtual IP may still come on the faulted node's
    connection.
    """
    links: dict[str, int] = {}
    buckets: dict[int, int] = {}
    first_after = None
    producers = {e["c"] for e in history.events if e["e"] == "attempt"}
    for event in history.events:
        kind, t = event["e"], event["t"]
        client = ts.PRODUCER if event["c"] in producers else ts.CONSUMER
        node = node_of.get(event.get("url", ""), event.get("url"))
        if kind == "link":
            links[event["c"]] = links.get(event["c"], 0) + 1
            if links[event["c"]] > 1:
                trace.line(t, ts.CLIENT_RECONNECTED, client, **{ts.CLIENT: client, ts.NODE: node},
                           name=event["c"], link=event.get("link"))
        elif kind == "accepted":
            k = int((t - t0) * 1000 // ts.ACK_BUCKET_MS)
            buckets[k] = buckets.get(k, 0) + 1
            if (first_after is None and trace.t_fault is not None and t >= trace.t_fault
                    and event.get("url") in node_of and node != trace.faulted_node):
                first_after = event
                trace.line(t, ts.FIRST_ACCEPTED_AFTER_FAULT, ts.PRODUCER, **{ts.CLIENT: ts.PRODUCER, ts.NODE: node},
                           id=event.get("id"), observed="harness, from the producers' history")
    if buckets:
        first, last = min(buckets), max(buckets)
        for k in range(first, last + 1, 10):
            counts = [buckets.get(i, 0) for i in range(k, min(k + 10, last + 1))]
            trace.line(t0 + (k + len(counts)) * ts.ACK_BUCKET_MS / 1000, ts.ACKS, ts.PRODUCER,
                       **{ts.K: k, ts.N: counts})
