"""Per-queue DR replication between real nodes (``hastandby replicate``).

Qpid's test_standalone_queue_replica and test_standalone_queue_replica_failover
(the Qpid C++ HA test suite, ha_tests.py, its DR-like cases), then our own: both modes side
by side, link cuts mid-stream, a replica restart, source consumers racing an
enqueue-mode link, backlog overflow, and what a replica refuses.  Links are
cut with a TCP proxy (hastandby/testing/delay_proxy.py) between replica and source.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from proton import Message
from proton.utils import LinkDetached

from hastandby.testing.delay_proxy import DelayProxy
from hastandby.client import ManagementClient, ManagementError
from hastandby.testing.clients import browse, connect, receive, send
from hastandby.testing.nodes import REPO
from hastandby.testing.waiting import wait_for


def hastandby(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "hastandby", *args], cwd=REPO, capture_output=True,
                            text=True, timeout=30)
    if ok:
        assert result.returncode == 0, f"hastandby {' '.join(args)}: {result.stdout}{result.stderr}"
    return result


def bodies(address: str, queue: str, limit: int = 10_000) -> list[Any]:
    return [m.body for m in browse(address, queue, limit, timeout=0.5)]


def wait_bodies(address: str, queue: str, expected: list[Any], timeout: float = 20.0) -> None:
    seen: list[Any] = []

    def same() -> bool:
        seen[:] = bodies(address, queue, len(expected) + 5)
        return seen == expected

    try:
        wait_for(same, timeout, f"{queue} on {address} to hold {len(expected)} messages")
    except AssertionError:
        raise AssertionError(f"{queue} on {address}: {seen[:20]}... ({len(seen)}), "
                             f"expected {expected[:20]}... ({len(expected)})") from None


def replication(address: str, side: str, queue: str) -> dict[str, Any] | None:
    with ManagementClient(address, timeout=5) as client:
        status = client.request("STATUS")
    return next((r for r in status["replication"][side] if r["queue"] == queue), None)


def wait_state(address: str, side: str, queue: str, state: str, timeout: float = 20.0) -> dict[str, Any]:
    return wait_for(lambda: (r := replication(address, side, queue)) and r["state"] == state and r,
                    timeout, f"{side} {queue} on {address} to be {state}")


def numbered(prefix: str, count: int, start: int = 0) -> list[Message]:
    return [Message(body=f"{prefix}{i}") for i in range(start, start + count)]


# -- Qpid's scenarios ------------------------------------------------------------------------


def test_standalone_queue_replica(node_factory):
    """Two standalone nodes; messages sent before ``replicate`` reach the full replica too."""
    source, replica = node_factory(name="source"), node_factory(name="replica")
    hastandby("add", "queue", "q", "-b", source.address)
    send(source.address, "q", numbered("", 3))
    hastandby("replicate", "-b", replica.address, source.address, "q", "--create")
    wait_bodies(replica.address, "q", ["0", "1", "2"])
    send(source.address, "q", numbered("", 3, start=3))
    wait_bodies(replica.address, "q", [str(i) for i in range(6)])
    assert [m.body for m in receive(source.address, "q", 1)] == ["0"]
    wait_bodies(replica.address, "q", [str(i) for i in range(1, 6)])
    # q2 with add queue --start-replica
    hastandby("add", "queue", "q2", "-b", source.address)
    hastandby("add", "queue", "q2", "-b", replica.address, "--start-replica", source.address)
    send(source.address, "q2", [Message(body="x")])
    wait_bodies(replica.address, "q2", ["x"])


def test_standalone_queue_replica_failover(cluster_factory, node_factory):
    """A two-node HA cluster is the source; the standalone replica follows its primary."""
    cluster = cluster_factory(2)
    replica = node_factory(name="replica")
    hastandby("add", "queue", "q", "-b", cluster[0].address)
    hastandby("replicate", "-b", replica.address, cluster.brokers_url, "q", "--create")
    assert send(cluster[0].address, "q", [Message(body="a")])[0] is not None
    wait_bodies(replica.address, "q", ["a"])
    # Bounce node 0: node 1 becomes primary.
    cluster.wait_state(1, "backup")
    cluster[0].kill()
    cluster.promote(1)
    cluster.restart(0)
    cluster.wait_state(0, "backup")
    wait_state(replica.address, "replicas", "q", "live")
    wait_bodies(replica.address, "q", ["a"])
    send(cluster[1].address, "q", [Message(body="b")])
    wait_bodies(replica.address, "q", ["a", "b"])
    # Bounce node 1: node 0 is primary again; consuming "a" there reaches the replica.
    cluster[1].kill()
    cluster.promote(0)
    assert [m.body for m in receive(cluster[0].address, "q", 1)] == ["a"]
    wait_bodies(replica.address, "q", ["b"])


def test_standalone_queue_replica_failover_enqueue_mode(cluster_factory, node_factory):
    """The same with an enqueue-mode replica: the source cluster's backups hold the tap, so
    what the replica has not acknowledged survives the source's failover, exactly once."""
    cluster = cluster_factory(2)
    replica = node_factory(name="replica")
    hastandby("add", "queue", "q", "-b", cluster[0].address)
    hastandby("replicate", "-b", replica.address, cluster.brokers_url, "q", "--create", "--mode", "enqueue")
    send(cluster[0].address, "q", numbered("a", 50))
    wait_bodies(replica.address, "q", [f"a{i}" for i in range(50)])
    assert len(receive(cluster[0].address, "q", 50)) == 50  # consumed at the source: the replica keeps them
    cluster.wait_state(1, "backup")
    cluster[0].kill()
    cluster.promote(1)
    send(cluster[1].address, "q", numbered("b", 50))
    assert len(receive(cluster[1].address, "q", 50)) == 50
    wait_bodies(replica.address, "q", [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(50)])
    assert wait_state(replica.address, "replicas", "q", "live")["duplicates_dropped"] >= 0


# -- ours ----------------------------------------------------------------------------------------


def test_sync_holds_producers_until_the_replica_has_the_message(node_factory):
    """--sync: a producer's accept waits for the replica (here 0.2 s away each way); async does not.

    Only the transfer is timed, on connections opened before: a loaded machine's connection set-up
    (0.1-0.4 s) blurred the difference when it was timed too."""
    source, replica = node_factory(name="source"), node_factory(name="replica")
    host, port = source.address.split(":")
    proxy = DelayProxy((host, int(port)), 0.2).start()
    try:
        for queue, extra in (("qs", ["--sync"]), ("qa", [])):
            hastandby("add", "queue", queue, "-b", source.address)
            hastandby("replicate", "-b", replica.address, proxy.address, queue, "--create", *extra)
            wait_state(replica.address, "replicas", queue, "live")
        timings = {}
        for queue in ("qs", "qa"):
            connection = connect(source.address)
            try:
                sender = connection.create_sender(queue)
                started = time.monotonic()
                sender.send(Message(body=queue))
                timings[queue] = time.monotonic() - started
            finally:
                connection.close()
        assert timings["qs"] >= 0.4 and timings["qa"] < 0.3, timings
        assert bodies(replica.address, "qs") == ["qs"]  # it was there when the producer heard 'accepted'
        wait_bodies(replica.address, "qa", ["qa"])
    finally:
        proxy.stop()


def test_both_modes_side_by_side(node_factory):
    """Full mirrors dequeues; enqueue keeps every message; both on one pair of nodes."""
    source, replica = node_factory(name="source"), node_factory(name="replica")
    for queue in ("qf", "qe"):
        hastandby("add", "queue", queue, "-b", source.address)
    hastandby("replicate", "-b", replica.address, source.address, "qf", "--create")
    hastandby("replicate", "-b", replica.address, source.address, "qe", "--create", "--mode", "enqueue")
    for queue in ("qf", "qe"):
        send(source.address, queue, numbered(queue, 100))
        assert len(receive(source.address, queue, 50)) == 50
    wait_bodies(replica.address, "qf", [f"qf{i}" for i in range(50, 100)])
    wait_bodies(replica.address, "qe", [f"qe{i}" for i in range(100)])
    # Enqueue mode: the replica has its own consumers.
    assert [m.body for m in receive(replica.address, "qe", 10)] == [f"qe{i}" for i in range(10)]
    out = hastandby("status", "-b", replica.address).stdout
    assert "replica qf <- " in out and "replica qe <- " in out, out
    source_out = hastandby("query", "-b", source.address).stdout
    assert "source qf -> " in source_out and "source qe -> " in source_out, source_out


@pytest.mark.parametrize("mode", ["full", "enqueue"])
def test_link_cut_mid_stream(node_factory, mode):
    """Cut the replication's TCP connection three times while a producer streams 3,000 messages."""
    source, replica = node_factory(name="source"), node_factory(name="replica")
    host, port = source.address.split(":")
    proxy = DelayProxy((host, int(port)), 0.0).start()
    try:
        hastandby("add", "queue", "q", "-b", source.address)
        hastandby("replicate", "-b", replica.address, proxy.address, "q", "--create", "--mode", mode)
        wait_state(replica.address, "replicas", "q", "live")
        producer = threading.Thread(target=send, args=(source.address, "q", numbered("m", 3000)))
        producer.start()
        for _ in range(3):
            time.sleep(0.3)
            proxy.cut()
        producer.join(60)
        assert not producer.is_alive()
        wait_bodies(replica.address, "q", [f"m{i}" for i in range(3000)], timeout=30)
        report = wait_state(replica.address, "replicas", "q", "live")
        assert report["received"] >= 3000 - 1
    finally:
        proxy.stop()
    assert replica.log().count("replication source lost") >= 1


def test_replica_restart_resumes(node_factory, tmp_path):
    """The replica node restarts (SIGTERM, same --data-dir): both replications resume."""
    source = node_factory(name="source")
    data_dir = str(tmp_path / "replica-data")
    replica = node_factory("--data-dir", data_dir, name="replica")
    for queue in ("qf", "qe"):
        hastandby("add", "queue", queue, "-b", source.address)
    hastandby("replicate", "-b", replica.address, source.address, "qf", "--create")
    hastandby("replicate", "-b", replica.address, source.address, "qe", "--create", "--mode", "enqueue")
    send(source.address, "qf", numbered("f", 10))
    send(source.address, "qe", numbered("e", 10))
    wait_bodies(replica.address, "qe", [f"e{i}" for i in range(10)])
    port = replica.port
    assert replica.stop() == 0
    send(source.address, "qf", numbered("f", 10, start=10))
    send(source.address, "qe", numbered("e", 10, start=10))
    receive(source.address, "qf", 5)
    restarted = node_factory("--data-dir", data_dir, name="replica", port=port)
    # Full: the source's state.  Enqueue: what was sent while away (the first ten
    # left with the old process's memory; nothing is downloaded twice).
    wait_bodies(restarted.address, "qf", [f"f{i}" for i in range(5, 20)])
    wait_bodies(restarted.address, "qe", [f"e{i}" for i in range(10, 20)])
    assert wait_state(restarted.address, "replicas", "qe", "live")["duplicates_dropped"] == 0
    saved = json.loads((tmp_path / "replica-data" / "replication.json").read_text())
    assert sorted((c["queue"], c["mode"]) for c in saved) == [("qe", "enqueue"), ("qf", "full")]


def test_source_restart_starts_a_new_epoch(node_factory, tmp_path):
    """A standalone source restarts (durable queues, non-durable messages gone, ids given out again): the
    full replica converges to the new state, the enqueue replica keeps its messages and appends."""
    data_dir = str(tmp_path / "source-data")
    source = node_factory("--data-dir", data_dir, name="source")
    replica = node_factory(name="replica")
    for queue, mode in (("qf", "full"), ("qe", "enqueue")):
        hastandby("add", "queue", queue, "--durable", "-b", source.address)
        hastandby("replicate", "-b", replica.address, source.address, queue, "--create", "--mode", mode)
        send(source.address, queue, numbered(queue, 5))
    wait_bodies(replica.address, "qf", [f"qf{i}" for i in range(5)])
    wait_bodies(replica.address, "qe", [f"qe{i}" for i in range(5)])
    port = source.port
    assert source.stop() == 0
    source = node_factory("--data-dir", data_dir, name="source", port=port)
    for queue in ("qf", "qe"):
        send(source.address, queue, numbered(queue, 3, start=5))
    wait_bodies(replica.address, "qf", [f"qf{i}" for i in range(5, 8)])
    wait_bodies(replica.address, "qe", [f"qe{i}" for i in range(8)])
    # The queue keeps its uuid (durable wiring), so the restart shows in its lineage: a restart epoch from
    # the first id given out again, from which the full replica dropped what it held (journal.py).
    assert "replica diverged from its source" in replica.log()


def test_enqueue_mode_with_source_consumers_racing(node_factory):
    """Source consumers take every message as it arrives; the replica still gets each one once."""
    source, replica = node_factory(name="source"), node_factory(name="replica")
    hastandby("add", "queue", "q", "-b", source.address)
    hastandby("replicate", "-b", replica.address, source.address, "q", "--create", "--mode", "enqueue")
    wait_state(replica.address, "replicas", "q", "live")
    taken: list[Any] = []
    consumer = threading.Thread(target=lambda: taken.extend(m.body for m in receive(source.address, "q", 2000,
                                                                                    timeout=15)))
    consumer.start()
    send(source.address, "q", numbered("r", 2000))
    consumer.join(60)
    assert taken == [f"r{i}" for i in range(2000)]
    wait_bodies(replica.address, "q", [f"r{i}" for i in range(2000)])


def test_backlog_overflow_reported(node_factory):
    """With the replica away, the source keeps --max-backlog messages and says it dropped the rest."""
    source, replica = node_factory(name="source"), node_factory(name="replica")
    host, port = source.address.split(":")
    proxy = DelayProxy((host, int(port)), 0.0).start()
    try:
        hastandby("add", "queue", "q", "-b", source.address)
        hastandby("replicate", "-b", replica.address, proxy.address, "q", "--create", "--mode", "enqueue",
                  "--max-backlog", "10")
        wait_state(replica.address, "replicas", "q", "live")
        proxy.refuse(True)
        wait_state(replica.address, "replicas", "q", "connecting")
        send(source.address, "q", numbered("o", 25))
        report = wait_state(source.address, "sources", "q", "overflow")
        assert report["overflow"] == 15 and report["lag_messages"] == 10
        assert "overflow dropped 15" in hastandby("status", "-b", source.address).stdout
        assert "replication backlog overflow" in source.log()
        proxy.refuse(False)
        wait_bodies(replica.address, "q", [f"o{i}" for i in range(15, 25)])
        assert wait_for(lambda: (r := replication(replica.address, "replicas", "q")) and r["overflow"] == 15,
                        20, "the replica to report the overflow")
    finally:
        proxy.stop()


def test_replica_refuses_local_changes(node_factory):
    """A full replica refuses producers, consumers, purge and delete; browsing is fine."""
    source, replica = node_factory(name="source"), node_factory(name="replica")
    hastandby("add", "queue", "q", "-b", source.address)
    hastandby("replicate", "-b", replica.address, source.address, "q", "--create")
    send(source.address, "q", numbered("s", 3))
    wait_bodies(replica.address, "q", ["s0", "s1", "s2"])
    with pytest.raises(LinkDetached, match="is a DR replica of"):
        send(replica.address, "q", [Message(body="local")])
    with pytest.raises(LinkDetached, match="browse it"):
        receive(replica.address, "q", 1, timeout=1)
    for args in (("purge", "q"), ("del", "queue", "q")):
        result = hastandby(*args, "-b", replica.address, ok=False)
        assert result.returncode != 0 and "replica" in result.stderr.lower(), result.stderr
    wait_bodies(replica.address, "q", ["s0", "s1", "s2"])
    # Stopping replication makes it an ordinary queue again.
    hastandby("replicate", "--stop", "-b", replica.address, "q")
    send(replica.address, "q", [Message(body="local")])
    assert len(bodies(replica.address, "q")) == 4
    assert replication(replica.address, "replicas", "q") is None


def test_source_queue_deleted_and_recreated(node_factory):
    """Deleting the source queue ends the link with a clear error; the replica retries and
    resumes when a queue of that name is back (a new one: a full replica converges to it)."""
    source, replica = node_factory(name="source"), node_factory(name="replica")
    hastandby("add", "queue", "q", "-b", source.address)
    hastandby("replicate", "-b", replica.address, source.address, "q", "--create")
    send(source.address, "q", numbered("old", 3))
    wait_bodies(replica.address, "q", ["old0", "old1", "old2"])
    hastandby("del", "queue", "q", "-b", source.address)
    # The first refusal says "was deleted"; the retries that follow say "no such queue". Either
    # names the condition and the queue, and which one a poll sees depends on the retry timing.
    error = wait_for(lambda: (replication(replica.address, "replicas", "q") or {}).get("error"),
                     20, "the replica to report the deleted source queue")
    assert "amqp:not-found" in error and "'q'" in error, error
    hastandby("add", "queue", "q", "-b", source.address)
    send(source.address, "q", numbered("new", 2))
    wait_bodies(replica.address, "q", ["new0", "new1"])
    assert wait_state(replica.address, "replicas", "q", "live")["error"] is None


def test_replicate_bad_input(node_factory):
    """Clear one-line errors, nothing changes, the node keeps serving."""
    source, replica = node_factory(name="source"), node_factory(name="replica")
    hastandby("add", "queue", "q", "-b", source.address)
    cases = [
        (("replicate", "-b", replica.address, source.address, "missing"), "--create"),
        (("replicate", "-b", replica.address, source.address, "q", "--create", "--mode", "sideways"), "sideways"),
        (("replicate", "-b", replica.address, replica.address, "q", "--create"), "own node"),
        (("replicate", "-b", replica.address, source.address, "q", "--create", "--max-backlog", "lots"), "lots"),
        (("replicate", "-b", replica.address, source.address, "q", "--create", "--max-backlog", "5"),
         "enqueue mode only"),
        (("replicate", "--stop", "-b", replica.address, "q"), "not replicating"),
    ]
    for args, words in cases:
        result = hastandby(*args, ok=False)
        assert result.returncode != 0 and words in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    with ManagementClient(replica.address) as client:
        with pytest.raises(ManagementError, match="source"):
            client.request("REPLICATE", "queue", "q", {"mode": "full"})
        assert client.request("STATUS")["replication"] == {"replicas": [], "sources": []}
    # A source refuses a tap address to ordinary clients.
    hastandby("replicate", "-b", replica.address, source.address, "q", "--create", "--mode", "enqueue")
    tap = wait_for(lambda: next((x["name"] for x in ManagementClient(source.address).request("QUERY")["queues"]
                                 if x["name"].startswith("$dr.")), None), what="the tap queue")
    with pytest.raises(LinkDetached, match="backlog of a DR replication"):
        receive(source.address, tap, 1, timeout=1)
