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


def test_synthetic_nemesis_lines_follow_the_schema():
    for r in synthetic.generate_nemesis_rounds(len(ts.VERDICTS), seed=3,
                                               verdicts=ts.VERDICTS):
        events = [json.loads(line) for line in r.trace_lines()]
        assert [e[ts.T] for e in events] == sorted(e[ts.T] for e in events)
        assert events[0][ts.FAULT] == ts.FAULT_NEMESIS
        assert events[0][ts.SCHEDULE_FAULTS] == r.nemesis.faults
        for e in events:
            assert e[ts.EVENT] in ts.EVENTS or e[ts.EVENT] == "node_state"  # one ignored event
            assert set(ts.REQUIRED_FIELDS.get(e[ts.EVENT], ())) <= e.keys()
        (checker,) = [e for e in events if e[ts.EVENT] == ts.CHECKER]
        (tally,) = [e for e in events if e[ts.EVENT] == ts.TALLY]
        assert ts.verdict(checker[ts.VALID], checker[ts.DRAIN_COMPLETE],
                          checker[ts.REPLICA_MISMATCHES]) == r.nemesis.verdict
        assert tally[ts.LOST_ACKNOWLEDGED] == checker[ts.LOST]
        assert tally[ts.ACKNOWLEDGED] == checker[ts.ACKNOWLEDGED]
        ops = [e for e in events if e[ts.EVENT] == ts.NEMESIS]
        (fault,) = [e for e in events if e[ts.EVENT] == ts.FAULT_INJECTED]
        assert ops[0][ts.T] == fault[ts.T] and ops[0][ts.OP] == fault[ts.OP]


def test_the_nemesis_writes_the_names_the_analysis_reads():
    """tests/nemesis spells the extension's names itself: they must stay these."""
    from tests.nemesis import schedule, trace

    assert (trace.FAULT_NEMESIS, trace.NEMESIS, trace.REPLICA_CHECK, trace.CHECKER) == (
        ts.FAULT_NEMESIS, ts.NEMESIS, ts.REPLICA_CHECK, ts.CHECKER)
    assert set(trace.FAULT_OPS) == set(ts.NEMESIS_FAULT_OPS)
    assert {ts.op_role(op) for op in schedule.UNDO.values()} == {ts.ROLE_RECOVERY}
    assert {ts.op_role(op) for op in (schedule.CHECK, schedule.ELECT_EACH)} == {ts.ROLE_CHECK}
    for kind in schedule.FAULT_KINDS:  # every fault kind a schedule declares is a fault type
        op, _, arg = (kind, "", "") if kind in ts.NEMESIS_FAULT_OPS else kind.partition("-")
        assert ts.op_role(op) == ts.ROLE_FAULT and ts.fault_type(op, arg or None) == kind
    for op in (schedule.PIN, schedule.PRODUCER, schedule.SEND, schedule.RATE,
               schedule.AWAIT_ACKED, schedule.AWAIT_PRIMARY, schedule.AWAIT_STATE):
        assert ts.op_role(op) == ts.ROLE_SCRIPT
    assert [ts.op_role(op) for op in (schedule.DISK_FAIL, schedule.ROT, schedule.DISK_REPAIR, schedule.ASSERT)] == [
        ts.ROLE_FAULT, ts.ROLE_FAULT, ts.ROLE_RECOVERY, ts.ROLE_CHECK]
    assert set(schedule.OP_KINDS) - {schedule.SLEEP} == (
        set(ts.NEMESIS_FAULT_OPS) | set(ts.NEMESIS_RECOVERY_OPS) | set(ts.NEMESIS_CHECK_OPS)
        | {schedule.PIN, schedule.PRODUCER, schedule.SEND, schedule.RATE, schedule.AWAIT_ACKED,
           schedule.AWAIT_PRIMARY, schedule.AWAIT_STATE})


def test_synthetic_command_line_writes_nemesis_rounds(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "spark_analysis.synthetic", "--rounds", "1", "--nemesis", "2",
         "--out", str(tmp_path)],
        capture_output=True, cwd=REPO, timeout=60, check=True,
    )
    assert b"wrote 3 traces" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "nem-000000.jsonl", "nem-000001.jsonl", "syn-000000.jsonl"]
