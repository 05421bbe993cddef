"""What a replica node is configured to replicate, and where that is kept.

Replication is configured state: it must survive a restart of the replica
node and, when the replica is an HA cluster's primary, its failover.  A
standalone node keeps it in ``<data-dir>/replication.json`` (written
atomically on every change); an etcd-coordinated cluster keeps it in etcd
under ``/hastandby/<cluster>/replication/<queue>``, where whichever node
becomes primary finds it.  Without either it lives in memory only, and the
node says so in its log.

Besides what the operator asked for, a configuration carries what resuming
needs: the source epoch last seen, the source queue's lineage last adopted
(``broker/queues/lineage.py``, in its wire form), in enqueue mode the id
``base`` that maps the source's ids onto the replica's (see ``replica``), and
the arguments the local queue was declared with, so a replica queue the node
has to declare again (not durable, after a restart) keeps its priorities,
delivery limit and single active consumer (docs/queues.md).
"""

from __future__ import annotations

import json
import uuid as uuidlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog

from hastandby.broker.errors import InvalidArgument
from hastandby.files import write_atomically
from hastandby.broker.transport.address import split_hostport

from hastandby.dr.protocol import MODES

if TYPE_CHECKING:
    from hastandby.election.etcd_client import EtcdSettings

log = structlog.get_logger("hastandby.dr")


@dataclass
class ReplicationConfig:
    """One replicated queue on the replica side."""

    queue: str
    source: str  # HOST:PORT, or a comma-separated list of an HA cluster's nodes
    mode: str = "full"
    sync: bool = False
    max_backlog_count: int | None = None
    max_backlog_bytes: int | None = None
    key: str = field(default_factory=lambda: uuidlib.uuid4().hex[:12])
    epoch: str = ""
    lineage: list[list[object]] = field(default_factory=list)
    base: int = 0
    queue_arguments: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.queue:
            raise InvalidArgument("replication needs a queue name")
        if self.mode not in MODES:
            raise InvalidArgument(f"invalid replication mode {self.mode!r}: must be one of {', '.join(MODES)}")
        if not self.addresses():
            raise InvalidArgument("replication needs a source node (HOST:PORT[,HOST:PORT...])")
        for address in self.addresses():
            try:
                split_hostport(address)
            except ValueError:
                raise InvalidArgument(f"invalid source address {address!r}: HOST:PORT[,HOST:PORT...]") from None
        for limit in (self.max_backlog_count, self.max_backlog_bytes):
            if limit is not None and (not isinstance(limit, int) or limit <= 0):
                raise InvalidArgument(f"max-backlog must be a positive whole number, got {limit!r}")
        if self.mode == "full" and (self.max_backlog_count or self.max_backlog_bytes):
            raise InvalidArgument("max-backlog applies to enqueue mode only: a full replica converges to "
                                  "the source queue, whose own limits bound it")

    def addresses(self) -> list[str]:
        return [part.strip() for part in self.source.split(",") if part.strip()]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "ReplicationConfig":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, raw: object) -> "ReplicationConfig":
        """From stored fields; fields this version does not know are ignored."""
        if not isinstance(raw, dict):
            raise ValueError("a replication config must be a JSON object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


class ConfigStore(Protocol):
    """Where replication configs live (one per queue)."""

    def load(self) -> list[ReplicationConfig]: ...

    def save(self, config: ReplicationConfig) -> None: ...

    def remove(self, queue: str) -> None: ...


class MemoryStore:
    """No data dir, no etcd: configs last as long as the process."""

    def __init__(self) -> None:
        self._configs: dict[str, ReplicationConfig] = {}

    def load(self) -> list[ReplicationConfig]:
        return list(self._configs.values())

    def save(self, config: ReplicationConfig) -> None:
        if config.queue not in self._configs:
            log.warning("replication configuration is kept in memory only (no --data-dir, no --etcd): "
                        "a restart forgets it", queue=config.queue)
        self._configs[config.queue] = config

    def remove(self, queue: str) -> None:
        self._configs.pop(queue, None)


class FileStore:
    """``<data-dir>/replication.json``: every config, rewritten atomically on each change."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "replication.json"
        self._configs = {c.queue: c for c in self._read()}

    def _read(self) -> list[ReplicationConfig]:
        if not self.path.exists():
            return []
        try:
            return [ReplicationConfig.from_dict(item) for item in json.loads(self.path.read_text())]
        except (OSError, ValueError, TypeError, InvalidArgument) as error:
            raise SystemExit(f"cannot read {self.path}: {error}") from None

    def load(self) -> list[ReplicationConfig]:
        return list(self._configs.values())

    def save(self, config: ReplicationConfig) -> None:
        self._configs[config.queue] = config
        self._write()

    def remove(self, queue: str) -> None:
        if self._configs.pop(queue, None) is not None:
            self._write()

    def _write(self) -> None:
        write_atomically(self.path, json.dumps([asdict(c) for c in self._configs.values()], indent=1, sort_keys=True))


class EtcdStore:
    """``/hastandby/<cluster>/replication/<queue>`` in etcd, shared by every member.

    ``etcd`` is the node's ``EtcdSettings`` (the coordinator's endpoints, TLS
    and user), or plain endpoints.  Each call blocks the caller for at most
    ``timeout`` seconds, all endpoints tried included; calls happen on a
    management request or an epoch change, never per message.  Failures
    raise ``EtcdError``.
    """

    def __init__(self, etcd: EtcdSettings | str, cluster: str, timeout: float = 2.0) -> None:
        # Imported here: etcd_client sets up protobuf before etcd3 loads, only when etcd is used.
        from hastandby.election.cluster import ClusterKeys
        from hastandby.election.etcd_client import EtcdClient

        self.prefix = ClusterKeys(cluster).prefix + "replication/"
        self._client = EtcdClient(etcd, timeout)

    def load(self) -> list[ReplicationConfig]:
        configs = []
        for kv in self._client.range_prefix(self.prefix, what="read replication configuration").kvs:
            try:
                configs.append(ReplicationConfig.from_json(kv.value))
            except (ValueError, TypeError, InvalidArgument) as error:
                log.warning("ignoring unreadable replication config", key=kv.key.decode(), error=str(error))
        return configs

    def save(self, config: ReplicationConfig) -> None:
        self._client.put(self.prefix + config.queue, config.to_json(), what="store replication configuration")

    def remove(self, queue: str) -> None:
        self._client.delete(self.prefix + queue, what="remove replication configuration")

    def close(self) -> None:
        self._client.close()
