"""Speed check: the dashboard job over 10,000 synthetic rounds on ``local[2]``.

    python -m spark_analysis.bench_synthetic [--rounds 10000] [--master local[2]] [--keep DIR]

The requirement is <= 60 s for 10,000 rounds on a 2-core machine.  The
figure reported is the wall time from before the Spark session is created
until ``dashboard.html`` is written (JVM start-up included); generating the
traces is timed separately and not included.  Because a shared machine's
other work slows the job down, the load average and, on a local master, the
CPU time of the Spark JVM are printed too: on an idle machine the wall time
is roughly that CPU time over the cores.  Exits non-zero if the job took
longer than ``--limit``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from spark_analysis import failover_dashboard, synthetic


def jvm_cpu_seconds(spark: SparkSession) -> float | None:
    """User + system CPU time of the local Spark JVM (Linux), or None if unknown."""
    try:
        pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time the dashboard job on synthetic rounds.")
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds allowed (default 60)")
    parser.add_argument("--keep", type=Path, help="write traces and dashboard here and keep them")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-synthetic-") as tmp:
        base = args.keep or Path(tmp)
        started = time.monotonic()
        synthetic.write_traces(synthetic.generate_rounds(args.rounds), base / "traces")
        generated = time.monotonic() - started
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        spark = failover_dashboard.build_session(args.master)
        try:
            result = failover_dashboard.run(str(base / "traces"), base / "dashboard", spark=spark)
            took = time.monotonic() - started
            cpu = jvm_cpu_seconds(spark) if args.master.startswith("local") else None
        finally:
            spark.stop()
    print(f"generated {args.rounds} rounds in {generated:.1f} s")
    print(f"dashboard job on {args.master}: {result.rounds} rounds in {took:.1f} s "
          f"(limit {args.limit:.0f} s)")
    print(f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
          + (f"; Spark JVM CPU time {cpu:.1f} s" if cpu is not None else ""))
    if result.rounds != args.rounds:
        print(f"error: expected {args.rounds} rounds in the summary", file=sys.stderr)
        return 1
    return 0 if took <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
