"""The nemesis suite's fixed schedules against the real thing: etcd and three nodes in network namespaces.

Each test runs one named schedule of ``benchmarks/nemesis/schedule.py`` end
to end (fresh namespaces, etcd, nodes and clients; everything stopped by PID
and the namespaces deleted, also when the schedule fails) and asserts what a
hot-standby cluster promises: no acknowledged message lost, none conjured,
and every ready backup holding what the primary holds; where the nodes
hold a virtual IP, also the primary alone holding it at every check, and
the producer that knows only that address acknowledged and checked with
the others.  A schedule the harness could not complete (the cluster never
settled, a client failed, the drain left messages behind) fails too: there
is no verdict then.

These tests find real bugs: on a product that loses acknowledged messages
they fail, and that is their job (``docs/nemesis.md`` says which and why).
Needs root (network namespaces) and etcd.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from benchmarks.nemesis.runner import Settings, run_schedule
from benchmarks.nemesis.schedule import FIXED
from benchmarks.nemesis.workload import VIRTUAL_IP_PRODUCER

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(150)]


def _namespaces() -> set[str]:
    """This process's nemesis namespaces (``network.py`` names them by pid: another run's come and go)."""
    mine = f"nemesis-{os.getpid() % 100000:05d}"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.startswith(mine)}


@pytest.mark.parametrize("name", list(FIXED))
def test_fixed_schedule(name, tmp_path):
    assert os.geteuid() == 0, "the nemesis runs every node in a network namespace of its own: run as root"
    before = _namespaces()
    result = run_schedule(FIXED[name], f"test-{os.getpid()}", Settings(out=tmp_path))
    assert _namespaces() == before, "the schedule left network namespaces behind"
    report = (f"{name}: {result['verdict_text']}\nreplica mismatches {result['replica_mismatches']}: "
              f"{[c.get('diffs') for c in result['replica_checks'] if c.get('mismatches')]}\n"
              f"error {result['error']}; drain {result['drain']}, depth after {result['depth_after_drain']}; "
              f"skipped {result['skipped_ops']}\ntrace {result['trace']}, logs {result['logs']}")
    assert result["complete"], f"no verdict: {report}"
    assert result["valid"], report
    assert result["replica_mismatches"] == 0, report
    assert result["verdict"]["acknowledged"] > 0, report
    if FIXED[name].virtual_ip:  # its producer through the address had its messages checked with the others
        assert result["acknowledged_by_client"].get(VIRTUAL_IP_PRODUCER, 0) > 0, report
        placed = [c["virtual_ip_on"] for c in result["replica_checks"] if "virtual_ip_on" in c]
        assert placed and result["virtual_ip_misplaced_checks"] == 0, f"{placed}\n{report}"
