"""Per-round figures: phase durations, throughput dip, message tally.

Everything here is Spark SQL expressions over whole DataFrames (no Python
UDFs, no per-round ``collect``), so the same code runs on ``local[*]`` and on
a cluster.  Times are compared in whole microseconds: two unix-epoch doubles
written with 6 decimals differ by their true difference within 0.25 µs, so
rounding the difference to whole µs recovers it exactly, and a duration in
ms is that integer / 1000.

A round is *rejected* (kept out of every figure, reported with file and
line) when it cannot be interpreted or trusted: no or several
``round_start``, ``fault_injected`` or ``tally`` events, several ``checker``
events (or none in a nemesis round), its lines spread over several files,
or a malformed line in its file.  A round that never
recovered is *not* rejected: its missing milestones are nulls and it counts
as unrecovered.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_analysis import nemesis as nm
from spark_analysis import phases as ph
from spark_analysis import trace_schema as ts
from spark_analysis.ingest import FILE, LINE, REASON

BUCKET_US = ts.ACK_BUCKET_MS * 1000
NEW_PRIMARY = "new_primary"
STEADY = "steady_acks_per_100ms"
DIP_MIN = "dip_min_acks_per_100ms"
RECOVERED = "recovered"
FAULT_BUCKET = "fault_bucket"
FAULT_OFFSET_US = "fault_offset_us"
BUCKET = "k"
ACKED = "c"

START_EXTRA = (ts.RUN, ts.SCHEDULE, ts.SEED, ts.SCHEDULE_FAULTS)
"""``round_start`` fields kept besides the configuration (the nemesis's table shows them)."""

SUMMARY_COLUMNS = (
    (ts.ROUND, FILE) + ph.CONFIG_COLUMNS + (ts.PRIMARY, NEW_PRIMARY)
    + ph.DURATION_COLUMNS + (STEADY, DIP_MIN) + ts.TALLY_FIELDS + (RECOVERED,)
)


@dataclass(frozen=True)
class RoundTables:
    """``summary``: one row per accepted round, columns ``SUMMARY_COLUMNS``.

    ``rejected``: ``file``, ``line`` (the round's first line), ``round``, ``reason``
    and ``fault`` (its ``round_start``'s, if it has exactly one).
    ``timing``: ``round``, ``fault_bucket``, ``fault_offset_us``, ``k_lo``,
    ``k_hi`` for every accepted round, input to :func:`bucket_series`.
    ``nemesis``: one row per accepted nemesis round, columns ``nemesis.NEMESIS_COLUMNS``.
    ``nemesis_ops``: every op of those rounds (``nemesis.ops_table``).
    """

    summary: DataFrame
    rejected: DataFrame
    timing: DataFrame
    nemesis: DataFrame
    nemesis_ops: DataFrame


def micros_between(earlier: Column, later: Column) -> Column:
    """Whole microseconds from ``earlier`` to ``later`` (unix-epoch seconds)."""
    return F.round((later - earlier) * 1_000_000).cast("long")


def _of(event: str, value: Column) -> Column:
    return F.when(F.col(ts.EVENT) == event, value)


def summarize_rounds(events: DataFrame, malformed: DataFrame) -> RoundTables:
    """Per-round summary of the well-formed trace lines ``events``.

    A trace file holds one round, so a malformed line (``malformed``, with
    ``file``) rejects the round of its file: its figures could be wrong.
    """
    t = F.col(ts.T)
    stamped = F.struct(t.alias("t"), F.col(ts.NODE).alias("node"))
    per_round = events.groupBy(ts.ROUND).agg(
        F.min(F.struct(FILE, LINE)).alias("first"),
        F.max(FILE).alias("last_file"),
        F.count(_of(ts.ROUND_START, F.lit(1))).alias("n_start"),
        F.min(_of(ts.ROUND_START, F.struct(
            t.alias("t"), *[F.col(c) for c in ph.CONFIG_COLUMNS + (ts.PRIMARY,) + START_EXTRA]
        ))).alias("start"),
        F.count(_of(ts.FAULT_INJECTED, F.lit(1))).alias("n_fault"),
        F.min(_of(ts.FAULT_INJECTED, t)).alias("t_fault"),
        F.count(_of(ts.TALLY, F.lit(1))).alias("n_tally"),
        F.max(_of(ts.TALLY, F.struct(*ts.TALLY_FIELDS))).alias("tally"),
        F.min(_of(ts.ACKS, F.col(ts.K))).alias("k_lo"),
        F.max(_of(ts.ACKS, F.col(ts.K) + F.size(ts.N) - 1)).alias("k_hi"),
        *[F.collect_list(_of(m, stamped)).alias(m) for m in ph.MILESTONES],
    )

    def count_problem(column: str, event: str) -> Column:
        n = F.col(column)
        return F.when(n == 0, F.lit(f"no {event} event")).when(
            n > 1, F.concat(n.cast("string"), F.lit(f" {event} events"))
        )

    reason = F.concat_ws(
        "; ",
        count_problem("n_start", ts.ROUND_START),
        count_problem("n_fault", ts.FAULT_INJECTED),
        count_problem("n_tally", ts.TALLY),
        *nm.rejection_reasons(),
        F.when(F.col("first.file") != F.col("last_file"), F.lit("round spread over several files")),
        F.when(F.col("bad_lines") > 0,
               F.concat(F.col("bad_lines").cast("string"), F.lit(" malformed lines in its file"))),
    )
    bad_lines = malformed.groupBy(F.col(FILE).alias("bad_file")).agg(
        F.count("*").alias("bad_lines")
    )
    # Materialised once: the summary, the rejected rounds and the bucket grid all read it.
    checked = (
        nm.join_per_round(per_round, nm.per_round(events))
        .join(bad_lines, F.col("first.file") == F.col("bad_file"), "left")
        .withColumn(REASON, reason)
        .localCheckpoint()
    )
    rejected = checked.where(F.col(REASON) != "").select(
        F.col("first.file").alias(FILE), F.col("first.line").alias(LINE), ts.ROUND, REASON,
        F.when(F.col("n_start") == 1, F.col(f"start.{ts.FAULT}")).alias(ts.FAULT),
    )

    t_fault = F.col("t_fault")
    reached = {ph.FAULT: F.struct(t_fault.alias("t"), F.lit(None).cast("string").alias("node"))}
    for m in ph.MILESTONES:
        reached[m] = F.array_min(F.filter(m, lambda s: s["t"] >= t_fault))
    durations = [
        (micros_between(reached[p.start]["t"], reached[p.end]["t"]) / 1000).alias(p.column)
        for p in ph.PHASES
    ]
    fault_offset = micros_between(F.col("start.t"), t_fault)
    accepted_rounds = checked.where(F.col(REASON) == "")
    accepted = accepted_rounds.select(
        ts.ROUND,
        F.col("first.file").alias(FILE),
        *[F.col(f"start.{c}").alias(c) for c in ph.CONFIG_COLUMNS + (ts.PRIMARY,)],
        reached[ts.PROMOTED]["node"].alias(NEW_PRIMARY),
        *durations,
        *[F.col(f"tally.{c}").alias(c) for c in ts.TALLY_FIELDS],
        reached[ts.FIRST_ACCEPTED_AFTER_FAULT].isNotNull().alias(RECOVERED),
        fault_offset.alias(FAULT_OFFSET_US),
        F.floor(fault_offset / BUCKET_US).cast("long").alias(FAULT_BUCKET),
        "k_lo",
        "k_hi",
    )
    timing = accepted.select(ts.ROUND, FAULT_BUCKET, FAULT_OFFSET_US, "k_lo", "k_hi")
    dips = throughput_dips(bucket_series(events, timing))
    summary = accepted.join(dips, ts.ROUND, "left").select(
        *[c for c in SUMMARY_COLUMNS if c not in (ph.BACK_TO_STEADY_MS, STEADY, DIP_MIN)],
        _back_to_steady().alias(ph.BACK_TO_STEADY_MS),
        STEADY,
        DIP_MIN,
    ).select(*SUMMARY_COLUMNS)
    return RoundTables(summary, rejected, timing, nm.rounds_table(accepted_rounds),
                       nm.ops_table(accepted_rounds))


def _back_to_steady() -> Column:
    """``BACK_TO_STEADY_MS`` from the columns of the summary joined with the dips.

    0 if the rate never dipped, null if it never came back (or is unknown).
    """
    recovery_start = (F.col("recovery_bucket") * BUCKET_US - F.col(FAULT_OFFSET_US)) / 1000
    return (
        F.when(F.col(STEADY).isNull(), F.lit(None).cast("double"))
        .when(F.col("dip_start").isNull(), F.lit(0.0))
        .when(F.col("recovery_bucket").isNotNull(),
              F.greatest(recovery_start, F.col(ph.UNAVAILABILITY.column)))
    )


def bucket_series(events: DataFrame, timing: DataFrame) -> DataFrame:
    """Acks per bucket, zeros filled in, from 2 s before the fault's bucket.

    Columns ``round``, ``k``, ``c`` (acks in bucket k) and ``fault_bucket``.
    Buckets the producer did not report count as 0; the last reported bucket
    is left out because the producer stopped part-way through it.  Rounds
    without 2 s of acks before the fault get no rows (no steady rate known).
    """
    first = F.col(FAULT_BUCKET) - ph.BASELINE_BUCKETS
    grid = timing.where((first >= F.col("k_lo")) & (F.col("k_hi") > F.col(FAULT_BUCKET))).select(
        ts.ROUND,
        F.explode(F.sequence(first, F.col("k_hi") - 1)).alias(BUCKET),
        F.lit(0).cast("long").alias(ACKED),
        FAULT_BUCKET,
    )
    reported = events.where(F.col(ts.EVENT) == ts.ACKS).select(
        ts.ROUND, ts.K, F.posexplode(ts.N).alias("i", ACKED)
    ).select(
        ts.ROUND,
        (F.col(ts.K) + F.col("i")).alias(BUCKET),
        ACKED,
        F.lit(None).cast("long").alias(FAULT_BUCKET),
    )
    # Partitioned by round once: the sum per bucket, the windows and the
    # per-round aggregate of throughput_dips then need no further shuffle.
    return (
        grid.unionByName(reported)
        .repartition(ts.ROUND)
        .groupBy(ts.ROUND, BUCKET)
        .agg(F.sum(ACKED).alias(ACKED), F.max(FAULT_BUCKET).alias(FAULT_BUCKET))
        .where(F.col(FAULT_BUCKET).isNotNull())
    )


def throughput_dips(buckets: DataFrame) -> DataFrame:
    """Steady rate, dip minimum and recovery bucket of every round in ``buckets``.

    Steady rate: mean acks per bucket over the ``BASELINE_BUCKETS`` buckets
    before the fault's bucket.  A bucket is *ok* if it holds at least 9/10 of
    that (compared in integers, so exactly).  The dip starts at the first
    bucket from the fault's bucket on that is not ok; the recovery bucket is
    the first after the dip start that begins a run of ``STEADY_RUN`` ok
    buckets.  The dip minimum is the fewest acks in a bucket from the fault's
    bucket up to (not including) the recovery bucket.
    """
    k, c, kf = F.col(BUCKET), F.col(ACKED), F.col(FAULT_BUCKET)
    whole = Window.partitionBy(ts.ROUND)
    ordered = whole.orderBy(BUCKET)
    baseline_sum = F.sum(F.when(k < kf, c)).over(whole)
    with_ok = buckets.select(
        ts.ROUND, BUCKET, ACKED, FAULT_BUCKET,
        baseline_sum.alias("baseline_sum"),
        (c * ph.BASELINE_BUCKETS * ph.STEADY_DENOMINATOR
         >= baseline_sum * ph.STEADY_NUMERATOR).alias("ok"),
    )
    ok = F.col("ok")
    run_ok = ok
    for step in range(1, ph.STEADY_RUN):
        run_ok = run_ok & F.lead(ok, step).over(ordered)
    with_dip = with_ok.select(
        "*",
        F.min(F.when((k >= kf) & ~ok, k)).over(whole).alias("dip_start"),
        run_ok.alias("run_ok"),
    )
    with_recovery = with_dip.select(
        "*",
        F.min(F.when((k > F.col("dip_start")) & F.col("run_ok"), k)).over(whole)
        .alias("recovery_bucket"),
    )
    recovery = F.col("recovery_bucket")
    return with_recovery.groupBy(ts.ROUND).agg(
        (F.max("baseline_sum") / ph.BASELINE_BUCKETS).alias(STEADY),
        F.min(F.when((k >= kf) & (recovery.isNull() | (k < recovery)), c)).alias(DIP_MIN),
        F.max("dip_start").alias("dip_start"),
        F.max(recovery).alias("recovery_bucket"),
    )
