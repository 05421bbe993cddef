"""EtcdCoordinator against a real etcd server: elections, expiry, handover, outages.

No mocks: every test runs etcd (hastandby/testing/etcd.py).  The conformance
checks that ``FakeCoordinator`` passes too (``hastandby/testing/coordinator_conformance.py``,
``tests/unit/test_coordinator_conformance.py``) run here first, on etcd.  Without an etcd
binary these tests fail with a message saying how to install one; they never
skip.  Timings are printed (``pytest -s``) and bounded by assertions.
"""

from __future__ import annotations

import base64
import json
import queue
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from hastandby.election.cluster import ClusterKeys
from hastandby.election.coordinator import CoordinatorEvent
from hastandby.election.etcd_coordinator import EtcdCoordinator
from hastandby.election.decide import Campaign, decide
from hastandby.lifecycle.states import NodeStatus, State, next_status
from hastandby.testing import COORDINATOR_CHECKS, etcd_world
from hastandby.testing.etcd import EtcdServer

pytestmark = pytest.mark.etcd

TTL = 2  # the shortest lease etcd grants with its default election timeout
MARGIN = 0.5
SAFE_AGE = TTL - MARGIN
BACKUP = NodeStatus(State.BACKUP)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    """One etcd for the module; each test uses its own cluster name."""
    with EtcdServer() as server:
        yield server


@pytest.fixture
def own_etcd() -> Iterator[EtcdServer]:
    """An etcd a test may pause, kill and restart."""
    with EtcdServer() as server:
        yield server


@dataclass
class Node:
    """A coordinator plus the notifications it made."""

    id: str
    coordinator: EtcdCoordinator
    events: queue.Queue[CoordinatorEvent]
    keys: ClusterKeys

    def wait_for(self, event: CoordinatorEvent, timeout: float) -> float:
        """Wait for ``event``; return the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                if self.events.get(timeout=remaining) is event:
                    return time.monotonic()
            except queue.Empty:
                break
        raise AssertionError(f"{self.id}: no {event} within {timeout} s")

    def drain(self) -> None:
        while not self.events.empty():
            self.events.get_nowait()


MakeNode = Callable[..., Node]


@pytest.fixture
def make_node() -> Iterator[MakeNode]:
    """Build registered nodes in a fresh cluster; close them all afterwards."""
    cluster = f"t{uuid.uuid4().hex[:8]}"
    nodes: list[Node] = []

    def make(
        server: EtcdServer, node_id: str, status: NodeStatus = BACKUP, watch: bool = False
    ) -> Node:
        events: queue.Queue[CoordinatorEvent] = queue.Queue()
        coordinator = EtcdCoordinator(
            server.client_url,
            cluster,
            node_id,
            f"amqp://{node_id}",
            events.put,
            lease_ttl=TTL,
            lease_margin=MARGIN,
            request_timeout=0.5,
        )
        node = Node(node_id, coordinator, events, ClusterKeys(cluster))
        nodes.append(node)
        coordinator.publish_status(status)
        if watch:
            assert coordinator.watch(), "watch not established"
        return node

    yield make
    for node in nodes:
        node.coordinator.close()


def etcd_http(server: EtcdServer, path: str, **body: str) -> dict[str, object]:
    """Call etcd's JSON gateway: a second opinion independent of the etcd3 client."""
    request = urllib.request.Request(f"{server.client_url}{path}", data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=2) as response:
        return json.load(response)


def read_key(server: EtcdServer, key: str) -> dict[str, str]:
    """The key's raw record (revisions and lease as decimal strings)."""
    response = etcd_http(server, "/v3/kv/range", key=base64.b64encode(key.encode()).decode())
    kvs = response.get("kvs")
    assert isinstance(kvs, list) and len(kvs) == 1, f"{key} not found"
    return kvs[0]


def campaign(node: Node, sync: frozenset[str] | None = None) -> int | None:
    """Campaign as the election loop does: writing a sync set, on the sync key's revision as read."""
    snapshot = node.coordinator.read_snapshot()
    revision = snapshot.sync.revision if snapshot.sync is not None else 0
    return node.coordinator.campaign(sync if sync is not None else frozenset({node.id}), revision)


def race(nodes: list[Node]) -> dict[str, int | None]:
    """All nodes campaign at the same moment; node id -> term or None."""
    start = threading.Barrier(len(nodes))
    results: dict[str, int | None] = {}

    def run(node: Node) -> None:
        start.wait()
        results[node.id] = campaign(node)

    threads = [threading.Thread(target=run, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == len(nodes), "a campaign hung"
    return results


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``condition`` every 20 ms; return the monotonic time it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.mark.parametrize("check", COORDINATOR_CHECKS, ids=lambda check: check.__name__)
def test_etcd_coordinator_conforms(etcd: EtcdServer, check: Callable[..., None]) -> None:
    """The checks the fake passes, on etcd: each in a cluster of its own, each node behind a proxy it can be
    cut off by."""
    check(lambda: etcd_world(etcd.client_url))


def test_exactly_one_racing_candidate_wins_and_its_term_is_the_key_revision(
    etcd: EtcdServer, make_node: MakeNode
) -> None:
    nodes = [make_node(etcd, f"n{i}") for i in range(3)]
    terms = []
    for _ in range(5):
        results = race(nodes)
        winners = [node_id for node_id, term in results.items() if term is not None]
        assert len(winners) == 1, results
        term = results[winners[0]]
        assert term is not None
        snapshot = nodes[0].coordinator.read_snapshot()
        assert snapshot.leader is not None
        assert (snapshot.leader.node_id, snapshot.leader.term) == (winners[0], term)
        record = read_key(etcd, nodes[0].keys.leader)
        assert int(record["create_revision"]) == int(record["mod_revision"]) == term
        terms.append(term)
        assert next(n for n in nodes if n.id == winners[0]).coordinator.resign(term)
    assert terms == sorted(set(terms)), f"terms must increase: {terms}"


def test_brand_new_cluster_of_connecting_nodes_elects_exactly_one(
    etcd: EtcdServer, make_node: MakeNode
) -> None:
    connecting = NodeStatus(State.CONNECTING)
    nodes = [make_node(etcd, f"n{i}", connecting) for i in range(3)]
    snapshot = nodes[0].coordinator.read_snapshot()
    decisions = {n.id: decide(n.id, connecting, snapshot, lease_confirmed=True) for n in nodes}
    assert all(isinstance(d, Campaign) and d.new_cluster for d in decisions.values()), decisions
    results = race(nodes)
    winners = {node_id: term for node_id, term in results.items() if term is not None}
    assert len(winners) == 1, results
    [(winner, term)] = winners.items()
    decision = decisions[winner]
    assert isinstance(decision, Campaign)
    promoted = next_status(connecting, decision.won_event, term)
    assert promoted.status.state is State.PRIMARY and promoted.status.term == term


def test_crashed_leader_key_expires_within_ttl_and_a_newer_term_wins(
    etcd: EtcdServer, make_node: MakeNode
) -> None:
    crashed, successor = make_node(etcd, "crashed"), make_node(etcd, "successor", watch=True)
    old_term = campaign(crashed)
    assert old_term is not None
    successor.drain()
    stopped_at = time.monotonic()
    crashed.coordinator.close()  # keepalive stops, nothing revoked: a crash as etcd sees it
    gone_at = wait_until(
        lambda: successor.coordinator.read_snapshot().leader is None, TTL + 3, "leader key expired"
    )
    print(f"\ncrashed leader's key gone after {gone_at - stopped_at:.2f} s (TTL {TTL} s)")
    assert gone_at - stopped_at <= TTL + 1
    successor.wait_for(CoordinatorEvent.CLUSTER_CHANGED, 1)
    new_term = campaign(successor)
    assert new_term is not None and new_term > old_term


def test_graceful_stop_revokes_and_a_successor_wins_at_once(etcd: EtcdServer, make_node: MakeNode) -> None:
    leaving, successor = make_node(etcd, "leaving"), make_node(etcd, "successor", watch=True)
    old_term = campaign(leaving)
    assert old_term is not None
    successor.drain()
    stopped_at = time.monotonic()
    leaving.coordinator.revoke_lease()
    leaving.coordinator.close()
    successor.wait_for(CoordinatorEvent.CLUSTER_CHANGED, 1)
    snapshot = successor.coordinator.read_snapshot()
    assert snapshot.leader is None and snapshot.member("leaving") is None
    new_term = campaign(successor)
    won_at = time.monotonic()
    print(f"\nsuccessor won {(won_at - stopped_at) * 1000:.0f} ms after a graceful stop")
    assert new_term is not None and new_term > old_term
    assert won_at - stopped_at < 0.5


def test_only_the_handover_target_can_win(etcd: EtcdServer, make_node: MakeNode) -> None:
    primary, bystander, target = (make_node(etcd, n) for n in ("primary", "bystander", "target"))
    term = campaign(primary)
    assert term is not None
    primary.coordinator.set_handover("target", ttl=10)
    assert primary.coordinator.read_snapshot().handover_target == "target"
    assert primary.coordinator.resign(term)
    assert campaign(bystander) is None
    new_term = campaign(target)
    assert new_term is not None and new_term > term
    target.coordinator.clear_handover()
    snapshot = target.coordinator.read_snapshot()
    assert snapshot.handover_target is None and snapshot.leader is not None
    assert snapshot.leader.node_id == "target"


def test_a_forgotten_handover_expires_by_itself(etcd: EtcdServer, make_node: MakeNode) -> None:
    node = make_node(etcd, "n1")
    node.coordinator.set_handover("absent", ttl=TTL)
    assert campaign(node) is None
    wait_until(lambda: node.coordinator.read_snapshot().handover_target is None, TTL + 2, "handover expired")
    assert campaign(node) is not None


def test_stale_terms_are_recognised_and_cannot_resign_a_newer_leader(
    etcd: EtcdServer, make_node: MakeNode
) -> None:
    first, second = make_node(etcd, "first"), make_node(etcd, "second")
    old_term = campaign(first)
    assert old_term is not None
    assert first.coordinator.read_snapshot().is_current_term(old_term)
    assert first.coordinator.resign(old_term)
    new_term = campaign(second)
    assert new_term is not None
    snapshot = first.coordinator.read_snapshot()
    assert not snapshot.is_current_term(old_term)
    assert snapshot.is_current_term(new_term)
    assert not first.coordinator.resign(old_term)  # fenced: the newer key survives
    leader = second.coordinator.read_snapshot().leader
    assert leader is not None and leader.term == new_term


def test_the_sync_set_is_written_with_the_win_and_only_by_the_leader(
    etcd: EtcdServer, make_node: MakeNode
) -> None:
    """A campaign writes the sync set in its transaction, fails if the set changed since it was read,
    and only the holder of the leader key's term may rewrite it."""
    first, second = make_node(etcd, "first"), make_node(etcd, "second")
    term = campaign(first, frozenset({"first", "second"}))
    assert term is not None
    sync = first.coordinator.read_snapshot().sync
    assert sync is not None and sync.members == frozenset({"first", "second"}) and sync.leader == "first"
    assert first.coordinator.update_sync(term, frozenset({"first"}))
    assert not second.coordinator.update_sync(term + 1, frozenset({"second"}))  # not the leader's term
    assert first.coordinator.read_snapshot().sync.members == frozenset({"first"})
    assert first.coordinator.resign(term)
    assert second.coordinator.campaign(frozenset({"second"}), sync.revision) is None  # read before the update
    new_term = campaign(second)
    assert new_term is not None
    assert not first.coordinator.update_sync(term, frozenset({"first", "second"}))  # a deposed leader
    assert second.coordinator.read_snapshot().sync.members == frozenset({"second"})


@pytest.mark.parametrize("outage", ["pause", "kill"])
def test_lease_is_unconfirmed_before_it_could_expire_when_etcd_goes_away(
    own_etcd: EtcdServer, make_node: MakeNode, outage: str
) -> None:
    node = make_node(own_etcd, "primary")
    assert campaign(node) is not None
    confirmed_before = node.coordinator.last_lease_confirmation()
    wait_until(lambda: node.coordinator.last_lease_confirmation() != confirmed_before, TTL, "a keepalive")
    node.drain()
    getattr(own_etcd, outage)()
    try:
        unconfirmed_at = wait_until(
            lambda: not node.coordinator.lease_confirmed_within(node.coordinator.safe_lease_age),
            TTL + 1,
            "lease unconfirmed",
        )
        last_confirmed = node.coordinator.last_lease_confirmation()
        assert last_confirmed is not None
        notified_at = node.wait_for(CoordinatorEvent.LEASE_UNCONFIRMED, 0.5)
        age = unconfirmed_at - last_confirmed
        print(
            f"\n{outage}: unconfirmed {age:.2f} s after the last confirmed refresh was sent, "
            f"notified at {notified_at - last_confirmed:.2f} s; server expiry no sooner than {TTL} s"
        )
        assert SAFE_AGE <= age <= SAFE_AGE + 0.2
        assert notified_at - last_confirmed < TTL - 0.2
    finally:
        if outage == "pause":
            own_etcd.resume()


def test_lease_and_watch_recover_after_an_etcd_restart(own_etcd: EtcdServer, make_node: MakeNode) -> None:
    node = make_node(own_etcd, "n1", watch=True)
    own_etcd.kill()
    time.sleep(TTL + 0.5)  # longer than the TTL: etcd renews leases when it comes back
    node.drain()
    own_etcd.restart()
    node.wait_for(CoordinatorEvent.CLUSTER_CHANGED, 5)  # the watch is back
    wait_until(lambda: node.coordinator.lease_confirmed_within(SAFE_AGE), 3, "lease confirmed again")
    assert node.coordinator.read_snapshot().member("n1") is not None
    node.drain()
    node.coordinator.publish_status(NodeStatus(State.CATCHUP))
    node.wait_for(CoordinatorEvent.CLUSTER_CHANGED, 2)


def test_a_lease_revoked_behind_our_back_is_reported_and_replaced(
    etcd: EtcdServer, make_node: MakeNode
) -> None:
    node = make_node(etcd, "n1")
    etcd_http(etcd, "/v3/lease/revoke", ID=read_key(etcd, node.keys.member("n1"))["lease"])
    node.wait_for(CoordinatorEvent.LEASE_LOST, TTL)
    assert not node.coordinator.lease_confirmed_within(SAFE_AGE)
    node.coordinator.publish_status(BACKUP)
    assert node.coordinator.lease_confirmed_within(SAFE_AGE)
    assert node.coordinator.read_snapshot().member("n1") is not None
