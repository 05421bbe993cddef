"""A virtual IP that follows the primary, and role-change hooks, on a LAN of network namespaces (needs root).

Three nodes, each a host (network namespace) on one Linux bridge
(``hastandby/testing/netns.Lan``), run under their supervisors with
``--virtual-ip VIP/24 --virtual-ip-interface <their LAN interface>`` and an
``--on-role-change`` script that appends every call to a file; etcd runs in
the root namespace on the bridge's address, lease TTL 2 s.  A plain
python-qpid-proton producer (``hastandby.testing.numbered_client``: proton's
reconnect every 0.1 s, a 1 s idle timeout) in a fourth host knows only
``amqp://VIP:5672``.  Faults on the primary, one after the other, the
cluster whole again (three nodes, all in the sync set) before each:

- ``kill9-broker``: kill -9 of the broker process; its supervisor removes
  the address on the spot and revokes the lease;
- ``kill9-host``: kill -9 of supervisor and node, a host crash: the address
  stays on the dead host (the window docs/lifecycle.md section 14
  describes) until the node is started there again, which removes it first;
- ``stop``: SIGSTOP of the broker past the lease, then SIGCONT;
- ``cut``: the primary's link cut (its bridge port down), then restored;
- ``term``: SIGTERM (a graceful stop): the node removes the address before
  it exits, its hook hears ``stopped``, and a backup takes over at once.

Each time a backup takes over and holds the address, the producer has a
message accepted again within 4 s of the fault, and the old primary no
longer holds the address once it knows it is not the primary (a frozen one
after SIGCONT; a cut one while still cut: it steps down when its lease goes).
At the end every accepted message is in the queue, and every node's hook
was called with each role its log shows, in order, with the term.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from hastandby.testing.numbered_client import drain
from hastandby.client import ManagementClient, ManagementError
from hastandby.testing import auth
from hastandby.testing.etcd import EtcdServer
from hastandby.testing.netns import Lan

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(300)]

PORT = 5672
TTL = 2
QUEUE = "vipq"
NODES = 3
RECOVERY_LIMIT = 4.0  # s from the fault to the producer's next accepted message
RATE = 50  # producer messages per second
FAULTS = ("kill9-broker", "kill9-host", "stop", "cut", "term")

HOOK = """#!/bin/sh
echo "$(date +%s.%N) $1 $2 $3 $HASTANDBY_ROLE $HASTANDBY_NODE_ID $HASTANDBY_PREVIOUS_ROLE" >> {out}/roles-$HASTANDBY_NODE_ID
"""


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns something other than None or False; that value."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        seen = check()
        if seen is not None and seen is not False:
            return seen
        time.sleep(interval)
    raise AssertionError(f"{what}: not after {timeout} s (last seen {seen!r})")


@dataclass
class Node:
    index: int
    host: str  # the Lan host name
    address: str  # HOST:PORT
    log_path: Path
    proc: subprocess.Popen | None = None  # the supervisor

    @property
    def node_id(self) -> str:
        return f"n{self.index}"


class VipCluster:
    """Three supervised nodes on the LAN, etcd on the bridge, the virtual IP and the hook on every node."""

    def __init__(self, lan: Lan, etcd: EtcdServer, workdir: Path) -> None:
        self.lan = lan
        self.etcd = etcd
        self.workdir = workdir
        self.name = f"vip{uuid.uuid4().hex[:6]}"
        self.vip = lan.address(100)
        self.nodes = [Node(i, f"n{i}", f"{lan[f'n{i}'].address}:{PORT}", workdir / f"n{i}.log") for i in range(NODES)]
        self.brokers = ",".join(n.address for n in self.nodes)
        self.hook = workdir / "hook"
        self.hook.write_text(HOOK.format(out=workdir))
        self.hook.chmod(0o755)

    def start(self, index: int) -> None:
        node = self.nodes[index]
        host = self.lan[node.host]
        argv = ["-m", "hastandby", "serve", "--supervise", "--listen", f"0.0.0.0:{PORT}",
                "--public-url", node.address, "--brokers-url", self.brokers, "--etcd", self.etcd.client_url,
                "--cluster", self.name, "--node-id", node.node_id, "--lease-ttl", str(TTL),
                "--log-format", "json", *auth.serve_arguments(),
                "--virtual-ip", f"{self.vip}/24", "--virtual-ip-interface", host.device,
                "--on-role-change", str(self.hook), "--on-role-change-timeout", "5"]
        node.proc = self.lan.python(node.host, argv, node.log_path)

    # -- asking ---------------------------------------------------------------------------------------

    def status(self, index: int, timeout: float = 1.0) -> dict[str, Any] | None:
        try:
            with ManagementClient(self.nodes[index].address, timeout=timeout) as client:
                return client.request("STATUS")
        except ManagementError:
            return None

    def _etcd(self, key: str) -> dict[str, Any] | None:
        full = f"/hastandby/{self.name}/{key}"
        request = urllib.request.Request(f"{self.etcd.client_url}/v3/kv/range",
                                         data=json.dumps({"key": base64.b64encode(full.encode()).decode()}).encode())
        with urllib.request.urlopen(request, timeout=2) as response:
            kvs = json.load(response).get("kvs") or []
        if not kvs:
            return None
        return {**json.loads(base64.b64decode(kvs[0]["value"])), "create_revision": int(kvs[0]["create_revision"])}

    def term(self) -> int | None:
        leader = self._etcd("leader")
        return leader["create_revision"] if leader else None

    def settled(self) -> int | None:
        """The primary's index once one node is primary (active) holding the address, two are backups, and the
        sync set has all three; else None."""
        states = [self.status(i) for i in range(NODES)]
        if any(s is None for s in states):
            return None
        primaries = [i for i, s in enumerate(states) if s and s["state"] == "primary" and s["detail"] == "active"]
        backups = [i for i, s in enumerate(states) if s and s["state"] == "backup"]
        if len(primaries) != 1 or len(backups) != NODES - 1:
            return None
        sync = self._etcd("sync")
        if not sync or len(sync["members"]) != NODES:
            return None
        primary = primaries[0]
        if self.lan.holders(self.vip) != [self.nodes[primary].host]:
            return None
        return primary

    def wait_settled(self, timeout: float = 40.0) -> int:
        return wait_for(self.settled, timeout, "cluster settled with the address on the primary", interval=0.2)

    def node_pid(self, index: int) -> int:
        status = self.status(index, timeout=3)
        assert status is not None, f"n{index} does not answer"
        return int(status["pid"])

    def holds_vip(self, index: int) -> bool:
        return any(a.split("/")[0] == self.vip for a in self.lan.addresses(self.nodes[index].host))

    # -- what the nodes wrote -------------------------------------------------------------------

    def log_records(self, index: int) -> list[dict[str, Any]]:
        records = []
        for line in self.nodes[index].log_path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def hook_calls(self, index: int) -> list[list[str]]:
        path = self.workdir / f"roles-n{index}"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


class Producer:
    """``hastandby.testing.numbered_client`` in the client host, producing to ``amqp://VIP:5672`` only."""

    def __init__(self, lan: Lan, vip: str, workdir: Path) -> None:
        self.history = workdir / "producer-history.jsonl"
        self.proc = lan.python("client", ["-m", "hastandby.testing.numbered_client", "--urls", f"amqp://{vip}:{PORT}",
                                          "--queue", QUEUE, "--history", str(self.history), "--heartbeat", "1",
                                          "--reconnect-delay", "0.1", "--time-limit", "280"],
                               workdir / "producer.log", env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                              **auth.client_environment()},
                               stdin=subprocess.PIPE)
        self.command(f"producer p1 {RATE}")

    def command(self, text: str) -> None:
        assert self.proc.poll() is None, "the producer process exited"
        assert self.proc.stdin is not None
        self.proc.stdin.write((text + "\n").encode())
        self.proc.stdin.flush()

    def events(self, kind: str) -> list[dict[str, Any]]:
        found = []
        if not self.history.exists():
            return found
        for line in self.history.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("e") == kind:
                found.append(record)
        return found

    def accepted(self) -> set[int]:
        return {int(e["id"].rsplit("-", 1)[1]) for e in self.events("accepted")}

    def first_after(self, kind: str, t: float) -> float | None:
        times = [e["t"] for e in self.events(kind) if e["t"] > t]
        return min(times) if times else None

    def recovered(self, fault: float) -> tuple[float, float] | None:
        """(time of the first connection opened after ``fault``, of the first acceptance after that), once both
        are there: nothing the old primary sent before the fault can count."""
        opened = self.first_after("connected", fault)
        accepted = self.first_after("accepted", opened) if opened is not None else None
        return (opened, accepted) if opened is not None and accepted is not None else None

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.command("finish 10")
            self.proc.wait(30)


@pytest.fixture
def lan(tmp_path) -> Iterator[Lan]:
    assert os.geteuid() == 0, "network namespaces and the virtual IP need root"
    network = Lan([*(f"n{i}" for i in range(NODES)), "client"])
    try:
        yield network
    finally:
        network.close()
        for path in sorted(tmp_path.glob("*.log")):
            print(f"===== {path.name} =====\n{path.read_text(errors='replace')[-6000:]}")


def test_the_address_follows_the_primary_through_kills_a_freeze_a_cut_link_and_a_stop(lan, tmp_path):
    with EtcdServer(host=lan.controller) as etcd:
        try:
            run_faults(lan, etcd, tmp_path)
        finally:
            lan.stop_processes()  # the nodes before their etcd


def run_faults(lan: Lan, etcd: EtcdServer, tmp_path: Path) -> None:
    cluster = VipCluster(lan, etcd, tmp_path)
    for index in range(NODES):
        cluster.start(index)
    primary = cluster.wait_settled(60)
    with ManagementClient(cluster.nodes[primary].address, timeout=10) as client:
        client.request("CREATE", "queue", QUEUE, {"durable": True})
    producer = Producer(lan, cluster.vip, tmp_path)
    wait_for(lambda: len(producer.accepted()) >= 20, 20, "the producer's first messages accepted")
    results: dict[str, dict[str, Any]] = {}
    for fault in FAULTS:
        results[fault] = run_fault(cluster, producer, fault, cluster.wait_settled())
    primary = cluster.wait_settled()
    before_finish = len(producer.accepted())
    producer.finish()
    accepted = producer.accepted()
    assert len(accepted) >= before_finish
    receiver = drain([auth.url(cluster.nodes[primary].address)], QUEUE, accepted, time_limit=60)
    missing = receiver.missing(accepted)
    print(json.dumps({"faults": results, "accepted": len(accepted), "received": len(receiver.received),
                      "duplicates": receiver.duplicates, "missing": len(missing)}, indent=1))
    assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:20]}"
    for fault, result in results.items():
        assert result["recovery_s"] <= RECOVERY_LIMIT, f"{fault}: {result}"
    for index in range(NODES):
        check_hook_calls(cluster, index)


def run_fault(cluster: VipCluster, producer: Producer, fault: str, old: int) -> dict[str, Any]:
    """Fault the primary ``old``; check the address moves and the producer recovers; heal; the figures."""
    lan, node = cluster.lan, cluster.nodes[old]
    others = [i for i in range(NODES) if i != old]
    old_term = cluster.term()
    wait_for(lambda: producer.first_after("accepted", time.time() - 0.5), 10, "the producer is producing")
    pid = cluster.node_pid(old)
    result: dict[str, Any] = {"old": node.node_id}
    t0 = time.time()
    if fault == "kill9-broker":
        os.kill(pid, signal.SIGKILL)
    elif fault == "kill9-host":
        assert node.proc is not None
        os.kill(pid, signal.SIGSTOP)  # so that its supervisor cannot see it die first
        os.kill(node.proc.pid, signal.SIGKILL)  # the node follows its supervisor (PR_SET_PDEATHSIG)
        os.kill(pid, signal.SIGKILL)
        node.proc.wait(5)
    elif fault == "stop":
        os.kill(pid, signal.SIGSTOP)
    elif fault == "cut":
        lan.set_link(node.host, False)
    elif fault == "term":
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGTERM)  # the supervisor passes it on and exits with the node
    else:
        raise AssertionError(fault)

    def new_primary() -> int | None:
        for index in others:
            status = cluster.status(index, timeout=0.5)
            if status and status["state"] == "primary" and cluster.holds_vip(index):
                return index
        return None

    new = wait_for(new_primary, 15, f"{fault}: a backup primary and holding the address")
    result["new"] = cluster.nodes[new].node_id
    result["new_primary_holds_vip_s"] = round(time.time() - t0, 3)
    opened, first = wait_for(lambda: producer.recovered(t0), 15, f"{fault}: the producer accepted again")
    result["reconnected_s"] = round(opened - t0, 3)
    result["recovery_s"] = round(first - t0, 3)
    result["failed_attempts"] = sum(1 for kind in ("transport_error", "disconnected")
                                    for e in producer.events(kind) if t0 < e["t"] < opened)
    assert cluster.term() != old_term

    # The old primary gives the address up as soon as it knows it is not the primary.
    if fault == "kill9-broker":
        wait_for(lambda: not cluster.holds_vip(old), 5, "the supervisor removed the dead node's address")
        result["old_released_s"] = round(time.time() - t0, 3)
    elif fault == "kill9-host":
        assert cluster.holds_vip(old), "nothing on a crashed host can remove the address"
        assert lan.holders(cluster.vip) == [cluster.nodes[i].host for i in sorted((old, new))]
        cluster.start(old)  # the node starting again removes it first thing
        wait_for(lambda: not cluster.holds_vip(old), 15, "the restarted node removed the address")
        result["old_released_s"] = round(time.time() - t0, 3)
    elif fault == "stop":
        assert cluster.holds_vip(old), "a frozen node cannot act"
        time.sleep(0.5)
        resumed = time.time()
        os.kill(pid, signal.SIGCONT)
        wait_for(lambda: not cluster.holds_vip(old), 5, "the resumed old primary removed the address")
        result["old_released_after_sigcont_s"] = round(time.time() - resumed, 3)
    elif fault == "cut":
        # Cut off, it loses its lease (no etcd) and steps down: the address goes while still cut.
        wait_for(lambda: not cluster.holds_vip(old), 10, "the cut-off old primary removed the address")
        result["old_released_s"] = round(time.time() - t0, 3)
        lan.set_link(node.host, True)
    elif fault == "term":
        assert node.proc is not None
        assert node.proc.wait(15) == 0
        assert not cluster.holds_vip(old), "the stopped node left the address behind"
        cluster.start(old)
    assert lan.holders(cluster.vip) == [cluster.nodes[new].host]
    print(f"{fault}: {result}")
    return result


def _role(now: str) -> str:
    """A ``state change`` log record's ``now`` (``primary (active) term 5``) as a hook's role."""
    words = now.split()
    return f"{words[0]}-{words[1].strip('()')}" if words[1].startswith("(") else words[0]


def check_hook_calls(cluster: VipCluster, index: int) -> None:
    """The hook was called with every role the node's log shows, in order, with its term, nothing else."""
    expected: list[tuple[str, str]] = []
    for record in cluster.log_records(index):
        if record.get("event") == "node serving":  # each start of the node: it is connecting
            expected.append(("connecting", "?"))
        elif record.get("event") == "state change":
            now = record["now"]
            expected.append((_role(now), now.rsplit(" ", 1)[1]))
    calls = cluster.hook_calls(index)
    got = [(call[1], call[3]) for call in calls]
    assert [role for role, _ in got] == [role for role, _ in expected], f"n{index}: {got} vs {expected}"
    assert all(term == want for (_, term), (_, want) in zip(got, expected) if want != "?"), f"n{index}: {got}"
    for call in calls:
        _, role, cluster_name, term, env_role, node_id, *_ = call
        assert (cluster_name, env_role, node_id) == (cluster.name, role, f"n{index}")
        assert term.isdigit()


@pytest.mark.parametrize("drop, missing", [("-net_admin", "CAP_NET_ADMIN"), ("-net_raw", "CAP_NET_RAW")])
def test_a_node_without_the_privilege_says_which_at_start(drop, missing, tmp_path):
    """Root without a capability in its bounding set (a container, systemd's CapabilityBoundingSet=)."""
    done = subprocess.run(["setpriv", "--bounding-set", drop, *_serve(), "--ha-cluster", "--allow-anonymous",
                           "--virtual-ip", "10.78.254.100/24", "--virtual-ip-interface", "lo"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"--virtual-ip needs the privilege {missing}" in done.stderr


def test_options_are_checked_before_the_node_starts():
    def fails(*args: str) -> str:
        done = subprocess.run([*_serve(), *args], capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        return done.stderr

    assert "need --ha-cluster or --etcd" in fails("--allow-anonymous", "--virtual-ip", "10.78.254.100/24",
                                                   "--virtual-ip-interface", "lo")
    assert "go together" in fails("--ha-cluster", "--allow-anonymous", "--virtual-ip", "10.78.254.100/24")
    assert "no such interface" in fails("--ha-cluster", "--allow-anonymous", "--virtual-ip", "10.78.254.100/24",
                                        "--virtual-ip-interface", "hsnone0")
    assert "not an executable file" in fails("--ha-cluster", "--allow-anonymous", "--on-role-change",
                                             "/nonexistent/hook")


def _serve() -> list[str]:
    import sys

    return [sys.executable, "-m", "hastandby", "serve", "--listen", "127.0.0.1:0"]
