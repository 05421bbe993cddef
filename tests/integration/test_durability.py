"""Durable messages on disk (docs/durability.md), with real nodes, a real etcd and real clients.

Each test kills real node processes with SIGKILL and restarts them on the
same ``--data-dir``: the journal (hastandby/broker/store/journal.py) must give back
every acknowledged durable message, a restarted backup must catch up by
sending only what changed, a torn journal tail must cost only the torn
record, and a full disk must refuse durable messages with
``amqp:resource-limit-exceeded`` while losing nothing it acknowledged.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from hastandby.testing.numbered_client import NumberedSender, drain
from hastandby.broker.store import journal_format as jf
from hastandby.client import ManagementClient
from hastandby.testing.bodies import check_every_body, drain_bodies, send_bodies
from hastandby.testing.disks import Tmpfs
from hastandby.testing.etcd_ha import EtcdHa
from hastandby.testing.nodes import REPO, NodeProcess
from hastandby.testing.waiting import wait_for

DURABLE = {"durable": True}


def create_durable_queue(node: NodeProcess, name: str) -> None:
    with ManagementClient(node.address, timeout=10) as client:
        client.request("CREATE", "queue", name, DURABLE)


def journal(node: NodeProcess) -> dict[str, Any]:
    status = node.request("STATUS")
    assert status["journal"] is not None, "the node keeps no journal"
    return status["journal"]


def events(node: NodeProcess, name: str) -> list[dict[str, Any]]:
    found = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == name:
            found.append(record)
    return found


def send_durable(urls: list[str], count: int, queue: str = "q") -> NumberedSender:
    sender = NumberedSender(urls, queue, count=count, time_limit=60, durable=True).start()
    assert sender.join(60) and sender.done, (sender.accepted_count, sender.errors)
    assert not sender.missing()
    return sender


# -- a whole-cluster crash ------------------------------------------------------------------------


@pytest.mark.etcd
def test_kill_9_of_every_node_under_a_durable_producer_loses_nothing_acknowledged(ha):
    c: EtcdHa = ha(3, data=True)
    primary = c.wait_settled()
    create_durable_queue(c[primary], "q")
    for index in range(3):
        if index != primary:
            c.wait_following(index, primary)
    urls = [node.url for node in c.nodes]
    sender = NumberedSender(urls, "q", count=100_000, time_limit=60, durable=True).start()
    wait_for(lambda: sender.accepted_count >= 2000, 60, "2000 durable messages accepted")
    for node in c.nodes:  # all at once, the producer still sending
        node.kill()
    sender.stop()
    sender.join(10)
    accepted = set(sender.accepted_set)
    print(f"\n{len(accepted)} durable messages accepted before every node was killed")

    for index in range(3):
        c.restart(index)
    for node in c.nodes:
        node.wait_ready(30)
    new = c.wait_settled(timeout=60)
    recovered = journal(c[new])["recovered_messages"]
    receiver = drain([c[new].url], "q", accepted, time_limit=60)
    missing = receiver.missing(accepted)
    print(f"{c.ids[new]} primary after the restart, its journal recovered {recovered} messages; "
          f"{len(receiver.seen)} drained, {len(missing)} acknowledged missing")
    assert not missing, f"acknowledged durable messages lost: {sorted(missing)[:20]}"


@pytest.mark.etcd
def test_a_restarted_backup_catches_up_by_sending_only_what_changed(ha):
    c: EtcdHa = ha(3, data=True)
    primary = c.wait_settled()
    create_durable_queue(c[primary], "q")
    backup = next(i for i in range(3) if i != primary)
    c.wait_following(backup, primary)
    send_durable([c[primary].url], 5000)
    wait_for(lambda: c.depth(backup, "q") == 5000, 30, "the backup holding all 5000")

    c[backup].kill()
    changed = send_durable([c[primary].url], 100, queue="r")  # meanwhile, on another queue
    assert changed.accepted_count == 100
    since = time.time()
    c.restart(backup).wait_ready(30)
    c.wait_following(backup, primary, timeout=30)
    wait_for(lambda: any(e.get("queue") == "q" and _after(e, since)
                         for e in events(c[primary], "backup caught up on queue")),
             30, "the primary logging the backup's catch-up on q")
    caught_up = [e for e in events(c[primary], "backup caught up on queue")
                 if e.get("queue") == "q" and _after(e, since)][-1]
    print(f"\nrestarted backup on q: held {caught_up['backup_held']}, skipped {caught_up['skipped']}, "
          f"sent {caught_up['sent']} of 5000")
    assert caught_up["backup_held"] == 5000 and caught_up["skipped"] == 5000
    assert caught_up["sent"] < 50, "a restarted backup should get under 1 % of what it already held"
    assert c.depth(backup, "q") == 5000


def _after(record: dict[str, Any], since: float) -> bool:
    from datetime import datetime

    return datetime.fromisoformat(record["timestamp"]).timestamp() >= since - 0.5


# -- one node's disk --------------------------------------------------------------------------


def test_a_torn_journal_tail_costs_only_the_torn_record(node_factory, tmp_path):
    data = tmp_path / "data"
    node = node_factory("--data-dir", str(data), name="torn")
    create_durable_queue(node, "q")
    send_durable([node.url], 500)
    node.kill()
    path = tmp_path / "data" / "journal"
    # A crash in the middle of a write leaves what was written before it whole and the write itself torn: the
    # first bytes of one more record (nothing in it was acknowledged: its fsync never returned).
    torn = jf.enqueue_run_record(1, [501, 502], [b"x" * 300, b"y" * 300])
    with open(path, "ab") as file:
        file.write(torn[:len(torn) // 2])
    node.start()
    wait_for(lambda: events(node, "journal tail cut off: a crash in the middle of a write (nothing in it was "
                                  "acknowledged)"), 10, "a log line about the cut tail")
    depth = node.request("QUERY")["queues"]
    held = next(q["depth"] for q in depth if q["name"] == "q")
    assert held == 500, f"{held} messages after cutting a torn write off 500 acknowledged"
    assert journal(node)["recovered_messages"] == 500 and journal(node)["torn_bytes"] == len(torn) // 2
    assert not journal(node)["damaged"], "a torn write is not damage"
    receiver = drain([node.url], "q", range(1, 501), time_limit=30)
    assert not receiver.missing(range(1, 501))
    # The node goes on: new durable messages are journaled after the cut.
    send_durable([node.url], 10, queue="q2_" + str(int(time.time())))


def test_a_full_disk_refuses_durable_messages_clearly_and_loses_nothing_acknowledged(node_factory, tmp_path):
    with Tmpfs(tmp_path / "disk", 2 << 20) as disk:
        node = node_factory("--data-dir", str(disk.mount), name="full")
        create_durable_queue(node, "q")
        # 4 MB of durable messages, one at a time, on a 2 MiB disk
        sender = send_bodies(node.url, "q", range(1, 401), window=1, size=10_000)
        print(f"\n2 MiB disk: {len(sender.accepted)} accepted, {len(sender.rejected)} rejected, "
              f"first: {next(iter(sender.rejected.values()), None)}")
        assert sender.accepted and sender.rejected, "the disk should fill part way through"
        assert all(text.startswith("amqp:resource-limit-exceeded") for text in sender.rejected.values()), \
            set(sender.rejected.values())
        wait_for(lambda: events(node, "journal write failed: durable messages are refused until it works again"),
                 10, "a log line about the failed write")
        # The node keeps serving: a non-durable message is still taken, and every accepted one drains.
        NumberedSender([node.url], "plain", count=10, time_limit=20).start().join(20)
        found = drain_bodies(node.url, "q")
        check_every_body(found, sender.accepted, size=10_000)
        assert set(found) == sender.accepted, f"refused but there: {sorted(set(found) - sender.accepted)[:20]}"
        # Restarted on the same nearly full disk it starts (no crash loop; a journal it cannot compact is
        # kept as it is).  Dequeues the full disk did not take may bring drained messages back (at least
        # once), but nothing beyond what was accepted.
        node.kill()
        node.start()
        assert journal(node)["recovered_messages"] <= len(sender.accepted)


# -- an operator's choice -----------------------------------------------------------------------


@pytest.mark.etcd
def test_promote_force_starts_a_restarted_cluster_without_its_absent_sync_members(ha):
    c: EtcdHa = ha(3, data=True)
    primary = c.wait_settled()
    create_durable_queue(c[primary], "q")
    late = next(i for i in range(3) if i != primary)
    c.wait_following(late, primary)
    send_durable([c[primary].url], 100)
    c[late].kill()  # it leaves the sync set; what follows is not on its disk
    send_durable([c[primary].url], 50, queue="after")
    for index in range(3):
        if index != late:
            c[index].kill()
    c.restart(late).wait_ready(30)
    wait_for(lambda: "waiting for it" in json.dumps(c.status(late) or {}) or c.state(late) == "connecting",
             15, "the restarted node connecting")
    time.sleep(3)
    assert c.state(late) == "connecting", "a node outside the sync set must not start the cluster alone"
    result = subprocess.run([sys.executable, "-m", "hastandby", "promote", "--force", "-b", c[late].address],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    print(f"\n{result.stdout.strip()}")
    assert "lost" in result.stdout, "promote --force must name the risk"
    c.wait_state(late, "primary", timeout=20)
    assert c.depth(late, "q") == 100
