"""etcd in memory, for unit tests of the election: ``FakeCluster`` and ``FakeCoordinator``.

After Patroni's ``dcs/``: the node loop programs against ``Coordinator``
(``hastandby/election/coordinator.py``); ``EtcdCoordinator`` is the real one,
``FakeCoordinator`` a second one with the same semantics on a ``FakeCluster``
that several coordinators (nodes) share.  No I/O, no threads, no real time.
``coordinator_conformance.py`` holds both to the same checks (the unit tests
run them on this one, the integration tests on etcd): where they differ, this
one is wrong.

What is modelled, as ``EtcdCoordinator`` does it on etcd:

* keys with etcd's revisions: every write (a transaction counts as one)
  moves ``FakeCluster.revision`` on; a key keeps its create revision and
  takes the write's revision as mod revision.  The leader key's create
  revision is the term, the sync key's mod revision the sync set's revision.
  Values are encoded and decoded with ``cluster.py``'s functions, and the key
  layout is ``ClusterKeys``'.
* ``campaign``: wins only if there is no leader key, the handover key is
  absent or names this node, and the sync key is still at ``sync_revision``
  (0: absent); it writes the leader key (under this node's lease) and the sync
  set in one step and returns the new term.  ``update_sync`` only while the
  leader key has ``term``; ``resign`` only if it has ``term``; ``force_sync``
  only while there is no leader key.
* leases, on a clock the test moves with ``FakeCluster.advance``: a node's
  lease is refreshed continuously and instantly (an ideal keepalive) unless
  the test ``freeze``s the node.  A frozen node's last confirmation stays
  where it was, so ``lease_confirmed_within(safe_lease_age)`` turns false
  once the safe age has passed, and one TTL after that confirmation the
  "server" drops the lease with every key under it.  ``partition`` also makes
  every other call of that node raise ``CoordinatorUnavailable`` (cut off
  from etcd); ``heal`` undoes both.  The handover key has a lease of its own
  that is never refreshed.  ``revoke_lease`` drops the lease and its keys;
  ``close`` stops the keepalive without revoking (a crash as etcd sees it:
  the keys go a TTL later), and a closed coordinator makes way for a new one
  of the same node (a restart).
* ``notify``: ``CLUSTER_CHANGED`` to every watching, reachable coordinator
  after each write and to a watching one when ``heal``ed (its watch, back,
  may have missed changes), ``LEASE_UNCONFIRMED`` once when a frozen lease passes the
  safe age, ``LEASE_LOST`` when a node learns that its lease is gone.

What is not: latency (a refresh is confirmed when sent, and the server sees
it at once), etcd raising a short TTL, several etcd endpoints, failures of
single calls other than a whole partition, unreadable keys, and
``time.monotonic()`` (``last_lease_confirmation`` is on the fake clock, so it
keeps no broker ``Fence``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hastandby.election.cluster import (
    ClusterKeys,
    ClusterSnapshot,
    Leader,
    Member,
    Store,
    SyncSet,
    decode_handover,
    decode_leader,
    decode_member,
    decode_sync,
    encode_handover,
    encode_leader,
    encode_member,
    encode_sync,
)
from hastandby import settings
from hastandby.election.coordinator import (
    Coordinator,
    CoordinatorError,
    CoordinatorEvent,
    CoordinatorUnavailable,
    LeasedCoordinator,
    Notify,
)
from hastandby.lifecycle.states import NodeStatus


@dataclass
class _Key:
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int | None


@dataclass
class _Lease:
    id: int
    ttl: float
    refreshed_at: float  # fake time of the last refresh the server saw (= the last confirmed one)
    owner: str | None  # the node whose keepalive refreshes it; None: nobody does (the handover's)
    alive: bool = True

    @property
    def expires_at(self) -> float:
        return self.refreshed_at + self.ttl


class FakeCluster:
    """The store the nodes share: keys, leases and a clock that moves only when the test says so."""

    def __init__(self, name: str = "fake") -> None:
        self.keys = ClusterKeys(name)
        self.now = 0.0
        self.revision = 0
        self._kv: dict[str, _Key] = {}
        self._leases: dict[int, _Lease] = {}
        self._last_lease_id = 0
        self._coordinators: dict[str, FakeCoordinator] = {}
        self.frozen: set[str] = set()  # nodes whose keepalives are not confirmed
        self.unreachable: set[str] = set()  # nodes whose every call fails

    # -- what the test does -------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the clock on: unfrozen leases are refreshed, frozen ones age and expire."""
        if seconds < 0:
            raise ValueError("the clock does not go back")
        self.now += seconds
        for lease in self._leases.values():
            if lease.owner is not None and lease.owner not in self.frozen:
                lease.refreshed_at = self.now
        for coordinator in self._coordinators.values():
            coordinator._check_confirmation()
        for lease in sorted(self._leases.values(), key=lambda lease: (lease.expires_at, lease.id)):
            if lease.expires_at <= self.now:
                self._drop_lease(lease)

    def freeze(self, node_id: str) -> None:
        """``node_id``'s keepalives stop being confirmed; its other calls still reach etcd."""
        self.frozen.add(node_id)

    def partition(self, node_id: str) -> None:
        """``node_id`` is cut off from etcd: no keepalive is confirmed and every call raises."""
        self.frozen.add(node_id)
        self.unreachable.add(node_id)

    def heal(self, node_id: str) -> None:
        """``node_id`` reaches etcd again; its keepalive finds out whether its lease is still there."""
        self.frozen.discard(node_id)
        self.unreachable.discard(node_id)
        coordinator = self._coordinators.get(node_id)
        if coordinator is not None:
            coordinator._keepalive_answered()
            if coordinator.watching:  # the watch is established again: it may have missed changes
                coordinator._tell(CoordinatorEvent.CLUSTER_CHANGED)

    # -- what the test reads -------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """The cluster's keys now, as ``EtcdCoordinator.read_snapshot`` builds them."""
        keys = self.keys
        leader: Leader | None = None
        members: list[Member] = []
        handover: str | None = None
        sync: SyncSet | None = None
        for name, key in self._kv.items():
            if name == keys.leader:
                leader = decode_leader(key.value, key.create_revision)
            elif name == keys.handover:
                handover = decode_handover(key.value)
            elif name == keys.sync:
                sync = decode_sync(key.value, key.mod_revision)
            elif name.startswith(keys.members):
                members.append(decode_member(name[len(keys.members):], key.value))
        members.sort(key=lambda member: member.node_id)
        return ClusterSnapshot(self.revision, leader, tuple(members), handover, sync)

    # Methods, not properties: a type checker would narrow a property across the writes between two reads.
    def leader(self) -> Leader | None:
        return self.snapshot().leader

    def sync(self) -> SyncSet | None:
        return self.snapshot().sync

    def handover_target(self) -> str | None:
        return self.snapshot().handover_target

    def member(self, node_id: str) -> Member | None:
        return self.snapshot().member(node_id)

    # -- etcd, for FakeCoordinator ----------------------------------------------------------------

    def _attach(self, coordinator: FakeCoordinator) -> None:
        previous = self._coordinators.get(coordinator.node_id)
        if previous is not None and not previous.closed:  # a closed one: the node restarted, as etcd allows
            raise ValueError(f"node {coordinator.node_id} already has a coordinator on this cluster")
        self._coordinators[coordinator.node_id] = coordinator

    def _reach(self, node_id: str, what: str) -> None:
        if node_id in self.unreachable:
            raise CoordinatorUnavailable(f"{what}: {node_id} cannot reach the fake etcd")

    def _get(self, name: str) -> _Key | None:
        return self._kv.get(name)

    def _grant(self, ttl: float, owner: str | None) -> _Lease:
        self._last_lease_id += 1
        lease = _Lease(self._last_lease_id, ttl, self.now, owner)
        self._leases[lease.id] = lease
        return lease

    def _write(self, puts: list[tuple[str, bytes, _Lease | None]], deletes: tuple[str, ...] = ()) -> int:
        """One transaction: every put and delete at one new revision, which is returned."""
        for _, _, lease in puts:
            if lease is not None and not lease.alive:
                raise CoordinatorError(f"lease {lease.id} not found")
        self.revision += 1
        for name, value, lease in puts:
            old = self._kv.get(name)
            created = old.create_revision if old is not None else self.revision
            self._kv[name] = _Key(value, created, self.revision, lease.id if lease is not None else None)
        for name in deletes:
            self._kv.pop(name, None)
        self._changed()
        return self.revision

    def _delete(self, *names: str) -> bool:
        present = tuple(name for name in names if name in self._kv)
        if present:
            self._write([], present)
        return bool(present)

    def _drop_lease(self, lease: _Lease) -> None:
        """The lease ends (expired or revoked): it and every key under it are gone."""
        if not lease.alive:
            return
        lease.alive = False
        del self._leases[lease.id]
        self._delete(*(name for name, key in self._kv.items() if key.lease == lease.id))
        owner = self._coordinators.get(lease.owner) if lease.owner is not None else None
        if owner is not None and lease.owner not in self.frozen:
            owner._keepalive_answered()

    def _changed(self) -> None:
        for coordinator in list(self._coordinators.values()):
            if coordinator.watching and coordinator.node_id not in self.unreachable:
                coordinator._tell(CoordinatorEvent.CLUSTER_CHANGED)


class FakeCoordinator(LeasedCoordinator):
    """``Coordinator`` on a ``FakeCluster``, with ``EtcdCoordinator``'s semantics (module doc); the lease
    queries, their checks and defaults are ``LeasedCoordinator``'s, as ``EtcdCoordinator``'s are.

    ``calls`` lists the name of every method called, except the reads
    (``read_snapshot``, ``safe_lease_age``, ``lease_confirmed_within``,
    ``last_lease_confirmation``), so that a test can say e.g. that a node never
    campaigned; ``events`` what ``notify`` was told.
    """

    def __init__(
        self, cluster: FakeCluster, node_id: str, url: str, notify: Notify, *,
        lease_ttl: int = settings.LEASE_TTL.default, lease_margin: float = settings.LEASE_MARGIN.default,
    ) -> None:
        super().__init__(lease_ttl, lease_margin)
        cluster.keys.member(node_id)  # validates the id
        self.cluster = cluster
        self.node_id = node_id
        self.url = url
        self._notify = notify
        self._lease: _Lease | None = None
        self._unconfirmed_reported = False
        self.watching = False
        self.closed = False
        self.calls: list[str] = []
        self.events: list[CoordinatorEvent] = []
        cluster._attach(self)

    # -- lease ---------------------------------------------------------------

    def _lease_ttl(self) -> float:
        return self._requested_ttl

    def _confirmed_at(self) -> float | None:
        return self._lease.refreshed_at if self._lease is not None else None

    def _now(self) -> float:
        return self.cluster.now

    def revoke_lease(self) -> None:
        self.calls.append("revoke_lease")
        lease, self._lease = self._lease, None
        if lease is None:
            return
        lease.owner = None  # forgotten here, so no longer refreshed, even if the revoke does not reach etcd
        self.cluster._reach(self.node_id, "revoke lease")
        self.cluster._drop_lease(lease)

    def _ensure_lease(self) -> _Lease:
        if self._lease is None or not self._lease.alive:  # etcd: NOT_FOUND on the put, take a new one
            self._lease = self.cluster._grant(self._requested_ttl, self.node_id)
            self._unconfirmed_reported = False
        return self._lease

    def _check_confirmation(self) -> None:
        """The keepalive thread's report when the safe age passes without a confirmed refresh."""
        if self._lease is None or self._unconfirmed_reported or self.closed:
            return
        if not self.lease_confirmed_within(self.safe_lease_age):
            self._unconfirmed_reported = True
            self._tell(CoordinatorEvent.LEASE_UNCONFIRMED)

    def _keepalive_answered(self) -> None:
        """etcd answered a refresh: the lease is confirmed, or (it is gone) forgotten."""
        lease = self._lease
        if lease is None or self.closed:
            return
        if lease.alive:
            lease.refreshed_at = self.cluster.now
            self._unconfirmed_reported = False
        else:
            self._lease = None
            self._tell(CoordinatorEvent.LEASE_LOST)

    # -- membership, election, handover -------------------------------------

    def publish_status(self, status: NodeStatus, store: Store = Store()) -> None:
        self.calls.append("publish_status")
        self.cluster._reach(self.node_id, "publish status")
        lease = self._ensure_lease()
        self.cluster._write([(self.cluster.keys.member(self.node_id), encode_member(self.url, status, store), lease)])

    def read_snapshot(self) -> ClusterSnapshot:
        self.cluster._reach(self.node_id, "read snapshot")
        return self.cluster.snapshot()

    def campaign(self, sync: frozenset[str], sync_revision: int) -> int | None:
        self.calls.append("campaign")
        cluster, keys = self.cluster, self.cluster.keys
        cluster._reach(self.node_id, "campaign")
        lease = self._lease
        if lease is None:
            raise CoordinatorError("no lease: publish_status() first")
        sync_key, handover = cluster._get(keys.sync), cluster._get(keys.handover)
        if (cluster._get(keys.leader) is not None
                or (sync_key.mod_revision if sync_key is not None else 0) != sync_revision
                or (handover is not None and decode_handover(handover.value) != self.node_id)):
            return None
        return cluster._write([(keys.leader, encode_leader(self.node_id, self.url), lease),
                               (keys.sync, encode_sync(sync, self.node_id), None)])

    def update_sync(self, term: int, members: frozenset[str]) -> bool:
        self.calls.append("update_sync")
        if not self._holds_leader_key(term, "update sync set"):
            return False
        self.cluster._write([(self.cluster.keys.sync, encode_sync(members, self.node_id), None)])
        return True

    def force_sync(self) -> bool:
        self.calls.append("force_sync")
        self.cluster._reach(self.node_id, "force sync set")
        if self.cluster._get(self.cluster.keys.leader) is not None:
            return False
        self.cluster._write([(self.cluster.keys.sync, encode_sync(frozenset({self.node_id}), self.node_id), None)])
        return True

    def resign(self, term: int) -> bool:
        self.calls.append("resign")
        return self._holds_leader_key(term, "resign") and self.cluster._delete(self.cluster.keys.leader)

    def _holds_leader_key(self, term: int, what: str) -> bool:
        """Is there a leader key of ``term``?  (etcd: ``Create(leader) == term``; any node may ask.)"""
        self.cluster._reach(self.node_id, what)
        leader = self.cluster._get(self.cluster.keys.leader)
        return leader is not None and leader.create_revision == term

    def set_handover(self, target: str, ttl: int) -> None:
        self.calls.append("set_handover")
        self.cluster.keys.member(target)  # validates the id
        self.cluster._reach(self.node_id, "set handover")
        lease = self.cluster._grant(ttl, owner=None)
        self.cluster._write([(self.cluster.keys.handover, encode_handover(target), lease)])

    def clear_handover(self) -> None:
        self.calls.append("clear_handover")
        self.cluster._reach(self.node_id, "clear handover")
        self.cluster._delete(self.cluster.keys.handover)

    # -- watch ---------------------------------------------------------------

    def watch(self) -> bool:
        self.calls.append("watch")
        self.watching = True
        if self.node_id in self.cluster.unreachable:
            return False
        self._tell(CoordinatorEvent.CLUSTER_CHANGED)  # a new watch may have missed changes
        return True

    def close(self) -> None:
        self.calls.append("close")
        self.watching = False
        self.closed = True
        if self._lease is not None:  # the keepalive stops: the lease and its keys expire a TTL later
            self._lease.owner = None

    def _tell(self, event: CoordinatorEvent) -> None:
        self.events.append(event)
        self._notify(event)


# mypy checks that the fake still implements the protocol (a method added to or changed in Coordinator fails here).
_implements: type[Coordinator] = FakeCoordinator
