"""DR replication on a node: management operations, refusals, status, roles.

``DisasterRecovery`` plugs the source side and the replica side into a node
through the core's hooks only:

- management ``REPLICATE`` (start, optionally creating the queue) and
  ``REPLICATE-STOP``; a ``replication`` section in ``query`` and ``status``;
- refusals that keep a replica queue a replica: no local producers (the ids
  are the source's), no consumers and no purge in full mode (it mirrors the
  source), no delete while replicating (stop first);
- roles: both sides run while the node serves clients.  On an HA cluster
  that is the primary; a new primary takes the replications over from the
  shared configuration store (etcd) and the taps it inherited.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from proton import Link, Terminus

from hastandby.broker.errors import (
    AlreadyExists,
    BrokerError,
    InvalidArgument,
    NotAllowed,
    NotFound,
)
from hastandby import settings
from hastandby.broker.management import Deferred, Request
from hastandby.node import Node

from hastandby.dr.config import ConfigStore, EtcdStore, FileStore, MemoryStore, ReplicationConfig
from hastandby.dr.protocol import ReplicaIdentity
from hastandby.dr.replica import ReplicaLink
from hastandby.dr.source import DrSource

log = structlog.get_logger("hastandby.dr")

LOAD_RETRY = 1.0  # seconds between attempts to read the configuration store


class StoreUnavailable(BrokerError):
    condition = "amqp:internal-error"
    status = 503


class DisasterRecovery:
    """Both sides of per-queue DR replication for one node."""

    def __init__(self, node: Node, store: ConfigStore, url: str,
                 heartbeat: float = settings.HEARTBEAT.default) -> None:
        self.node = node
        self.store = store
        self.url = url
        self.heartbeat = heartbeat
        self.serving = False
        self.source = DrSource(node.registry, node.driver, node.authority)
        self.replicas: dict[str, ReplicaLink] = {}
        self._pending: set[str] = set()  # replications whose configuration is being stored
        node.handler.claim_links(self._attach)
        node.management.register("REPLICATE", self._replicate)
        node.management.register("REPLICATE-STOP", self._replicate_stop)
        node.management.guards.append(self._guard)
        node.management.query_extras["replication"] = self.describe
        node.status_extras.append(lambda: {"replication": self.describe()})
        node.on_stop.append(lambda: self.set_serving(False))

    # -- roles -----------------------------------------------------------------------

    def set_serving(self, serving: bool) -> None:
        """The node starts or stops serving clients (standalone start, HA promotion or demotion)."""
        if serving == self.serving:
            return
        self.serving = serving
        if serving:
            self.source.activate()
            self._load()
        else:
            self.source.deactivate()
            for replica in self.replicas.values():
                replica.stop(final=False)
            self.replicas.clear()
            self.node.registry.read_only.clear()

    def _load(self) -> None:
        """Start every configured replication; read off the reactor thread, retried while etcd cannot be read."""
        if self.serving:
            self.node.blocking.run(self.store.load, self._loaded)

    def _loaded(self, configs: list[ReplicationConfig] | None, error: Exception | None) -> None:
        if not self.serving:
            return
        if error is not None:  # etcd unreachable: the node serves on, replication waits
            log.error("cannot read the replication configuration; retrying", error=str(error))
            self.node.schedule(LOAD_RETRY, self._load)
            return
        for config in configs or []:
            if config.queue not in self.replicas and config.queue not in self._pending:
                self._start(config)

    def _start(self, config: ReplicationConfig) -> None:
        registry = self.node.registry
        if config.queue not in registry.queues:
            # Not durable and the node restarted: the replication says the queue exists, as it was declared.
            try:
                registry.declare_queue(config.queue, config.queue_arguments or None)
            except InvalidArgument as error:
                log.error("replica queue's stored arguments refused: recreated without them", queue=config.queue,
                          error=str(error))
                registry.declare_queue(config.queue)
            log.info("replica queue recreated", queue=config.queue, source=config.source,
                     arguments=config.queue_arguments)
        me = ReplicaIdentity(self.node.node_id, self.url)
        replica = ReplicaLink(config, registry, self.node.driver, self.node.handler.fence, me, self._save_quietly,
                              self.heartbeat, self.node.peer_security)
        self.replicas[config.queue] = replica
        registry.read_only[config.queue] = (
            f"queue {config.queue!r} is a DR replica of {config.source} ({config.mode} mode): "
            "it takes messages from its source only")
        replica.start()

    # -- management ------------------------------------------------------------------

    def _replicate(self, request: Request) -> tuple[int, Any] | Deferred:
        self._require_serving()
        body = request.body
        name = request.name
        config = ReplicationConfig(
            queue=name, source=str(body.get("source") or ""), mode=str(body.get("mode") or "full"),
            sync=bool(body.get("sync", False)),
            max_backlog_count=_limit(body.get("max-backlog-count")),
            max_backlog_bytes=_limit(body.get("max-backlog-bytes")),
        )
        if _same_node(config, self.url):
            raise InvalidArgument("a queue cannot replicate from its own node")
        if name in self._pending:
            raise AlreadyExists(f"queue {name!r} is being configured already")
        existing = self.replicas.get(name)
        if existing is not None:
            old = existing.config
            if (old.source, old.mode, old.sync) == (config.source, config.mode, config.sync):
                return 200, existing.describe()
            raise AlreadyExists(f"queue {name!r} already replicates from {old.source} in {old.mode} mode: "
                                "stop that first (hastandby replicate --stop)")
        registry = self.node.registry
        if name not in registry.queues:
            if not body.get("create"):
                raise NotFound(f"no such queue: {name!r} (--create makes it)")
            registry.declare_queue(name, request.arguments(), durable=bool(body.get("durable", False)))
        config.queue_arguments = dict(registry.queues[name].settings.arguments)
        reply = Deferred()
        self._pending.add(name)

        def saved(_: Any, error: Exception | None) -> None:
            self._pending.discard(name)
            if error is not None:
                reply.fail(StoreUnavailable(f"cannot store the replication configuration: {error}"))
            elif not self.serving:
                reply.fail(NotAllowed(f"{self.url} stopped serving clients while the replication was stored"))
            else:
                self._start(config)
                log.info("replication configured", queue=name, source=config.source, mode=config.mode,
                         sync=config.sync)
                reply.resolve(201, self.replicas[name].describe())

        self.node.blocking.run(lambda: self.store.save(config), saved)
        return reply

    def _replicate_stop(self, request: Request) -> Deferred:
        self._require_serving()
        name = request.name
        if name not in self.replicas:
            raise NotFound(f"queue {name!r} is not replicating")
        reply = Deferred()

        def removed(_: Any, error: Exception | None) -> None:
            if error is not None:
                reply.fail(StoreUnavailable(f"cannot store the replication configuration: {error}"))
                return
            replica = self.replicas.pop(name, None)
            if replica is not None:
                replica.stop(final=True)
                log.info("replication stopped", queue=name, source=replica.config.source)
            self.node.registry.read_only.pop(name, None)
            reply.resolve(200, {"queue": name, "state": "stopped"})

        self.node.blocking.run(lambda: self.store.remove(name), removed)
        return reply

    def _save_quietly(self, config: ReplicationConfig) -> None:
        """An epoch change: kept if the store can (off the reactor thread); else only in memory, and said so."""
        def saved(_: Any, error: Exception | None) -> None:
            if error is not None:
                log.error("cannot store the new source epoch", queue=config.queue, error=str(error))

        self.node.blocking.run(lambda: self.store.save(config), saved)

    def _require_serving(self) -> None:
        if not self.serving:
            raise NotAllowed(f"{self.url} is not serving clients ({self.node.state}): "
                             "configure replication on the primary")

    def _guard(self, request: Request) -> None:
        """Keep replica queues replicas: no delete while replicating, no purge of a full replica."""
        replica = self.replicas.get(request.name) if request.type in ("queue", "") else None
        if replica is None:
            return
        if request.operation == "DELETE":
            raise NotAllowed(f"queue {request.name!r} is replicating from {replica.config.source}: "
                             "stop replication first (hastandby replicate --stop)")
        if request.operation == "PURGE" and replica.config.mode == "full":
            raise NotAllowed(f"queue {request.name!r} is a full replica of {replica.config.source}: "
                             "it mirrors the source, purge the source instead")

    # -- links -----------------------------------------------------------------------

    def _attach(self, link: Link) -> Any:
        endpoint = self.source.attach(link)
        if endpoint is not None:
            return endpoint
        if link.is_sender:
            replica = self.replicas.get(link.remote_source.address or "")
            if (replica is not None and replica.config.mode == "full"
                    and link.remote_source.distribution_mode != Terminus.DIST_MODE_COPY):
                raise NotAllowed(f"queue {replica.queue_name!r} is a full replica of {replica.config.source}: "
                                 "browse it; consuming would change what it mirrors")
        else:
            reason = self.node.registry.read_only.get(link.remote_target.address or "")
            if reason:
                raise NotAllowed(reason)
        return None

    # -- reporting -------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "replicas": [replica.describe() for replica in self.replicas.values()],
            "sources": self.source.describe(),
        }


def _limit(value: Any) -> int | None:
    if value in (None, "", 0):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"max-backlog must be a whole number, got {value!r}") from None


def _same_node(config: ReplicationConfig, url: str) -> bool:
    return any(address.split("://")[-1] == url for address in config.addresses())


def config_store(data_dir: Path | None, etcd: str | None, cluster: str) -> ConfigStore:
    """etcd for a cluster that has it (every member sees it), else the data dir, else memory."""
    if etcd:
        return EtcdStore(etcd, cluster)
    if data_dir is not None:
        return FileStore(data_dir)
    return MemoryStore()
