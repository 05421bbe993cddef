"""The documented command line, in its own process with its own Spark session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spark_analysis import synthetic

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def test_command_line_writes_every_output(tmp_path):
    synthetic.write_traces(synthetic.generate_rounds(3), tmp_path / "traces")
    done = subprocess.run(
        [sys.executable, "-m", "spark_analysis.failover_dashboard",
         "--traces", f"{tmp_path}/traces/*.jsonl", "--out", str(tmp_path / "out"),
         "--master", "local[2]"],
        capture_output=True, cwd=REPO, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    assert b"3 rounds, 0 rejected rounds, 0 malformed lines" in done.stdout
    for name in ("dashboard.html", "summary.parquet", "summary.csv", "aggregates.csv",
                 "problems.csv"):
        assert (tmp_path / "out" / name).stat().st_size > 0
