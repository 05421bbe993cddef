"""Aggregates of the per-round summary by fault type, lease TTL, node count and load.

Percentiles are *nearest-rank*: for n values sorted ascending, the p-th
percentile is the value at 1-based rank ceil(p * n / 100), computed in
integers as (p * n + 99) div 100.  It is always one of the observed values,
so it can be checked for exact equality, and it needs no interpolation
choice.  Nulls (a phase a round never reached) are left out of that phase's
count and percentiles; ``unrecovered`` counts the rounds without a first
accepted send after the fault.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_analysis import phases as ph
from spark_analysis import round_metrics as rm
from spark_analysis import trace_schema as ts

ROUNDS = "rounds"
UNRECOVERED = "unrecovered"
LOSSY_ROUNDS = "rounds_losing_acknowledged"
LOSSY_SHARE = "share_losing_acknowledged"
STATS = ("count", "min") + tuple(f"p{p}" for p in ph.PERCENTILES) + ("max",)


def stat_column(duration: str, stat: str) -> str:
    """Name of an aggregate column, e.g. ``unavailability_ms_p99``."""
    return f"{duration}_{stat}"


def nearest_rank(sorted_values: Column, percent: int) -> Column:
    """The nearest-rank ``percent`` percentile of an ascending array column."""
    n = F.size(sorted_values)
    # (p*n + 99) / 100 is never within 0.01 of the next integer unless it is one,
    # so the floor of the double quotient is the exact integer division.
    rank = F.floor((n * percent + 99) / 100).cast("int")
    return F.when(n > 0, F.element_at(sorted_values, rank))


def by_configuration(summary: DataFrame) -> DataFrame:
    """One row per (fault, lease TTL, nodes, load) with ``STATS`` of every duration."""
    lost = F.col(ts.LOST_ACKNOWLEDGED)
    grouped = summary.groupBy(*ph.CONFIG_COLUMNS).agg(
        F.count(F.lit(1)).alias(ROUNDS),
        F.count(F.when(~F.col(rm.RECOVERED), F.lit(1))).alias(UNRECOVERED),
        F.count(F.when(lost > 0, F.lit(1))).alias(LOSSY_ROUNDS),
        F.sum(lost).alias(ts.LOST_ACKNOWLEDGED),
        F.sum(ts.DUPLICATED).alias(ts.DUPLICATED),
        *[F.array_sort(F.collect_list(d)).alias(d) for d in ph.DURATION_COLUMNS],
    )
    stats = []
    for d in ph.DURATION_COLUMNS:
        values = F.col(d)
        stats.append(F.size(values).alias(stat_column(d, "count")))
        stats.append(F.array_min(values).alias(stat_column(d, "min")))
        stats += [nearest_rank(values, p).alias(stat_column(d, f"p{p}")) for p in ph.PERCENTILES]
        stats.append(F.array_max(values).alias(stat_column(d, "max")))
    return grouped.select(
        *ph.CONFIG_COLUMNS,
        ROUNDS,
        UNRECOVERED,
        LOSSY_ROUNDS,
        (F.col(LOSSY_ROUNDS) / F.col(ROUNDS)).alias(LOSSY_SHARE),
        ts.LOST_ACKNOWLEDGED,
        ts.DUPLICATED,
        *stats,
    ).orderBy(*ph.CONFIG_COLUMNS)
