"""Running cases of a kind and keeping score: crashes, hangs, losses, failures, distinct errors.

Case ``i`` of kind ``k`` with seed ``s`` draws everything from
``random.Random(f"{s}:{k}:{i}")``, so ``--seed s --start i --cases 1``
replays it (against fresh nodes: what earlier cases left behind is not
replayed).  After every case:

- every node of the kind must still run (else a **crash**; the nodes are
  started again);
- the kind's checks (``checks.reference``: PING, reference producer and
  consumer) must pass within their bound (a timeout is a **hang**, the nodes
  are started again; a message accepted and not received back is a **loss**);
- the nodes' logs must hold no failure (``node.classify``).

A case with any of these is a *failing case*; its description, the node's
answer and the log records are kept (the first ``KEEP_FAILING`` of each kind,
and every crash, hang and loss up to ``KEEP_SERIOUS``, which are also
printed as they happen).
"""

from __future__ import annotations

import collections
import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from .base import CaseRecord, Kind, segments_hex
from .node import LogFinding

KEEP_FAILING = 20  # failing cases kept in the tally (for the report), and beyond them
KEEP_SERIOUS = 200  # crashes, hangs and losses
DISTINCT_LIMIT = 200
EXIT_GRACE = 2.0  # seconds a node whose checks failed may take to exit (then it is a crash, not a hang)


@dataclass
class Failing:
    index: int
    reasons: list[str]
    description: list[str]
    conditions: list[str]
    log: list[str]
    segments: list[str] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"case": self.index, "reasons": self.reasons, "description": self.description,
                "conditions": self.conditions[:20], "log": self.log[:10], "segments": self.segments}


@dataclass
class Tally:
    """What one kind's run found."""

    kind: str
    seed: int
    cases: int = 0
    crashes: int = 0
    hangs: int = 0
    losses: int = 0  # acknowledged messages lost
    lost_messages: int = 0
    conjured: int = 0
    verified: int = 0  # acknowledged replicated messages checked present afterwards (backup, dr-replica)
    failures: int = 0  # cases with an unhandled error in the log (or a check that failed otherwise)
    harness_errors: int = 0
    seconds: float = 0.0
    restarts: int = 0
    failing: list[Failing] = field(default_factory=list)
    failure_signatures: collections.Counter = field(default_factory=collections.Counter)
    contained: collections.Counter = field(default_factory=collections.Counter)
    errors: collections.Counter = field(default_factory=collections.Counter)
    refusals: collections.Counter = field(default_factory=collections.Counter)
    conditions: collections.Counter = field(default_factory=collections.Counter)
    check_seconds: float = 0.0

    failing_cases: int = 0  # every failing case (``failing`` keeps the first KEEP_FAILING)

    def as_dict(self) -> dict[str, Any]:
        def top(counter: collections.Counter) -> dict[str, int]:
            return dict(counter.most_common(DISTINCT_LIMIT))

        return {
            "kind": self.kind, "seed": self.seed, "cases": self.cases, "crashes": self.crashes, "hangs": self.hangs,
            "losses": self.losses, "lost_messages": self.lost_messages, "conjured": self.conjured,
            "verified": self.verified,
            "failures": self.failures, "failing_cases": self.failing_cases, "harness_errors": self.harness_errors,
            "restarts": self.restarts, "seconds": round(self.seconds, 1),
            "check_seconds_mean": round(self.check_seconds / self.cases, 4) if self.cases else None,
            "failure_signatures": top(self.failure_signatures), "contained_refusals": top(self.contained),
            "errors": top(self.errors), "refusals": top(self.refusals), "conditions": top(self.conditions),
            "failing": [f.as_dict() for f in self.failing],
        }


def _wait_for_exit(nodes: list[Any], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and all(node.alive() for node in nodes):
        time.sleep(0.05)


def _count(counter: collections.Counter, key: str) -> None:
    if key in counter or len(counter) < DISTINCT_LIMIT * 5:
        counter[key] += 1


class Runner:
    """Runs one kind's cases, in order, and keeps its tally."""

    def __init__(self, kind: Kind, seed: int, verbose: bool = False, progress: int = 0) -> None:
        self.kind = kind
        self.seed = seed
        self.verbose = verbose
        self.progress = progress  # print a line every this many cases (0: never)
        self.tally = Tally(kind.name, seed)

    def run(self, cases: int, start: int = 0, deadline: float | None = None) -> Tally:
        started = time.monotonic()
        tally = self.tally
        for index in range(start, start + cases):
            if deadline is not None and time.monotonic() > deadline:
                break
            self.run_one(index)
            if self.progress and tally.cases % self.progress == 0:
                print(f"  {kind_progress(tally, time.monotonic() - started)}", flush=True)
        tally.seconds += time.monotonic() - started
        return tally

    def run_one(self, index: int) -> list[str]:
        """One case and its checks; returns why it failed (empty: it passed)."""
        kind, tally = self.kind, self.tally
        rng = random.Random(f"{self.seed}:{kind.name}:{index}")
        reasons: list[str] = []
        try:
            record = kind.run_case(rng, index)
        except Exception as error:  # noqa: BLE001 - our bug, or a node that answered in a way we did not expect
            tally.harness_errors += 1
            record = CaseRecord()
            record.note(f"harness error: {type(error).__name__}: {error}")
            record.conditions.append(traceback.format_exc(limit=6))
        tally.cases += 1
        for condition in record.conditions:
            _count(tally.conditions, condition.split("\n")[0][:160])
        checked = time.monotonic()
        check = None
        dead = [node for node in kind.nodes.nodes if not node.alive()]
        if not dead:
            check = kind.check(record)
            if record.hang or not check.ok:  # a node that is going down may still be exiting: give it a moment
                _wait_for_exit(kind.nodes.nodes, EXIT_GRACE)
            dead = [node for node in kind.nodes.nodes if not node.alive()]
        tally.check_seconds += time.monotonic() - checked
        findings: list[tuple[str, LogFinding]] = []
        for node in kind.nodes.nodes:
            findings += [(node.name, f) for f in node.findings()]
        if dead:
            tally.crashes += 1
            reasons.append("crash: " + ", ".join(f"{n.name} exited with {n.returncode()}" for n in dead))
        elif record.hang:
            tally.hangs += 1
            reasons.append(f"hang: {record.hang}")
        elif check is not None and not check.ok:
            if check.hang:
                tally.hangs += 1
                reasons.append(f"hang: {check.error}")
            elif check.lost:
                reasons.append(f"loss: {check.error}")
            else:
                reasons.append(f"check failed: {check.error}")
        if check is not None and check.lost:
            tally.losses += 1
            tally.lost_messages += check.lost
        tally.verified += record.verified
        if record.lost:
            tally.losses += 1
            tally.lost_messages += record.lost
            reasons.append(f"loss: {record.loss}")
        if check is not None:
            tally.conjured += check.conjured
        log_lines = []
        for node_name, finding in findings:
            if finding.verdict == "failure":
                _count(tally.failure_signatures, finding.signature)
                log_lines.append(f"{node_name}: {finding.excerpt()}")
            elif finding.verdict == "contained":
                _count(tally.contained, finding.signature)
            elif finding.verdict == "error":
                _count(tally.errors, finding.signature)
            else:
                _count(tally.refusals, finding.signature)
        if log_lines:
            reasons.append(f"unhandled error logged: {len(log_lines)} record(s)")
        if any(r.startswith(("unhandled", "check failed")) for r in reasons):
            tally.failures += 1
        if record.description and record.description[0].startswith("harness error"):
            reasons.append(record.description[0])
        if reasons:
            tally.failing_cases += 1
            serious = any(r.startswith(("crash", "hang", "loss", "harness")) for r in reasons)
            if len(tally.failing) < KEEP_FAILING or (serious and len(tally.failing) < KEEP_SERIOUS):
                tally.failing.append(Failing(index, reasons, record.description, record.conditions,
                                             log_lines or [f"{n.name}: {n.tail(1500)}" for n in dead],
                                             _segments(record)))
            if self.verbose or serious:
                print(f"  {kind.name} case {index}: {'; '.join(reasons)}", flush=True)
                for line in record.description[:8]:
                    print(f"      {line}", flush=True)
                for line in record.conditions[:3] if record.description[:1] and \
                        record.description[0].startswith("harness error") else []:
                    print(f"      {line}", flush=True)
                for line in log_lines[:3]:
                    print(f"      log: {line[:600]}", flush=True)
        if dead or record.hang or (check is not None and (check.hang or not check.ok)):
            tally.restarts += 1
            kind.recover()
        return reasons


def kind_progress(tally: Tally, seconds: float) -> str:
    return (f"{tally.kind}: {tally.cases} cases, {seconds:.0f} s: {tally.crashes} crashes, {tally.hangs} hangs, "
            f"{tally.losses} losses, {tally.failing_cases} failing")


def _segments(record: CaseRecord) -> list[str] | None:
    """A failing case's bytes, kept when small enough to paste into a regression test."""
    if record.segments is None or sum(len(s) for s in record.segments if isinstance(s, bytes)) > 16384:
        return None
    return segments_hex(record.segments)


def table(tallies: list[Tally]) -> str:
    """The summary: one row per kind."""
    header = ["kind", "cases", "crashes", "hangs", "losses", "failures", "failing", "harness", "verified",
              "contained", "errors", "refusals", "conditions", "seconds"]
    rows = [header]
    for t in tallies:
        rows.append([t.kind, str(t.cases), str(t.crashes), str(t.hangs), str(t.losses), str(t.failures),
                     str(t.failing_cases), str(t.harness_errors), str(t.verified), str(len(t.contained)), str(len(t.errors)),
                     str(len(t.refusals)), str(len(t.conditions)), f"{t.seconds:.0f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fuzz(kind_name: str, cases: int, seed: int, directory: Any, start: int = 0, verbose: bool = False) -> Tally:
    """Start ``kind_name``'s nodes in ``directory``, run ``cases`` cases from ``seed``, stop the nodes."""
    from hastandby.testing.auth import users

    from .kinds import KINDS

    kind = KINDS[kind_name](directory, users())
    try:
        kind.setup()
        return Runner(kind, seed, verbose=verbose).run(cases, start)
    finally:
        kind.teardown()


def report(tally: Tally) -> str:
    """A failing tally in words, for an assertion message."""
    lines = [table([tally])]
    for failing in tally.failing:
        lines.append(f"case {failing.index} (seed {tally.seed}): {'; '.join(failing.reasons)}")
        lines += [f"    {line}" for line in failing.description[:12]]
        lines += [f"    log: {line[:1200]}" for line in failing.log[:2]]
    return "\n".join(lines)
