"""Clusters of real node processes on loopback ports, for integration tests.

``NodeGroup`` is what every cluster shares: nodes on free ports named in one
brokers URL, asking them for STATUS and QUERY, waiting for a state, and
stopping every process it started by PID.  ``HaCluster`` (Qpid's HaCluster)
adds a manual promotion; ``etcd_ha.EtcdHa`` elects through etcd.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hastandby.client import ManagementClient, ManagementError

from hastandby.testing import auth
from hastandby.testing.nodes import NodeProcess, free_port, stop_together


class NodeGroup:
    """``size`` node processes; a subclass says how each is started (``_make``)."""

    status_timeout = 5.0  # seconds a STATUS may take before the node counts as not answering

    def __init__(self, log_dir: Path, size: int) -> None:
        self.log_dir = Path(log_dir)
        self.ports = [free_port() for _ in range(size)]
        self.brokers_url = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        self.nodes: list[NodeProcess] = []
        self.retired: list[NodeProcess] = []  # killed processes a restart replaced: stopped too

    def _make(self, index: int, *args: str) -> NodeProcess:
        raise NotImplementedError

    def __getitem__(self, index: int) -> NodeProcess:
        return self.nodes[index]

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def url_list(self) -> list[str]:
        """Every node's URL with the ``app`` user's credentials, for failover clients."""
        return [auth.url(f"127.0.0.1:{p}") for p in self.ports]

    def _replace(self, index: int, *args: str) -> NodeProcess:
        """A fresh, not yet started process for a node that was killed (same port and log file)."""
        self.retired.append(self.nodes[index])
        node = self.nodes[index] = self._make(index, *args)
        return node

    def stop(self) -> None:
        stop_together(self.nodes + self.retired)

    # -- asking the nodes ---------------------------------------------------------------------

    def _request(self, index: int, *request: str, timeout: float = 10.0) -> Any:
        with ManagementClient(self.nodes[index].address, timeout=timeout) as client:
            return client.request(*request)

    def status(self, index: int) -> dict[str, Any] | None:
        """The node's STATUS, or None while it does not answer (killed, frozen, starting)."""
        try:
            return self._request(index, "STATUS", timeout=self.status_timeout)
        except ManagementError:
            return None

    def state(self, index: int) -> str | None:
        status = self.status(index)
        return status["state"] if status else None

    def wait_state(self, index: int, state: str, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until node ``index`` is in ``state``; its status."""
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            status = self.status(index)
            if status and status["state"] == state:
                return status
            time.sleep(0.05)
        raise AssertionError(f"node {index} is {status and status['state']}, not {state}, after {timeout} s:\n"
                             f"{self.nodes[index].log()}")

    def query(self, index: int) -> dict[str, Any]:
        return self._request(index, "QUERY")

    def queue(self, index: int, name: str) -> dict[str, Any] | None:
        return next((q for q in self.query(index)["queues"] if q["name"] == name), None)

    def depth(self, index: int, name: str) -> int | None:
        queue = self.queue(index, name)
        return queue["depth"] if queue else None

    def wait_depth(self, index: int, name: str, depth: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        seen: Any = None
        while time.monotonic() < deadline:
            seen = self.depth(index, name)
            if seen == depth:
                return
            time.sleep(0.1)
        raise AssertionError(f"node {index} queue {name!r} depth is {seen}, not {depth}")

    def create_queue(self, index: int, name: str) -> None:
        self._request(index, "CREATE", "queue", name)


class HaCluster(NodeGroup):
    """N nodes started with --ha-cluster and one brokers URL, node 0 promoted by hand."""

    def __init__(self, log_dir: Path, size: int = 3, extra: tuple[str, ...] = (), promote: bool = True) -> None:
        super().__init__(log_dir, size)
        self.extra = tuple(extra)
        self.nodes = [self._make(index) for index in range(size)]
        try:
            for node in self.nodes:
                node.start(wait=False)
            for node in self.nodes:
                node.wait_ready()
            if promote:
                self.promote(0)
                for index in range(1, size):
                    self.wait_state(index, "backup")
        except BaseException:  # the fixture never gets a cluster that failed to start: stop its nodes here
            self.stop()
            raise

    def _make(self, index: int, *args: str) -> NodeProcess:
        return NodeProcess(self.log_dir, "--ha-cluster", "--brokers-url", self.brokers_url, *self.extra, *args,
                           port=self.ports[index], name=f"ha{index}")

    def promote(self, index: int) -> dict[str, Any]:
        result = self._request(index, "PROMOTE")
        self.wait_state(index, "primary")
        return result

    def restart(self, index: int, *args: str) -> NodeProcess:
        """Start a fresh process for a node that was killed or stopped, and wait until it answers."""
        node = self._replace(index, *args)
        node.start()
        return node
