"""The trace format module and the synthetic generator, as the benchmark and operators use them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark_analysis import synthetic
from spark_analysis import trace_schema as ts

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def test_trace_schema_imports_without_pyspark():
    """The benchmark imports the constants; that must not pull in Spark."""
    code = ("import sys; import spark_analysis.trace_schema as t; "
            "assert 'pyspark' not in sys.modules; print(t.SCHEMA_VERSION)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=REPO,
                          timeout=60, check=False)
    assert done.stdout.strip() == str(ts.SCHEMA_VERSION).encode(), done.stderr


def test_spark_schema_covers_every_field_the_events_require():
    names = set(ts.spark_schema().fieldNames())
    assert {ts.ROUND, ts.T, ts.EVENT} <= names
    for fields in ts.REQUIRED_FIELDS.values():
        assert set(fields) <= names


def test_synthetic_lines_follow_the_schema():
    r = synthetic.generate_rounds(1)[0]
    events = [json.loads(line) for line in r.trace_lines()]
    assert events[0][ts.EVENT] == ts.ROUND_START and events[-1][ts.EVENT] == ts.ROUND_END
    assert [e[ts.T] for e in events] == sorted(e[ts.T] for e in events)
    for e in events:
        assert e[ts.EVENT] in ts.EVENTS and e[ts.ROUND] == r.round_id
        assert set(ts.REQUIRED_FIELDS.get(e[ts.EVENT], ())) <= e.keys()
    acked = sum(sum(e[ts.N]) for e in events if e[ts.EVENT] == ts.ACKS)
    assert acked == r.expected()[ts.ACKNOWLEDGED]


def test_synthetic_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "spark_analysis.synthetic", "--rounds", "3", "--out", str(tmp_path)],
        capture_output=True, cwd=REPO, timeout=60, check=True,
    )
    assert b"wrote 3 traces" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "syn-000000.jsonl", "syn-000001.jsonl", "syn-000002.jsonl"]


def test_synthetic_rounds_are_reproducible():
    assert synthetic.generate_rounds(5, seed=1) == synthetic.generate_rounds(5, seed=1)
    assert synthetic.generate_rounds(5, seed=1) != synthetic.generate_rounds(5, seed=2)
