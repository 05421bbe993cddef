"""The primary's side of the sync set: a departed backup holds producers until etcd drops it.

Pure logic on a real Registry and Queue; the driver is constructed but never
run (only its timer heap is touched), and no link or socket is opened.
"""

from __future__ import annotations

from hastandby.broker.queues.completion import Completion
from hastandby.broker.queues.lineage import Epoch
from hastandby.ha.primary import PrimaryRole, RemoteBackup
from tests.unit.ha_roles import primary_role


def replication(keeps_sync_set: bool, expected: dict[str, str] | None = None, min_sync: int = 1) -> PrimaryRole:
    return primary_role(expected=expected, keeps_sync_set=keeps_sync_set, min_sync=min_sync)


def produce(primary: PrimaryRole) -> list[str]:
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


def test_with_min_sync_a_departed_last_backup_stays_in_the_sync_set_and_holds_producers():
    """Cut off from its only backup, the primary stops acknowledging instead of acknowledging alone."""
    primary = replication(keeps_sync_set=True, min_sync=2)
    accepted = produce(primary)
    backup = primary.backups["b"]
    primary.disconnected(backup, backup.wiring)
    assert primary.sync_wanted == frozenset({"p", "b"})  # b stays: it holds everything acknowledged
    primary.sync_confirmed(frozenset({"p", "b"}))
    assert accepted == [] and "b" in primary.leaving


def test_with_min_sync_a_primary_alone_holds_new_messages_until_a_large_enough_set_is_confirmed():
    primary = replication(keeps_sync_set=True, expected={}, min_sync=2)
    accepted = produce(primary)
    queue, _ = primary.registry.declare_queue("later")
    later: list[str] = []
    completion = Completion(later.append, "accepted")
    queue.enqueue(b"m", completion)
    completion.release()
    assert accepted == [] and later == []
    primary.sync_confirmed(frozenset({"p"}))
    assert accepted == []
    primary.sync_confirmed(frozenset({"p", "c"}))
    assert accepted == ["accepted"] and later == ["accepted"]
    assert produce(primary) == ["accepted"]  # no hold once min_sync nodes hold everything


def test_a_backup_ready_again_releases_its_last_connections_guards():
    primary = replication(keeps_sync_set=True, min_sync=1)
    accepted = produce(primary)
    backup = primary.backups["b"]
    primary.disconnected(backup, backup.wiring)
    primary.sync_confirmed(frozenset({"p", "b"}))  # b is back in the set by the time etcd answers
    assert accepted == [] and "b" in primary.leaving
    again = RemoteBackup("b", "h:2", expected=False)
    again.connected = True
    primary.backups["b"] = again
    primary._check_ready(again)
    assert accepted == ["accepted"] and not primary.leaving
