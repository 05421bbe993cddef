"""The phase and percentile definitions the failover benchmark shares with the Spark job."""

from __future__ import annotations

import pytest

from spark_analysis import phases as ph
from spark_analysis import trace_schema as ts


def test_sequential_phases_add_up_to_the_unavailability():
    milestones = {
        ts.LEADER_KEY_GONE: 0.02,
        ts.ELECTION_WON: 0.025,
        ts.PROMOTED: 0.026,
        ts.CLIENT_RECONNECTED: 0.126,
        ts.FIRST_ACCEPTED_AFTER_FAULT: 0.127,
        ts.BACKUP_REATTACHED: 0.3,
        ts.BACKUP_CAUGHT_UP: 0.5,
    }
    d = ph.durations(milestones)
    assert d == {
        "detection": 0.02, "election": 0.005, "promotion": 0.001, "reconnect": 0.1, "first_send": 0.001,
        "unavailability": 0.127, "reattach": 0.274, "catch_up": 0.2,
    }
    assert sum(d[ph.phase_name(p)] for p in ph.SEQUENTIAL) == pytest.approx(d["unavailability"])


def test_a_milestone_never_reached_leaves_the_phases_around_it_empty():
    d = ph.durations({ts.LEADER_KEY_GONE: 2.0, ts.ELECTION_WON: None, ts.PROMOTED: 2.01})
    assert d["detection"] == 2.0
    assert d["election"] is None and d["promotion"] is None
    assert d["unavailability"] is None and d["reattach"] is None


@pytest.mark.parametrize(
    ("values", "percent", "expected"),
    [
        ([], 50, None),
        ([7.0], 99, 7.0),
        ([4.0, 1.0, 3.0, 2.0], 50, 2.0),
        ([float(v) for v in range(1, 11)], 90, 9.0),
        ([float(v) for v in range(1, 101)], 99, 99.0),
        ([float(v) for v in range(1, 101)], 100, 100.0),
    ],
)
def test_nearest_rank_is_an_observed_value_at_rank_ceil_p_n_over_100(values, percent, expected):
    assert ph.nearest_rank(values, percent) == expected
