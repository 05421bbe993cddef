"""A hot-standby cluster of real node processes on loopback ports (Qpid's HaCluster)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hastandby.client import ManagementClient, ManagementError

from . import auth
from .nodes import NodeProcess, free_port


class HaCluster:
    """N nodes started with --ha-cluster and one brokers URL; stopped by PID at the end."""

    def __init__(self, log_dir: Path, size: int = 3, extra: tuple[str, ...] = (), promote: bool = True) -> None:
        self.log_dir = Path(log_dir)
        self.ports = [free_port() for _ in range(size)]
        self.brokers_url = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        self.extra = tuple(extra)
        self.nodes: list[NodeProcess] = []
        self.retired: list[NodeProcess] = []
        for index in range(size):
            self.nodes.append(self._make(index))
        for node in self.nodes:
            node.start(wait=False)
        for node in self.nodes:
            node.wait_ready()
        if promote:
            self.promote(0)
            for index in range(1, size):
                self.wait_state(index, "backup")

    def _make(self, index: int, *args: str) -> NodeProcess:
        return NodeProcess(self.log_dir, "--ha-cluster", "--brokers-url", self.brokers_url, *self.extra, *args,
                           port=self.ports[index], name=f"ha{index}")

    def __getitem__(self, index: int) -> NodeProcess:
        return self.nodes[index]

    @property
    def url_list(self) -> list[str]:
        """Every node's URL with the ``app`` user's credentials, for failover clients."""
        return [auth.url(f"127.0.0.1:{p}") for p in self.ports]

    def status(self, index: int) -> dict[str, Any]:
        with ManagementClient(self.nodes[index].address, timeout=5) as client:
            return client.request("STATUS")

    def state(self, index: int) -> str | None:
        try:
            return self.status(index)["state"]
        except ManagementError:
            return None

    def wait_state(self, index: int, state: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.state(index)
            if seen == state:
                return
            time.sleep(0.1)
        raise AssertionError(f"node {index} is {seen}, not {state}, after {timeout}s:\n{self.nodes[index].log()}")

    def promote(self, index: int) -> dict[str, Any]:
        with ManagementClient(self.nodes[index].address, timeout=10) as client:
            result = client.request("PROMOTE")
        self.wait_state(index, "primary")
        return result

    def query(self, index: int) -> dict[str, Any]:
        with ManagementClient(self.nodes[index].address, timeout=10) as client:
            return client.request("QUERY")

    def queue(self, index: int, name: str) -> dict[str, Any] | None:
        return next((q for q in self.query(index)["queues"] if q["name"] == name), None)

    def wait_depth(self, index: int, name: str, depth: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        seen: Any = None
        while time.monotonic() < deadline:
            queue = self.queue(index, name)
            seen = queue and queue["depth"]
            if seen == depth:
                return
            time.sleep(0.1)
        raise AssertionError(f"node {index} queue {name!r} depth is {seen}, not {depth}")

    def restart(self, index: int, *args: str) -> NodeProcess:
        """Start a fresh process for a node that was killed or stopped."""
        self.retired.append(self.nodes[index])
        node = self._make(index, *args)
        self.nodes[index] = node
        node.start()
        return node

    def stop(self) -> None:
        for node in self.nodes + self.retired:
            node.stop()
