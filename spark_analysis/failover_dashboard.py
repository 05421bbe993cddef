"""Failover dashboards from failover-benchmark traces, computed with PySpark.

    python -m spark_analysis.failover_dashboard --traces DIR_OR_GLOB --out DIR \\
        [--master local[*]|spark://host:7077]

Reads every ``*.jsonl`` trace (``docs/failover-traces.md``), computes the
per-round phase durations, throughput dip and message tally, aggregates them
by fault type, lease TTL, node count and load, reads the nemesis rounds'
checker verdicts and counts every fault type injected, and writes into
``--out``: ``dashboard.html`` (self-contained), ``summary.parquet``,
``summary.csv`` (one row per round), ``aggregates.csv``, ``nemesis.csv`` (one
row per nemesis round), ``fault_types.csv`` and ``problems.csv`` (malformed
lines and rejected rounds, with file and line).  ``docs/dashboards.md`` is
the operator's guide.

The Spark work is plain DataFrame code, so the same job runs on the
embedded ``local[*]`` master and on a cluster given with ``--master`` (the
traces must then be on storage every executor can read; the outputs are
written by the driver).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_analysis import aggregates as ag
from spark_analysis import exports
from spark_analysis import nemesis as nm
from spark_analysis import phases as ph
from spark_analysis import round_metrics as rm
from spark_analysis import trace_schema as ts
from spark_analysis.ingest import FILE, LINE, REASON, NoTracesError, read_lines
from spark_analysis.render import Curve, DashboardData, render_dashboard

DEFAULT_MASTER = "local[*]"
MALFORMED_ROWS_KEPT = 10_000
"""Malformed lines listed in problems.csv; all of them are counted."""
PROBLEM_COLUMNS = ("kind", FILE, LINE, ts.ROUND, REASON, "text")


@dataclass(frozen=True)
class DashboardResult:
    """What a run produced, for the CLI's report and for tests."""

    html: Path
    rounds: int
    rejected_rounds: int
    malformed_lines: int
    seconds: float
    nemesis_rounds: int = 0
    failing_nemesis_rounds: int = 0


def build_session(master: str) -> SparkSession:
    """A Spark session for ``master``; local masters get small-job settings.

    Traces are many small files: a low open cost lets one task read thousands
    of them instead of one task per few dozen.  On a local master the whole
    job is one short-lived JVM, which spends more time compiling than running
    hot code: the client compiler alone (``TieredStopAtLevel=1``) cuts the
    JVM's CPU time for 10,000 rounds by about a third.  The options only
    apply when this call starts the JVM.
    """
    builder = (
        SparkSession.builder.master(master)
        .appName("hastandby-failover-dashboard")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.files.openCostInBytes", "8192")
    )
    if master.startswith("local"):
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run(traces: str | Sequence[str], out: str | Path, master: str = DEFAULT_MASTER,
        spark: SparkSession | None = None) -> DashboardResult:
    """Build the dashboard of the traces at ``traces`` (directories or globs) into ``out``.

    Uses ``spark`` if given, else the active session if there is one (both are
    left running), else a new session on ``master`` that is stopped at the end.
    Raises :class:`NoTracesError` if nothing matched.
    """
    started = time.monotonic()
    inputs = [traces] if isinstance(traces, str) else list(traces)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    session = spark or SparkSession.getActiveSession()
    own_session = session is None
    session = session or build_session(master)
    try:
        lines = read_lines(session, inputs)
        try:
            tables = rm.summarize_rounds(lines.events, lines.malformed)
            summary_df = tables.summary.persist()
            summary = [r.asDict() for r in summary_df.orderBy(ts.ROUND).collect()]
            summary_schema = summary_df.schema
            aggregates_df = ag.by_configuration(summary_df)
            aggregates = [r.asDict() for r in aggregates_df.collect()]
            aggregate_columns = aggregates_df.columns
            rejected = [r.asDict() for r in tables.rejected.orderBy(FILE, LINE).collect()]
            malformed_total = lines.malformed_count
            malformed = [r.asDict() for r in
                         lines.malformed.orderBy(FILE, LINE).limit(MALFORMED_ROWS_KEPT).collect()]
            curves = _curves(lines.events, tables.timing, summary)
            nemesis_df = tables.nemesis.persist()
            nemesis = [r.asDict() for r in nemesis_df.orderBy(ts.ROUND).collect()]
            typed = [r.asDict() for r in nm.fault_types(tables.nemesis_ops, summary_df).collect()]
            fault_types = [r for r in typed if not r[nm.TOTAL]]
            fault_role_totals = [r for r in typed if r[nm.TOTAL]]
            nemesis_df.unpersist()
            summary_df.unpersist()
        finally:
            lines.release()
    finally:
        if own_session:
            session.stop()

    exports.write_parquet(summary, summary_schema, out_dir / "summary.parquet")
    exports.write_csv(summary, rm.SUMMARY_COLUMNS, out_dir / "summary.csv")
    exports.write_csv(aggregates, aggregate_columns, out_dir / "aggregates.csv")
    exports.write_csv(nemesis, nm.NEMESIS_COLUMNS, out_dir / "nemesis.csv")
    exports.write_csv(fault_types, nm.FAULT_TYPE_COLUMNS, out_dir / "fault_types.csv")
    problems = [{"kind": "rejected round", "text": "", **r} for r in rejected] + [
        {"kind": "malformed line", ts.ROUND: "", **r} for r in malformed
    ]
    exports.write_csv(problems, PROBLEM_COLUMNS, out_dir / "problems.csv")
    seconds = time.monotonic() - started
    html = out_dir / "dashboard.html"
    html.write_text(render_dashboard(DashboardData(
        inputs=inputs,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        summary=summary,
        aggregates=aggregates,
        rejected=rejected,
        malformed=malformed,
        malformed_total=malformed_total,
        curves=curves,
        job_seconds=seconds,
        nemesis=nemesis,
        fault_types=fault_types,
        fault_role_totals=fault_role_totals,
    )), encoding="utf-8")
    return DashboardResult(html, len(summary), len(rejected), malformed_total, seconds,
                           len(nemesis), sum(1 for r in nemesis if r[nm.FAILING]))


def pick_curve_rounds(summary: Sequence[dict]) -> list[tuple[str, dict]]:
    """The worst round (an unrecovered one if any, else the longest unavailability)
    and the nearest-rank median round by unavailability, among rounds with a steady rate."""
    u = ph.UNAVAILABILITY.column
    usable = [r for r in summary if r[rm.STEADY] is not None]
    if not usable:
        return []
    worst = max(usable, key=lambda r: (not r[rm.RECOVERED], r[u] or 0.0, r[ts.ROUND]))
    recovered = sorted((r for r in usable if r[u] is not None), key=lambda r: (r[u], r[ts.ROUND]))
    picked = [("worst round", worst)]
    if recovered:
        median = recovered[(len(recovered) + 1) // 2 - 1]
        if median is not worst:
            picked.append(("median round", median))
    return picked


def _curves(events: DataFrame, timing: DataFrame, summary: Sequence[dict]) -> list[Curve]:
    """Acks per bucket of the worst and the median round (one small collect)."""
    picked = pick_curve_rounds(summary)
    ids = [r[ts.ROUND] for _, r in picked]
    if not ids:
        return []
    chosen = F.col(ts.ROUND).isin(ids)
    chosen_timing = timing.where(chosen)
    rows = (
        rm.bucket_series(events.where(chosen), chosen_timing)
        .join(chosen_timing.select(ts.ROUND, rm.FAULT_OFFSET_US), ts.ROUND)
        .select(
            ts.ROUND,
            ((F.col(rm.BUCKET) * rm.BUCKET_US - F.col(rm.FAULT_OFFSET_US)) / 1e6).alias("x"),
            rm.ACKED,
        )
        .orderBy(ts.ROUND, "x")
        .collect()
    )
    return [
        Curve(title, r, [(row["x"], float(row[rm.ACKED])) for row in rows
                         if row[ts.ROUND] == r[ts.ROUND]])
        for title, r in picked
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_analysis.failover_dashboard",
        description="Failover-timing dashboard from failover-benchmark traces (PySpark).",
    )
    parser.add_argument("--traces", required=True, nargs="+", metavar="DIR_OR_GLOB",
                        help="trace directories (searched recursively for *.jsonl) or globs")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="output directory for dashboard.html, summary.* and problems.csv")
    parser.add_argument("--master", default=DEFAULT_MASTER,
                        help="Spark master URL (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        result = run(args.traces, args.out, args.master)
    except NoTracesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{result.html}: {result.rounds} rounds, {result.rejected_rounds} rejected rounds, "
        f"{result.malformed_lines} malformed lines"
        + (f" (see {args.out / 'problems.csv'})" if result.rejected_rounds
           or result.malformed_lines else "")
        + (f"; {result.nemesis_rounds} nemesis rounds, {result.failing_nemesis_rounds} failing "
           "the checker" if result.nemesis_rounds else "")
        + f"; {result.seconds:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
