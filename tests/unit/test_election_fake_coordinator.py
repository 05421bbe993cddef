"""The election loop, cycle by cycle, for several nodes on one in-memory etcd (issue 15).

Each node is an ``ElectionLoop`` over a ``FakeHaNode`` (the state table and
its actions, recorded) and a ``FakeCoordinator`` on a shared ``FakeCluster``
(hastandby/testing).  The loop's thread is never started: a test runs what one
turn of ``ElectionLoop._run`` does (``_drain_requests``, then ``_cycle``) and
then the node's "reactor" (the role changes the cycle handed over), node by
node, and moves the fake clock by hand.  The first tests pin the fake to
``EtcdCoordinator``'s semantics.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hastandby.election.cluster import Leader, SyncSet
from hastandby.election.coordinator import CoordinatorEvent, CoordinatorUnavailable
from hastandby.election.loop import ElectionLoop
from hastandby.lifecycle.states import (
    BACKUP,
    CONNECTING,
    PRIMARY_ACTIVE,
    TRANSITIONS,
    Action,
    Detail,
    Event,
    NodeStatus,
    State,
)
from hastandby.testing.fake_coordinator import FakeCluster, FakeCoordinator
from hastandby.testing.fake_elected_node import FakeHaNode

TTL, MARGIN = 2, 0.5  # safe lease age 1.5 s
BECOME_PRIMARY = [Action.STOP_REPLICATION, Action.START_GUARDING, Action.ADMIT_CLIENTS, Action.PUBLISH_STATUS]
STEP_DOWN = [Action.EXCLUDE_CLIENTS, Action.STOP_SERVING_BACKUPS, Action.RESIGN, Action.PUBLISH_STATUS,
             Action.LOOK_FOR_PRIMARY]


def url(node_id: str) -> str:
    return f"{node_id}.example:5672"


@dataclass
class Peer:
    """One node: its fake HA node, its coordinator and the loop between them."""

    node: FakeHaNode
    coordinator: FakeCoordinator
    loop: ElectionLoop

    def cycle(self) -> None:
        """One turn of ``ElectionLoop._run`` without its wait: the queued etcd requests, then a decision."""
        self.loop._drain_requests()
        self.loop._cycle()

    def react(self) -> int:
        """The reactor runs what the loop handed it (role changes)."""
        return self.node.run_reactor()

    def step(self) -> None:
        self.cycle()
        self.react()

    def campaigns(self) -> int:
        return self.coordinator.calls.count("campaign")


def peer(cluster: FakeCluster, node_id: str) -> Peer:
    node = FakeHaNode(node_id)
    coordinator = FakeCoordinator(cluster, node_id, url(node_id), lambda event: None,
                                  lease_ttl=TTL, lease_margin=MARGIN)
    loop = ElectionLoop(node, coordinator)  # its thread is never started
    node.election = loop
    return Peer(node, coordinator, loop)


def published(cluster: FakeCluster, node_id: str) -> State:
    """The state in ``node_id``'s member key."""
    member = cluster.member(node_id)
    assert member is not None, f"{node_id} has no member key"
    return member.state


def settle(cluster: FakeCluster, *peers: Peer, rounds: int = 12) -> None:
    """Step every node in turn until a whole round changes nothing."""

    def fingerprint() -> object:
        return cluster.revision, [(p.node.status, len(p.node.effects), len(p.node.followed), len(p.node.reactor),
                                   p.loop._requests.qsize()) for p in peers]

    for _ in range(rounds):
        before = fingerprint()
        for p in peers:
            p.step()
        if fingerprint() == before:
            return
    raise AssertionError(f"no steady state after {rounds} rounds")


def running_cluster(c_state: State = State.CATCHUP, c_in_sync: bool = False) -> tuple[FakeCluster, Peer, Peer, Peer]:
    """a primary (active), b a backup in the sync set, c in ``c_state`` (in the sync set if ``c_in_sync``).

    Formed by the loop from a brand-new cluster; replication is played by hand.
    Recorded effects and calls are cleared at the end.
    """
    cluster = FakeCluster()
    a, b, c = (peer(cluster, n) for n in "abc")
    settle(cluster, a, b, c)
    leader = cluster.leader()
    assert leader is not None and leader.node_id == "a"
    for backup in (b, c):  # the primary's hello reaches them
        assert backup.node.fire(Event.CONNECTED_TO_PRIMARY, leader.term)
    assert b.node.fire(Event.CAUGHT_UP)
    if c_state is State.BACKUP:
        assert c.node.fire(Event.CAUGHT_UP)
    assert a.node.fire(Event.EXPECTED_BACKUPS_READY)
    a.node.wanted_sync = frozenset({"a", "b", "c"} if c_in_sync else {"a", "b"})
    settle(cluster, a, b, c)
    sync = cluster.sync()
    assert sync is not None and sync.members == a.node.wanted_sync
    assert a.node.confirmed_sync == [(leader.term, a.node.wanted_sync)]
    assert [published(cluster, n) for n in "abc"] == [State.PRIMARY, State.BACKUP, c_state]
    for p in (a, b, c):
        p.node.effects.clear()
        p.coordinator.calls.clear()
    return cluster, a, b, c


# -- the fake is etcd as EtcdCoordinator uses it ------------------------------------------------


def test_the_fake_campaign_wins_only_without_leader_with_the_sync_revision_read_and_no_other_handover() -> None:
    cluster = FakeCluster()
    a, b = (FakeCoordinator(cluster, n, url(n), lambda event: None) for n in "ab")
    a.publish_status(NodeStatus(State.CONNECTING))
    b.publish_status(NodeStatus(State.CONNECTING))
    a.force_sync()  # the sync key exists, at this revision
    sync_revision = cluster.revision
    assert a.campaign(frozenset({"a"}), sync_revision - 1) is None  # the sync set moved since it was read
    b.set_handover("b", ttl=10)
    assert a.campaign(frozenset({"a"}), sync_revision) is None  # the handover names another node
    cluster.advance(10)  # the handover's lease expires; the nodes' leases are refreshed
    assert cluster.handover_target() is None and cluster.member("a") is not None
    term = a.campaign(frozenset({"a", "b"}), sync_revision)
    assert term == cluster.revision
    assert cluster.leader() == Leader("a", url("a"), term)
    assert cluster.sync() == SyncSet(frozenset({"a", "b"}), "a", term)  # written in the same step
    # Two nodes that decided on the same snapshot: the second campaign loses.
    assert b.campaign(frozenset({"b"}), sync_revision) is None
    assert b.campaign(frozenset({"b"}), term) is None


def test_the_fake_writes_the_sync_set_and_resigns_only_for_the_leaders_term_and_forces_only_without_leader() -> None:
    cluster = FakeCluster()
    a, b = (FakeCoordinator(cluster, n, url(n), lambda event: None) for n in "ab")
    a.publish_status(NodeStatus(State.CONNECTING))
    b.publish_status(NodeStatus(State.CONNECTING))
    term = a.campaign(frozenset({"a"}), 0)
    assert term is not None
    assert not a.update_sync(term - 1, frozenset({"a", "b"}))
    assert not b.force_sync()
    assert cluster.sync() == SyncSet(frozenset({"a"}), "a", term)
    assert a.update_sync(term, frozenset({"a", "b"}))
    assert cluster.sync() == SyncSet(frozenset({"a", "b"}), "a", cluster.revision)
    assert not a.resign(term + 1)
    assert cluster.leader() is not None
    assert a.resign(term)
    assert cluster.leader() is None
    assert not a.update_sync(term, frozenset({"a"}))
    assert b.force_sync()
    assert cluster.sync() == SyncSet(frozenset({"b"}), "b", cluster.revision)


def test_the_fake_lease_of_a_frozen_node_is_unconfirmed_after_the_safe_age_and_expires_with_its_keys() -> None:
    cluster = FakeCluster()
    events: list[CoordinatorEvent] = []
    a = FakeCoordinator(cluster, "a", url("a"), events.append, lease_ttl=TTL, lease_margin=MARGIN)
    assert not a.lease_confirmed_within(a.safe_lease_age)  # no lease before the first publish
    a.publish_status(NodeStatus(State.CONNECTING))
    assert a.campaign(frozenset({"a"}), 0) is not None
    cluster.advance(60)
    assert a.lease_confirmed_within(0) and cluster.leader() is not None  # refreshed all along
    cluster.freeze("a")
    cluster.advance(1.4)
    assert a.lease_confirmed_within(a.safe_lease_age) and events == []
    cluster.advance(0.2)
    assert not a.lease_confirmed_within(a.safe_lease_age)
    assert events == [CoordinatorEvent.LEASE_UNCONFIRMED]
    assert cluster.leader() is not None and cluster.member("a") is not None  # not before the TTL
    cluster.advance(0.4)
    assert cluster.leader() is None and cluster.member("a") is None
    cluster.heal("a")
    assert events[-1] is CoordinatorEvent.LEASE_LOST and a.last_lease_confirmation() is None
    a.publish_status(NodeStatus(State.CONNECTING))  # a fresh lease
    assert a.lease_confirmed_within(a.safe_lease_age) and cluster.member("a") is not None
    cluster.partition("a")
    with pytest.raises(CoordinatorUnavailable):
        a.read_snapshot()


def test_the_fake_revoke_lease_drops_the_member_and_leader_keys_at_once() -> None:
    cluster = FakeCluster()
    a, b = (FakeCoordinator(cluster, n, url(n), lambda event: None) for n in "ab")
    a.publish_status(NodeStatus(State.CONNECTING))
    b.publish_status(NodeStatus(State.CONNECTING))
    assert a.campaign(frozenset({"a"}), 0) is not None
    a.revoke_lease()
    assert cluster.leader() is None and cluster.member("a") is None and cluster.member("b") is not None
    assert cluster.sync() is not None  # the sync key has no lease


# -- the loop on the fake ----------------------------------------------------------------------


def test_a_brand_new_cluster_elects_exactly_one_primary_and_the_others_follow_it() -> None:
    cluster = FakeCluster()
    a, b, c = peers = [peer(cluster, n) for n in "abc"]
    for p in peers:
        p.step()
    assert [m.state for m in cluster.snapshot().members] == [State.CONNECTING] * 3
    assert cluster.leader() is None

    a.cycle()  # every member connecting: a campaigns for a new cluster, and wins
    leader = cluster.leader()
    assert leader is not None and leader.node_id == "a"
    term = leader.term
    assert cluster.sync() == SyncSet(frozenset({"a"}), "a", term)
    assert a.node.status == NodeStatus(State.CONNECTING)  # the role change is with the reactor
    a.cycle()  # so no decision now (deciding as connecting would give the key back)
    assert cluster.leader() == leader and a.coordinator.calls.count("resign") == 0

    for p in (b, c):
        p.step()
        assert p.node.followed == [leader]  # FollowLeader -> node.follow(leader)
        assert p.node.status == NodeStatus(State.CONNECTING)  # until the primary's hello
    assert a.react() == 1
    assert a.node.status == NodeStatus(State.PRIMARY, Detail.RECOVERING, term)
    assert a.node.effects == list(TRANSITIONS[CONNECTING][Event.WON_ELECTION_NEW_CLUSTER].actions) == BECOME_PRIMARY
    assert a.node.expected == frozenset() and a.node.admitting

    settle(cluster, *peers)
    assert [p.node.status.state for p in peers] == [State.PRIMARY, State.CONNECTING, State.CONNECTING]
    assert [p.campaigns() for p in peers] == [1, 0, 0]
    assert cluster.leader() == leader and published(cluster, "a") is State.PRIMARY
    assert b.node.followed == c.node.followed == [leader]


def test_a_primary_whose_lease_is_unconfirmed_steps_down_before_a_sync_backup_can_win() -> None:
    cluster, a, b, c = running_cluster(c_state=State.CATCHUP)
    old = cluster.leader()
    assert old is not None and a.node.status == NodeStatus(State.PRIMARY, Detail.ACTIVE, old.term)
    cluster.partition("a")  # cut off from etcd: no keepalive is confirmed, every call fails

    cluster.advance(1.4)  # within the safe age: a rides it out
    for p in (a, b, c):
        p.step()
    assert a.node.status.state is State.PRIMARY and a.node.effects == []

    cluster.advance(0.2)  # past the safe age (1.5 s), before the TTL (2 s)
    for p in (b, c):
        p.step()
    assert cluster.leader() == old  # nobody can win yet: the key is still a's
    assert b.campaigns() == c.campaigns() == 0
    a.step()
    assert a.node.status == NodeStatus(State.CONNECTING, term=old.term)
    assert a.node.transitions[-1].event is Event.LOST_LEASE
    assert a.node.effects == list(TRANSITIONS[PRIMARY_ACTIVE][Event.LOST_LEASE].actions) == STEP_DOWN
    assert not a.node.admitting
    assert cluster.leader() == old  # a stepped down while the key was still its own

    cluster.advance(0.5)  # the TTL has passed on the server: a's lease and keys are gone
    assert cluster.leader() is None and cluster.member("a") is None
    c.step()
    assert cluster.leader() is None and c.campaigns() == 0  # a catchup node never campaigns
    b.step()
    new = cluster.leader()
    assert new is not None and new.node_id == "b" and new.term > old.term
    assert b.node.status == NodeStatus(State.PRIMARY, Detail.RECOVERING, new.term)
    assert b.node.effects == list(TRANSITIONS[BACKUP][Event.WON_ELECTION].actions) == BECOME_PRIMARY
    assert cluster.sync() == SyncSet(frozenset({"b"}), "b", new.term)  # a is no live backup any more
    assert b.node.expected == frozenset()

    c.step()
    assert c.node.followed[-1] == new and c.campaigns() == 0
    cluster.heal("a")  # a comes back: a fresh lease, and it follows the new primary
    settle(cluster, a, b, c)
    assert a.node.followed == [new] and a.campaigns() == 0
    assert CoordinatorEvent.LEASE_LOST in a.coordinator.events
    assert published(cluster, "a") is State.CONNECTING
    assert [p.node.halted for p in (a, b, c)] == [None, None, None]


@pytest.mark.parametrize(("c_state", "why"), [(State.CATCHUP, "catching up"), (State.BACKUP, "not in the sync set")],
                         ids=["catchup", "backup-outside-the-sync-set"])
def test_without_a_sync_backup_a_node_that_is_not_one_never_campaigns(c_state: State, why: str) -> None:
    cluster, a, b, c = running_cluster(c_state=c_state, c_in_sync=False)
    cluster.partition("a")
    cluster.partition("b")  # the one sync backup is gone too
    cluster.advance(2.5)
    assert cluster.leader() is None and [m.node_id for m in cluster.snapshot().members] == ["c"]
    sync = cluster.sync()
    assert sync is not None and sync.members == {"a", "b"}
    assert c.coordinator.lease_confirmed_within(c.coordinator.safe_lease_age)
    settle(cluster, c)  # c alone, round after round
    assert cluster.leader() is None and c.campaigns() == 0 and c.node.status.state is c_state

    cluster.heal("b")  # the sync backup is back: it publishes again under a fresh lease and wins
    settle(cluster, b, c)
    new = cluster.leader()
    assert new is not None and new.node_id == "b"
    assert c.node.followed[-1] == new and c.campaigns() == 0


def test_a_primary_that_loses_its_lease_but_reaches_etcd_gives_the_key_back_before_it_expires() -> None:
    cluster, a, b, c = running_cluster(c_state=State.CATCHUP)
    old = cluster.leader()
    assert old is not None
    cluster.freeze("a")  # keepalives unconfirmed, the rest of etcd answers
    cluster.advance(1.6)
    a.step()
    assert a.node.status.state is State.CONNECTING and a.node.effects == STEP_DOWN
    assert cluster.leader() == old
    a.cycle()  # the step-down's resign, requested by its RESIGN action
    assert a.coordinator.calls.count("resign") == 1
    assert cluster.leader() is None and cluster.now < TTL  # given back before the lease could expire
    b.step()
    new = cluster.leader()
    assert new is not None and new.node_id == "b" and new.term > old.term


def test_a_handover_makes_the_primary_step_down_and_only_the_target_may_campaign() -> None:
    cluster, a, b, c = running_cluster(c_state=State.BACKUP, c_in_sync=True)  # b and c both eligible
    old = cluster.leader()
    assert old is not None
    # hastandby promote on b: the handover is written from b's election thread.
    b.loop.request(lambda: b.coordinator.set_handover("b", ttl=10))
    b.cycle()
    assert cluster.handover_target() == "b"

    a.step()
    assert a.node.status == NodeStatus(State.CONNECTING, term=old.term)
    assert a.node.transitions[-1].event is Event.DEMOTED
    assert a.node.effects == list(TRANSITIONS[PRIMARY_ACTIVE][Event.DEMOTED].actions) == STEP_DOWN
    assert cluster.leader() == old  # the key goes with a's next turn (its resign request)
    a.cycle()
    assert cluster.leader() is None

    for _ in range(3):  # c is a ready backup in the sync set, but the handover names b
        c.step()
        a.step()
    assert cluster.leader() is None and c.campaigns() == a.campaigns() == 0

    b.step()
    new = cluster.leader()
    assert new is not None and new.node_id == "b" and new.term > old.term
    assert b.node.status == NodeStatus(State.PRIMARY, Detail.RECOVERING, new.term)
    assert b.node.expected == frozenset({"c"})  # the live sync members it now guards for
    assert cluster.sync() == SyncSet(frozenset({"b", "c"}), "b", new.term)
    b.step()  # the handover names the primary: cleared
    assert cluster.handover_target() is None and "clear_handover" in b.coordinator.calls
    settle(cluster, a, b, c)
    assert a.node.followed == [new] and c.node.followed[-1] == new
    assert [p.campaigns() for p in (a, b, c)] == [0, 1, 0]


def test_an_election_won_when_the_table_no_longer_allows_it_gives_the_key_back() -> None:
    cluster, a, b, c = running_cluster(c_state=State.CATCHUP)
    old = cluster.leader()
    assert old is not None
    a.node.fire(Event.STOP)  # a graceful stop: its actions revoke a's lease, freeing both keys at once
    assert a.node.effects == list(TRANSITIONS[PRIMARY_ACTIVE][Event.STOP].actions)
    assert cluster.leader() is None and cluster.member("a") is None

    b.cycle()  # b, a sync backup, wins ...
    won = cluster.leader()
    assert won is not None and won.node_id == "b"
    assert b.node.fire(Event.DROPPED_BY_PRIMARY)  # ... but the reactor has it catching up before it hears so
    assert b.react() == 1
    assert b.node.status == NodeStatus(State.CATCHUP, term=old.term)  # the won term is not taken
    assert [e.event for e in b.node.refused] == [Event.WON_ELECTION] and b.node.halted is None
    assert Action.START_GUARDING not in b.node.effects and not b.node.admitting
    assert cluster.leader() == won  # the give-back is a request for b's election thread
    b.cycle()
    assert b.coordinator.calls.count("resign") == 1
    assert cluster.leader() is None
    # The sync set written with the won key stays: b alone, now catching up, so nobody is eligible.
    assert cluster.sync() == SyncSet(frozenset({"b"}), "b", won.term)
    settle(cluster, b, c)
    assert cluster.leader() is None and b.campaigns() == 1 and c.campaigns() == 0


def test_a_primary_frozen_past_its_ttl_steps_down_when_it_resumes_and_leaves_the_new_leaders_key_alone() -> None:
    cluster, a, b, c = running_cluster(c_state=State.CATCHUP)
    old = cluster.leader()
    assert old is not None
    cluster.partition("a")  # as if SIGSTOPped: a takes no turn at all
    cluster.advance(2.5)
    settle(cluster, b, c)
    new = cluster.leader()
    assert new is not None and new.node_id == "b" and new.term > old.term

    cluster.heal("a")  # a resumes; its keepalive learns that the lease is gone
    assert not a.coordinator.lease_confirmed_within(a.coordinator.safe_lease_age)
    a.step()
    assert a.node.status == NodeStatus(State.CONNECTING, term=old.term) and a.node.effects == STEP_DOWN
    a.cycle()  # its resign names the old term: the new leader's key stays
    assert a.coordinator.calls.count("resign") == 1 and cluster.leader() == new
    settle(cluster, a, b, c)
    assert a.node.followed == [new] and cluster.leader() == new


def test_an_operators_handover_that_etcd_refuses_is_written_at_a_later_cycle() -> None:
    """A node whose etcd link just came back fails its first write; the promote it was asked for still happens."""
    cluster, a, b, c = running_cluster(c_state=State.BACKUP, c_in_sync=True)
    cluster.partition("b")
    b.loop.hand_over("b", ttl=10)
    b.cycle()
    assert cluster.handover_target() is None and b.coordinator.calls.count("set_handover") == 1
    cluster.heal("b")
    b.cycle()
    assert cluster.handover_target() == "b" and b.coordinator.calls.count("set_handover") == 2
    b.cycle()
    assert b.coordinator.calls.count("set_handover") == 2  # written once: not again


def test_a_handover_still_refused_when_its_time_is_up_is_given_up() -> None:
    cluster, a, b, c = running_cluster(c_state=State.BACKUP, c_in_sync=True)
    cluster.partition("b")
    b.loop.hand_over("b", ttl=0)
    b.cycle()
    cluster.heal("b")
    b.cycle()
    assert cluster.handover_target() is None and b.coordinator.calls.count("set_handover") == 1
