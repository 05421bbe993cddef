"""The election loop: etcd decides who is primary, the state table decides what that means.

A thread of its own (etcd calls block, the broker's reactor must not) runs
Patroni's cycle: read a snapshot of the cluster, ``decide()``, carry out the
one decision, wait for the next coordinator notification or ``loop_wait``.
Decisions that change the node's role are handed to the reactor thread with
``call_soon_threadsafe``; etcd writes (member key, campaign, resign) stay in
this thread.

Fencing does not wait for this loop: the coordinator keeps the broker's
``Fence`` (``broker/admission/fence.py``) at the moment the lease stops being
confirmed with the margin, and the broker checks it before it takes any
producer's message and before it settles one.  A primary frozen past its
TTL (SIGSTOP) therefore takes and acknowledges nothing when it resumes, even
before the loop has seen the lost lease and stepped it down.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol, assert_never

import structlog

from hastandby.election.cluster import ClusterSnapshot, Leader, Store
from hastandby.election.coordinator import Coordinator, CoordinatorError, CoordinatorEvent
from hastandby.election.sync_request import SyncRequest
from hastandby.election.decide import (
    Campaign,
    ClearHandover,
    Decision,
    FollowLeader,
    PublishMember,
    RemoveStaleLeaderKey,
    Stay,
    StepDown,
    UpdateSync,
    decide,
)
from hastandby.lifecycle.states import Event, NodeStatus, State

if TYPE_CHECKING:
    from hastandby.broker.admission.fence import Fence
    from hastandby.election.etcd_client import EtcdSettings

log = structlog.get_logger("hastandby.election")

LOOP_WAIT = 0.5  # seconds between cycles when nothing happens


class ElectedNode(Protocol):
    """What the loop needs of the HA node (``HaNode``; read from this thread, acted on via the reactor)."""

    @property
    def node_id(self) -> str: ...

    leader: Leader | None
    sync: SyncRequest  # the --min-sync round trip (sync_request.py): read and answered from this thread

    @property
    def status(self) -> NodeStatus: ...

    @property
    def store(self) -> Store:
        """What the node says of its messages in its member key (``cluster.Store``)."""
        ...

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None: ...

    def fire(self, event: Event, term: int | None = None) -> bool: ...

    def follow(self, leader: Leader) -> None: ...


class ElectionLoop:
    """Runs the decision cycle for one node against its coordinator, on a thread of its own.

    Contract: the node makes calls on it from its reactor thread (``start``, ``wake``, ``request``,
    ``hand_over``, ``hand_over_to_a_ready_backup``, ``force_sync``, ``stop``), the coordinator's threads on
    ``notify``.  The loop's own thread makes calls on the coordinator (etcd), reads the node's ``status``,
    ``leader``, ``sync.wanted`` and ``store``, writes ``sync`` (``won``, ``written``), and calls the node back
    only on the reactor thread, through ``call_soon_threadsafe`` (role changes, etcd's word on the sync set).
    """

    def __init__(self, node: ElectedNode, coordinator: Coordinator, loop_wait: float = LOOP_WAIT) -> None:
        self.node = node
        self.coordinator = coordinator
        self.loop_wait = loop_wait
        self.snapshot: ClusterSnapshot | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pending = threading.Event()  # a role change is on its way to the reactor
        self._requests: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._again: list[Callable[[], object]] = []  # requests to try again next cycle (election thread only)
        self._thread = threading.Thread(target=self._run, name="hastandby-election", daemon=True)

    # -- called from any thread ------------------------------------------------------------

    def start(self) -> None:
        self.coordinator.watch()
        self._thread.start()

    def notify(self, event: CoordinatorEvent) -> None:
        """The coordinator's callback (its threads): run a cycle now."""
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def request(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` (an etcd write) on the election thread before the next decision."""
        self._requests.put(fn)
        self._wake.set()

    def hand_over(self, target: str, ttl: int) -> None:
        """An operator's promotion: name ``target`` the handover target for ``ttl`` seconds.

        A write etcd refuses is tried again each cycle while those seconds last: a node whose etcd
        link had just come back failed its first write on the old connection, and the operator's
        ``promote`` then waited 15 s for a handover nobody had asked for (the nemesis schedule
        frozen-primary-resumes-cut-from-etcd).
        """
        deadline = time.monotonic() + ttl

        def write() -> None:
            try:
                self.coordinator.set_handover(target, ttl=ttl)
            except CoordinatorError as error:
                if time.monotonic() >= deadline:
                    raise
                log.warning("handover not written yet; trying again next cycle", error=str(error))
                self._again.append(write)

        self.request(write)

    def hand_over_to_a_ready_backup(self, ttl: int) -> str | None:
        """A primary whose journal cannot write: name a backup that can take over (``ClusterSnapshot
        .ready_to_take_over``, as the loop last read etcd) the handover target; which one, or None."""
        snapshot = self.snapshot
        ready = snapshot.ready_to_take_over(self.node.node_id) if snapshot is not None else []
        if ready:
            self.hand_over(ready[0], ttl=ttl)
        return ready[0] if ready else None

    def force_sync(self, answer: Callable[[bool | CoordinatorError], None]) -> None:
        """``promote --force``: make the sync set this node alone while there is no leader; ``answer`` is told,
        on this loop's thread, whether it was written, or etcd's error."""

        def force() -> None:
            try:
                written = self.coordinator.force_sync()
            except CoordinatorError as error:
                answer(error)
                return
            answer(written)

        self.request(force)

    def stop(self, revoke: bool = True) -> None:
        """Graceful stop: revoke the lease so a ready backup can take over at once."""
        self._stop.set()
        self._wake.set()
        if revoke:
            try:
                self.coordinator.revoke_lease()
            except CoordinatorError as error:
                log.warning("lease revoke failed", error=str(error))
        self.coordinator.close()

    # -- the election thread ------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.loop_wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._drain_requests()
                self._cycle()
            except Exception:  # the loop must outlive any one bad cycle
                log.exception("election cycle failed")

    def _drain_requests(self) -> None:
        again, self._again = self._again, []
        for fn in again:
            self._requests.put(fn)
        while True:
            try:
                fn = self._requests.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except CoordinatorError as error:
                log.warning("etcd request failed", error=str(error))

    def _cycle(self) -> None:
        if self._pending.is_set():
            # The node's status is about to change; deciding on the old one would
            # e.g. give back a leader key just won, or campaign twice.
            return
        coordinator = self.coordinator
        try:
            snapshot: ClusterSnapshot | None = coordinator.read_snapshot()
        except CoordinatorError as error:
            log.warning("etcd unreadable", error=str(error))
            snapshot = None
        self.snapshot = snapshot
        status = self.node.status
        if status.state is State.STOPPED:
            return  # shutting down: the loop is about to stop, there is nothing left to decide
        decision = decide(
            self.node.node_id,
            status,
            snapshot,
            coordinator.lease_confirmed_within(coordinator.safe_lease_age),
            self.node.leader,
            self.node.sync.wanted,
            self.node.store,
        )
        self._act(decision, status)

    def _act(self, decision: Decision, status: NodeStatus) -> None:
        node = self.node
        coordinator = self.coordinator
        if not isinstance(decision, (PublishMember, Stay)):
            log.info("election decision", decision=type(decision).__name__, reason=decision.reason)
        match decision:
            case Stay():
                pass
            case PublishMember():
                store = node.store
                self._guarded(lambda: coordinator.publish_status(status, store))
            case Campaign():
                campaign = decision
                term = self._guarded(lambda: coordinator.campaign(campaign.sync, campaign.sync_revision))
                if term:
                    log.info("won the election", term=term, new_cluster=campaign.new_cluster,
                             sync=sorted(campaign.sync))
                    node.sync.won(campaign.sync - {node.node_id})  # sync_request.py, step 0
                    self._on_reactor(lambda: self._won(campaign.won_event, term))
            case FollowLeader(leader=leader):
                self._on_reactor(lambda: node.follow(leader))
            case StepDown(event=event):
                self._on_reactor(lambda: node.fire(event))
            case RemoveStaleLeaderKey(term=stale):
                self._guarded(lambda: coordinator.resign(stale))
            case ClearHandover():
                self._guarded(coordinator.clear_handover)
            case UpdateSync(members=members):
                if self._guarded(lambda: coordinator.update_sync(status.term, members)):  # sync_request.py, step 3
                    node.sync.written(status.term, members)
                    self._wake.set()  # the wanted set may have moved on meanwhile
            case _:
                assert_never(decision)

    def _on_reactor(self, fn: Callable[[], Any]) -> None:
        """Hand a role change to the reactor; no decision is taken until it has run."""
        self._pending.set()

        def run() -> None:
            try:
                fn()
            finally:
                self._pending.clear()
                self._wake.set()

        self.node.call_soon_threadsafe(run)

    def _won(self, event: Event, term: int) -> None:
        if not self.node.fire(event, term):
            # The table refused (e.g. we started catching up meanwhile): give the key back.
            self.request(lambda: self.coordinator.resign(term))

    @staticmethod
    def _guarded(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except CoordinatorError as error:
            log.warning("etcd request failed", error=str(error))
            return None


def etcd_election(node: ElectedNode, etcd: EtcdSettings | str, cluster: str, url: str, *, lease_ttl: int,
                  lease_margin: float, fence: Fence, on_lease: Callable[[int], None] | None) -> ElectionLoop:
    """The election loop of ``node`` (known to the others as ``url``) over etcd, not started yet."""
    from hastandby.election.etcd_coordinator import EtcdCoordinator  # gRPC and etcd3 load only for a node with --etcd

    loop: ElectionLoop | None = None

    def notify(event: CoordinatorEvent) -> None:
        if loop is not None:
            loop.notify(event)

    coordinator = EtcdCoordinator(etcd, cluster, node.node_id, url, notify, lease_ttl=lease_ttl,
                                  lease_margin=lease_margin, fence=fence, on_lease=on_lease)
    loop = ElectionLoop(node, coordinator)
    return loop
