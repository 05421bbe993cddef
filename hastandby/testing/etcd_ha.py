"""A cluster of real nodes elected by a real etcd (``etcd.py``), for integration tests.

Every node is a ``python -m hastandby serve --etcd URL --cluster NAME
--node-id ID --lease-ttl 2 --brokers-url ...`` process; ``stop()`` stops
each by PID, SIGSTOPped and retired ones included.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from hastandby import settings
from hastandby.testing.cluster import NodeGroup
from hastandby.testing.etcd import EtcdServer
from hastandby.testing.nodes import NodeProcess

TTL = settings.MIN_LEASE_TTL  # --lease-ttl: the shortest lease etcd grants with its default election timeout
POLL = 0.02  # seconds between status polls while timing a failover


class EtcdHa(NodeGroup):
    """``size`` nodes of one etcd cluster (``--node-id n0 ... nN``), started by ``start()``."""

    status_timeout = 2.0  # a frozen node must not hold up the polls that time a failover

    def __init__(self, etcd: EtcdServer, log_dir: Path, size: int, data: bool = False, ttl: int = TTL,
                 extra: tuple[str, ...] = ()) -> None:
        super().__init__(log_dir, size)
        self.etcd = etcd
        self.data = data  # each node keeps a --data-dir (journal) under log_dir
        self.ttl = ttl
        self.extra = extra  # more serve options for every node
        self.name = f"t{uuid.uuid4().hex[:8]}"
        self.ids = [f"n{i}" for i in range(size)]
        self.nodes = [self._make(i) for i in range(size)]

    def _make(self, index: int, *args: str) -> NodeProcess:
        data = ("--data-dir", str(self.data_dir(index))) if self.data else ()
        return NodeProcess(self.log_dir, "--etcd", self.etcd.client_url, "--cluster", self.name,
                           "--node-id", self.ids[index], "--lease-ttl", str(self.ttl),
                           "--brokers-url", self.brokers_url, *data, *self.extra, *args,
                           port=self.ports[index], name=self.ids[index])

    def data_dir(self, index: int) -> Path:
        return self.log_dir / f"{self.name}-{self.ids[index]}-data"

    def start(self) -> "EtcdHa":
        for node in self.nodes:
            node.start(wait=False)
        for node in self.nodes:
            node.wait_ready()
        return self

    def restart(self, index: int) -> NodeProcess:
        """A fresh process for a node that was killed (same id, port and log file); not waited for."""
        node = self._replace(index)
        node.start(wait=False)
        return node

    # -- asking the nodes ---------------------------------------------------------------------

    def wait_following(self, index: int, primary: int, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until node ``index`` is a backup replicating from node ``primary``; its status."""
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            status = self.status(index)
            if status and status["state"] == "backup" and status["primary"] == self.nodes[primary].address:
                return status
            time.sleep(0.05)
        raise AssertionError(f"{self.ids[index]} does not follow {self.ids[primary]} after {timeout} s: {status}")

    def wait_settled(self, among: list[int] | None = None, timeout: float = 20.0) -> int:
        """Wait until exactly one of ``among`` is primary and the others are backups; its index."""
        among = list(range(len(self))) if among is None else among
        deadline = time.monotonic() + timeout
        states: list[str | None] = []
        while time.monotonic() < deadline:
            states = [self.state(i) for i in among]
            if states.count("primary") == 1 and states.count("backup") == len(among) - 1:
                return among[states.index("primary")]
            time.sleep(0.1)
        raise AssertionError(f"cluster did not settle in {timeout} s: {dict(zip(among, states))}")

    def wait_replicating(self, timeout: float = 20.0) -> int:
        """Wait until one node is primary and every other follows it as a backup; the primary's index."""
        primary = self.wait_settled(timeout=timeout)
        for index in range(len(self)):
            if index != primary:
                self.wait_following(index, primary, timeout=timeout)
        return primary

    def wait_new_primary(self, among: list[int], timeout: float) -> tuple[int, float]:
        """Poll ``among`` until one is primary: (its index, monotonic time it was first seen)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for index in among:
                if self.state(index) == "primary":
                    return index, time.monotonic()
            time.sleep(POLL)
        raise AssertionError(f"none of {[self.ids[i] for i in among]} became primary in {timeout} s: "
                             f"{[self.state(i) for i in among]}")

    def leader(self) -> tuple[str, int] | None:
        """etcd's leader key as (node id, term), read through etcd's JSON gateway."""
        key = f"/hastandby/{self.name}/leader"
        request = urllib.request.Request(
            f"{self.etcd.client_url}/v3/kv/range",
            data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode())
        with urllib.request.urlopen(request, timeout=2) as response:
            kvs = json.load(response).get("kvs") or []
        if not kvs:
            return None
        value = json.loads(base64.b64decode(kvs[0]["value"]))
        return value["node_id"], int(kvs[0]["create_revision"])

    def events(self, index: int, event: str) -> list[dict[str, Any]]:
        """The node's JSON log records named ``event`` (all runs of this node id)."""
        records = []
        try:
            text = self.nodes[index].log_path.read_text(errors="replace")
        except OSError:
            return []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == event:
                records.append(record)
        return records
