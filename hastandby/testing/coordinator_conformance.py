"""What every ``Coordinator`` must do: checks that ``FakeCoordinator`` and ``EtcdCoordinator`` both pass.

After trio's ``testing.check_two_way_stream(stream_maker)``: each check takes a
``make_world`` callable returning a context manager of a ``CoordinatorWorld``
(one fresh cluster in one store, nodes joined to it, a clock, and a way to cut
a node off from the store), drives several coordinators through it, and
raises ``AssertionError`` where the implementation differs from the contract
(``hastandby/election/coordinator.py``, as the election loop uses it).  No
pytest: ``tests/unit/test_coordinator_conformance.py`` runs them on the fake
(``fake_world``), ``tests/integration/test_etcd_coordinator.py`` on a real etcd
(``etcd_world``).  The fake is right only as far as these checks reach: a
difference found between the fake and etcd is a bug in the fake, and a check
here says so for the next one.

| check | the contract |
|---|---|
| ``check_lease_queries`` | no lease before ``publish_status``; then confirmed, and kept confirmed beyond its TTL |
| ``check_snapshot`` | member keys (url, state, detail, store) sorted by id; the revision moves with every write |
| ``check_one_leader_at_a_time`` | one of several campaigners wins; the term is the leader key's create revision and the sync key's revision; resign only for that term; no campaign without a lease |
| ``check_campaign_needs_the_sync_revision_read`` | a campaign on a stale sync revision loses; ``force_sync`` only without a leader |
| ``check_sync_set_only_for_the_current_term`` | ``update_sync`` only for the leader key's term, never for a deposed one |
| ``check_handover`` | only the target may win; cleared by hand; a forgotten one expires by itself |
| ``check_revoke_frees_the_keys_at_once`` | graceful stop: member and leader keys gone at once, and a new lease on the next publish |
| ``check_crashed_node_keys_expire_within_a_ttl`` | ``close`` without revoke: keys expire within a TTL, no notification after it; a restarted node (same id) |
| ``check_cut_off_node_fences_itself_before_its_lease_can_expire`` | unconfirmed (and told) at the safe age, before the key can expire; every call raises ``CoordinatorUnavailable``; back again: ``LEASE_LOST``, a deposed term does nothing, the watch says it may have missed changes |
| ``check_watch_reports_every_change`` | ``CLUSTER_CHANGED`` on a new watch and after every write, to watching nodes only |
| ``check_unreachable_store`` | a node that never reached the store: every call raises, ``watch`` is False; it recovers |

A coordinator that keeps the broker's ``Fence`` (a ``fence`` attribute, as
``EtcdCoordinator`` does; the fake's clock is not the fence's) is checked too:
closed without a lease, closing at the safe age, closed when the lease is lost.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from hastandby import settings
from hastandby.election.cluster import Member, Store
from hastandby.election.coordinator import (
    Coordinator,
    CoordinatorError,
    CoordinatorEvent,
    CoordinatorUnavailable,
    Notify,
)
from hastandby.lifecycle.states import Detail, NodeStatus, State
from hastandby.testing.delay_proxy import DelayProxy
from hastandby.testing.fake_coordinator import FakeCluster, FakeCoordinator

__all__ = [
    "COORDINATOR_CHECKS",
    "CoordinatorWorld",
    "check_coordinator",
    "etcd_world",
    "fake_world",
]

#: How often a check polls, on the world's clock (the fake's clock moves by this much per poll).
STEP = 0.05
CHANGED, UNCONFIRMED, LOST = (CoordinatorEvent.CLUSTER_CHANGED, CoordinatorEvent.LEASE_UNCONFIRMED,
                              CoordinatorEvent.LEASE_LOST)
CONNECTING, BACKUP = NodeStatus(State.CONNECTING), NodeStatus(State.BACKUP)
LEASE_TTL, LEASE_MARGIN = settings.LEASE_TTL.default, settings.LEASE_MARGIN.default


class CoordinatorWorld(Protocol):
    """One fresh cluster in one store, as a check drives it.  Its context manager closes every coordinator
    it made (without revoking their leases) and whatever it started."""

    #: The lease TTL, in seconds, that every coordinator made here requests.
    ttl: int

    def join(self, node_id: str, url: str, notify: Notify) -> Coordinator:
        """A new coordinator of ``node_id`` in this cluster (a second one for an id: the node restarted)."""
        ...

    def cut(self, node_id: str) -> None:
        """``node_id`` can no longer reach the store: no refresh of its lease is confirmed, every call fails."""
        ...

    def heal(self, node_id: str) -> None:
        """``node_id`` reaches the store again."""
        ...

    def now(self) -> float:
        """The clock that ``last_lease_confirmation`` is read on."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass on that clock."""
        ...


MakeWorld = Callable[[], AbstractContextManager[CoordinatorWorld]]


# -- the worlds -----------------------------------------------------------------------------------


@dataclass
class FakeWorld:
    """``FakeCoordinator``s on one ``FakeCluster``; its clock moves only in ``sleep``."""

    ttl: int = LEASE_TTL
    margin: float = LEASE_MARGIN
    cluster: FakeCluster = field(default_factory=FakeCluster)
    coordinators: list[FakeCoordinator] = field(default_factory=list)

    def join(self, node_id: str, url: str, notify: Notify) -> FakeCoordinator:
        coordinator = FakeCoordinator(self.cluster, node_id, url, notify, lease_ttl=self.ttl,
                                      lease_margin=self.margin)
        self.coordinators.append(coordinator)
        return coordinator

    def cut(self, node_id: str) -> None:
        self.cluster.partition(node_id)

    def heal(self, node_id: str) -> None:
        self.cluster.heal(node_id)

    def now(self) -> float:
        return self.cluster.now

    def sleep(self, seconds: float) -> None:
        self.cluster.advance(seconds)


@contextmanager
def fake_world(ttl: int = LEASE_TTL, margin: float = LEASE_MARGIN) -> Iterator[FakeWorld]:
    """A ``FakeWorld`` on a fresh ``FakeCluster``."""
    world = FakeWorld(ttl, margin)
    try:
        yield world
    finally:
        for coordinator in world.coordinators:
            coordinator.close()


class EtcdWorld:
    """``EtcdCoordinator``s in a fresh cluster (a name of its own) on a real etcd at ``client_url`` (plain
    http).  Each node reaches etcd through a ``DelayProxy`` of its own, without delay, which ``cut`` makes
    refuse every connection."""

    def __init__(self, client_url: str, ttl: int = LEASE_TTL, margin: float = LEASE_MARGIN,
                 request_timeout: float = 0.5) -> None:
        scheme, _, hostport = client_url.partition("://")
        if scheme != "http":
            raise ValueError(f"etcd_world needs a plain http etcd: {client_url}")
        host, _, port = hostport.rpartition(":")
        self._target = (host, int(port))
        self.ttl = ttl
        self.margin = margin
        self.request_timeout = request_timeout
        self.cluster = f"conformance{uuid.uuid4().hex[:8]}"
        self.proxies: dict[str, DelayProxy] = {}
        self.coordinators: list[Any] = []

    def join(self, node_id: str, url: str, notify: Notify) -> Coordinator:
        from hastandby.election.etcd_coordinator import EtcdCoordinator  # gRPC loads only for etcd

        proxy = self.proxies.get(node_id)
        if proxy is None:
            proxy = self.proxies[node_id] = DelayProxy(self._target, 0.0).start()
        coordinator = EtcdCoordinator(f"http://{proxy.address}", self.cluster, node_id, url, notify,
                                      lease_ttl=self.ttl, lease_margin=self.margin,
                                      request_timeout=self.request_timeout)
        self.coordinators.append(coordinator)
        return coordinator

    def cut(self, node_id: str) -> None:
        self.proxies[node_id].refuse(True)

    def heal(self, node_id: str) -> None:
        self.proxies[node_id].refuse(False)

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def close(self) -> None:
        for coordinator in self.coordinators:
            coordinator.close()
        for proxy in self.proxies.values():
            proxy.refuse(True)  # its connections end before its loop stops (no cancelled handler to report)
        time.sleep(0.05)
        for proxy in self.proxies.values():
            proxy.stop()


@contextmanager
def etcd_world(client_url: str, ttl: int = LEASE_TTL, margin: float = LEASE_MARGIN,
               request_timeout: float = 0.5) -> Iterator[EtcdWorld]:
    """An ``EtcdWorld`` on the etcd at ``client_url`` (``hastandby.testing.etcd.EtcdServer().client_url``)."""
    world = EtcdWorld(client_url, ttl, margin, request_timeout)
    try:
        yield world
    finally:
        world.close()


# -- what the checks share ------------------------------------------------------------------------


@dataclass
class _Node:
    """A coordinator and what it told its ``notify`` (appended from any thread)."""

    id: str
    url: str
    c: Coordinator
    events: list[CoordinatorEvent]

    def told(self, event: CoordinatorEvent, since: int = 0) -> bool:
        return event in self.events[since:]


def _join(world: CoordinatorWorld, node_id: str, status: NodeStatus | None = CONNECTING) -> _Node:
    """``node_id`` joins the world; it publishes ``status`` unless that is None."""
    events: list[CoordinatorEvent] = []
    url = f"amqp://{node_id}.conformance:5672"
    node = _Node(node_id, url, world.join(node_id, url, events.append), events)
    if status is not None:
        node.c.publish_status(status)
    return node


def _wait(world: CoordinatorWorld, condition: Callable[[], object], timeout: float, what: str) -> float:
    """Poll ``condition`` every ``STEP`` on the world's clock; return the time it held."""
    deadline = world.now() + timeout
    while True:
        if condition():
            return world.now()
        if world.now() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        world.sleep(STEP)


def _campaign(node: _Node, sync: frozenset[str] | None = None) -> int | None:
    """Campaign as the election loop does: on the sync key's revision as read just before."""
    snapshot = node.c.read_snapshot()
    revision = snapshot.sync.revision if snapshot.sync is not None else 0
    return node.c.campaign(sync if sync is not None else frozenset({node.id}), revision)


def _leader(node: _Node) -> tuple[str, int] | None:
    leader = node.c.read_snapshot().leader
    return (leader.node_id, leader.term) if leader is not None else None


def _raises(error: type[Exception], call: Callable[[], object], what: str) -> None:
    try:
        call()
    except error:
        return
    raise AssertionError(f"{what}: no {error.__name__}")


def _succeeds(call: Callable[[], object]) -> bool:
    try:
        call()
    except CoordinatorError:
        return False
    return True


def _fence_until(node: _Node) -> float | None:
    """The deadline of the ``Fence`` the coordinator keeps, if it keeps one."""
    fence = getattr(node.c, "fence", None)
    return fence.until if fence is not None else None


def _check_fence_closed(node: _Node, what: str) -> None:
    until = _fence_until(node)
    assert until is None or until == -math.inf, f"{what}: the fence is open until {until}"


def _ttl_and_margin(world: CoordinatorWorld, node: _Node) -> tuple[float, float]:
    margin = world.ttl - node.c.safe_lease_age
    assert 0 < margin < world.ttl * 2 / 3, f"safe lease age {node.c.safe_lease_age} for a TTL of {world.ttl}"
    return world.ttl, margin


# -- the checks -----------------------------------------------------------------------------------


def check_lease_queries(make_world: MakeWorld) -> None:
    """No lease before the first ``publish_status``; then a lease confirmed all along, beyond its TTL."""
    with make_world() as world:
        node = _join(world, "a", status=None)
        ttl, _ = _ttl_and_margin(world, node)
        assert node.c.last_lease_confirmation() is None, "a lease before publish_status"
        assert not node.c.lease_confirmed_within(ttl * 10), "confirmed without a lease"
        _check_fence_closed(node, "before any lease")
        node.c.publish_status(CONNECTING)
        started = world.now()
        while world.now() - started < ttl + 0.5:  # the keepalive's business: the lease outlives its TTL
            confirmed = node.c.last_lease_confirmation()
            assert confirmed is not None and confirmed <= world.now(), f"last confirmation {confirmed}"
            assert node.c.lease_confirmed_within(node.c.safe_lease_age), "a kept lease counted as unconfirmed"
            until = _fence_until(node)
            assert until is None or until >= confirmed, f"fence until {until}, lease confirmed at {confirmed}"
            world.sleep(0.1)
        member = node.c.read_snapshot().member("a")
        assert member is not None and member.state is State.CONNECTING, f"member key after a TTL: {member}"
        assert not node.told(UNCONFIRMED) and not node.told(LOST), f"a kept lease reported: {node.events}"


def check_snapshot(make_world: MakeWorld) -> None:
    """Every member key as published (url, state, detail, store), sorted by id; no leader, handover or sync
    set in a new cluster; the snapshot's revision moves with every write."""
    with make_world() as world:
        empty = _join(world, "observer", status=None).c.read_snapshot()
        assert (empty.leader, empty.members, empty.handover_target, empty.sync) == (None, (), None, None), empty
        published = {
            "c": (NodeStatus(State.CATCHUP), Store(journal=True)),
            "a": (NodeStatus(State.PRIMARY, Detail.RECOVERING, term=7), Store(journal=True, holds_data=True)),
            "b": (BACKUP, Store(holds_data=True, damaged=True)),
        }
        nodes = {node_id: _join(world, node_id, status=None) for node_id in published}
        revision = empty.revision
        for node_id, (status, store) in published.items():
            nodes[node_id].c.publish_status(status, store)
            snapshot = nodes[node_id].c.read_snapshot()
            assert snapshot.revision > revision, f"revision {snapshot.revision} after a write at {revision}"
            revision = snapshot.revision
        snapshot = nodes["a"].c.read_snapshot()
        assert snapshot.members == tuple(
            Member(node_id, nodes[node_id].url, status.state, status.detail, store)
            for node_id, (status, store) in sorted(published.items())
        ), snapshot.members
        assert snapshot.leader is None and snapshot.handover_target is None and snapshot.sync is None, snapshot
        nodes["c"].c.publish_status(BACKUP)  # a republished member replaces its key; the default store
        member = nodes["b"].c.read_snapshot().member("c")
        assert member == Member("c", nodes["c"].url, State.BACKUP, None, Store()), member


def check_one_leader_at_a_time(make_world: MakeWorld) -> None:
    """Of nodes that read the same snapshot and campaign, the first wins and the others lose; the term is the
    leader key's create revision, which the sync key written with it has as its revision; only that term
    resigns it, and each new term is higher.  A node without a lease cannot campaign."""
    with make_world() as world:
        nodes = [_join(world, node_id) for node_id in ("a", "b", "c")]
        terms: list[int] = []
        for _ in range(3):
            snapshots = [node.c.read_snapshot() for node in nodes]
            assert all(s.leader is None for s in snapshots), snapshots
            results = [node.c.campaign(frozenset({node.id, "b"}), s.sync.revision if s.sync else 0)
                       for node, s in zip(nodes, snapshots)]
            winners = [node for node, term in zip(nodes, results) if term is not None]
            assert [w.id for w in winners] == [nodes[0].id], f"campaign results {results}"
            term = results[0]
            assert term is not None
            snapshot = nodes[2].c.read_snapshot()
            assert snapshot.leader is not None
            assert (snapshot.leader.node_id, snapshot.leader.url, snapshot.leader.term) == (
                nodes[0].id, nodes[0].url, term), snapshot.leader
            assert snapshot.sync is not None
            assert (snapshot.sync.members, snapshot.sync.leader, snapshot.sync.revision) == (
                frozenset({nodes[0].id, "b"}), nodes[0].id, term), snapshot.sync
            assert snapshot.revision >= term and snapshot.is_current_term(term)
            assert _campaign(nodes[1]) is None, "a second leader while the key is held"
            assert not nodes[1].c.resign(term + 1), "resigned a term that is not the leader key's"
            assert _leader(nodes[1]) == (nodes[0].id, term)
            assert nodes[0].c.resign(term), "the leader could not resign its term"
            assert not nodes[0].c.resign(term), "resigned twice"
            assert _leader(nodes[0]) is None
            terms.append(term)
            nodes = nodes[1:] + nodes[:1]  # the next round's first campaigner
        assert terms == sorted(set(terms)), f"terms must increase: {terms}"
        lone = _join(world, "without-lease", status=None)
        _raises(CoordinatorError, lambda: lone.c.campaign(frozenset({"without-lease"}), 0),
                "a campaign without a lease")
        assert _leader(nodes[0]) is None, "a campaign without a lease wrote the leader key"


def check_campaign_needs_the_sync_revision_read(make_world: MakeWorld) -> None:
    """A campaign made on a sync revision that has changed since loses (0: the key was absent);
    ``force_sync`` writes this node alone as the sync set, only while there is no leader."""
    with make_world() as world:
        a, b = _join(world, "a"), _join(world, "b")
        assert a.c.force_sync(), "force_sync refused without a leader"
        sync = b.c.read_snapshot().sync
        assert sync is not None and (sync.members, sync.leader) == (frozenset({"a"}), "a"), sync
        assert b.c.campaign(frozenset({"b"}), 0) is None, "won on a sync key read as absent"
        assert b.c.campaign(frozenset({"b"}), sync.revision + 1) is None, "won on a sync revision never read"
        assert _leader(a) is None
        term = b.c.campaign(frozenset({"a", "b"}), sync.revision)
        assert term is not None, "lost on the sync revision read"
        assert not a.c.force_sync(), "force_sync with a leader"
        after = a.c.read_snapshot().sync
        assert after is not None and (after.members, after.leader, after.revision) == (
            frozenset({"a", "b"}), "b", term), after


def check_sync_set_only_for_the_current_term(make_world: MakeWorld) -> None:
    """``update_sync`` writes while the leader key has that term, and never for any other or deposed term."""
    with make_world() as world:
        a, b = _join(world, "a"), _join(world, "b")
        term = _campaign(a, frozenset({"a", "b"}))
        assert term is not None
        assert a.c.update_sync(term, frozenset({"a"})), "the leader could not write its sync set"
        sync = b.c.read_snapshot().sync
        assert sync is not None and (sync.members, sync.leader) == (frozenset({"a"}), "a"), sync
        assert sync.revision > term, f"sync revision {sync.revision} after the write, term {term}"
        assert not a.c.update_sync(term + 1, frozenset({"a", "b"})), "written for a term that is not the key's"
        assert not b.c.update_sync(sync.revision, frozenset({"b"})), "written for the sync key's revision"
        unchanged = b.c.read_snapshot().sync
        assert unchanged == sync, f"{unchanged} after refused writes, was {sync}"
        assert a.c.resign(term)
        new_term = _campaign(b)
        assert new_term is not None and new_term > term
        assert not a.c.update_sync(term, frozenset({"a", "b"})), "a deposed leader wrote the sync set"
        final = a.c.read_snapshot().sync
        assert final is not None and (final.members, final.leader) == (frozenset({"b"}), "b"), final


def check_handover(make_world: MakeWorld) -> None:
    """While a handover names a node, only that node may win; it is cleared by hand, and a forgotten one
    expires with its own lease.  A target that is not a node id is refused."""
    with make_world() as world:
        primary, bystander, target = (_join(world, n) for n in ("primary", "bystander", "target"))
        term = _campaign(primary)
        assert term is not None
        primary.c.set_handover("target", ttl=30)
        assert bystander.c.read_snapshot().handover_target == "target"
        assert primary.c.resign(term)
        assert _campaign(bystander) is None, "a bystander won against the handover"
        assert _campaign(primary) is None, "the old primary won against the handover"
        new_term = _campaign(target)
        assert new_term is not None and new_term > term, "the handover target lost"
        target.c.clear_handover()
        snapshot = bystander.c.read_snapshot()
        assert snapshot.handover_target is None and snapshot.leader is not None, snapshot
        assert snapshot.leader.node_id == "target"
        target.c.clear_handover()  # none: nothing happens
        _raises(ValueError, lambda: primary.c.set_handover("not/a/node", ttl=30), "a handover to a bad id")
        assert target.c.resign(new_term)
        primary.c.set_handover("absent", ttl=world.ttl)
        set_at = world.now()
        assert _campaign(bystander) is None, "won against a handover to another node"
        gone_at = _wait(world, lambda: bystander.c.read_snapshot().handover_target is None, world.ttl + 3,
                        "the forgotten handover expired")
        assert gone_at - set_at >= world.ttl - 0.5, f"a handover of {world.ttl} s gone after {gone_at - set_at} s"
        assert _campaign(bystander) is not None, "lost with the handover expired"


def check_revoke_frees_the_keys_at_once(make_world: MakeWorld) -> None:
    """``revoke_lease`` (graceful stop) drops the lease, and the member and leader keys with it, at once; a
    successor wins without waiting; the next ``publish_status`` takes a fresh lease."""
    with make_world() as world:
        leaving, successor = _join(world, "leaving"), _join(world, "successor")
        term = _campaign(leaving)
        assert term is not None
        leaving.c.revoke_lease()
        snapshot = successor.c.read_snapshot()
        assert snapshot.leader is None and snapshot.member("leaving") is None, snapshot
        assert leaving.c.last_lease_confirmation() is None, "a lease after revoke_lease"
        assert not leaving.c.lease_confirmed_within(world.ttl * 10)
        _check_fence_closed(leaving, "after revoke_lease")
        leaving.c.revoke_lease()  # none: nothing happens
        new_term = _campaign(successor)
        assert new_term is not None and new_term > term
        leaving.c.publish_status(BACKUP)
        assert leaving.c.lease_confirmed_within(leaving.c.safe_lease_age), "no fresh lease on publish"
        member = successor.c.read_snapshot().member("leaving")
        assert member is not None and member.state is State.BACKUP, member
        assert _campaign(leaving) is None
        world.sleep(world.ttl + 0.5)
        assert successor.c.read_snapshot().member("leaving") is not None, "the fresh lease was not kept"
        assert not leaving.told(LOST), f"a revoked lease reported lost: {leaving.events}"


def check_crashed_node_keys_expire_within_a_ttl(make_world: MakeWorld) -> None:
    """``close`` without ``revoke_lease`` is a crash as the store sees it: nothing refreshes the lease, its keys
    expire within a TTL (and not much sooner), and ``notify`` is not called after ``close``.  The node's next
    coordinator (same id, a restart) replaces its member key, but not its old leader key."""
    with make_world() as world:
        crashed, successor = _join(world, "crashed"), _join(world, "successor")
        ttl, _ = _ttl_and_margin(world, crashed)
        term = _campaign(crashed)
        assert term is not None
        told_before = len(crashed.events)
        crashed.c.close()
        closed_at = world.now()
        restarted = _join(world, "crashed", status=NodeStatus(State.CONNECTING))
        snapshot = successor.c.read_snapshot()
        member = snapshot.member("crashed")
        assert member is not None and member.url == restarted.url and member.state is State.CONNECTING, member
        assert snapshot.leader is not None and snapshot.leader.term == term, "the crashed node's key went early"
        assert _campaign(restarted) is None, "the restarted node won while its old key lives"
        gone_at = _wait(world, lambda: successor.c.read_snapshot().leader is None, ttl + 3,
                        "the crashed leader's key expired")
        assert ttl * 2 / 3 - 0.1 <= gone_at - closed_at <= ttl + 1.5, (
            f"the key of a {ttl} s lease expired {gone_at - closed_at:.2f} s after the crash")
        assert successor.c.read_snapshot().member("crashed") is not None, "the restarted node's member key went"
        new_term = _campaign(successor)
        assert new_term is not None and new_term > term
        assert crashed.events[told_before:] == [], f"notified after close: {crashed.events[told_before:]}"


def check_cut_off_node_fences_itself_before_its_lease_can_expire(make_world: MakeWorld) -> None:
    """A leader cut off from the store stops counting its lease as confirmed at the safe age (and is told so)
    before the store can drop its key, and every call it makes raises ``CoordinatorUnavailable``.  Another node
    wins once the key is gone.  Back again, the node is told its lease is lost, its deposed term resigns and
    writes nothing, its next ``publish_status`` takes a fresh lease, and its watch says it may have missed
    changes."""
    with make_world() as world:
        leader, other = _join(world, "leader", BACKUP), _join(world, "other", BACKUP)
        ttl, margin = _ttl_and_margin(world, leader)
        safe = leader.c.safe_lease_age
        assert leader.c.watch() and other.c.watch(), "watch not established"
        term = _campaign(leader, frozenset({"leader", "other"}))
        assert term is not None
        confirmed = leader.c.last_lease_confirmation()
        _wait(world, lambda: leader.c.last_lease_confirmation() != confirmed, ttl, "a refresh confirmed")
        world.cut("leader")
        unconfirmed_at = _wait(world, lambda: not leader.c.lease_confirmed_within(safe), ttl + 1,
                               "the lease counted as unconfirmed")
        last = leader.c.last_lease_confirmation()
        assert last is not None, "the lease was forgotten before the store could answer"
        assert safe <= unconfirmed_at - last <= safe + 0.5, (
            f"unconfirmed {unconfirmed_at - last:.2f} s after the last confirmation; safe age {safe} s")
        told_at = _wait(world, lambda: leader.told(UNCONFIRMED), ttl, "LEASE_UNCONFIRMED")
        assert told_at - last < ttl - margin / 2, f"told {told_at - last:.2f} s after the last confirmation"
        until = _fence_until(leader)
        assert until is None or until <= last + safe + 1e-6, f"fence until {until}; confirmed at {last}"
        for what, call in (
            ("read_snapshot", leader.c.read_snapshot),
            ("publish_status", lambda: leader.c.publish_status(NodeStatus(State.PRIMARY, Detail.ACTIVE))),
            ("campaign", lambda: leader.c.campaign(frozenset({"leader"}), 0)),
            ("update_sync", lambda: leader.c.update_sync(term, frozenset({"leader"}))),
            ("resign", lambda: leader.c.resign(term)),
            ("force_sync", leader.c.force_sync),
            ("set_handover", lambda: leader.c.set_handover("other", ttl=30)),
            ("clear_handover", leader.c.clear_handover),
        ):
            _raises(CoordinatorUnavailable, call, f"{what} cut off from the store")
        gone_at = _wait(world, lambda: other.c.read_snapshot().leader is None, ttl + 3,
                        "the cut-off leader's key expired")
        assert gone_at - last >= ttl - 0.1, f"the key of a {ttl} s lease expired {gone_at - last:.2f} s after " \
                                            "its last confirmed refresh was sent"
        assert gone_at - unconfirmed_at >= margin / 2, "unconfirmed too late: the key could already be gone"
        new_term = _campaign(other)
        assert new_term is not None and new_term > term
        healed = len(leader.events)
        world.heal("leader")
        _wait(world, lambda: leader.told(LOST, healed), 5, "LEASE_LOST once the store answers again")
        assert leader.c.last_lease_confirmation() is None, "a lost lease still counted"
        _check_fence_closed(leader, "after the lease was lost")
        _wait(world, lambda: leader.told(CHANGED, healed), 5, "the watch back, saying it may have missed changes")
        assert _succeeds(leader.c.read_snapshot)
        assert not leader.c.resign(term), "a deposed term resigned the new leader"
        assert not leader.c.update_sync(term, frozenset({"leader"})), "a deposed term wrote the sync set"
        assert _leader(other) == ("other", new_term)
        leader.c.publish_status(BACKUP)
        assert leader.c.lease_confirmed_within(safe), "no fresh lease on publish after the loss"
        member = other.c.read_snapshot().member("leader")
        assert member is not None and member.state is State.BACKUP, member


def check_watch_reports_every_change(make_world: MakeWorld) -> None:
    """A new watch tells ``CLUSTER_CHANGED`` once established (it may have missed changes), then after every
    write under the cluster, whoever made it; a node that never watched is never told."""
    with make_world() as world:
        writer, watcher, deaf = _join(world, "writer"), _join(world, "watcher"), _join(world, "deaf")
        assert watcher.c.watch(), "watch not established"
        _wait(world, lambda: watcher.told(CHANGED), 2, "CLUSTER_CHANGED on a new watch")
        assert watcher.c.watch(), "a second watch() not established"
        terms: list[int] = []

        def campaign() -> None:
            term = _campaign(writer)
            assert term is not None
            terms.append(term)

        for what, write in (
            ("publish_status", lambda: writer.c.publish_status(BACKUP)),
            ("campaign", campaign),
            ("update_sync", lambda: writer.c.update_sync(terms[0], frozenset({"writer", "watcher"}))),
            ("set_handover", lambda: writer.c.set_handover("watcher", ttl=30)),
            ("clear_handover", writer.c.clear_handover),
            ("resign", lambda: writer.c.resign(terms[0])),
            ("force_sync", writer.c.force_sync),
            ("revoke_lease", writer.c.revoke_lease),
            ("the watcher's own publish_status", lambda: watcher.c.publish_status(BACKUP)),
        ):
            since = len(watcher.events)
            write()
            _wait(world, lambda: watcher.told(CHANGED, since), 2, f"CLUSTER_CHANGED after {what}")
        assert not deaf.told(CHANGED), f"a node that never watched was told: {deaf.events}"


def check_unreachable_store(make_world: MakeWorld) -> None:
    """A node that cannot reach the store: every call raises ``CoordinatorUnavailable`` (``revoke_lease``
    without a lease has nothing to do), ``watch`` says it is not established; once the store answers the node
    publishes, and its watch, kept trying, tells it."""
    with make_world() as world:
        node = _join(world, "lonely", status=None)
        world.cut("lonely")
        for what, call in (
            ("publish_status", lambda: node.c.publish_status(CONNECTING)),
            ("read_snapshot", node.c.read_snapshot),
            ("force_sync", node.c.force_sync),
            ("resign", lambda: node.c.resign(1)),
            ("update_sync", lambda: node.c.update_sync(1, frozenset({"lonely"}))),
            ("set_handover", lambda: node.c.set_handover("lonely", ttl=30)),
            ("clear_handover", node.c.clear_handover),
        ):
            _raises(CoordinatorUnavailable, call, f"{what} without the store")
        assert node.c.last_lease_confirmation() is None
        node.c.revoke_lease()
        assert not node.c.watch(), "a watch established without the store"
        assert not node.told(CHANGED), f"told without the store: {node.events}"
        world.heal("lonely")
        _wait(world, lambda: _succeeds(lambda: node.c.publish_status(CONNECTING)), 5, "publish_status again")
        assert node.c.lease_confirmed_within(node.c.safe_lease_age)
        _wait(world, lambda: node.told(CHANGED), 5, "the watch established once the store answers")
        assert node.c.read_snapshot().member("lonely") is not None


#: Every check, in the order ``check_coordinator`` runs them (a test may parametrize over it).
COORDINATOR_CHECKS: tuple[Callable[[MakeWorld], None], ...] = (
    check_lease_queries,
    check_snapshot,
    check_one_leader_at_a_time,
    check_campaign_needs_the_sync_revision_read,
    check_sync_set_only_for_the_current_term,
    check_handover,
    check_revoke_frees_the_keys_at_once,
    check_crashed_node_keys_expire_within_a_ttl,
    check_cut_off_node_fences_itself_before_its_lease_can_expire,
    check_watch_reports_every_change,
    check_unreachable_store,
)


def check_coordinator(make_world: MakeWorld) -> None:
    """Run every check of ``COORDINATOR_CHECKS``; the first that fails raises ``AssertionError``."""
    for check in COORDINATOR_CHECKS:
        check(make_world)
