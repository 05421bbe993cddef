"""The primary's side of the sync set: a departed backup holds producers until etcd drops it.

Pure logic on a real Registry and Queue; the driver is constructed but never
run (only its timer heap is touched), and no link or socket is opened.
"""

from __future__ import annotations

from hastandby.broker.completion import Completion
from hastandby.broker.driver import Driver
from hastandby.broker.lineage import Epoch
from hastandby.broker.registry import Registry
from hastandby.browser.primary import PrimaryReplication


def replication(keeps_sync_set: bool, expected: dict[str, str] | None = None) -> PrimaryReplication:
    registry = Registry("all", True)
    registry.declare_queue("q")
    return PrimaryReplication(registry, Driver(None), me={"node_id": "p", "url": "h:1"}, term=7,
                              expected=expected if expected is not None else {"b": "h:2"},
                              backup_timeout=10.0, on_expected_done=lambda timed_out: None,
                              keeps_sync_set=keeps_sync_set)


def produce(primary: PrimaryReplication) -> list[str]:
    """One producer's message on ``q``; the list gets "accepted" when its acknowledgement leaves."""
    accepted: list[str] = []
    completion = Completion(accepted.append, "accepted")
    primary.registry.queues["q"].enqueue(b"m", completion)
    completion.release()
    return accepted


def test_a_promotion_claims_an_epoch_on_every_replicated_queue():
    primary = replication(keeps_sync_set=True)
    assert primary.registry.queues["q"].lineage == (Epoch(7, "p", 1),)
    queue, _ = primary.registry.declare_queue("later")
    assert queue.lineage == (Epoch(7, "p", 1),)


def test_the_sync_set_wanted_is_this_node_and_the_expected_backups():
    primary = replication(keeps_sync_set=True)
    assert primary.sync_wanted == frozenset({"p", "b"})


def test_a_departed_sync_member_holds_producers_until_etcd_drops_it():
    primary = replication(keeps_sync_set=True)
    accepted = produce(primary)
    assert accepted == []  # guarded for the expected backup b
    backup = primary.backups["b"]
    primary.disconnected(backup, backup.wiring)
    assert primary.sync_wanted == frozenset({"p"})
    assert accepted == [], "released before etcd dropped b from the sync set"
    primary.sync_confirmed(frozenset({"p", "b"}))  # an older write landing late
    assert accepted == []
    primary.sync_confirmed(frozenset({"p"}))
    assert accepted == ["accepted"]
    assert not primary.leaving


def test_without_etcd_a_departed_backup_releases_at_once():
    primary = replication(keeps_sync_set=False)
    accepted = produce(primary)
    backup = primary.backups["b"]
    primary.disconnected(backup, backup.wiring)
    assert accepted == ["accepted"]


def test_stepping_down_forgets_leaving_backups_too():
    primary = replication(keeps_sync_set=True)
    accepted = produce(primary)
    backup = primary.backups["b"]
    primary.disconnected(backup, backup.wiring)
    primary.stop()
    assert not primary.leaving and not primary.backups
    assert accepted == ["accepted"]  # released locally; a stepping-down node has closed its clients first
