"""Aggregates: nearest-rank percentiles equal the ones computed by hand from known values."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from spark_analysis import aggregates as ag
from spark_analysis import phases as ph
from spark_analysis import round_metrics as rm
from spark_analysis import synthetic
from spark_analysis import trace_schema as ts
from spark_analysis.ingest import read_lines

pytestmark = pytest.mark.spark

CONFIGS = (
    synthetic.RoundConfig(ts.FAULT_KILL9, 1.0, 3, 500),
    synthetic.RoundConfig(ts.FAULT_SIGSTOP, 2.0, 2, 200),
    synthetic.RoundConfig(ts.FAULT_SIGTERM, 1.0, 3, 1000),
)
ROUNDS = 3 * 37  # 37 rounds per configuration: no percentile rank falls on a round number


def by_hand(values: list[float], percent: int) -> float:
    """Nearest rank, written independently: smallest v with >= percent % of values <= v."""
    ordered = sorted(values)
    for v in ordered:
        if sum(1 for x in ordered if x <= v) * 100 >= percent * len(ordered):
            return v
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def rounds() -> list[synthetic.SyntheticRound]:
    return synthetic.generate_rounds(ROUNDS, seed=3, configs=CONFIGS, lossy_every=10)


@pytest.fixture(scope="module")
def aggregates(spark, rounds, tmp_path_factory) -> list[dict]:
    traces = tmp_path_factory.mktemp("traces")
    synthetic.write_traces(rounds, traces)
    lines = read_lines(spark, [str(traces)])
    summary = rm.summarize_rounds(lines.events, lines.malformed).summary
    rows = [r.asDict() for r in ag.by_configuration(summary).collect()]
    lines.release()
    return rows


def test_one_row_per_configuration(aggregates):
    assert len(aggregates) == len(CONFIGS)
    assert all(a[ag.ROUNDS] == 37 and a[ag.UNRECOVERED] == 0 for a in aggregates)


def test_percentiles_equal_known_values_exactly(aggregates, rounds):
    for a in aggregates:
        mine = [r.expected() for r in rounds
                if (r.config.fault, r.config.lease_ttl_s, r.config.nodes, r.config.load_msg_s)
                == tuple(a[c] for c in ph.CONFIG_COLUMNS)]
        assert len(mine) == 37
        for d in ph.DURATION_COLUMNS:
            values = [m[d] for m in mine]
            assert a[ag.stat_column(d, "count")] == 37
            assert a[ag.stat_column(d, "min")] == min(values)
            assert a[ag.stat_column(d, "max")] == max(values)
            for p in ph.PERCENTILES:
                assert a[ag.stat_column(d, f"p{p}")] == by_hand(values, p), (a[ts.FAULT], d, p)


def test_share_of_rounds_losing_acknowledged_messages(aggregates, rounds):
    for a in aggregates:
        lossy = sum(1 for r in rounds if r.config.fault == a[ts.FAULT] and r.lost_acknowledged)
        assert a[ag.LOSSY_ROUNDS] == lossy
        assert a[ag.LOSSY_SHARE] == lossy / 37
    assert sum(a[ag.LOSSY_ROUNDS] for a in aggregates) == ROUNDS // 10


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], {25: None, 50: None, 99: None}),
        ([7.0], {25: 7.0, 50: 7.0, 99: 7.0}),
        ([float(v) for v in range(1, 11)], {25: 3.0, 50: 5.0, 75: 8.0, 90: 9.0, 99: 10.0}),
        ([4.0, 1.0, 3.0, 2.0], {25: 1.0, 50: 2.0, 75: 3.0, 90: 4.0}),
    ],
)
def test_nearest_rank_definition(spark, values, expected):
    df = spark.createDataFrame([(values,)], "v array<double>")
    row = df.select(*[
        ag.nearest_rank(F.array_sort("v"), p).alias(str(p)) for p in expected
    ]).first()
    assert {p: row[str(p)] for p in expected} == expected
    assert {p: ph.nearest_rank(values, p) for p in expected} == expected, "the benchmarks' rule differs"
