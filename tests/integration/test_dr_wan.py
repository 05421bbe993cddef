"""DR replication between two hosts over a WAN-like link.

The source node runs in one network namespace, the replica in another; the
two are joined by a veth pair, and the replication link goes through a
delaying TCP proxy (25 ms each way; this kernel has no ``netem``) on the
replica's side.  The test replicates over that link in both modes, cuts it
by taking the source's interface down while messages keep arriving, and
checks that both replicas recover with nothing lost or duplicated.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Iterator

import pytest

from hastandby.testing import auth
from hastandby.testing.netns import WanPair

PORT = 5672
PROXY_PORT = 7000

SEND = """
import sys
from proton import Message
from proton.utils import BlockingConnection
conn = BlockingConnection(sys.argv[1], timeout=10)
sender = conn.create_sender(sys.argv[2])
for i in range(int(sys.argv[4]), int(sys.argv[4]) + int(sys.argv[5])):
    sender.send(Message(body=sys.argv[3] + str(i)))
conn.close()
"""

BROWSE = """
import json, sys
from proton.reactor import Copy
from proton.utils import BlockingConnection
conn = BlockingConnection(sys.argv[1], timeout=10)
receiver = conn.create_receiver(sys.argv[2], credit=5000, options=Copy())
got = []
while True:
    try:
        got.append(receiver.receive(timeout=0.5).body)
    except Exception:
        break
    receiver.accept()
conn.close()
print(json.dumps(got))
"""

ROUND_TRIP = """
import socket, sys, time
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
start = time.monotonic()
sock.sendall(b"AMQP\\x00\\x01\\x00\\x00")
sock.recv(8)
print(round((time.monotonic() - start) * 1000, 1))
"""


@pytest.fixture
def wan(tmp_path) -> Iterator[WanPair]:
    pair = WanPair(uuid.uuid4().hex[:5])
    try:
        yield pair
    finally:
        pair.close()
        for path in sorted(tmp_path.glob("*.log")):
            print(f"===== {path.name} =====\n{path.read_text(errors='replace')[-20000:]}")


def cli(wan: WanPair, side: str, *args: str) -> str:
    result = wan.python(side, "-m", "hastandby", *args)
    assert result.returncode == 0, f"hastandby {' '.join(args)} in {side}: {result.stdout}{result.stderr}"
    return result.stdout


def wait_ready(wan: WanPair, side: str, address: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if wan.python(side, "-m", "hastandby", "ping", "-b", address, "--timeout", "2").returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"node {address} in {side} not ready")


def browse(wan: WanPair, side: str, address: str, queue: str) -> list[Any]:
    result = wan.python(side, "-c", BROWSE, auth.url(address), queue)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def wait_bodies(wan: WanPair, side: str, address: str, queue: str, expected: list[Any], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while time.monotonic() < deadline:
        seen = browse(wan, side, address, queue)
        if seen == expected:
            return
        time.sleep(0.3)
    raise AssertionError(f"{queue}: {len(seen)} messages {seen[:5]}..., expected {len(expected)}")


def replica_state(wan: WanPair, address: str, queue: str) -> dict[str, Any]:
    status = json.loads(cli(wan, "b", "status", "-b", address, "--json"))
    return next(r for r in status["replication"]["replicas"] if r["queue"] == queue)


def wait_replica_state(wan: WanPair, address: str, queue: str, state: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    report: dict[str, Any] = {}
    while time.monotonic() < deadline:
        report = replica_state(wan, address, queue)
        if report["state"] == state:
            return report
        time.sleep(0.3)
    raise AssertionError(f"replica {queue} is {report.get('state')}, not {state}: {report}")


def test_replication_over_a_delayed_link_between_namespaces(wan, tmp_path):
    source = f"{wan.ip['a']}:{PORT}"
    replica = f"{wan.ip['b']}:{PORT}"
    proxy = f"127.0.0.1:{PROXY_PORT}"
    wan.popen("a", tmp_path / "source.log", "-m", "hastandby", "serve", "--listen", source, "--log-format", "json",
              *auth.serve_arguments())
    wan.popen("b", tmp_path / "replica.log", "-m", "hastandby", "serve", "--listen", replica,
              "--log-format", "json", *auth.serve_arguments())
    wan.popen("b", tmp_path / "proxy.log", "-m", "hastandby.testing.delay_proxy", "--listen", proxy, "--target", source,
              "--delay-ms", "25")
    wait_ready(wan, "a", source)
    wait_ready(wan, "b", replica)
    # The two hosts see each other only over the veth link, and the proxy adds 25 ms each way.
    assert wan.python("b", "-m", "hastandby", "ping", "-b", f"127.0.0.1:{PORT}", "--timeout", "2").returncode != 0
    round_trip = float(wan.python("b", "-c", ROUND_TRIP, "127.0.0.1", str(PROXY_PORT)).stdout)
    assert round_trip >= 50, round_trip

    for queue, mode in (("qf", "full"), ("qe", "enqueue")):
        cli(wan, "a", "add", "queue", queue, "-b", source)
        cli(wan, "b", "replicate", "-b", replica, proxy, queue, "--create", "--mode", mode)
        wait_replica_state(wan, replica, queue, "live")
        wan.python("a", "-c", SEND, auth.url(source), queue, queue, "0", "200")
    wait_bodies(wan, "b", replica, "qf", [f"qf{i}" for i in range(200)])
    wait_bodies(wan, "b", replica, "qe", [f"qe{i}" for i in range(200)])

    # Cut the WAN; the source keeps taking messages (and consumers keep taking some).
    wan.set_link(False)
    for queue in ("qf", "qe"):
        assert wan.python("a", "-c", SEND, auth.url(source), queue, queue, "200", "300").returncode == 0
    cli(wan, "a", "purge", "qf", "-b", source)  # full mode must mirror this
    for queue in ("qf", "qe"):  # each replication has its own connection, which notices the cut on its own
        wait_replica_state(wan, replica, queue, "connecting")
    assert browse(wan, "b", replica, "qe") == [f"qe{i}" for i in range(200)]

    wan.set_link(True)
    wait_bodies(wan, "b", replica, "qf", [])
    wait_bodies(wan, "b", replica, "qe", [f"qe{i}" for i in range(500)])
    report = wait_replica_state(wan, replica, "qe", "live")
    assert report["connected_to"] == proxy
    assert (tmp_path / "replica.log").read_text().count("replication source lost") >= 2
