"""The nemesis's rounds: the checker's verdict per round, and the fault types across rounds.

A nemesis round (``round_start`` fault ``nemesis``, ``docs/failover-traces.md``
"Nemesis traces") is one schedule of overlapping faults.  Its timing figures
are those of any round (measured from the schedule's first fault); what is
its own is read here:

* one row per accepted nemesis round (:data:`NEMESIS_COLUMNS`): the schedule,
  its ``checker`` line, the verdict the nemesis itself prints (``ok``,
  ``INVALID``, ``MISMATCH``, ``NO VERDICT``), its replica checks and how its
  ops ended;
* one row per fault type (:data:`FAULT_TYPE_COLUMNS`): how often it was
  injected (an op whose result is ``ok``) and in how many rounds, across the
  nemesis rounds (every ``nemesis`` op, a partition typed by its kind) and
  the classic rounds (their ``fault``, once per round), and how often it did
  not take effect.

A round is *failing* if it is a nemesis round whose verdict is not ``ok``, or
a classic round that lost an acknowledged message.

Like :mod:`round_metrics`, everything is Spark SQL expressions over whole
DataFrames.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_analysis import trace_schema as ts
from spark_analysis.ingest import FILE

VERDICT = "verdict"
FAILING = "failing"
FAULTS_TEXT = "faults"  # the schedule's fault kinds, comma-separated
MISMATCHED_CHECKS = "mismatched_checks"
OPS = "ops"
OPS_BY_OUTCOME = {o: f"ops_{o.lower()}" for o in ts.OUTCOMES if o != ts.RESULT_OK}
"""Per-round count of ops that did not end ``ok``, by outcome (e.g. ``ops_skipped``)."""
ID_SEPARATOR = " "

NEMESIS_COLUMNS = (
    ts.ROUND, FILE, ts.RUN, ts.SCHEDULE, ts.SEED, VERDICT, FAILING, ts.VALID, ts.DRAIN_COMPLETE,
    ts.ATTEMPTED, ts.ACKNOWLEDGED, ts.RECEIVED, ts.LOST, ts.UNEXPECTED, ts.DUPLICATED,
    ts.DUPLICATES, ts.RECOVERED, ts.REPLICA_MISMATCHES, ts.REPLICA_CHECKS, MISMATCHED_CHECKS,
    OPS, *OPS_BY_OUTCOME.values(), FAULTS_TEXT, ts.LOST_IDS, ts.UNEXPECTED_IDS,
)
"""Columns of the per-round nemesis table (``nemesis.csv``); ids are space-separated."""

FAULT_TYPE = "fault_type"
ROLE = "role"
INJECTED = "injected"
ROUNDS = "rounds"
NEMESIS_ROUNDS = "nemesis_rounds"
FAILING_ROUNDS = "failing_rounds"
INJECTED_IN_FAILING = "injected_in_failing_rounds"
NOT_OK = {o: o.lower() for o in ts.OUTCOMES if o != ts.RESULT_OK}
"""Columns counting ops that did not end ``ok``, by outcome (``refused``, ..., ``mismatch``)."""

FAULT_TYPE_COLUMNS = (
    FAULT_TYPE, ROLE, INJECTED, ROUNDS, NEMESIS_ROUNDS, FAILING_ROUNDS, INJECTED_IN_FAILING,
    *NOT_OK.values(),
)
"""Columns of the per-fault-type table (``fault_types.csv``); the role totals have the same
columns with ``fault_type`` "all <role> ops" (and ``total`` true)."""


def _of(event: str, value: Column) -> Column:
    return F.when(F.col(ts.EVENT) == event, value)


def fault_type(op: Column, arg: Column) -> Column:
    """:func:`trace_schema.fault_type` as a Spark expression."""
    return F.when((op == ts.OP_PARTITION) & arg.isNotNull(), F.concat(op, F.lit("-"), arg)) \
        .otherwise(op)


def role(op: Column) -> Column:
    """:func:`trace_schema.op_role` as a Spark expression."""
    return (F.when(op.isin(*ts.NEMESIS_FAULT_OPS), F.lit(ts.ROLE_FAULT))
            .when(op.isin(*ts.NEMESIS_RECOVERY_OPS), F.lit(ts.ROLE_RECOVERY))
            .when(op.isin(*ts.NEMESIS_CHECK_OPS), F.lit(ts.ROLE_CHECK))
            .otherwise(F.lit(ts.ROLE_SCRIPT)))


def outcome(result: Column) -> Column:
    """:func:`trace_schema.outcome` as a Spark expression."""
    out = F.when(result == ts.RESULT_OK, F.lit(ts.RESULT_OK)).when(
        result == ts.RESULT_MISMATCH, F.lit(ts.RESULT_MISMATCH))
    for prefix in ts.RESULT_PREFIXES:
        out = out.when(result.startswith(prefix), F.lit(prefix))
    return out.otherwise(F.lit("other"))


def verdict(checker: Column) -> Column:
    """:func:`trace_schema.verdict` of a struct column holding the checker's fields."""
    return (F.when(~checker[ts.DRAIN_COMPLETE], F.lit(ts.VERDICT_NO_VERDICT))
            .when(~checker[ts.VALID], F.lit(ts.VERDICT_INVALID))
            .when(checker[ts.REPLICA_MISMATCHES] > 0, F.lit(ts.VERDICT_MISMATCH))
            .otherwise(F.lit(ts.VERDICT_OK)))


def per_round(events: DataFrame) -> DataFrame:
    """The nemesis lines of every round that has some, aggregated: one row per such round.

    Only the few ``nemesis``, ``replica_check`` and ``checker`` lines are
    grouped (a classic round has none), so the job over many classic rounds
    pays for a filter only.  :func:`rounds_table` and :func:`rejection_reasons`
    read the result once it is joined (left) to the other per-round aggregates.
    """
    op, result = F.col(ts.OP), F.col(ts.RESULT)
    mismatched = (F.col(ts.MISMATCHES) > 0) | (result == ts.RESULT_MISMATCH)
    injected_fault = (result == ts.RESULT_OK) & (role(op) == ts.ROLE_FAULT)
    return events.where(F.col(ts.EVENT).isin(ts.NEMESIS, ts.REPLICA_CHECK, ts.CHECKER)).groupBy(
        F.col(ts.ROUND).alias("nemesis_round")
    ).agg(
        F.count(_of(ts.CHECKER, F.lit(1))).alias("n_checker"),
        F.max(_of(ts.CHECKER, F.struct(
            *[F.col(c) for c in ts.CHECKER_FIELDS + ts.CHECKER_OPTIONAL_FIELDS]
        ))).alias("checker"),
        F.count(_of(ts.REPLICA_CHECK, F.lit(1))).alias("n_replica_checks"),
        F.count(_of(ts.REPLICA_CHECK, F.when(mismatched, F.lit(1)))).alias(MISMATCHED_CHECKS),
        F.count(_of(ts.NEMESIS, F.lit(1))).alias(OPS),
        *[F.count(_of(ts.NEMESIS, F.when(outcome(result) == o, F.lit(1)))).alias(column)
          for o, column in OPS_BY_OUTCOME.items()],
        F.collect_list(_of(ts.NEMESIS, F.when(injected_fault, F.struct(
            F.col(ts.T).alias("t"), fault_type(op, F.col(ts.ARG)).alias("type"))))
        ).alias("injected_faults"),
        F.collect_list(_of(ts.NEMESIS, F.struct(
            fault_type(op, F.col(ts.ARG)).alias(FAULT_TYPE), role(op).alias(ROLE),
            outcome(result).alias("outcome")))
        ).alias("op_kinds"),
    )


def join_per_round(rounds: DataFrame, nemesis: DataFrame) -> DataFrame:
    """``rounds`` (one row per round, column ``round``) with the columns of :func:`per_round`;
    a round without nemesis lines gets zero counts."""
    counts = ["n_checker", "n_replica_checks", MISMATCHED_CHECKS, OPS, *OPS_BY_OUTCOME.values()]
    joined = rounds.join(nemesis, F.col(ts.ROUND) == F.col("nemesis_round"), "left")
    return joined.select(
        *[c for c in joined.columns if c not in counts and c != "nemesis_round"],
        *[F.coalesce(F.col(c), F.lit(0)).alias(c) for c in counts],
    )


def rejection_reasons() -> list[Column]:
    """Why a round (a row of the per-round aggregates) cannot be trusted, or nulls."""
    n = F.col("n_checker")
    return [
        F.when(n > 1, F.concat(n.cast("string"), F.lit(f" {ts.CHECKER} events"))),
        F.when((F.col(f"start.{ts.FAULT}") == ts.FAULT_NEMESIS) & (n == 0),
               F.lit(f"no {ts.CHECKER} event")),
    ]


def rounds_table(accepted: DataFrame) -> DataFrame:
    """One row per accepted nemesis round, columns :data:`NEMESIS_COLUMNS`.

    ``accepted``: the per-round aggregates (with ``start`` and ``first``) of
    the accepted rounds.
    """
    checker = F.col("checker")
    declared = F.col(f"start.{ts.SCHEDULE_FAULTS}")
    injected = F.array_distinct(F.transform(F.array_sort("injected_faults"), lambda s: s["type"]))
    faults = F.when(declared.isNotNull(), declared).otherwise(injected)
    return accepted.where(F.col(f"start.{ts.FAULT}") == ts.FAULT_NEMESIS).select(
        ts.ROUND,
        F.col("first.file").alias(FILE),
        F.col(f"start.{ts.RUN}").alias(ts.RUN),
        F.col(f"start.{ts.SCHEDULE}").alias(ts.SCHEDULE),
        F.col(f"start.{ts.SEED}").alias(ts.SEED),
        verdict(checker).alias(VERDICT),
        (verdict(checker) != ts.VERDICT_OK).alias(FAILING),
        *[checker[c].alias(c) for c in (
            ts.VALID, ts.DRAIN_COMPLETE, ts.ATTEMPTED, ts.ACKNOWLEDGED, ts.RECEIVED, ts.LOST,
            ts.UNEXPECTED, ts.DUPLICATED, ts.DUPLICATES, ts.RECOVERED, ts.REPLICA_MISMATCHES)],
        F.coalesce(checker[ts.REPLICA_CHECKS], F.col("n_replica_checks")).alias(ts.REPLICA_CHECKS),
        MISMATCHED_CHECKS,
        OPS,
        *OPS_BY_OUTCOME.values(),
        F.concat_ws(", ", faults).alias(FAULTS_TEXT),
        F.concat_ws(ID_SEPARATOR, checker[ts.LOST_IDS]).alias(ts.LOST_IDS),
        F.concat_ws(ID_SEPARATOR, checker[ts.UNEXPECTED_IDS]).alias(ts.UNEXPECTED_IDS),
    )


def ops_table(accepted: DataFrame) -> DataFrame:
    """Every op of the accepted nemesis rounds: ``round``, ``failing``, ``fault_type``,
    ``role``, ``outcome`` (input to :func:`fault_types`)."""
    return accepted.where(F.col(f"start.{ts.FAULT}") == ts.FAULT_NEMESIS).select(
        ts.ROUND, (verdict(F.col("checker")) != ts.VERDICT_OK).alias(FAILING),
        F.explode("op_kinds").alias("op"),
    ).select(ts.ROUND, FAILING, "op.*")


def _injection_aggregates() -> list[Column]:
    ok = F.col("outcome") == ts.RESULT_OK
    failing, rnd = F.col(FAILING), F.col(ts.ROUND)
    return [
        F.count(F.when(ok, F.lit(1))).alias(INJECTED),
        F.countDistinct(F.when(ok, rnd)).alias(ROUNDS),
        F.countDistinct(F.when(ok & F.col("in_nemesis"), rnd)).alias(NEMESIS_ROUNDS),
        F.countDistinct(F.when(ok & failing, rnd)).alias(FAILING_ROUNDS),
        F.count(F.when(ok & failing, F.lit(1))).alias(INJECTED_IN_FAILING),
        *[F.count(F.when(F.col("outcome") == o, F.lit(1))).alias(column)
          for o, column in NOT_OK.items()],
    ]


TOTAL = "total"
"""True on the per-role totals of :func:`fault_types` ("all fault ops", ...)."""


def fault_types(nemesis_ops: DataFrame, summary: DataFrame) -> DataFrame:
    """One row per fault type and one total per role: :data:`FAULT_TYPE_COLUMNS` and ``total``.

    ``nemesis_ops``: :func:`ops_table`; ``summary``: the per-round summary.
    Nemesis rounds count every ``nemesis`` op of theirs; every other accepted
    round counts its ``fault`` once, as injected.  Rows are ordered by role
    (faults first), then the totals last, then by injections, most first.
    """
    ops = nemesis_ops.select(ts.ROUND, FAULT_TYPE, ROLE, "outcome",
                             F.lit(True).alias("in_nemesis"), FAILING)
    classic = summary.where(F.col(ts.FAULT) != ts.FAULT_NEMESIS).select(
        ts.ROUND,
        F.col(ts.FAULT).alias(FAULT_TYPE),
        F.lit(ts.ROLE_FAULT).alias(ROLE),
        F.lit(ts.RESULT_OK).alias("outcome"),
        F.lit(False).alias("in_nemesis"),
        (F.col(ts.LOST_ACKNOWLEDGED) > 0).alias(FAILING),
    )
    role_order = F.array_position(F.array(*[F.lit(r) for r in ts.ROLES]), F.col(ROLE))
    # One pass: the rollup gives (role, type) rows and (role) totals (and a grand total, dropped).
    rolled = ops.unionByName(classic).rollup(ROLE, FAULT_TYPE).agg(*_injection_aggregates())
    total = F.col(FAULT_TYPE).isNull()
    return (
        rolled.where(F.col(ROLE).isNotNull())
        .select(
            F.when(total, F.concat(F.lit("all "), F.col(ROLE), F.lit(" ops")))
            .otherwise(F.col(FAULT_TYPE)).alias(FAULT_TYPE),
            *FAULT_TYPE_COLUMNS[1:],
            total.alias(TOTAL),
            role_order.alias("role_order"),
        )
        .orderBy("role_order", TOTAL, F.desc(INJECTED), FAULT_TYPE)
        .drop("role_order")
    )
