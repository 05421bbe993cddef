"""Per-round figures equal, exactly, the ones the synthetic generator built the traces from."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_analysis import round_metrics as rm
from spark_analysis import synthetic
from spark_analysis.ingest import read_lines

pytestmark = pytest.mark.spark

ROUNDS = 2 * len(synthetic.DEFAULT_CONFIGS)  # every configuration twice


@pytest.fixture(scope="module")
def rounds() -> list[synthetic.SyntheticRound]:
    return synthetic.generate_rounds(ROUNDS, seed=7, lossy_every=5)


@pytest.fixture(scope="module")
def traces(rounds, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("traces")
    synthetic.write_traces(rounds, path)
    return path


@pytest.fixture(scope="module")
def summary(spark, traces) -> dict[str, dict]:
    lines = read_lines(spark, [str(traces)])
    tables = rm.summarize_rounds(lines.events, lines.malformed)
    rows = {r["round"]: r.asDict() for r in tables.summary.collect()}
    assert tables.rejected.count() == 0
    assert lines.malformed.count() == 0
    lines.release()
    return rows


def test_every_round_is_summarised(summary, rounds):
    assert sorted(summary) == sorted(r.round_id for r in rounds)


def test_figures_equal_the_generated_ones_exactly(summary, rounds):
    for r in rounds:
        got = summary[r.round_id]
        for column, value in r.expected().items():
            assert got[column] == value, (r.round_id, column)
        assert got[rm.RECOVERED] is True
        assert Path(got["file"]).name == f"{r.round_id}.jsonl"


def test_events_before_the_fault_are_ignored(summary, rounds):
    """The cluster's first election and the consumer's pre-fault reconnect are not milestones."""
    for r in rounds:
        assert summary[r.round_id]["new_primary"] == r.new_primary
        assert summary[r.round_id]["reconnect_ms"] == r.reconnect_us / 1000


def test_lossy_rounds_are_the_generated_ones(summary, rounds):
    lossy = {r.round_id for r in rounds if r.lost_acknowledged}
    assert lossy == {k for k, v in summary.items() if v["lost_acknowledged"] > 0}
    assert len(lossy) == ROUNDS // 5



@pytest.mark.parametrize("pattern", ["{dir}/*.jsonl", "{dir}/syn-00000?.jsonl", "{dir}*", "{dir}/"])
def test_globs_and_directories_select_traces(spark, traces, pattern):
    lines = read_lines(spark, [pattern.format(dir=traces)])
    files = lines.events.select("file").distinct().count()
    lines.release()
    assert files == (10 if "?" in pattern else ROUNDS)


def test_back_to_steady_is_never_before_the_first_accepted_send(spark, tmp_path):
    """A burst of acks can fill the bucket of the first accepted send: its start is too early."""
    import json

    r = synthetic.generate_rounds(1, seed=9)[0]
    burst = (r.fault_offset_us + r.unavailability_us) // synthetic.BUCKET_US
    lines = []
    for line in r.trace_lines():
        event = json.loads(line)
        if event["event"] == "acks" and event["k"] <= burst < event["k"] + len(event["n"]):
            event["n"][burst - event["k"]] = r.steady_acks
            line = line.split(',"n":')[0] + f',"n":{json.dumps(event["n"])}}}'
        lines.append(line)
    (tmp_path / "burst.jsonl").write_text("\n".join(lines) + "\n")
    parsed = read_lines(spark, [str(tmp_path)])
    row = rm.summarize_rounds(parsed.events, parsed.malformed).summary.first()
    parsed.release()
    assert row["unavailability_ms"] == r.unavailability_us / 1000
    assert row["back_to_steady_ms"] == row["unavailability_ms"]
    assert row["dip_min_acks_per_100ms"] == 0
