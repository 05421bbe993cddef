"""The failover benchmark's cases: a fault and how the clients reach the cluster, as ``--faults`` and ``--via`` say."""

from __future__ import annotations

import pytest

from benchmarks.failover import parse_cases
from benchmarks.failover_lan import VIA_LOOPBACK, VIA_URLS, VIA_VIRTUAL_IP, Case
from spark_analysis import trace_schema as ts


def test_loopback_cases_keep_the_fault_names_of_earlier_reports():
    cases = parse_cases("kill,stop,term,kill9", VIA_LOOPBACK)
    assert [c.name for c in cases] == [ts.FAULT_KILL9, ts.FAULT_SIGSTOP, ts.FAULT_SIGTERM]
    assert not any(c.on_lan or c.supervised for c in cases)
    assert parse_cases("kill9-broker", VIA_LOOPBACK)[0].supervised


def test_a_way_written_before_a_fault_overrides_via():
    cases = parse_cases("kill, cut, stop, urls:cut", VIA_VIRTUAL_IP)
    assert cases == [Case(ts.FAULT_KILL9, VIA_VIRTUAL_IP), Case(ts.FAULT_CUT, VIA_VIRTUAL_IP),
                     Case(ts.FAULT_SIGSTOP, VIA_VIRTUAL_IP), Case(ts.FAULT_CUT, VIA_URLS)]
    assert [c.name for c in cases] == ["kill9/virtual-ip", "cut/virtual-ip", "sigstop/virtual-ip", "cut/urls"]
    assert all(c.on_lan and c.supervised for c in cases)


@pytest.mark.parametrize("text, message", [
    ("cut", "cut needs the LAN"),
    ("wan:kill", "unknown way 'wan'"),
    ("fire", "unknown fault 'fire'"),
    (" , ", "no fault given"),
])
def test_what_cannot_run_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_cases(text, VIA_LOOPBACK)
