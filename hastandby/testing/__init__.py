"""The harness that the tests (``tests/``) and the benchmarks (``benchmarks/``) share.

As trio ships ``trio/testing``: real processes, clients, fakes and checkers
for exercising hastandby from outside, in private-looking modules behind a
chosen public surface.  Importing it starts nothing, imports none of its
modules until a name is first used (so ``python -m hastandby.testing.X`` runs
``X`` once) and needs no pytest (the fixtures are ``tests/conftest.py``'s); it
imports neither ``tests`` nor ``benchmarks``, and the product never imports it
(``tests/unit/test_layers.py``).  Every process it starts is stopped by PID.

Use the names of ``__all__`` from here (``from hastandby.testing import
EtcdServer, wait_for, request``); the modules marked *(module)* are used as
modules (``from hastandby.testing import auth, cexamples``), and the rest of
each module is its own business.

| module | what | exported here |
|---|---|---|
| ``paths`` | the checkout, where results go (``results/``, ignored) and where the C clients are compiled (``build/cexamples/``) | ``repo``, ``results_dir`` |
| ``provenance`` | what a figure depends on besides the commit: the host and the commit, uncommitted changes | ``host_info``, ``uncommitted_changes`` |
| ``auth`` | the run's users (admin, peer, app) in a temporary users file; URLs, client environments, serve options | *(module)* |
| ``certs`` | a CA, server and client certificates made with openssl (``make_certificates`` for benchmarks) | ``Pki``, ``make_pki`` |
| ``processes`` | free ports, a child process with CPU/RSS accounting, stopped by PID; one that speaks JSON lines | ``LOOPBACK``, ``Service``, ``JsonLinesProcess``, ``free_port``, ``python_env`` |
| ``waiting`` | bounded polling: fails saying what it waited for (tests), or says true or false (harnesses) | ``wait_for``, ``wait_until`` |
| ``nodes`` | one ``hastandby serve`` on loopback, ready once it answers PING; a node's JSON log | ``NodeProcess``, ``stop_together``, ``read_node_log`` |
| ``status_poller`` | a node's STATUS polled by a thread, each change kept (roles as an operator sees them) | ``StatusPoller`` |
| ``cluster``, ``etcd_ha`` | clusters of nodes: promoted by hand, or elected by etcd | ``HaCluster``, ``EtcdHa`` |
| ``netns_cluster``, ``netns_workload`` | etcd and nodes each in a namespace of a ``netns.Network`` (signals, restarts, promote), and the numbered clients in one, their history read back (the nemesis suite, the client-cut benchmark) | *(modules)* |
| ``etcd`` | a real, throw-away etcd server or cluster (TLS, authentication, pause/kill/restart) | ``EtcdServer``, ``EtcdCluster`` |
| ``netns`` | network namespaces: a WAN pair, a LAN on a bridge with link cuts and partitions (``Lan``; ``Network`` for the nemesis) | *(module)* |
| ``delay_proxy`` | a TCP proxy delaying each direction (a WAN on loopback), cut or refusing on demand; ``python -m hastandby.testing.delay_proxy`` | ``DelayProxy`` |
| ``blackhole`` | an address whose connects hang, on loopback | ``BlackHole`` |
| ``clients`` | small blocking python-qpid-proton clients; a PLAIN ``SaslClient`` for raw connections | ``connect``, ``send``, ``receive``, ``browse`` |
| ``bodies`` | numbered durable messages whose bodies are checked byte for byte: what a disk fault must not change | *(module)* |
| ``numbered_client`` | the numbered failover producer and consumer; ``python -m hastandby.testing.numbered_client`` | *(module)* |
| ``flood_clients`` | a producer and a flood of failed logins, each a process (``python -m hastandby.testing.flood_clients``) | *(module)* |
| ``cexamples`` | the proton C example clients and broker, patched and compiled on demand | *(module)* |
| ``checker`` | Jepsen's total-queue checker and the replica comparison: pure functions over histories | ``compare_replicas``, ``ReplicaDiff`` |
| ``prometheus`` | a real, throw-away Prometheus server scraping test nodes | *(module)* |
| ``disks`` | real disk faults: bit flips in real files, ext4 on a loop device that turns read-only, a small tmpfs | *(module)* |
| ``fake_coordinator``, ``fake_elected_node`` | etcd in memory and a HA node without a broker, for driving the election loop by hand | ``FakeCluster``, ``FakeCoordinator``, ``FakeHaNode`` |
| ``coordinator_conformance`` | what every ``Coordinator`` must do, as checks that the fake and ``EtcdCoordinator`` (on a real etcd) both pass, after trio's ``check_two_way_stream`` | ``COORDINATOR_CHECKS``, ``check_coordinator``, ``CoordinatorWorld``, ``fake_world``, ``etcd_world`` |
| ``bench`` | what the benchmarks share: management requests to a node and waits on its answers, figures formatted, reports written | ``request``, ``wait_answering``, ``wait_state``, ``interrupt_on_sigterm``, ``median_or_none``, ``ratio``, ``fmt``, ``output_tail``, ``write_report`` |
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker and ruff see; at run time ``__getattr__`` imports on first use
    from hastandby.testing.waiting import wait_for, wait_until
    from hastandby.testing.processes import LOOPBACK, JsonLinesProcess, Service, free_port, python_env
    from hastandby.testing.paths import repo, results_dir
    from hastandby.testing.provenance import host_info, uncommitted_changes
    from hastandby.testing.nodes import NodeProcess, read_node_log, stop_together
    from hastandby.testing.status_poller import StatusPoller
    from hastandby.testing.cluster import HaCluster
    from hastandby.testing.etcd_ha import EtcdHa
    from hastandby.testing.etcd import EtcdCluster, EtcdServer
    from hastandby.testing.certs import Pki, make_pki
    from hastandby.testing.clients import browse, connect, receive, send
    from hastandby.testing.delay_proxy import DelayProxy
    from hastandby.testing.blackhole import BlackHole
    from hastandby.testing.checker import ReplicaDiff, compare_replicas
    from hastandby.testing.fake_coordinator import FakeCluster, FakeCoordinator
    from hastandby.testing.fake_elected_node import FakeHaNode
    from hastandby.testing.coordinator_conformance import (
        COORDINATOR_CHECKS,
        CoordinatorWorld,
        check_coordinator,
        etcd_world,
        fake_world,
    )
    from hastandby.testing.bench import (
        fmt,
        interrupt_on_sigterm,
        median_or_none,
        output_tail,
        ratio,
        request,
        wait_answering,
        wait_state,
        write_report,
    )

__all__ = [
    "BlackHole",
    "browse",
    "check_coordinator",
    "compare_replicas",
    "connect",
    "COORDINATOR_CHECKS",
    "CoordinatorWorld",
    "DelayProxy",
    "etcd_world",
    "EtcdCluster",
    "EtcdHa",
    "EtcdServer",
    "fake_world",
    "FakeCluster",
    "FakeCoordinator",
    "FakeHaNode",
    "fmt",
    "free_port",
    "HaCluster",
    "host_info",
    "interrupt_on_sigterm",
    "JsonLinesProcess",
    "LOOPBACK",
    "make_pki",
    "median_or_none",
    "NodeProcess",
    "output_tail",
    "Pki",
    "python_env",
    "ratio",
    "read_node_log",
    "receive",
    "ReplicaDiff",
    "repo",
    "request",
    "results_dir",
    "send",
    "Service",
    "StatusPoller",
    "stop_together",
    "uncommitted_changes",
    "wait_answering",
    "wait_for",
    "wait_state",
    "wait_until",
    "write_report",
]

# Each exported name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "wait_for": "waiting",
    "wait_until": "waiting",
    "LOOPBACK": "processes",
    "JsonLinesProcess": "processes",
    "Service": "processes",
    "free_port": "processes",
    "python_env": "processes",
    "repo": "paths",
    "results_dir": "paths",
    "host_info": "provenance",
    "uncommitted_changes": "provenance",
    "NodeProcess": "nodes",
    "read_node_log": "nodes",
    "stop_together": "nodes",
    "StatusPoller": "status_poller",
    "HaCluster": "cluster",
    "EtcdHa": "etcd_ha",
    "EtcdCluster": "etcd",
    "EtcdServer": "etcd",
    "Pki": "certs",
    "make_pki": "certs",
    "browse": "clients",
    "connect": "clients",
    "receive": "clients",
    "send": "clients",
    "DelayProxy": "delay_proxy",
    "BlackHole": "blackhole",
    "ReplicaDiff": "checker",
    "compare_replicas": "checker",
    "FakeCluster": "fake_coordinator",
    "FakeCoordinator": "fake_coordinator",
    "FakeHaNode": "fake_elected_node",
    "COORDINATOR_CHECKS": "coordinator_conformance",
    "CoordinatorWorld": "coordinator_conformance",
    "check_coordinator": "coordinator_conformance",
    "etcd_world": "coordinator_conformance",
    "fake_world": "coordinator_conformance",
    "fmt": "bench",
    "interrupt_on_sigterm": "bench",
    "median_or_none": "bench",
    "output_tail": "bench",
    "ratio": "bench",
    "request": "bench",
    "wait_answering": "bench",
    "wait_state": "bench",
    "write_report": "bench",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
