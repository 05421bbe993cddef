"""A damaged or failing disk on one node, with real kernel faults, real nodes, a real etcd and real clients.

- **Bit rot** in the middle of a sync member's journal (3 bytes flipped in the real file), then the
  restart orders an operator uses, the damaged node first and alone among them: no acknowledged message
  is lost or changed (bodies checked byte for byte), the damaged node is never elected while it lacks
  data, and it recovers what it lacks from a healthy peer (``hastandby verify`` equal afterwards).
- **A backup whose disk turns read-only** (ext4 on a loop device mounted ``errors=remount-ro``, failed
  through ``/sys/fs/ext4/<dev>/trigger_fs_error``): it leaves at once; with three nodes producers go on
  being acknowledged under ``--min-sync 2``, with two they get a clear refusal, never a silent hold; the
  node comes back once its disk is repaired.
- **A full disk** (a small tmpfs) stays refused until a probe of real size fits, not flapping back at the
  next small write.

Needs root (mounts, loop devices) and etcd.
"""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from hastandby.broker.store import journal_files
from hastandby.client import ManagementClient
from hastandby.testing.bodies import body, check_every_body, drain_bodies, send_bodies
from hastandby.testing.disks import Ext4Loop, Tmpfs, flip
from hastandby.testing.etcd_ha import EtcdHa
from hastandby.testing.nodes import REPO, NodeProcess
from hastandby.testing.numbered_client import NumberedSender, drain
from hastandby.testing.waiting import wait_for

pytestmark = pytest.mark.timeout(240)

COUNT = 2000


def create_durable_queue(node: NodeProcess, name: str) -> None:
    with ManagementClient(node.address, timeout=10) as client:
        client.request("CREATE", "queue", name, {"durable": True})


def hastandby(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hastandby", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def stays_out(c: EtcdHa, index: int, seconds: float) -> list[str | None]:
    """Node ``index``'s states over ``seconds``: it must never be primary meanwhile."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = c.state(index)
        seen.append(state)
        assert state != "primary", f"{c.ids[index]} was elected while its journal lacked data: {seen}"
        time.sleep(0.1)
    return seen


def verified_then_served_by(c: EtcdHa, primary: int, recovered: int, acknowledged: set[int]) -> None:
    """``hastandby verify`` finds every backup equal to the primary; then the node that recovered from the
    damage takes over (``promote``) and serves every acknowledged message, byte for byte."""
    verified = hastandby("verify", "-b", c[primary].address)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    promoted = hastandby("promote", "-b", c[recovered].address)
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr
    c.wait_state(recovered, "primary", timeout=20)
    check_every_body(drain_bodies(c[recovered].url, "q"), acknowledged)


JOURNAL_DAMAGED = ("journal damaged: records that were on disk are lost on this node; the file is kept aside. "
                   "The node lacks data until it has caught up from a healthy primary, and is not elected meanwhile")


# -- bit rot in the middle of a sync member's journal ---------------------------------------------------


@pytest.mark.etcd
@pytest.mark.parametrize("order", ["damaged-first-alone", "intact-first", "together"])
def test_bit_rot_in_a_sync_members_journal_loses_nothing_in_any_restart_order(ha, order):
    """The issue's run: two nodes, ``--min-sync 2`` (the sync set is both), 2,000 durable messages
    acknowledged; the backup stopped cleanly, 3 bytes of the middle of its journal flipped; the primary
    killed; then the nodes started again in ``order``."""
    c: EtcdHa = ha(2, data=True)
    primary = c.wait_replicating()
    damaged = 1 - primary
    create_durable_queue(c[primary], "q")
    c.wait_following(damaged, primary)
    sent = send_bodies(c[primary].url, "q", range(1, COUNT + 1))
    assert sent.accepted == set(range(1, COUNT + 1)) and not sent.rejected
    wait_for(lambda: c.depth(damaged, "q") == COUNT, 30, "the backup holding all 2000")

    assert c[damaged].stop() == 0  # SIGTERM: a clean stop
    journal = c.data_dir(damaged) / "journal"
    flip(journal, journal.stat().st_size // 2)
    c[primary].kill()

    if order == "damaged-first-alone":
        c.restart(damaged).wait_ready(30)
        states = stays_out(c, damaged, 5.0)
        status = c.status(damaged)
        print(f"\n{c.ids[damaged]} alone for 5 s: {sorted(set(states), key=str)}; "
              f"not ready because: {status and status.get('not_ready_because')}")
        assert status is not None and status["state"] == "connecting"
        assert "damaged" in (status.get("not_ready_because") or ""), status
        assert status["journal"]["damaged"], "STATUS names the damage"
        assert status["journal"]["clean_shutdown"], "it stopped cleanly: the checkpoint says so despite the damage"
        c.restart(primary).wait_ready(30)
    elif order == "intact-first":
        c.restart(primary).wait_ready(30)
        c.wait_state(primary, "primary", timeout=20)
        c.restart(damaged).wait_ready(30)
    else:
        c.restart(damaged)
        c.restart(primary)
        c[damaged].wait_ready(30)
        c[primary].wait_ready(30)
    new = c.wait_settled(timeout=60)
    assert new == primary, f"{c.ids[damaged]}, whose journal lacks data, was elected"
    c.wait_following(damaged, primary, timeout=30)
    wait_for(lambda: not (c.status(damaged) or {}).get("journal", {}).get("damaged"), 20,
             "the damaged node holding everything again (caught up)")

    logged = c.events(damaged, JOURNAL_DAMAGED)
    assert logged and logged[-1]["lost_bytes"] > 0 and logged[-1]["ranges"], "an error naming what was lost"
    quarantined = Path(logged[-1]["quarantined"])
    assert quarantined.exists() and quarantined.name.startswith(journal_files.QUARANTINE_PREFIX)
    assert not (c.data_dir(damaged) / journal_files.DAMAGE).exists()
    print(f"lost on {c.ids[damaged]}: {logged[-1]['ranges']}, kept as {quarantined.name}")

    verified_then_served_by(c, primary, damaged, sent.accepted)


@pytest.mark.etcd
def test_bit_rot_then_every_node_killed_the_damaged_node_back_first_waits_for_an_intact_one(ha):
    """Three nodes, all in the sync set; kill -9 of every node (no clean stop: the checkpoint, not a CLOSE
    record, says which bytes were on disk); bit rot in one backup's journal; that node is started first and
    alone, then a second: the intact one starts the cluster, the damaged one catches up, is elected in
    turn and serves every acknowledged message."""
    c: EtcdHa = ha(3, data=True)
    primary = c.wait_replicating()
    create_durable_queue(c[primary], "q")
    backups = [i for i in range(3) if i != primary]
    for index in backups:
        c.wait_following(index, primary)
    sent = send_bodies(c[primary].url, "q", range(1, COUNT + 1))
    assert sent.accepted == set(range(1, COUNT + 1))
    for index in backups:
        wait_for(lambda index=index: c.depth(index, "q") == COUNT, 30, "every backup holding all 2000")
    time.sleep(1.5)  # the journals' checkpoints follow what is on disk within a second
    for node in c.nodes:
        node.kill()
    damaged, intact = backups
    journal = c.data_dir(damaged) / "journal"
    flip(journal, journal.stat().st_size // 2)

    c.restart(damaged).wait_ready(30)
    stays_out(c, damaged, 4.0)
    assert c.state(damaged) == "connecting"
    c.restart(intact).wait_ready(30)
    c.wait_state(intact, "primary", timeout=30)
    c.restart(primary).wait_ready(30)
    c.wait_following(damaged, intact, timeout=30)
    c.wait_following(primary, intact, timeout=30)
    assert c.events(damaged, JOURNAL_DAMAGED), "the damage was found"
    verified_then_served_by(c, intact, damaged, sent.accepted)


@pytest.mark.etcd
def test_promote_force_starts_a_damaged_node_alone_and_says_what_is_lost(ha):
    """Only an operator who accepts the loss starts a cluster from a damaged journal: ``promote --force``
    names it; the messages the damage took are gone, every other one is served."""
    c: EtcdHa = ha(2, data=True)
    primary = c.wait_replicating()
    damaged = 1 - primary
    create_durable_queue(c[primary], "q")
    c.wait_following(damaged, primary)
    sent = send_bodies(c[primary].url, "q", range(1, 501))
    wait_for(lambda: c.depth(damaged, "q") == 500, 30, "the backup holding all 500")
    assert c[damaged].stop() == 0
    journal = c.data_dir(damaged) / "journal"
    flip(journal, journal.stat().st_size // 2)
    c[primary].kill()
    c.restart(damaged).wait_ready(30)
    stays_out(c, damaged, 3.0)
    refused = hastandby("promote", "-b", c[damaged].address)
    assert refused.returncode != 0 and "damaged" in refused.stderr + refused.stdout
    forced = hastandby("promote", "--force", "-b", c[damaged].address)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    print(f"\n{forced.stdout.strip()}")
    assert "damaged journal lost" in forced.stdout and "lost" in forced.stdout
    c.wait_state(damaged, "primary", timeout=20)
    found = drain_bodies(c[damaged].url, "q")
    assert found and set(found) < sent.accepted, "what the damage took is gone, the rest is there"
    assert all(data == body(n) for n, data in found.items()), "no message changed"


# -- a backup's disk turns read-only ------------------------------------------------------------------------


@contextmanager
def cluster_on_disks(etcd: Any, tmp_path: Path, size: int, disk: Callable[[Path], Any] = Ext4Loop
                     ) -> Iterator[tuple[EtcdHa, list[Any]]]:
    """``size`` etcd nodes, each with its data dir on a disk of its own (``disk(path)``, a context manager:
    ``Ext4Loop`` or a ``Tmpfs``); the nodes stopped and the disks unmounted afterwards, whatever happened."""
    c = EtcdHa(etcd, tmp_path, size, data=True)
    with ExitStack() as stack:
        disks = [stack.enter_context(disk(c.data_dir(index))) for index in range(size)]
        stack.callback(c.stop)  # (callbacks run last first: the nodes stop before their disks go)
        c.start()
        yield c, disks


@pytest.mark.etcd
def test_a_backup_whose_disk_turns_read_only_leaves_and_producers_go_on(etcd, tmp_path):
    with cluster_on_disks(etcd, tmp_path, 3) as (c, disks):
        primary = c.wait_replicating()
        create_durable_queue(c[primary], "q")
        failing, other = [i for i in range(3) if i != primary]
        for index in (failing, other):
            c.wait_following(index, primary)
        sender = NumberedSender(c.url_list, "q", count=4000, rate=400, durable=True, time_limit=90).start()
        assert sender.wait_accepted(800, 30), sender.status()
        failed_at = time.time()
        disks[failing].fail()
        assert sender.join(60) and sender.done, sender.status()
        gap = sender.max_gap(since=failed_at - 0.5)
        print(f"\n{c.ids[failing]}'s disk read-only: {sender.accepted_count} accepted, longest wait for an "
              f"acknowledgement after the fault {gap:.2f} s")
        assert not sender.missing() and not sender.rejected
        assert gap < 5.0, "producers held while a backup that cannot store stayed in the sync set"

        status = c.status(failing)
        assert status is not None and status["state"] == "catchup", status and status["state"]
        assert status["journal"]["writing"] is False and "Read-only" in status["journal"]["error"]
        assert "cannot write" in (status.get("not_ready_because") or "")
        query = c.query(primary)["ha"]
        assert "Read-only file system" in query["not_storing"].get(c.ids[failing], ""), query["not_storing"]
        assert query["acks_held"]["refusing"] is None
        assert [m for m in query["members"] if m["node_id"] == c.ids[failing]] == [] or \
            all(m["state"] != "ready" for m in query["members"] if m["node_id"] == c.ids[failing])
        assert c.events(primary, "backup cannot store: it leaves the ready and sync sets")

        # The operator repairs the disk: the node comes back and catches up.
        c[failing].kill()
        disks[failing].repair()
        c.restart(failing).wait_ready(30)
        c.wait_following(failing, primary, timeout=30)
        verified = hastandby("verify", "-b", c[primary].address)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        receiver = drain([c[primary].url], "q", sender.accepted_set, time_limit=60)
        assert not receiver.missing(sender.accepted_set)


@pytest.mark.etcd
def test_with_two_nodes_a_backup_that_cannot_store_gets_producers_a_clear_refusal(etcd, tmp_path):
    """``--min-sync 2`` cannot be met without the backup: the primary refuses, naming it and why, at once;
    nothing refused stays on a queue; messages are taken again once the backup is back and caught up."""
    with cluster_on_disks(etcd, tmp_path, 2) as (c, disks):
        primary = c.wait_replicating()
        failing = 1 - primary
        create_durable_queue(c[primary], "q")
        c.wait_following(failing, primary)
        before = send_bodies(c[primary].url, "q", range(1, 201))
        assert before.accepted == set(range(1, 201))
        disks[failing].fail()
        started = time.monotonic()
        during = send_bodies(c[primary].url, "q", range(201, 301), window=1, timeout=60)
        took = time.monotonic() - started
        conditions = set(during.rejected.values())
        print(f"\ntwo nodes, the backup's disk read-only: {len(during.accepted)} accepted, {len(during.rejected)} "
              f"refused in {took:.1f} s: {sorted(conditions)[:2]}")
        assert during.rejected, "a refusal, not a silent hold"
        assert all(text.startswith("amqp:resource-limit-exceeded") and c.ids[failing] in text
                   for text in conditions), conditions
        query = c.query(primary)["ha"]
        assert query["acks_held"]["refusing"] and c.ids[failing] in query["acks_held"]["refusing"]
        status = c.status(primary)
        assert status and status.get("refusing"), "STATUS says why producers are refused"
        shown = hastandby("status", "-b", c[primary].address)
        assert "refusing messages for replicated queues" in shown.stdout, shown.stdout

        c[failing].kill()
        disks[failing].repair()
        c.restart(failing).wait_ready(30)
        c.wait_following(failing, primary, timeout=30)
        after = send_bodies(c[primary].url, "q", range(301, 401))
        assert after.accepted == set(range(301, 401)), after.rejected
        accepted = before.accepted | during.accepted | after.accepted
        found = drain_bodies(c[primary].url, "q")
        check_every_body(found, accepted)
        assert not set(found) & set(during.rejected), "a refused message was kept"


@pytest.mark.etcd
def test_a_backup_whose_disk_fills_leaves_and_comes_back_by_itself_once_there_is_room(etcd, tmp_path):
    """ENOSPC on a backup: it leaves (producers go on, min_sync met by the others), says why, and once the
    operator makes room its probe fits: it reconnects and catches up without a restart."""
    with cluster_on_disks(etcd, tmp_path, 3, lambda path: Tmpfs(path, 16 << 20)) as (c, disks):
        primary = c.wait_replicating()
        create_durable_queue(c[primary], "q")
        full, other = [i for i in range(3) if i != primary]
        disks[full].fill(leave=64 << 10)  # about 1,000 of these messages
        sender = NumberedSender(c.url_list, "q", count=3000, rate=500, durable=True, time_limit=90).start()
        assert sender.join(60) and sender.done, sender.status()
        status = c.status(full)
        print(f"\n{c.ids[full]}'s disk full: {sender.accepted_count} accepted, longest wait "
              f"{sender.max_gap():.2f} s; {c.ids[full]}: {status and status.get('not_ready_because')}")
        assert status is not None and status["state"] == "catchup" and status["journal"]["writing"] is False
        assert "No space left on device" in c.query(primary)["ha"]["not_storing"].get(c.ids[full], "")
        (c.data_dir(full) / "filler").unlink()
        c.wait_following(full, primary, timeout=30)
        assert c.query(primary)["ha"]["not_storing"] == {}
        verified = hastandby("verify", "-b", c[primary].address)
        assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.etcd
def test_a_primary_whose_disk_turns_read_only_hands_over_to_a_backup_that_can_write(etcd, tmp_path):
    """A primary that cannot write would refuse every durable message for as long as its disk is broken: it
    hands over to a ready backup instead, and a producer with the URL list goes on."""
    with cluster_on_disks(etcd, tmp_path, 3) as (c, disks):
        primary = c.wait_replicating()
        create_durable_queue(c[primary], "q")
        sender = NumberedSender(c.url_list, "q", count=3000, rate=300, durable=True, time_limit=90).start()
        assert sender.wait_accepted(600, 30), sender.status()
        failed_at = time.time()
        disks[primary].fail()
        new, _ = c.wait_new_primary([i for i in range(3) if i != primary], timeout=20)
        wait_for(lambda: sender.issued >= 3000 and not sender.in_flight, 60, "every message settled")
        sender.stop()
        sender.join(10)
        gap = sender.max_gap(since=failed_at - 0.5)
        print(f"\nthe primary's disk read-only: {c.ids[new]} took over; {sender.accepted_count} accepted, "
              f"{len(sender.rejected)} refused (the write that failed), longest wait for an acknowledgement "
              f"{gap:.2f} s")
        assert sender.accepted_set | set(sender.rejected) == set(range(1, 3001)), "every message answered"
        assert len(sender.rejected) < 100, "only what the failed write held is refused"
        assert gap < 5.0
        assert c.events(primary, "this primary's journal cannot write: handing over to a backup that can")
        status = c.status(primary)
        assert status is not None and status["state"] == "connecting" and "cannot write" in \
            (status.get("not_ready_because") or ""), status
        c[primary].kill()
        disks[primary].repair()
        c.restart(primary).wait_ready(30)
        c.wait_following(primary, new, timeout=30)
        receiver = drain([c[new].url], "q", sender.accepted_set, time_limit=60)
        assert not receiver.missing(sender.accepted_set)


# -- a full disk ----------------------------------------------------------------------------------------------


def test_a_full_disk_stays_refused_until_a_probe_of_real_size_fits(node_factory, tmp_path):
    """The issue's flapping: a little room back (the failed write cut off, a small file removed) must not
    let the journal take durable messages again, only to fail the next ones; room for a probe of real size
    does."""
    with Tmpfs(tmp_path / "disk", 8 << 20) as disk:
        small = disk.mount / "small"
        small.write_bytes(bytes(64 << 10))
        disk.fill(leave=100 << 10)  # about 250 of these messages' records
        node = node_factory("--data-dir", str(disk.mount), name="full")
        create_durable_queue(node, "q")
        first = send_bodies(node.url, "q", range(1, 1001), window=1)
        refused_from = min(first.rejected) if first.rejected else None
        print(f"\nnearly full disk: {len(first.accepted)} accepted, then {len(first.rejected)} refused")
        assert refused_from is not None, "the disk should fill"
        assert all(n < refused_from for n in first.accepted), \
            "accepted again after a refusal: the refusal flapped at the next small write"
        assert all(text.startswith("amqp:resource-limit-exceeded") for text in first.rejected.values())
        small.unlink()  # 64 KiB free again: room for a record or two, not for a pass of messages
        time.sleep(2.5)  # a probe every second: none may pass
        status = node.request("STATUS")["journal"]
        assert status["writing"] is False and status["error"] == "No space left on device", status
        more = send_bodies(node.url, "q", range(1001, 1021), window=1)
        assert not more.accepted and len(more.rejected) == 20, "taken again with 64 KiB free: it would flap"
        (disk.mount / "filler").unlink()
        wait_for(lambda: node.request("STATUS")["journal"]["writing"] is True, 10, "the journal writing again")
        after = send_bodies(node.url, "q", range(1021, 1041), window=1)
        assert after.accepted == set(range(1021, 1041))
        node.kill()
        node.start()
        found = drain_bodies(node.url, "q")
        check_every_body(found, first.accepted | after.accepted)
        assert not set(found) & (set(first.rejected) | set(more.rejected)), "a refused message was kept"
