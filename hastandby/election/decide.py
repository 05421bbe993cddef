"""One decision per cycle: what this node should do about the cluster.

After Patroni's ``ha.py`` run cycle: the node loop reads a snapshot of the
cluster from etcd, calls ``decide()``, carries out the one decision it gets
back, and goes round again (on every coordinator notification and at least
every loop period).  ``decide`` is pure, so every rule below is unit-tested
without etcd.  The decision's ``reason`` is meant for the log.

Rules, in the order they are applied:

1. A primary that cannot confirm its lease within the safe age (TTL minus a
   margin) steps down (``lost_lease``) *before* the lease can have expired on
   the server, whether or not etcd can be read.  So does a primary that does
   not hold the leader key under its own term.
2. A primary hands over (``demoted``) when the handover target is a
   ``backup``; it clears a handover that names itself.
3. A node whose member key is missing or out of date publishes it first.
4. With a leader: a non-primary follows it; a leader key in this node's own
   name that this node does not act on (left by a crashed previous run) is
   removed so the others need not wait a TTL.
5. Without a leader: while a handover target is set only the target may
   campaign; a node whose lease is not confirmed does not campaign; a
   ``backup`` campaigns only if it is in the sync set (it holds every
   acknowledged message, ``cluster.py``); a ``connecting`` node campaigns only
   if every member is ``connecting`` (a brand-new cluster, where the etcd
   transaction lets exactly one win) and no other member is in the sync set
   (one that is holds data: a primary that stepped down), and never while its
   journal was damaged and it lacks data; a ``catchup`` node never campaigns.  A campaign writes the sync set in the same transaction:
   the winner and the members that are in it and alive, for which the winner
   guards every message until they are back or dropped.
6. A primary keeps the sync set equal to what its replication wants: the
   backups it guards and that are caught up.  Removing one is how it may
   stop waiting for it, so a write is due before anything else but fencing.
"""

from __future__ import annotations

from dataclasses import dataclass

from hastandby.election.cluster import ClusterSnapshot, Leader, Store
from hastandby.lifecycle.states import Event, NodeStatus, State


@dataclass(frozen=True)
class Stay:
    """Nothing to do this cycle."""

    reason: str


@dataclass(frozen=True)
class PublishMember:
    """Write this node's member key (``Coordinator.publish_status``)."""

    reason: str


@dataclass(frozen=True)
class Campaign:
    """Try to create the leader key (``Coordinator.campaign``), writing ``sync``
    if the sync key is still at ``sync_revision``.

    On success fire ``won_event`` with the term the coordinator returned; the
    other members of ``sync`` are the backups the new primary expects.
    """

    new_cluster: bool
    reason: str
    sync: frozenset[str] = frozenset()
    sync_revision: int = 0

    @property
    def won_event(self) -> Event:
        return Event.WON_ELECTION_NEW_CLUSTER if self.new_cluster else Event.WON_ELECTION


@dataclass(frozen=True)
class FollowLeader:
    """Replicate from ``leader.url``, accepting only ``leader.term``."""

    leader: Leader
    reason: str


@dataclass(frozen=True)
class StepDown:
    """Stop being primary: fire ``event`` (its actions exclude clients first)."""

    event: Event
    reason: str


@dataclass(frozen=True)
class RemoveStaleLeaderKey:
    """Delete the leader key if it still has ``term`` (``Coordinator.resign``)."""

    term: int
    reason: str


@dataclass(frozen=True)
class ClearHandover:
    """Delete the handover key (``Coordinator.clear_handover``)."""

    reason: str


@dataclass(frozen=True)
class UpdateSync:
    """Write the sync set (``Coordinator.update_sync``) as this primary's replication wants it."""

    members: frozenset[str]
    reason: str


Decision = (Stay | PublishMember | Campaign | FollowLeader | StepDown | RemoveStaleLeaderKey | ClearHandover
            | UpdateSync)

_CLUSTER_STATES = (State.CONNECTING, State.CATCHUP, State.BACKUP, State.PRIMARY)


def decide(
    me: str,
    status: NodeStatus,
    snapshot: ClusterSnapshot | None,
    lease_confirmed: bool,
    following: Leader | None = None,
    sync_wanted: frozenset[str] | None = None,
    store: Store = Store(),
) -> Decision:
    """The one thing node ``me`` should do now.

    ``snapshot`` is None when etcd could not be read this cycle.
    ``lease_confirmed`` is ``Coordinator.lease_confirmed_within(safe age)``.
    ``following`` is the leader the node's replication currently points at.
    ``sync_wanted`` is, on a primary, the sync set its replication wants (``sync_request.py``, step 2).
    ``store`` is what the node says of its messages in its member key.
    """
    if status.state not in _CLUSTER_STATES:
        raise ValueError(f"decide() is for cluster members, not a {status.state} node")
    if status.state is State.PRIMARY:
        return _decide_as_primary(me, status, snapshot, lease_confirmed, sync_wanted, store)
    return _decide_as_non_primary(me, status, snapshot, lease_confirmed, following, store)


def _member_outdated(me: str, status: NodeStatus, snapshot: ClusterSnapshot, store: Store) -> str | None:
    published = snapshot.member(me)
    if published is None:
        return "member key missing"
    if (published.state, published.detail) != status.phase:
        return f"member key says {published.state}, node is {status.state}"
    if published.store != store:
        return "member key's store is out of date"
    return None


def _decide_as_primary(
    me: str, status: NodeStatus, snapshot: ClusterSnapshot | None, lease_confirmed: bool,
    sync_wanted: frozenset[str] | None, store: Store,
) -> Decision:
    if not lease_confirmed:
        return StepDown(Event.LOST_LEASE, "lease not confirmed within the safe age")
    if snapshot is None:
        return Stay("etcd unreadable, lease still confirmed")
    leader = snapshot.leader
    if leader is None:
        return StepDown(Event.LOST_LEASE, "leader key gone")
    if leader.node_id != me or leader.term != status.term:
        return StepDown(
            Event.LOST_LEASE, f"leader key held by {leader.node_id} term {leader.term}"
        )
    target = snapshot.handover_target
    if target == me:
        return ClearHandover("handover target is already primary")
    if target is not None:
        candidate = snapshot.member(target)
        if candidate is not None and candidate.state is State.BACKUP and snapshot.in_sync(target):
            return StepDown(Event.DEMOTED, f"handing over to {target}")
    if sync_wanted is not None and (snapshot.sync is None or snapshot.sync.members != sync_wanted):
        return UpdateSync(sync_wanted, f"sync set should be {sorted(sync_wanted)}")
    outdated = _member_outdated(me, status, snapshot, store)
    if outdated:
        return PublishMember(outdated)
    if target is not None:
        return Stay(f"handover target {target} is not a ready backup in the sync set")
    return Stay("holding the leader key")


def _decide_as_non_primary(
    me: str,
    status: NodeStatus,
    snapshot: ClusterSnapshot | None,
    lease_confirmed: bool,
    following: Leader | None,
    store: Store,
) -> Decision:
    if snapshot is None:
        return Stay("etcd unreadable")
    outdated = _member_outdated(me, status, snapshot, store)
    if outdated:
        return PublishMember(outdated)
    leader = snapshot.leader
    if leader is not None:
        if leader.node_id == me:
            return RemoveStaleLeaderKey(leader.term, "leader key in my name but I am not primary")
        if leader.term < status.term:
            return Stay(f"leader term {leader.term} older than term {status.term} seen")
        if leader == following:
            return Stay(f"following {leader.node_id}")
        return FollowLeader(leader, f"{leader.node_id} leads in term {leader.term}")
    target = snapshot.handover_target
    if target is not None and target != me:
        return Stay(f"no leader; waiting for handover to {target}")
    if not lease_confirmed:
        return Stay("no leader, but my lease is not confirmed: a win would not last")
    revision = snapshot.sync.revision if snapshot.sync is not None else 0
    if status.state is State.BACKUP:
        if not snapshot.in_sync(me):
            return Stay("no leader; I am not in the sync set, so I may lack acknowledged messages")
        expected = snapshot.live_sync_members() - {me}
        return Campaign(False, "no leader and I am a caught-up backup in the sync set",
                        frozenset({me}) | expected, revision)
    if status.state is State.CONNECTING and snapshot.every_member_connecting():
        if store.damaged:  # with or without a sync set (a fresh etcd has none): it lacks what others may hold
            return Stay("no leader; my journal was damaged and lacks data: an intact member starts the cluster "
                        "(hastandby promote --force starts it here, and loses what the damage took)")
        waiting = _waiting_for_a_store(me, snapshot)
        if waiting:
            return Stay(waiting)
        return Campaign(True, "no leader and every member is connecting: new cluster", frozenset({me}), revision)
    if status.state is State.CATCHUP:
        return Stay("no leader; still catching up, not eligible")
    return Stay("no leader; waiting for a caught-up backup to win")


def _waiting_for_a_store(me: str, snapshot: ClusterSnapshot) -> str | None:
    """Why node ``me`` may not start a cluster of connecting nodes now (None: it may).

    The sync set says who held every acknowledged message.  Its members that
    are here and hold data, and whose journal was not damaged since, start the
    cluster, any one of them.  If none is here, one that is absent may hold
    the latest store, and one whose journal was damaged holds it only in part:
    when the cluster keeps journals, everyone waits for an intact one (an
    operator may start without it, ``hastandby promote --force``); without
    journals nothing survived a restart, and any node may start.  A damaged
    node never starts a cluster while an intact copy may come back: the
    intact nodes would then drop their copies of what it lost as another
    lineage's.
    """
    sync = snapshot.sync
    if sync is None:
        return None
    present = [m for m in snapshot.members if m.node_id in sync.members]
    holders = {m.node_id for m in present if m.store.holds_data and not m.store.damaged}
    if holders:
        if me in holders:
            return None
        return f"no leader; waiting for a sync member holding data to start the cluster ({', '.join(sorted(holders))})"
    absent = sync.members - {m.node_id for m in snapshot.members}
    damaged = sorted(m.node_id for m in present if m.store.damaged)
    if (absent or damaged) and any(m.store.journal for m in snapshot.members):
        why = [f"{', '.join(sorted(absent))} may hold the latest store"] if absent else []
        why += [f"the journal of {', '.join(damaged)} was damaged and lacks data"] if damaged else []
        return (f"no leader; {'; '.join(why)}: waiting for an intact sync member "
                "(hastandby promote --force starts without it, and loses what only it holds)")
    return None
