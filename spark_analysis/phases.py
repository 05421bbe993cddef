"""The failover phases and round metrics: one definition for job, charts and tests.

A *milestone* is the first event of a kind at or after the round's fault
(``docs/failover-traces.md`` says why "at or after": the same kinds of event
also occur while the cluster forms, before the fault).  A *phase* is the time
between two milestones.  The five sequential phases add up exactly to the
total unavailability of the round, which is what the stacked chart shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spark_analysis import trace_schema as ts

FAULT = ts.FAULT_INJECTED
"""The milestone all others are measured from."""

MILESTONES = (
    ts.LEADER_KEY_GONE,
    ts.ELECTION_WON,
    ts.PROMOTED,
    ts.CLIENT_RECONNECTED,
    ts.FIRST_ACCEPTED_AFTER_FAULT,
    ts.BACKUP_REATTACHED,
    ts.BACKUP_CAUGHT_UP,
)


@dataclass(frozen=True)
class Phase:
    """Time from milestone ``start`` to milestone ``end``, as summary column ``column`` (ms)."""

    column: str
    label: str
    start: str
    end: str


DETECTION = Phase("detection_ms", "detection", FAULT, ts.LEADER_KEY_GONE)
ELECTION = Phase("election_ms", "election", ts.LEADER_KEY_GONE, ts.ELECTION_WON)
PROMOTION = Phase("promotion_ms", "promotion", ts.ELECTION_WON, ts.PROMOTED)
RECONNECT = Phase("reconnect_ms", "client reconnect", ts.PROMOTED, ts.CLIENT_RECONNECTED)
FIRST_SEND = Phase(
    "first_send_ms", "first accepted send", ts.CLIENT_RECONNECTED, ts.FIRST_ACCEPTED_AFTER_FAULT
)
UNAVAILABILITY = Phase(
    "unavailability_ms", "total unavailability", FAULT, ts.FIRST_ACCEPTED_AFTER_FAULT
)
REATTACH = Phase("reattach_ms", "backup re-attach", ts.PROMOTED, ts.BACKUP_REATTACHED)
CATCH_UP = Phase("catch_up_ms", "backup catch-up", ts.BACKUP_REATTACHED, ts.BACKUP_CAUGHT_UP)

SEQUENTIAL = (DETECTION, ELECTION, PROMOTION, RECONNECT, FIRST_SEND)
"""Back-to-back phases from the fault to the first accepted send."""

PHASES = SEQUENTIAL + (UNAVAILABILITY, REATTACH, CATCH_UP)

BACK_TO_STEADY_MS = "back_to_steady_ms"
"""Fault -> start of the first of 3 consecutive buckets at >= 90 % of steady rate, but not
before the first accepted send (a burst of acks can fill the bucket that send falls in)."""

DURATION_COLUMNS = tuple(p.column for p in PHASES) + (BACK_TO_STEADY_MS,)
"""Every per-round duration (ms) that gets count/percentiles/max aggregates."""

DURATION_LABELS = {p.column: p.label for p in PHASES} | {BACK_TO_STEADY_MS: "back to steady rate"}

# Throughput-dip definition (``docs/dashboards.md`` explains it to operators).
BASELINE_BUCKETS = 20
"""Steady rate = mean acks per bucket over the 20 buckets (2 s) before the fault's bucket."""
STEADY_NUMERATOR, STEADY_DENOMINATOR = 9, 10
"""A bucket is "at steady rate" when it holds >= 9/10 of the steady rate."""
STEADY_RUN = 3
"""Consecutive at-steady-rate buckets that count as being back to steady rate."""

PERCENTILES = (25, 50, 75, 90, 99)
"""Nearest-rank percentiles computed for every duration column."""


def nearest_rank(values: Iterable[float], percent: int) -> float | None:
    """The project's one percentile rule, for code without Spark (the benchmarks).

    For n values sorted ascending, the value at 1-based rank ceil(p * n / 100),
    computed in integers; ``aggregates.nearest_rank`` is the same rule on an array
    column.  It is always an observed value, so tests can compare it exactly.
    """
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[(percent * len(ordered) + 99) // 100 - 1]


def phase_name(phase: Phase) -> str:
    """A phase's key where durations are not in ms: its column without the unit."""
    return phase.column.removesuffix("_ms")


def durations(milestones: Mapping[str, float | None]) -> dict[str, float | None]:
    """Every phase of one round, from its milestones (times after the fault, any unit).

    The Spark job computes the same phases in columns; the failover benchmark
    reports them from this, so both come from the definitions above.  A phase
    whose start or end the round never reached is None.
    """
    at = {FAULT: 0.0, **milestones}
    out: dict[str, float | None] = {}
    for phase in PHASES:
        start, end = at.get(phase.start), at.get(phase.end)
        out[phase_name(phase)] = None if start is None or end is None else round(end - start, 6)
    return out

CONFIG_COLUMNS = (ts.FAULT, ts.LEASE_TTL_S, ts.NODES, ts.LOAD_MSG_S)
"""The dimensions rounds are grouped by in the aggregates."""

