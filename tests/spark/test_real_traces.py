"""The dashboard built from real traces: a short failover benchmark run (3 rounds, one per fault).

Real etcd, real nodes, real python-qpid-proton clients (benchmarks.failover),
then the Spark job on what they wrote.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from spark_analysis.failover_dashboard import run
from spark_analysis.render import SECTIONS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.spark
@pytest.mark.etcd
def test_dashboard_from_a_short_failover_benchmark_run(spark, tmp_path):
    traces = tmp_path / "traces"
    bench = subprocess.run(
        [sys.executable, "-m", "benchmarks.failover", "--rounds", "1", "--faults", "kill,stop,term",
         "--out", str(traces), "--results", str(tmp_path / "results")],
        cwd=REPO, capture_output=True, text=True, timeout=400,
    )
    assert bench.returncode == 0, f"benchmark failed:\n{bench.stdout[-3000:]}\n{bench.stderr[-3000:]}"
    assert len(sorted(traces.glob("*.jsonl"))) == 3

    result = run(str(traces), tmp_path / "dashboard", spark=spark)

    assert (result.rounds, result.rejected_rounds, result.malformed_lines) == (3, 0, 0)
    html = result.html.read_text()
    for section_id, heading in SECTIONS:
        assert f'<section id="{section_id}"><h2>{heading}</h2>' in html
    assert "<script" not in html
    with open(tmp_path / "dashboard" / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(row["fault"] for row in rows) == ["kill9", "sigstop", "sigterm"]
    assert all(row["lost_acknowledged"] == "0" for row in rows)
