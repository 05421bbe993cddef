"""Nemesis rounds on the dashboard: checker verdicts per round, fault types across rounds.

Synthetic nemesis rounds (passing and failing) mixed with classic rounds go
through the whole job; the nemesis table, the fault-type counts and the page
must show exactly what the generator put in, and a nemesis round whose
``checker`` line is malformed (or missing, or doubled) must be rejected with
file and line.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from spark_analysis import failover_dashboard, render, synthetic
from spark_analysis import nemesis as nm
from spark_analysis import trace_schema as ts

pytestmark = pytest.mark.spark

CLASSIC = synthetic.generate_rounds(
    12, seed=21, lossy_every=5,
    configs=[c for c in synthetic.DEFAULT_CONFIGS if c.lease_ttl_s == 1.0 and c.nodes == 3])
NEMESIS = synthetic.generate_nemesis_rounds(18, seed=4)
DAMAGED = synthetic.generate_nemesis_rounds(4, seed=5, prefix="bad")


def _rewrite_checker(path: Path, change) -> int:
    """Apply ``change`` to the parsed checker line (None drops it); its 1-based line number."""
    lines = path.read_text().splitlines()
    index = next(i for i, x in enumerate(lines) if f'"event":"{ts.CHECKER}"' in x)
    new = change(json.loads(lines[index]))
    if new is None:
        del lines[index]
    elif isinstance(new, list):
        lines[index:index + 1] = [json.dumps(x) for x in new]
    else:
        lines[index] = new if isinstance(new, str) else json.dumps(new)
    path.write_text("\n".join(lines) + "\n")
    return index + 1


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def job(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("nemesis")
    traces = base / "traces"
    synthetic.write_traces(CLASSIC + NEMESIS, traces)
    damaged = synthetic.write_traces(DAMAGED, traces)
    bad_lines = {
        # a count that is not an integer: the line is malformed
        DAMAGED[0].round_id: _rewrite_checker(damaged[0], lambda c: {**c, ts.LOST: "none"}),
        # a required field missing
        DAMAGED[1].round_id: _rewrite_checker(
            damaged[1], lambda c: {k: v for k, v in c.items() if k != ts.VALID}),
    }
    _rewrite_checker(damaged[2], lambda c: [c, c])  # two verdicts for one round
    _rewrite_checker(damaged[3], lambda c: None)  # a nemesis round without a verdict
    result = failover_dashboard.run(str(traces), base / "out", spark=spark)
    out = base / "out"
    return {
        "result": result,
        "paths": dict(zip([r.round_id for r in DAMAGED], damaged, strict=True)),
        "bad_lines": bad_lines,
        "nemesis": {r[ts.ROUND]: r for r in _read_csv(out / "nemesis.csv")},
        "fault_types": _read_csv(out / "fault_types.csv"),
        "problems": _read_csv(out / "problems.csv"),
        "summary": {r[ts.ROUND]: r for r in _read_csv(out / "summary.csv")},
        "html": result.html.read_text(),
    }


def _csv_value(value: object) -> str:
    return "" if value is None else str(value)


def test_counts_of_the_run(job):
    result = job["result"]
    assert result.rounds == len(CLASSIC) + len(NEMESIS)
    assert result.rejected_rounds == len(DAMAGED)
    assert result.malformed_lines == 2
    assert result.nemesis_rounds == len(NEMESIS)
    assert result.failing_nemesis_rounds == sum(
        1 for r in NEMESIS if r.nemesis.verdict != ts.VERDICT_OK) == 6


def test_every_verdict_is_generated():
    assert {r.nemesis.verdict for r in NEMESIS} == set(ts.VERDICTS)


def test_nemesis_table_equals_the_generated_rounds(job):
    table = job["nemesis"]
    assert sorted(table) == sorted(r.round_id for r in NEMESIS)
    assert list(next(iter(table.values()))) == list(nm.NEMESIS_COLUMNS)
    for r in NEMESIS:
        row = table[r.round_id]
        assert Path(row["file"]).name == f"{r.round_id}.jsonl"
        for column, value in r.expected_nemesis().items():
            assert row[column] == _csv_value(value), (r.round_id, column)


def test_nemesis_rounds_keep_their_timing_figures(job):
    for r in NEMESIS:
        row = job["summary"][r.round_id]
        assert row[ts.FAULT] == ts.FAULT_NEMESIS
        for column, value in r.expected().items():
            assert row[column] == str(value), (r.round_id, column)


def _by_hand() -> dict[str, dict[str, int]]:
    """The fault-type table computed from the generator's own records."""
    kept = CLASSIC + NEMESIS
    injected, rounds, nemesis_rounds, failing_rounds = Counter(), {}, {}, {}
    in_failing, not_ok, roles = Counter(), Counter(), {}
    for r in kept:
        failing = (r.nemesis.verdict != ts.VERDICT_OK if r.nemesis
                   else r.lost_acknowledged > 0)
        ops = (r.nemesis.ops if r.nemesis
               else [synthetic.NemesisOp(0, r.config.fault, "n1", ts.RESULT_OK)])
        for o in ops:
            kind = o.fault_type
            roles[kind] = ts.op_role(o.op)
            if o.result == ts.RESULT_OK:
                injected[kind] += 1
                rounds.setdefault(kind, set()).add(r.round_id)
                if r.nemesis:
                    nemesis_rounds.setdefault(kind, set()).add(r.round_id)
                if failing:
                    failing_rounds.setdefault(kind, set()).add(r.round_id)
                    in_failing[kind] += 1
            else:
                not_ok[kind, ts.outcome(o.result)] += 1
    return {
        kind: {
            nm.ROLE: roles[kind],
            nm.INJECTED: injected[kind],
            nm.ROUNDS: len(rounds.get(kind, ())),
            nm.NEMESIS_ROUNDS: len(nemesis_rounds.get(kind, ())),
            nm.FAILING_ROUNDS: len(failing_rounds.get(kind, ())),
            nm.INJECTED_IN_FAILING: in_failing[kind],
            **{column: not_ok[kind, o] for o, column in nm.NOT_OK.items()},
        }
        for kind in roles
    }


def test_fault_types_equal_the_generated_ops(job):
    got = {r[nm.FAULT_TYPE]: r for r in job["fault_types"]}
    expected = _by_hand()
    assert set(got) == set(expected)
    for kind, figures in expected.items():
        for column, value in figures.items():
            assert got[kind][column] == str(value), (kind, column)
    # every classic fault and every fault kind of the nemesis is there
    assert set(ts.FAULTS) | {"promote", "partition-primary-etcd", "partition-primary-backups",
                             "partition-clients-primary", "sigcont", "restart", "heal"} <= set(got)
    # faults first, then recovery, check and script ops; the most injected first in each role
    order = [(ts.ROLES.index(r[nm.ROLE]), -int(r[nm.INJECTED])) for r in job["fault_types"]]
    assert order == sorted(order)


def test_malformed_or_missing_checker_lines_reject_their_round(job):
    problems = job["problems"]
    rejected = {p[ts.ROUND]: (p["file"], int(p["line"]), p["reason"])
                for p in problems if p["kind"] == "rejected round"}
    paths = job["paths"]
    malformed_checker = "no checker event; 1 malformed lines in its file"  # the line is unusable
    assert rejected == {
        DAMAGED[0].round_id: (str(paths[DAMAGED[0].round_id]), 1, malformed_checker),
        DAMAGED[1].round_id: (str(paths[DAMAGED[1].round_id]), 1, malformed_checker),
        DAMAGED[2].round_id: (str(paths[DAMAGED[2].round_id]), 1, "2 checker events"),
        DAMAGED[3].round_id: (str(paths[DAMAGED[3].round_id]), 1, "no checker event"),
    }
    malformed = {(p["file"], int(p["line"])): p["reason"]
                 for p in problems if p["kind"] == "malformed line"}
    assert malformed == {
        (str(paths[DAMAGED[0].round_id]), job["bad_lines"][DAMAGED[0].round_id]):
            "not a JSON object of the trace schema",
        (str(paths[DAMAGED[1].round_id]), job["bad_lines"][DAMAGED[1].round_id]):
            f"{ts.CHECKER} lacks {ts.VALID}",
    }
    assert not set(rejected) & set(job["nemesis"])
    assert not set(rejected) & set(job["summary"])
    # their ops are not counted either
    assert sum(int(r[nm.INJECTED]) for r in job["fault_types"]) == sum(
        v[nm.INJECTED] for v in _by_hand().values())


def _section(html: str, section: str) -> str:
    start = html.index(f'<section id="{section}">')
    return html[start:html.index("</section>", start)]


def test_page_shows_the_checker_panel(job):
    html = job["html"]
    panel = _section(html, "nemesis")
    failing = [r for r in NEMESIS if r.nemesis.verdict != ts.VERDICT_OK]
    # one row per round, failing rounds red and first
    rows = re.findall(r"<tr( class=\"[a-z]+\")?><td", panel)
    assert len(rows) == 1 + len(NEMESIS)  # the totals row and one row per round
    bad_rows = re.findall(r'<tr class="bad"><td class="text"><span title="([^":]+):', panel)
    assert bad_rows == sorted(r.round_id for r in failing)
    for r in failing:
        assert f'<span class="bad">{r.nemesis.verdict}</span>' in panel
        assert f"<b>{r.nemesis.schedule}</b>" in panel  # listed under "Failing rounds"
    invalid = next(r for r in failing if r.nemesis.verdict == ts.VERDICT_INVALID)
    assert " ".join(invalid.nemesis.lost_ids[:render.IDS_SHOWN]) in panel
    # totals
    total_lost = sum(r.nemesis.lost for r in NEMESIS)
    assert f'<span class="bad">{total_lost}</span>' in panel
    assert "4 nemesis rounds rejected" in panel
    alert = re.search(r'<div class="alert red" id="nemesis-alert">(.*?)</div>', html).group(1)
    assert "6 of 18 nemesis rounds failed the checker" in alert
    assert "2 INVALID, 2 MISMATCH, 2 NO VERDICT" in alert


def test_page_shows_the_fault_types(job):
    panel = _section(job["html"], "fault-types")
    assert panel.count('<svg class="chart"') == 1
    for row in job["fault_types"]:
        assert f'<td class="text">{row[nm.FAULT_TYPE]}</td>' in panel
        if row[nm.ROLE] in (ts.ROLE_FAULT, ts.ROLE_RECOVERY):
            injected = int(row[nm.INJECTED])
            failing = int(row[nm.INJECTED_IN_FAILING])
            if injected - failing:
                assert (f"<title>{row[nm.FAULT_TYPE]}: in passing rounds {injected - failing} "
                        "injections</title>") in panel
    roles = Counter(row[nm.ROLE] for row in job["fault_types"])
    assert roles[ts.ROLE_FAULT] > 1 and roles[ts.ROLE_RECOVERY] > 1
    for role in ts.ROLES:  # a total below every role with more than one fault type
        total = f'<tr class="total"><td class="text">all {role} ops</td>'
        assert (total in panel) == (roles[role] > 1), role


def test_classic_timing_figures_still_per_fault(job):
    phases = _section(job["html"], "phases")
    for fault in ts.FAULTS + (ts.FAULT_NEMESIS,):
        assert f"<h3>{fault}</h3>" in phases
    headline = _section(job["html"], "headline")
    assert 'id="lost-alert"' in headline and 'id="nemesis-alert"' in headline


def test_spark_expressions_agree_with_the_documented_functions(spark):
    from pyspark.sql import functions as F

    cases = [
        ("kill9", None, "ok"), ("partition", "primary-etcd", "skipped: n1 is down"),
        ("partition", None, "ok"), ("heal", None, "timeout: x"), ("promote", "x", "refused: no"),
        ("check", None, "MISMATCH"), ("elect_each", None, "failed: n2 exited"),
        ("send", "b", "weird"), ("restart", None, "ok"), ("sigcont", None, "ok"), ("kill9-all", None, "ok"),
    ]
    df = spark.createDataFrame(cases, "op string, arg string, result string")
    got = df.select(
        nm.fault_type(F.col("op"), F.col("arg")).alias("type"), nm.role(F.col("op")).alias("role"),
        nm.outcome(F.col("result")).alias("outcome"),
    ).collect()
    assert [tuple(r) for r in got] == [
        (ts.fault_type(op, arg), ts.op_role(op), ts.outcome(result)) for op, arg, result in cases
    ]
    verdicts = [(v, d, m) for v in (True, False) for d in (True, False) for m in (0, 3)]
    vdf = spark.createDataFrame(verdicts, f"{ts.VALID} boolean, {ts.DRAIN_COMPLETE} boolean, "
                                          f"{ts.REPLICA_MISMATCHES} long")
    got = [r[0] for r in vdf.select(nm.verdict(F.struct("*"))).collect()]
    assert got == [ts.verdict(*v) for v in verdicts]
