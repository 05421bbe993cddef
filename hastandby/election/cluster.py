"""What the cluster looks like in etcd: key layout, value format, snapshots.

Pure data, no I/O: the coordinator reads the keys and builds a
``ClusterSnapshot``; ``decide`` reasons about it; tests build snapshots by hand.

Key layout under ``/hastandby/<cluster>/``:

``leader``
    ``{"node_id": ..., "url": ...}`` attached to the leader's lease.  The key's
    etcd *create revision* is the leader's **term**: unique, increasing with
    every new leader, and unforgeable by a deposed one.
``members/<node-id>``
    ``{"url": ..., "state": ..., "detail": ...}`` attached to the member's
    lease, so a crashed node disappears after one TTL.
``handover``
    ``{"target": <node-id>}`` set by an operator promotion, attached to its
    own short lease so that a handover that cannot happen expires by itself.
``sync``
    ``{"members": [<node-id>, ...], "leader": <node-id>}``, no lease: the
    *sync set*, the nodes that hold every message acknowledged so far (Kafka's
    in-sync replicas, Patroni's ``/sync``).  Only a member may be elected.
    The primary writes it, and only while it holds the leader key: it adds a
    backup once that backup is caught up and guarded, and removes one
    *before* it acknowledges anything without it.  A campaign that wins
    rewrites it in the same transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hastandby import settings
from hastandby.lifecycle.states import Detail, NodeStatus, State

ROOT = "/hastandby"


@dataclass(frozen=True)
class ClusterKeys:
    """The etcd keys of one cluster."""

    cluster: str

    def __post_init__(self) -> None:
        settings.CLUSTER.check(self.cluster)  # a SettingError (ValueError): non-empty, without '/'

    @property
    def prefix(self) -> str:
        return f"{ROOT}/{self.cluster}/"

    @property
    def leader(self) -> str:
        return self.prefix + "leader"

    @property
    def handover(self) -> str:
        return self.prefix + "handover"

    @property
    def sync(self) -> str:
        return self.prefix + "sync"

    @property
    def members(self) -> str:
        return self.prefix + "members/"

    def member(self, node_id: str) -> str:
        if not node_id or "/" in node_id:
            raise ValueError(f"node id must be non-empty without '/': {node_id!r}")
        return self.members + node_id


@dataclass(frozen=True)
class Leader:
    """The holder of the leader key; ``term`` is the key's create revision."""

    node_id: str
    url: str
    term: int


@dataclass(frozen=True)
class Store:
    """What a node says of its messages, for a whole-cluster restart.

    ``journal``: it keeps durable messages on disk (``broker/store/journal.py``).
    ``holds_data``: it holds what it replicated or served, either because it
    has been past ``connecting`` since it started or because its journal
    brought back a store it had as a member of this cluster.
    ``damaged``: its journal was damaged and it has not recovered what the
    damage took (``journal_files.py``): whatever else it holds, it does not
    hold every acknowledged message, and must not start a restarted cluster.
    """

    journal: bool = False
    holds_data: bool = False
    damaged: bool = False


@dataclass(frozen=True)
class Member:
    """A node as it published itself."""

    node_id: str
    url: str
    state: State
    detail: Detail | None = None
    store: Store = Store()


@dataclass(frozen=True)
class SyncSet:
    """The nodes that hold every acknowledged message, as the primary ``leader`` last wrote it.

    ``revision`` is the key's mod revision, for compare-and-set.
    """

    members: frozenset[str]
    leader: str
    revision: int = 0


@dataclass(frozen=True)
class ClusterSnapshot:
    """The cluster's keys as read at one etcd ``revision``."""

    revision: int
    leader: Leader | None = None
    members: tuple[Member, ...] = ()
    handover_target: str | None = None
    sync: SyncSet | None = None

    def member(self, node_id: str) -> Member | None:
        return next((m for m in self.members if m.node_id == node_id), None)

    def in_sync(self, node_id: str) -> bool:
        """May ``node_id`` be elected?  Without a sync key (none written yet) every node may."""
        return self.sync is None or node_id in self.sync.members

    def ready_to_take_over(self, me: str) -> list[str]:
        """The other members that could take over from ``me`` now: caught-up backups of the sync set whose
        journal is not damaged, sorted."""
        return sorted(m.node_id for m in self.members if m.state is State.BACKUP and m.node_id != me
                      and self.in_sync(m.node_id) and not m.store.damaged)

    def live_sync_members(self) -> frozenset[str]:
        """Sync members whose member key says they are caught-up backups (alive, reachable by etcd)."""
        if self.sync is None:
            return frozenset()
        return frozenset(m.node_id for m in self.members
                         if m.node_id in self.sync.members and m.state is State.BACKUP)

    def is_current_term(self, term: int) -> bool:
        """True if ``term`` is the term of the leader in this snapshot.

        A replication link or a request stamped with any other term comes
        from, or is meant for, a deposed primary.
        """
        return self.leader is not None and self.leader.term == term

    def every_member_connecting(self) -> bool:
        """A brand-new cluster: members exist and none is past ``connecting``."""
        return bool(self.members) and all(m.state is State.CONNECTING for m in self.members)


def _encode(fields: dict[str, str | None]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _decode(value: bytes, what: str) -> dict[str, object]:
    try:
        fields = json.loads(value)
    except ValueError as error:
        raise ValueError(f"{what}: not JSON: {value!r}") from error
    if not isinstance(fields, dict):
        raise ValueError(f"{what}: not a JSON object: {value!r}")
    return fields


def _text(fields: dict[str, object], name: str, what: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what}: field {name!r} missing or not a string")
    return value


def encode_leader(node_id: str, url: str) -> bytes:
    return _encode({"node_id": node_id, "url": url})


def decode_leader(value: bytes, term: int) -> Leader:
    fields = _decode(value, "leader key")
    return Leader(_text(fields, "node_id", "leader key"), _text(fields, "url", "leader key"), term)


def encode_member(url: str, status: NodeStatus, store: Store = Store()) -> bytes:
    return json.dumps({"url": url, "state": status.state.value, "detail": status.detail,
                       "journal": store.journal, "holds_data": store.holds_data, "damaged": store.damaged},
                      sort_keys=True, separators=(",", ":")).encode()


def decode_member(node_id: str, value: bytes) -> Member:
    what = f"member {node_id}"
    fields = _decode(value, what)
    url, state, detail = _text(fields, "url", what), _text(fields, "state", what), fields.get("detail")
    store = Store(bool(fields.get("journal", False)), bool(fields.get("holds_data", False)),
                  bool(fields.get("damaged", False)))
    try:
        return Member(node_id, url, State(state), Detail(str(detail)) if detail else None, store)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from error


def encode_sync(members: frozenset[str], leader: str) -> bytes:
    return json.dumps({"members": sorted(members), "leader": leader}, separators=(",", ":")).encode()


def decode_sync(value: bytes, revision: int) -> SyncSet:
    fields = _decode(value, "sync key")
    members = fields.get("members")
    if not isinstance(members, list) or not all(isinstance(m, str) and m for m in members):
        raise ValueError("sync key: field 'members' missing or not a list of node ids")
    return SyncSet(frozenset(members), _text(fields, "leader", "sync key"), revision)


def encode_handover(target: str) -> bytes:
    return _encode({"target": target})


def decode_handover(value: bytes) -> str:
    return _text(_decode(value, "handover key"), "target", "handover key")
