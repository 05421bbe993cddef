"""Bad input is counted and reported by file and line; it never crashes the job or skews figures."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from spark_analysis import failover_dashboard, synthetic
from spark_analysis import trace_schema as ts
from spark_analysis.ingest import NoTracesError

pytestmark = pytest.mark.spark


def _edit(path: Path, edit) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(edit(lines)) + "\n")


def _without(event: str):
    return lambda lines: [x for x in lines if f'"event":"{event}"' not in x]


@pytest.fixture(scope="module")
def damaged(spark, tmp_path_factory):
    """12 rounds, 6 of them damaged in different ways, through the whole job."""
    base = tmp_path_factory.mktemp("bad")
    rounds = synthetic.generate_rounds(12, seed=11)
    paths = synthetic.write_traces(rounds, base / "traces")
    # malformed lines: not JSON (line 3), a wrong type (line 6), no event (last line)
    _edit(paths[0], lambda ls: ls[:2] + ["this is not json"] + ls[2:4]
          + [ls[4].replace('"t":', '"t":"soon","x":')] + ls[5:]
          + ['{"round":"syn-000000","t":1700000099.5}'])
    _edit(paths[1], _without(ts.FAULT_INJECTED))
    _edit(paths[2], lambda ls: ls[:1] + ls)  # round_start twice
    _edit(paths[3], _without(ts.TALLY))
    _edit(paths[4], _without(ts.FIRST_ACCEPTED_AFTER_FAULT))  # never recovered
    _edit(paths[5], lambda ls: [x.replace('"n":[', '"n":[-1,', 1) if '"acks"' in x else x
                                for x in ls])
    result = failover_dashboard.run(str(base / "traces"), base / "out", spark=spark)
    with (base / "out" / "summary.csv").open() as f:
        summary = {row[ts.ROUND]: row for row in csv.DictReader(f)}
    with (base / "out" / "problems.csv").open() as f:
        problems = list(csv.DictReader(f))
    return rounds, paths, result, summary, problems


def _acks_lines(path: Path) -> int:
    return sum(1 for x in path.read_text().splitlines() if '"event":"acks"' in x)


def test_job_reports_the_counts(damaged):
    _, paths, result, summary, _ = damaged
    # round 0: 3 bad lines; round 5: every acks line has a negative count
    assert result.malformed_lines == 3 + _acks_lines(paths[5])
    assert result.rejected_rounds == 5
    assert result.rounds == len(summary) == 7


def test_malformed_lines_are_reported_with_file_and_line(damaged):
    _, paths, _, _, problems = damaged
    bad = {(p["file"], int(p["line"]), p["reason"]) for p in problems
           if p["kind"] == "malformed line" and p["file"] == str(paths[0])}
    n = len(paths[0].read_text().splitlines())
    assert bad == {
        (str(paths[0]), 3, "not a JSON object of the trace schema"),
        (str(paths[0]), 6, "not a JSON object of the trace schema"),
        (str(paths[0]), n, "missing event"),
    }
    acks = [p for p in problems if p["kind"] == "malformed line" and p["file"] == str(paths[5])]
    assert {p["reason"] for p in acks} == {"acks counts must be non-negative integers"}


def test_rounds_that_cannot_be_trusted_are_rejected_with_file_and_line(damaged):
    rounds, paths, _, summary, problems = damaged
    rejected = {p[ts.ROUND]: (p["file"], int(p["line"]), p["reason"])
                for p in problems if p["kind"] == "rejected round"}
    assert rejected == {
        rounds[0].round_id: (str(paths[0]), 1, "3 malformed lines in its file"),
        rounds[1].round_id: (str(paths[1]), 1, "no fault_injected event"),
        rounds[2].round_id: (str(paths[2]), 1, "2 round_start events"),
        rounds[3].round_id: (str(paths[3]), 1, "no tally event"),
        rounds[5].round_id: (
            str(paths[5]), 1, f"{_acks_lines(paths[5])} malformed lines in its file"
        ),
    }
    assert not set(rejected) & set(summary)


def test_unrecovered_round_is_kept_and_flagged(damaged):
    rounds, _, _, summary, _ = damaged
    row = summary[rounds[4].round_id]
    assert row["recovered"] == "False"
    assert row["unavailability_ms"] == row["first_send_ms"] == ""
    assert float(row["detection_ms"]) == rounds[4].detection_us / 1000


def test_other_rounds_are_not_skewed(damaged):
    rounds, _, _, summary, _ = damaged
    for r in rounds[6:]:
        row = summary[r.round_id]
        for column, value in r.expected().items():
            assert str(value) == row[column], (r.round_id, column)


def test_dashboard_lists_the_problems(damaged):
    _, paths, result, _, _ = damaged
    html = result.html.read_text()
    assert "3 malformed lines in its file" in html
    assert "no fault_injected event" in html
    assert str(paths[1]) in html
    assert "1 round never accepted a send after the fault" in html


def test_no_traces_is_an_error(spark, tmp_path):
    with pytest.raises(NoTracesError):
        failover_dashboard.run(str(tmp_path / "nowhere"), tmp_path / "out", spark=spark)
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoTracesError):
        failover_dashboard.run(str(tmp_path / "empty"), tmp_path / "out", spark=spark)


def test_cli_exits_2_without_traces(tmp_path, capsys):
    assert failover_dashboard.main(["--traces", str(tmp_path / "nowhere"),
                                    "--out", str(tmp_path / "out")]) == 2
    assert "no trace files" in capsys.readouterr().err
