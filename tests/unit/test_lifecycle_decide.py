"""The decision rules of one node-loop cycle, on hand-built snapshots (no I/O)."""

from __future__ import annotations

import pytest

from hastandby.election.cluster import ClusterSnapshot, Leader, Member, Store, SyncSet
from hastandby.election.decide import (
    Campaign,
    ClearHandover,
    FollowLeader,
    PublishMember,
    RemoveStaleLeaderKey,
    Stay,
    StepDown,
    UpdateSync,
    decide,
)
from hastandby.lifecycle.states import Detail, Event, NodeStatus, State

ME = "n1"
ACTIVE = NodeStatus(State.PRIMARY, Detail.ACTIVE, 10)
BACKUP = NodeStatus(State.BACKUP, term=10)
CATCHUP = NodeStatus(State.CATCHUP, term=10)
CONNECTING = NodeStatus(State.CONNECTING)


def member(node_id: str, state: State, detail: Detail | None = None) -> Member:
    return Member(node_id, f"amqp://{node_id}", state, detail)


def leader(node_id: str, term: int = 10) -> Leader:
    return Leader(node_id, f"amqp://{node_id}", term)


def snapshot(
    *members: Member, leader: Leader | None = None, handover: str | None = None, sync: SyncSet | None = None
) -> ClusterSnapshot:
    return ClusterSnapshot(42, leader, tuple(members), handover, sync)


def sync_of(*members: str, revision: int = 7) -> SyncSet:
    return SyncSet(frozenset(members), "n9", revision)


def me_as(status: NodeStatus) -> Member:
    return member(ME, status.state, status.detail)


# -- a primary --------------------------------------------------------------


def test_primary_holding_its_key_stays() -> None:
    cluster = snapshot(me_as(ACTIVE), member("n2", State.BACKUP), leader=leader(ME))
    assert isinstance(decide(ME, ACTIVE, cluster, lease_confirmed=True), Stay)


@pytest.mark.parametrize("readable", [True, False])
def test_primary_with_unconfirmed_lease_steps_down_even_if_etcd_is_unreadable(readable: bool) -> None:
    cluster = snapshot(me_as(ACTIVE), leader=leader(ME)) if readable else None
    decision = decide(ME, ACTIVE, cluster, lease_confirmed=False)
    assert isinstance(decision, StepDown) and decision.event is Event.LOST_LEASE


def test_primary_with_confirmed_lease_rides_out_an_unreadable_etcd() -> None:
    assert isinstance(decide(ME, ACTIVE, None, lease_confirmed=True), Stay)


@pytest.mark.parametrize(
    "current_leader",
    [None, leader("n2", term=11), leader(ME, term=9)],
    ids=["key gone", "another node", "my name, older term"],
)
def test_primary_not_holding_the_key_under_its_term_steps_down(current_leader: Leader | None) -> None:
    cluster = snapshot(me_as(ACTIVE), member("n2", State.BACKUP), leader=current_leader)
    decision = decide(ME, ACTIVE, cluster, lease_confirmed=True)
    assert isinstance(decision, StepDown) and decision.event is Event.LOST_LEASE


def test_primary_hands_over_to_a_ready_backup() -> None:
    cluster = snapshot(me_as(ACTIVE), member("n2", State.BACKUP), leader=leader(ME), handover="n2")
    decision = decide(ME, ACTIVE, cluster, lease_confirmed=True)
    assert isinstance(decision, StepDown) and decision.event is Event.DEMOTED
    assert "n2" in decision.reason


@pytest.mark.parametrize("target_state", [State.CATCHUP, State.CONNECTING, None])
def test_primary_keeps_the_key_while_the_handover_target_is_not_ready(target_state: State | None) -> None:
    others = (member("n2", target_state),) if target_state else ()
    cluster = snapshot(me_as(ACTIVE), *others, leader=leader(ME), handover="n2")
    decision = decide(ME, ACTIVE, cluster, lease_confirmed=True)
    assert isinstance(decision, Stay) and "not a ready backup" in decision.reason


def test_new_primary_clears_the_handover_that_named_it() -> None:
    cluster = snapshot(me_as(ACTIVE), leader=leader(ME), handover=ME)
    assert isinstance(decide(ME, ACTIVE, cluster, lease_confirmed=True), ClearHandover)


def test_primary_republishes_an_outdated_member_key() -> None:
    recovering = NodeStatus(State.PRIMARY, Detail.RECOVERING, 10)
    cluster = snapshot(me_as(recovering), leader=leader(ME))
    assert isinstance(decide(ME, ACTIVE, cluster, lease_confirmed=True), PublishMember)


# -- non-primaries -----------------------------------------------------------


@pytest.mark.parametrize("status", [CONNECTING, CATCHUP, BACKUP], ids=str)
def test_missing_member_key_is_published_first(status: NodeStatus) -> None:
    cluster = snapshot(member("n2", State.PRIMARY, Detail.ACTIVE), leader=leader("n2"))
    assert isinstance(decide(ME, status, cluster, lease_confirmed=False), PublishMember)


def test_outdated_member_key_is_published() -> None:
    cluster = snapshot(member(ME, State.CATCHUP), leader=leader("n2"))
    decision = decide(ME, BACKUP, cluster, lease_confirmed=True)
    assert isinstance(decision, PublishMember) and "catchup" in decision.reason


@pytest.mark.parametrize("status", [CONNECTING, CATCHUP, BACKUP], ids=str)
def test_non_primary_follows_the_leader(status: NodeStatus) -> None:
    cluster = snapshot(me_as(status), member("n2", State.PRIMARY, Detail.ACTIVE), leader=leader("n2", 12))
    decision = decide(ME, status, cluster, lease_confirmed=True)
    assert isinstance(decision, FollowLeader) and decision.leader == leader("n2", 12)
    assert isinstance(decide(ME, status, cluster, lease_confirmed=True, following=leader("n2", 12)), Stay)


def test_a_new_leader_term_is_followed_even_on_the_same_node() -> None:
    cluster = snapshot(me_as(BACKUP), leader=leader("n2", 12))
    decision = decide(ME, BACKUP, cluster, lease_confirmed=True, following=leader("n2", 10))
    assert isinstance(decision, FollowLeader) and decision.leader.term == 12


def test_a_leader_older_than_the_term_seen_is_not_followed() -> None:
    cluster = snapshot(me_as(BACKUP), leader=leader("n2", 9))
    assert isinstance(decide(ME, BACKUP, cluster, lease_confirmed=True), Stay)


@pytest.mark.parametrize("status", [CONNECTING, CATCHUP, BACKUP], ids=str)
def test_a_leader_key_in_my_name_that_i_do_not_act_on_is_removed(status: NodeStatus) -> None:
    cluster = snapshot(me_as(status), leader=leader(ME, 11))
    decision = decide(ME, status, cluster, lease_confirmed=True)
    assert isinstance(decision, RemoveStaleLeaderKey) and decision.term == 11


def test_non_primary_waits_when_etcd_is_unreadable() -> None:
    assert isinstance(decide(ME, BACKUP, None, lease_confirmed=True), Stay)


# -- elections -----------------------------------------------------------------


def test_backup_campaigns_when_there_is_no_leader() -> None:
    cluster = snapshot(me_as(BACKUP), member("n2", State.CATCHUP))
    decision = decide(ME, BACKUP, cluster, lease_confirmed=True)
    assert isinstance(decision, Campaign) and not decision.new_cluster
    assert decision.won_event is Event.WON_ELECTION


def test_catchup_never_campaigns() -> None:
    cluster = snapshot(me_as(CATCHUP), member("n2", State.CATCHUP))
    decision = decide(ME, CATCHUP, cluster, lease_confirmed=True)
    assert isinstance(decision, Stay) and "catching up" in decision.reason


def test_every_member_connecting_means_a_new_cluster_and_all_campaign() -> None:
    members = [member(n, State.CONNECTING) for n in ("n1", "n2", "n3")]
    cluster = snapshot(*members)
    for node in ("n1", "n2", "n3"):
        decision = decide(node, CONNECTING, cluster, lease_confirmed=True)
        assert isinstance(decision, Campaign) and decision.new_cluster
        assert decision.won_event is Event.WON_ELECTION_NEW_CLUSTER


@pytest.mark.parametrize("other", [State.CATCHUP, State.BACKUP])
def test_connecting_node_waits_when_any_member_is_past_connecting(other: State) -> None:
    cluster = snapshot(me_as(CONNECTING), member("n2", other))
    assert isinstance(decide(ME, CONNECTING, cluster, lease_confirmed=True), Stay)


def test_no_campaign_without_a_confirmed_lease() -> None:
    cluster = snapshot(me_as(BACKUP))
    decision = decide(ME, BACKUP, cluster, lease_confirmed=False)
    assert isinstance(decision, Stay) and "lease" in decision.reason


@pytest.mark.parametrize("status", [BACKUP, CONNECTING], ids=str)
def test_other_nodes_do_not_campaign_while_a_handover_target_is_set(status: NodeStatus) -> None:
    cluster = snapshot(me_as(status), member("n2", State.BACKUP), handover="n2")
    decision = decide(ME, status, cluster, lease_confirmed=True)
    assert isinstance(decision, Stay) and "handover to n2" in decision.reason


def test_the_handover_target_campaigns() -> None:
    cluster = snapshot(me_as(BACKUP), member("n2", State.BACKUP), handover=ME)
    assert isinstance(decide(ME, BACKUP, cluster, lease_confirmed=True), Campaign)


def test_a_catchup_handover_target_still_may_not_campaign() -> None:
    cluster = snapshot(me_as(CATCHUP), handover=ME)
    assert isinstance(decide(ME, CATCHUP, cluster, lease_confirmed=True), Stay)


# -- whole-cluster properties ------------------------------------------------------


def test_in_any_leaderless_cluster_only_backups_or_a_new_cluster_campaign() -> None:
    """Over every mix of member states, campaigners are exactly the eligible nodes."""
    states = (State.CONNECTING, State.CATCHUP, State.BACKUP)
    for a in states:
        for b in states:
            for c in states:
                mix = {"n1": a, "n2": b, "n3": c}
                cluster = snapshot(*(member(n, s) for n, s in mix.items()))
                new_cluster = all(s is State.CONNECTING for s in mix.values())
                for node, state in mix.items():
                    decision = decide(node, NodeStatus(state), cluster, lease_confirmed=True)
                    eligible = state is State.BACKUP or new_cluster
                    assert isinstance(decision, Campaign) == eligible, (mix, node, decision)


@pytest.mark.parametrize("state", [State.STANDALONE, State.STOPPED])
def test_decide_is_only_for_cluster_members(state: State) -> None:
    with pytest.raises(ValueError):
        decide(ME, NodeStatus(state), snapshot(), lease_confirmed=True)


def test_snapshot_term_check() -> None:
    cluster = snapshot(leader=leader("n2", 12))
    assert cluster.is_current_term(12)
    assert not cluster.is_current_term(11)
    assert not snapshot().is_current_term(12)


# -- the sync set ------------------------------------------------------------------


def test_a_backup_outside_the_sync_set_does_not_campaign() -> None:
    """It was dropped by the primary, which then acknowledged messages without it."""
    cluster = snapshot(me_as(BACKUP), member("n2", State.BACKUP), sync=sync_of("n2", "n3"))
    decision = decide(ME, BACKUP, cluster, lease_confirmed=True)
    assert isinstance(decision, Stay) and "sync set" in decision.reason
    assert isinstance(decide("n2", BACKUP, cluster, lease_confirmed=True), Campaign)


def test_a_campaign_keeps_the_live_sync_members_and_compares_the_revision() -> None:
    """n3 is in the sync set but gone from etcd (crashed or frozen): the winner does not wait for it."""
    cluster = snapshot(me_as(BACKUP), member("n2", State.BACKUP), member("n4", State.CATCHUP),
                       sync=sync_of(ME, "n2", "n3", revision=31))
    decision = decide(ME, BACKUP, cluster, lease_confirmed=True)
    assert isinstance(decision, Campaign)
    assert decision.sync == frozenset({ME, "n2"}) and decision.sync_revision == 31


def test_without_a_sync_key_a_campaign_writes_one() -> None:
    decision = decide(ME, BACKUP, snapshot(me_as(BACKUP), member("n2", State.BACKUP)), lease_confirmed=True)
    assert isinstance(decision, Campaign) and decision.sync == frozenset({ME}) and decision.sync_revision == 0


def holding(node_id: str, journal: bool = False) -> Member:
    return Member(node_id, f"amqp://{node_id}", State.CONNECTING, None, Store(journal, holds_data=True))


def test_a_new_cluster_waits_for_a_connecting_sync_member() -> None:
    """Every member connecting, but n2 was in the sync set: a primary that stepped down, holding data."""
    members = [member(ME, State.CONNECTING), holding("n2"), member("n3", State.CONNECTING)]
    cluster = snapshot(*members, sync=sync_of("n2"))
    decision = decide(ME, CONNECTING, cluster, lease_confirmed=True)
    assert isinstance(decision, Stay) and "n2" in decision.reason
    decision = decide("n2", CONNECTING, cluster, lease_confirmed=True, store=Store(holds_data=True))
    assert isinstance(decision, Campaign) and decision.new_cluster and decision.sync == frozenset({"n2"})


def test_a_new_cluster_whose_sync_members_are_gone_may_start_anywhere() -> None:
    members = [member(n, State.CONNECTING) for n in (ME, "n2")]
    decision = decide(ME, CONNECTING, snapshot(*members, sync=sync_of("n5")), lease_confirmed=True)
    assert isinstance(decision, Campaign) and decision.new_cluster


def test_a_primary_writes_the_sync_set_its_replication_wants() -> None:
    cluster = snapshot(me_as(ACTIVE), member("n2", State.BACKUP), leader=leader(ME), sync=sync_of(ME, "n2"))
    decision = decide(ME, ACTIVE, cluster, lease_confirmed=True, sync_wanted=frozenset({ME}))
    assert isinstance(decision, UpdateSync) and decision.members == frozenset({ME})
    same = decide(ME, ACTIVE, cluster, lease_confirmed=True, sync_wanted=frozenset({ME, "n2"}))
    assert isinstance(same, Stay)


def test_fencing_comes_before_the_sync_set() -> None:
    cluster = snapshot(me_as(ACTIVE), leader=leader(ME), sync=sync_of(ME, "n2"))
    decision = decide(ME, ACTIVE, cluster, lease_confirmed=False, sync_wanted=frozenset({ME}))
    assert isinstance(decision, StepDown)


def test_no_handover_to_a_backup_outside_the_sync_set() -> None:
    """It could not campaign once the primary stepped down."""
    cluster = snapshot(me_as(ACTIVE), member("n2", State.BACKUP), leader=leader(ME), handover="n2",
                       sync=sync_of(ME))
    decision = decide(ME, ACTIVE, cluster, lease_confirmed=True, sync_wanted=frozenset({ME}))
    assert isinstance(decision, Stay) and "sync set" in decision.reason


def test_after_a_whole_cluster_restart_a_sync_member_whose_journal_holds_data_starts_it() -> None:
    members = [Member(ME, "amqp://n1", State.CONNECTING, None, Store(journal=True)), holding("n2", journal=True),
               holding("n3", journal=True)]
    cluster = snapshot(*members, sync=sync_of("n2", "n3"))
    mine = Store(journal=True)
    assert isinstance(decide(ME, CONNECTING, cluster, lease_confirmed=True, store=mine), Stay)  # n1: not in sync
    for node in ("n2", "n3"):
        assert isinstance(decide(node, CONNECTING, cluster, lease_confirmed=True, store=Store(True, True)), Campaign)


def test_with_journals_everyone_waits_for_an_absent_sync_member() -> None:
    """n3 held every acknowledged message and is not back: starting without it could lose them."""
    members = [Member(n, f"amqp://{n}", State.CONNECTING, None, Store(journal=True)) for n in (ME, "n2")]
    decision = decide(ME, CONNECTING, snapshot(*members, sync=sync_of("n3")), lease_confirmed=True,
                      store=Store(journal=True))
    assert isinstance(decision, Stay) and "n3 may hold the latest store" in decision.reason
    assert "promote --force" in decision.reason


def test_without_journals_a_restarted_cluster_starts_anywhere() -> None:
    """Nothing survived the restart (messages lived in memory): there is nothing to wait for."""
    members = [member(n, State.CONNECTING) for n in (ME, "n2")]
    decision = decide(ME, CONNECTING, snapshot(*members, sync=sync_of("n3")), lease_confirmed=True)
    assert isinstance(decision, Campaign) and decision.new_cluster


def test_a_store_that_changed_is_published() -> None:
    cluster = snapshot(member(ME, State.BACKUP), leader=leader("n2"))
    decision = decide(ME, BACKUP, cluster, lease_confirmed=True, store=Store(journal=True, holds_data=True))
    assert isinstance(decision, PublishMember) and "store" in decision.reason


def damaged(node_id: str) -> Member:
    return Member(node_id, f"amqp://{node_id}", State.CONNECTING, None, Store(True, holds_data=True, damaged=True))


def test_a_damaged_sync_member_back_first_and_alone_does_not_start_the_cluster() -> None:
    """The issue's restart order: n2's journal lost records to bit rot, n2 is back first; n3, intact, is not.
    Were n2 to start the cluster, n3 would drop its copies of what n2 lost as another lineage's."""
    store = Store(True, holds_data=True, damaged=True)
    cluster = snapshot(damaged("n2"), sync=sync_of("n2", "n3"))
    decision = decide("n2", CONNECTING, cluster, lease_confirmed=True, store=store)
    assert isinstance(decision, Stay) and "my journal was damaged" in decision.reason
    joined = snapshot(damaged("n2"), member(ME, State.CONNECTING), sync=sync_of("n2", "n3"))
    decision = decide(ME, CONNECTING, joined, lease_confirmed=True)  # a node outside the sync set, back too
    assert isinstance(decision, Stay)
    assert "n3 may hold the latest store" in decision.reason and "n2 was damaged" in decision.reason


def test_an_intact_sync_member_starts_the_cluster_before_a_damaged_one() -> None:
    cluster = snapshot(damaged("n2"), holding("n3", journal=True), member(ME, State.CONNECTING),
                       sync=sync_of("n2", "n3"))
    assert isinstance(decide("n2", CONNECTING, cluster, lease_confirmed=True,
                             store=Store(True, True, damaged=True)), Stay)
    assert isinstance(decide("n3", CONNECTING, cluster, lease_confirmed=True, store=Store(True, True)), Campaign)
    assert isinstance(decide(ME, CONNECTING, cluster, lease_confirmed=True), Stay)


def test_when_every_sync_member_back_is_damaged_everyone_waits_for_the_operator() -> None:
    """Nobody is absent, yet nobody holds every acknowledged message: only promote --force may start it."""
    cluster = snapshot(damaged("n2"), member(ME, State.CONNECTING), sync=sync_of("n2"))
    for node, store in (("n2", Store(True, True, damaged=True)), (ME, Store())):
        decision = decide(node, CONNECTING, cluster, lease_confirmed=True, store=store)
        assert isinstance(decision, Stay) and "promote --force" in decision.reason, decision


def test_a_damaged_node_starts_no_cluster_even_where_etcd_has_no_sync_set() -> None:
    """A fresh etcd (no sync key) says nothing of who holds what; the node knows it lacks data."""
    cluster = snapshot(damaged(ME), member("n2", State.CONNECTING))
    decision = decide(ME, CONNECTING, cluster, lease_confirmed=True, store=Store(True, True, damaged=True))
    assert isinstance(decision, Stay) and "damaged" in decision.reason and "promote --force" in decision.reason
    assert isinstance(decide("n2", CONNECTING, cluster, lease_confirmed=True), Campaign)
