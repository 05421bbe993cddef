"""The nemesis suite's fixed schedules against the real thing: etcd and three nodes in network namespaces.

Each test runs one named schedule of ``tests/nemesis/schedule.py`` end
to end (fresh namespaces, etcd, nodes and clients; everything stopped by PID
and the namespaces deleted, also when the schedule fails) and asserts what a
hot-standby cluster promises: no acknowledged message lost, none conjured,
and every ready backup holding what the primary holds; where the nodes
hold a virtual IP, also the primary alone holding it at every check, and
the producer that knows only that address acknowledged and checked with
the others; every ``assert`` op of the schedule holding (a damaged node is
not elected, a failed backup costs no message, ...), and, in a schedule with
disk faults, every op having run (a rot that was skipped tested nothing),
and no mount or loop device left behind.  A schedule the harness could not complete (the cluster never
settled, a client failed, the drain left messages behind) fails too: there
is no verdict then.

These tests find real bugs: on a product that loses acknowledged messages
they fail, and that is their job (``docs/nemesis.md`` says which and why).
Needs root (network namespaces, loop devices, mounts) and etcd.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from hastandby.testing.netns_workload import VIRTUAL_IP_PRODUCER
from tests.nemesis.runner import Settings, run_schedule
from tests.nemesis.schedule import ASSERT, CANARIES, DISK_FAIL, FIXED, ROT, parse_faults, random_schedule

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(150)]


def _namespaces() -> set[str]:
    """This process's nemesis namespaces (``network.py`` names them by pid: another run's come and go)."""
    mine = f"nemesis-{os.getpid() % 100000:05d}"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.startswith(mine)}


def _mounts() -> set[str]:
    """Mount points under a nemesis work dir (``/tmp/nemesis-*``: the nodes' disks, their shared bind mount)."""
    with open("/proc/mounts", encoding="utf-8") as mounts:
        return {line.split()[1] for line in mounts if "/nemesis-" in line.split()[1]}


def _attached(images: list[str]) -> list[str]:
    """Loop devices still backed by one of ``images`` (other tests' loops, e.g. test_disk_faults.py's, differ)."""
    listed = subprocess.run(["losetup", "-a"], capture_output=True, text=True, timeout=10, check=False).stdout
    return [line for line in listed.splitlines() if any(f"({image}" in line for image in images)]


@pytest.mark.parametrize("name", list(FIXED))
def test_fixed_schedule(name, tmp_path):
    assert os.geteuid() == 0, "the nemesis runs every node in a network namespace of its own: run as root"
    before, mounts_before = _namespaces(), _mounts()
    result = run_schedule(FIXED[name], f"test-{os.getpid()}", Settings(out=tmp_path))
    assert _namespaces() == before, "the schedule left network namespaces behind"
    assert _mounts() == mounts_before, "the schedule left mounts behind"
    assert not _attached(result["disk_images"]), "the schedule left loop devices behind"
    assert not any(os.path.exists(image) for image in result["disk_images"]), "the schedule left disk images behind"
    assert bool(result["disk_images"]) == FIXED[name].disks, result["disk_images"]
    report = (f"{name}: {result['verdict_text']}\nreplica mismatches {result['replica_mismatches']}: "
              f"{[c.get('diffs') for c in result['replica_checks'] if c.get('mismatches')]}\n"
              f"error {result['error']}; drain {result['drain']}, depth after {result['depth_after_drain']}; "
              f"skipped {result['skipped_ops']}; timeouts {result['timeout_ops']}\n"
              f"violated {result['violated']}\ntrace {result['trace']}, logs {result['logs']}")
    assert result["complete"], f"no verdict: {report}"
    assert result["valid"], report
    assert result["replica_mismatches"] == 0, report
    assert result["verdict"]["acknowledged"] > 0, report
    assert not result["violated"], report
    ops = FIXED[name].ops
    if any(op.kind in (ROT, DISK_FAIL, ASSERT) for op in ops):  # a disk fault that did not happen tested nothing
        assert not result["skipped_ops"] and not result["timeout_ops"], report
        assert [a["result"] for a in result["assertions"]] == ["ok"] * sum(op.kind == ASSERT for op in ops), report
    if FIXED[name].virtual_ip:  # its producer through the address had its messages checked with the others
        assert result["acknowledged_by_client"].get(VIRTUAL_IP_PRODUCER, 0) > 0, report
        placed = [c["virtual_ip_on"] for c in result["replica_checks"] if "virtual_ip_on" in c]
        assert placed and result["virtual_ip_misplaced_checks"] == 0, f"{placed}\n{report}"


def test_the_checker_sees_a_damaged_node_that_starts_the_cluster(tmp_path):
    """The negative control ``damaged-node-forced-first``: the node whose journal rotted is forced on
    (``promote --force``, an operator accepting the loss) while the others are down; they follow it and drop
    the copies it lost.  The harness must report those acknowledged messages as lost: a checker that passes
    this schedule could not see a damaged node elected."""
    assert os.geteuid() == 0, "the nemesis runs every node in a network namespace of its own: run as root"
    result = run_schedule(CANARIES["damaged-node-forced-first"], f"test-{os.getpid()}", Settings(out=tmp_path))
    report = f"{result['verdict_text']}\nerror {result['error']}; trace {result['trace']}, logs {result['logs']}"
    assert result["complete"], f"no verdict: {report}"
    assert [a["result"] for a in result["assertions"]] == ["ok"], report  # the rot was found as damage
    assert not result["valid"] and result["verdict"]["lost"] > 0 and not result["ok"], report


def test_a_dedup_queue_takes_no_re_sent_message_twice(tmp_path):
    """A random schedule (seed 2813: SIGSTOPs of the primary, kill -9 of every node twice, of a backup once)
    on a queue declared with ``x-dedup-window`` (``--queue dedup``): the producers re-send, with the same
    message-id, what was in doubt at each fault.  On a plain queue a re-send of a message the cluster had
    kept is a second copy (4 in this schedule's plain run, docs/nemesis.md); on this queue the node accepts
    it and keeps one: no id that was sent more than once is received more than once, and nothing
    acknowledged is lost."""
    assert os.geteuid() == 0, "the nemesis runs every node in a network namespace of its own: run as root"
    schedule = random_schedule(2813, parse_faults("kill,all,stop"))
    result = run_schedule(schedule, f"test-{os.getpid()}", Settings(out=tmp_path, dedup_window=600))
    report = (f"{result['verdict_text']}\nre-sent ids {result['resent_ids']}, duplicated by a re-send "
              f"{result['duplicated_resent']}, delivered twice {result['duplicated_redelivered']}, deduplicated "
              f"{result['deduplicated']}; error {result['error']}; trace {result['trace']}, logs {result['logs']}")
    assert result["queue"] == "dedup" and result["complete"] and result["valid"], report
    assert result["replica_mismatches"] == 0, report
    assert result["resent_ids"] > 0, f"nothing was re-sent: the schedule tested nothing\n{report}"
    assert result["duplicated_resent"] == 0, report
