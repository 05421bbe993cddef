"""Shared fixtures: real node processes on loopback, always stopped by PID.

Authentication is on everywhere: every node started here requires it and
knows the run's users (hastandby/testing/auth.py), and management clients and
``hastandby`` CLI subprocesses authenticate as ``admin`` (``_admin_login``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

import pytest

from hastandby.testing import auth
from hastandby.testing.etcd import EtcdServer
from hastandby.testing.etcd_ha import TTL, EtcdHa
from hastandby.testing.nodes import NodeProcess, stop_together

if TYPE_CHECKING:
    from hastandby.testing.cluster import HaCluster


@pytest.fixture(scope="session", autouse=True)
def _admin_login() -> None:
    """``ManagementClient`` and ``hastandby`` subprocesses use ``admin`` (HASTANDBY_USER/PASSWORD)."""
    auth.export_admin()


@pytest.fixture
def node_factory(tmp_path) -> Iterator[Callable[..., NodeProcess]]:
    """Start nodes with extra ``serve`` arguments; every one is stopped at teardown."""
    started: list[NodeProcess] = []

    def start(*args: str, wait: bool = True, name: str = "node", port: int | None = None) -> NodeProcess:
        node = NodeProcess(tmp_path, *args, port=port, name=name)
        started.append(node)
        return node.start(wait=wait)

    yield start
    stop_together(started)


@pytest.fixture
def node(node_factory) -> NodeProcess:
    """One standalone node with default settings."""
    return node_factory()


@pytest.fixture
def cluster_factory(tmp_path) -> Iterator[Callable[..., HaCluster]]:
    """Start hot-standby clusters (node 0 promoted unless promote=False); all stopped at teardown."""
    from hastandby.testing.cluster import HaCluster

    started: list[HaCluster] = []

    def start(size: int = 3, *extra: str, promote: bool = True) -> HaCluster:
        cluster = HaCluster(tmp_path, size, extra, promote)
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server


@pytest.fixture
def ha(etcd, tmp_path) -> Iterator[Callable[[int], EtcdHa]]:
    """Start etcd clusters of real nodes; every node is stopped by PID, and its log printed, at teardown."""
    clusters: list[EtcdHa] = []

    def start(size: int = 3, data: bool = False, ttl: int = TTL, extra: tuple[str, ...] = ()) -> EtcdHa:
        cluster = EtcdHa(etcd, tmp_path, size, data, ttl, extra)
        clusters.append(cluster)
        return cluster.start()

    yield start
    for cluster in clusters:
        cluster.stop()
        for node in cluster.retired + cluster.nodes:
            print(f"===== {node.log_path.name} =====\n{node.log()}")
