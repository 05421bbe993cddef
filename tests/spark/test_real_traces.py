"""The dashboard built from real traces: a short failover benchmark run (3 rounds, one per fault)
and a short nemesis run (one fixed schedule).

Real etcd, real nodes, real python-qpid-proton clients (benchmarks.failover,
tests.nemesis), then the Spark job on what they wrote.
"""

from __future__ import annotations

import csv
import json
import os
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


NEMESIS_SCHEDULES = ("partitioned-primary-killed",)
"""A partition of the primary from its backups, kill9, heal, restart, a check and waits: 15-30 s when
the cluster recovers.  One schedule: tests/integration/test_nemesis.py runs every fixed schedule, and
the synthetic nemesis rounds (tests/spark/test_nemesis.py) give the dashboard every other kind."""


@pytest.mark.spark
@pytest.mark.etcd
def test_dashboard_from_a_short_nemesis_run(spark, tmp_path):
    """The checker panel says what the nemesis's own summary says, schedule by schedule."""
    assert os.geteuid() == 0, "the nemesis runs every node in a network namespace: run as root"
    traces, results = tmp_path / "traces", tmp_path / "results"
    bench = subprocess.run(
        [sys.executable, "-m", "tests.nemesis", "--fixed", ",".join(NEMESIS_SCHEDULES),
         "--out", str(traces), "--results", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )
    # exit status 1: a schedule found a problem; the dashboard must then show it as failing
    assert bench.returncode in (0, 1), \
        f"nemesis failed:\n{bench.stdout[-3000:]}\n{bench.stderr[-3000:]}"
    (report,) = results.glob("nemesis-*.json")
    schedules = {r["round"]: r for r in json.loads(report.read_text())["schedules"]}
    assert sorted(r["schedule"] for r in schedules.values()) == sorted(NEMESIS_SCHEDULES)

    result = run(str(traces), tmp_path / "dashboard", spark=spark)

    out = tmp_path / "dashboard"
    with open(out / "nemesis.csv", newline="") as handle:
        rows = {row["round"]: row for row in csv.DictReader(handle)}
    with open(out / "problems.csv", newline="") as handle:
        problems = list(csv.DictReader(handle))
    # a schedule in which no fault took effect has no fault_injected: rejected, as documented
    rejected = {p["round"]: p["reason"] for p in problems if p["kind"] == "rejected round"}
    assert set(rejected) <= set(schedules)
    assert all(reason == "no fault_injected event" for reason in rejected.values()), rejected
    assert result.malformed_lines == 0
    assert set(rows) | set(rejected) == set(schedules)
    assert result.nemesis_rounds == len(rows)
    for round_id, row in rows.items():
        mine = schedules[round_id]
        verdict = mine["verdict"]
        assert row["schedule"] == mine["schedule"] and row["seed"] == ""
        assert row["verdict"] == mine["status"], (round_id, row["verdict"], mine["status"])
        assert row["failing"] == str(not mine["ok"])
        for column in ("attempted", "acknowledged", "received", "lost", "unexpected",
                       "duplicated", "recovered"):
            assert row[column] == str(verdict[column]), (round_id, column)
        assert row["replica_mismatches"] == str(mine["replica_mismatches"])
        assert row["replica_checks"] == str(len(mine["replica_checks"]))
        assert row["mismatched_checks"] == str(mine["mismatched_checks"])
        assert row["ops_skipped"] == str(len(mine["skipped_ops"]))
        assert row["ops_failed"] == str(len(mine["failed_ops"]))
        assert row["faults"] == ", ".join(mine["faults"])

    with open(out / "fault_types.csv", newline="") as handle:
        fault_types = {row["fault_type"]: row for row in csv.DictReader(handle)}
    for kind in {k for r in rows.values() for k in r["faults"].split(", ")}:
        assert kind in fault_types, kind  # every declared fault kind was tried
    html = result.html.read_text()
    failing = sum(1 for r in rows.values() if r["failing"] == "True")
    rounds = f"{len(rows)} nemesis round" + ("s" if len(rows) > 1 else "")
    assert (f"{failing} of {rounds} failed the checker" if failing
            else f"All {rounds} passed the checker") in html
    for round_id, row in rows.items():
        assert f'title="{round_id}: ' in html
