"""One running node: the broker core on its driver, its timers and signals.

Everything that touches proton objects runs on the driver's thread.  Other
threads (signal handlers, and later etcd's gRPC threads) hand work over with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import os
import signal
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import structlog
from proton import Condition

from hastandby import __version__
from hastandby.broker.transport.address import split_hostport
from hastandby.access import register_access_operations
from hastandby.broker.admission.authority import Authority, principal_of
from hastandby.broker.transport.blocking import BlockingCalls
from hastandby.broker.store.journal import Journal
from hastandby.broker.admission.limits import Limits
from hastandby.broker.management import Management
from hastandby.broker.admission.memory import DEFAULT_FRACTION, LOW_FRACTION, SAMPLE_INTERVAL, total_ram
from hastandby.broker.queues.registry import Registry
from hastandby.broker.hooks import NodeHooks, Refusal, StandaloneHooks
from hastandby.broker.server import BrokerHandler
from hastandby.broker.store.wiring import WiringStore
from hastandby.files import write_atomically
from hastandby.security.acl import Acl, AclError
from hastandby.security.credentials import Credentials
from hastandby.security.login_pool import LoginPool
from hastandby.security.login_throttle import LoginThrottle
from hastandby.security.logins import Logins
from hastandby.security.pipe import ClientSecurity, ServerSecurity
from hastandby.security.source_rate import SourceRate
from hastandby.security.tls import TlsSettings

log = structlog.get_logger("hastandby.node")

HOUSEKEEPING_INTERVAL = 0.25  # seconds between TTL expiry sweeps
SHUTDOWN_GRACE = 0.3  # seconds at most to flush close frames before the loop stops
SHUTDOWN_POLL = 0.01  # seconds between looks at whether every connection has closed


@dataclass
class NodeConfig:
    """What ``hastandby serve`` was asked for."""

    listen: str | None = "127.0.0.1:5672"  # None: no plain listener (TLS only)
    data_dir: Path | None = None
    replicate: str = "none"
    max_message_size: int = 64 * 1024 * 1024
    auto_create: bool = True
    heartbeat: float = 0.0
    node_id: str | None = None
    users_file: Path | None = None  # default: <data-dir>/users.json
    allow_anonymous: bool = False
    acl_file: Path | None = None
    listen_tls: str | None = None
    tls: TlsSettings = field(default_factory=TlsSettings)
    peer_user: str | None = None  # how this node authenticates to peers (its primary, a DR source)
    peer_password: str | None = None
    peer_tls: bool = False
    memory_high_watermark: int | None = None  # bytes; default DEFAULT_FRACTION of the machine's RAM
    limits: Limits = field(default_factory=Limits)
    journal_sync: str = "batch"  # with --data-dir: durable messages are journaled (journal.py)

    @property
    def users_path(self) -> Path | None:
        if self.users_file is not None:
            return self.users_file
        return self.data_dir / "users.json" if self.data_dir is not None else None

    @property
    def acl_path(self) -> Path | None:
        """The node's ACL file: ``--acl-file``, else ``<data-dir>/acl`` (where a backup keeps its primary's)."""
        if self.acl_file is not None:
            return self.acl_file
        return self.data_dir / "acl" if self.data_dir is not None else None

    @property
    def address(self) -> str:
        """The address this node is known by: its plain listener, else its TLS one."""
        return self.listen or self.listen_tls or ""

    @property
    def peer_address(self) -> str:
        """Where peers reach this node: its TLS listener when peers speak TLS."""
        return (self.listen_tls if self.peer_tls else None) or self.address


class Node:
    """A standalone broker node (HA wraps it with its own roles, through ``use_hooks``)."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.hooks: NodeHooks = StandaloneHooks()
        self.node_id = self._node_id()
        self.started = time.time()
        self.registry = Registry(config.replicate, config.auto_create, scheduler=self.schedule)
        users_path = config.users_path
        self.users = Credentials.load(users_path) if users_path is not None else Credentials()
        acl_path = config.acl_path
        if acl_path is not None and config.acl_file is None and not acl_path.exists():
            acl_path = None  # no ACL file given, none kept from a primary
        policy = Acl.load(acl_path) if acl_path is not None else None
        self.authority = Authority(self.users, policy, config.allow_anonymous)
        self.management = Management(self.registry, self.status, self.authority, config.limits)
        register_access_operations(self.management, self.authority, config.acl_path)
        self.authority.listeners.append(lambda: self.schedule(0.0, self._close_removed_users))
        self.handler = BrokerHandler(
            self.registry,
            self.management,
            max_message_size=config.max_message_size,
            idle_timeout=config.heartbeat,
            limits=config.limits,
        )
        self.handler.container_id = f"hastandby-{self.node_id}"
        self.driver = self.handler.driver
        security = ServerSecurity(self.users, config.allow_anonymous)
        limits = config.limits
        self.logins = Logins(self.users, security.decoy_key, self.schedule,
                             LoginPool(self.call_soon_threadsafe, limit=limits.login_checks),
                             LoginThrottle(limits.failed_logins_per_source, limits.failed_login_delay_ms / 1000),
                             SourceRate(limits.tls_handshakes_per_source_per_s))
        self.driver.security = security
        self.driver.logins = self.logins
        self.driver.max_handshakes = limits.handshakes
        self.driver.max_handshakes_per_source = limits.handshakes_per_source
        self.memory = self.handler.memory
        self.memory.high = config.memory_high_watermark or int(total_ram() * DEFAULT_FRACTION)
        self.memory.low = int(self.memory.high * LOW_FRACTION)
        self.management.query_extras["memory"] = self.memory.describe
        self.peer_security = ClientSecurity(config.peer_user, config.peer_password,
                                            config.tls.client_context() if config.peer_tls else None)
        self.status_extras: list[Callable[[], dict[str, Any]]] = []
        self.blocking = BlockingCalls(self.call_soon_threadsafe)  # etcd and peers, off the reactor thread
        self.on_start: list[Callable[[], None]] = []
        self.on_stop: list[Callable[[], object]] = []
        self._listeners: list[Any] = []
        self._stopping = False
        self.journal: Journal | None = None
        if config.data_dir is not None:
            store = WiringStore(self.registry, config.data_dir)
            store.load()
            self.registry.observers.append(store)
            self.journal = Journal(config.data_dir, self.node_id, self.registry, config.journal_sync,
                                   self.driver.after_events, self.call_soon_threadsafe, self.schedule)
            self.recovered = self.journal.recover()
            self.journal.start()

    def _node_id(self) -> str:
        if self.config.node_id:
            return self.config.node_id
        if self.config.data_dir is None:
            return uuidlib.uuid4().hex[:12]
        data_dir = Path(self.config.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / "node-id"
        if not path.exists():
            write_atomically(path, uuidlib.uuid4().hex[:12] + "\n")
        return path.read_text().strip()

    def use_hooks(self, hooks: NodeHooks) -> None:
        """What the layer above decides for this node (``broker/hooks.py``): given once, before it runs."""
        self.hooks = hooks
        self.handler.use_hooks(hooks)

    @property
    def state(self) -> str:
        """The node's role as STATUS shows it: ``standalone``, or what its hooks say."""
        return self.hooks.state

    # -- reactor-thread services ---------------------------------------------------

    def schedule(self, delay: float, fn: Callable[[], object]) -> Any:
        """Run ``fn`` on the driver's thread after ``delay`` seconds."""
        return self.driver.schedule(delay, fn)

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the driver's thread; callable from any thread or a signal handler."""
        self.driver.call_soon_threadsafe(fn)

    def _sample_memory(self) -> None:
        self.memory.check()
        if not self._stopping:
            self.schedule(SAMPLE_INTERVAL, self._sample_memory)

    def _housekeeping(self) -> None:
        now = time.monotonic()
        for queue in list(self.registry.queues.values()):
            if queue._expiry_heap:
                queue.expire(now)
        if not self._stopping:
            self.schedule(HOUSEKEEPING_INTERVAL, self._housekeeping)

    # -- status --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        host, port = split_hostport(self.config.address)
        scheme = "amqp" if self.config.listen else "amqps"
        status: dict[str, Any] = {
            "state": self.state,
            "node_id": self.node_id,
            "url": f"{scheme}://{host}:{port}",
            "tls": self.config.listen_tls,
            "anonymous": self.config.allow_anonymous,
            "acl": self.authority.policy.source,
            "memory": self.memory.describe(),
            "journal": self._describe_journal(),
            "version": __version__,
            "pid": os.getpid(),
            "uptime": round(time.time() - self.started, 3),
            "connections": len(self.handler.connections),
            "queues": len(self.registry.queues),
            "logins": {**self.logins.describe(), "handshakes": len(self.driver.handshakes)},
        }
        for extra in self.status_extras:
            status.update(extra())
        return status

    def _describe_journal(self) -> dict[str, Any] | None:
        journal = self.journal
        if journal is None:
            return None
        return {"sync": journal.sync, "term": journal.term, "writing": journal.full is None, "error": journal.full,
                "recovered_messages": self.recovered.messages, "clean_shutdown": self.recovered.clean,
                "torn_bytes": self.recovered.torn_bytes, "damaged": journal.damage or None,
                "found_damaged": self.recovered.damaged,
                "file_bytes": journal.file_bytes, **journal.stats}

    # -- running -------------------------------------------------------------------

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM, then close every connection and return."""
        config = self.config
        if config.listen:
            self._listeners.append(self.driver.listen(*split_hostport(config.listen)))
        if config.listen_tls:
            self._listeners.append(self.driver.listen(*split_hostport(config.listen_tls, 5671),
                                                      tls=config.tls.server_context()))
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self.call_soon_threadsafe(self.stop))
        signal.signal(signal.SIGHUP, lambda *_: self.call_soon_threadsafe(self.reload_acl))
        host, port = split_hostport(config.address)
        self.schedule(HOUSEKEEPING_INTERVAL, self._housekeeping)
        self._sample_memory()
        for fn in self.on_start:
            self.schedule(0.0, fn)
        log.info("node serving", url=f"amqp://{host}:{port}", state=self.state, node_id=self.node_id, pid=os.getpid())
        self.driver.run()
        log.info("node stopped", node_id=self.node_id)

    def stop(self) -> None:
        """Graceful stop: no new connections, close the open ones, then end the loop."""
        if self._stopping:
            return
        self._stopping = True
        log.info("node stopping", node_id=self.node_id)
        for fn in self.on_stop:
            try:
                fn()
            except Exception:  # a stop must always finish: log and go on
                log.exception("stop hook failed")
        for listener in self._listeners:
            listener.close()
        self.handler.close_all(self.hooks.shutdown_refusal())
        self._finish_once_closed(time.monotonic() + SHUTDOWN_GRACE)

    def _finish_once_closed(self, deadline: float) -> None:
        """End the loop once every connection has closed (its peer answered our close, or went), or at
        ``deadline``: a node with no client, or with clients that answer at once, stops at once."""
        if self.driver.sockets and time.monotonic() < deadline:
            self.schedule(SHUTDOWN_POLL, lambda: self._finish_once_closed(deadline))
            return
        self._finish()

    def reload_acl(self) -> None:
        """SIGHUP: read the ACL file again; a file with a mistake leaves the rules as they were."""
        path = self.config.acl_path
        if path is None or not path.exists():
            log.info("SIGHUP: no ACL file to reload")
            return
        try:
            self.authority.reload_acl(path)
        except AclError as error:
            log.error("ACL not reloaded, the rules stay as they were", reason=str(error))

    def _close_removed_users(self) -> None:
        """A user removed (here or on the primary) keeps no connection open."""
        refusal = Refusal(Condition("amqp:unauthorized-access", "user removed"))
        for connection in list(self.handler.connections):
            principal = principal_of(connection)
            if not principal.anonymous and principal.user not in self.users:
                log.info("closing the connection of a removed user", user=principal.user)
                self.handler.close_connection(connection, refusal)

    def _finish(self) -> None:
        self.blocking.close()
        if self.journal is not None:
            self.journal.close()  # what is buffered, then the clean-shutdown record
        self.driver.stop()
