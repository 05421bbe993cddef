"""Failover and recovery against real node processes: Qpid's ha_tests.py failover scenarios.

Each test is named after the scenario of Qpid's src/tests/ha_tests.py it ports
(the Qpid C++ HA test suite, ha_tests.py); the docstring says where ours differs.
Clients are python-qpid-proton ``Container`` clients given the URL list of
every node (hastandby/testing/numbered_client.py) and the proton C examples.
Every wait is bounded.  Node logs are printed when a test fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import Callable, Iterator

import pytest
from proton import Delivery, Message

from hastandby.testing import cexamples
from hastandby.testing.numbered_client import NumberedReceiver, NumberedSender, drain
from hastandby.testing import auth
from hastandby.testing.clients import browse, receive, send
from hastandby.testing.cluster import HaCluster
from hastandby.testing.nodes import REPO
from hastandby.testing.waiting import wait_for

ACCEPTED = Delivery.ACCEPTED


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture
def ha(cluster_factory) -> Iterator[Callable[..., HaCluster]]:
    """``cluster_factory``, plus every node's log on stdout at teardown (pytest shows it on failure)."""
    clusters: list[HaCluster] = []

    def start(size: int = 3, *extra: str, promote: bool = True) -> HaCluster:
        cluster = cluster_factory(size, *extra, promote=promote)
        clusters.append(cluster)
        return cluster

    yield start
    logs = {node.log_path for cluster in clusters for node in cluster.retired + cluster.nodes}
    for path in sorted(logs):  # a restarted node appends to its predecessor's log
        text = path.read_text(errors="replace") if path.exists() else ""
        print(f"===== {path.name} =====\n{text[-30000:]}")


def hastandby(*args: str, timeout: float = 20.0) -> str:
    """Run the ``hastandby`` CLI; return its output, failing on a non-zero exit."""
    result = subprocess.run([sys.executable, "-m", "hastandby", *args], cwd=REPO, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"hastandby {' '.join(args)}: {result.stdout}{result.stderr}"
    return result.stdout.strip()


def cli_status(cluster: HaCluster, index: int) -> str:
    return hastandby("status", "-b", cluster[index].address, timeout=10)


def wait_detail(cluster: HaCluster, index: int, detail: str, timeout: float = 20.0) -> None:
    wait_for(lambda: (cluster.status(index) or {}).get("detail") == detail, timeout,
                    f"node {index} primary ({detail})", interval=0.1)


def assert_running(cluster: HaCluster, *indices: int) -> None:
    """Qpid's implicit teardown check: nodes that should run have not died."""
    for index in indices:
        node = cluster[index]
        assert node.proc is not None and node.proc.poll() is None, f"node {index} died:\n{node.log()}"


def bodies(address: str, queue: str, count: int) -> list[object]:
    """Browse ``count`` messages through an admin connection (works on a backup too)."""
    return [m.body for m in browse(address, queue, count, admin=True, timeout=2)]


def wait_bodies(cluster: HaCluster, index: int, queue: str, expected: list[object], timeout: float = 20.0) -> None:
    """Wait until ``queue`` on node ``index`` holds exactly ``expected``, in order (Qpid's assert_browse_backup)."""
    seen: list[object] = []

    def matches() -> bool:
        nonlocal seen
        queue_info = cluster.queue(index, queue)
        if queue_info is None or queue_info["depth"] != len(expected):
            seen = [f"depth {queue_info and queue_info['depth']}"]
            return False
        seen = bodies(cluster[index].address, queue, len(expected))  # the depth is right: no extra
        return seen == expected

    try:
        wait_for(matches, timeout, f"node {index} {queue} == expected", interval=0.2)
    except AssertionError:
        raise AssertionError(f"node {index} queue {queue!r}: {seen[:20]}... != {expected[:20]}...") from None


def c_sequences(output: str) -> list[int]:
    """The ``{"sequence"=N}`` bodies printed by the stock C ``receive`` example."""
    return [int(n) for n in re.findall(r'"sequence"=(\d+)', output)]


# -- the scenarios -----------------------------------------------------------------------------


def test_failover(ha):
    """Kill -9 the primary under load and promote a backup; nothing acknowledged is lost.

    Also the by-hand acceptance check: 10,000 messages sent with the C ``send``
    example before the failure all reach the C ``receive`` example on the new
    primary.  Meanwhile a python-qpid-proton sender holding the URL list of all
    three nodes (plain proton reconnect, 0.1 s steps) keeps sending across the
    failure and the ``hastandby promote``; every number it was told
    ``accepted`` is then received from the new primary (duplicates allowed).
    The URL order puts the promoted node right after the dead one; the client
    has a 1 s heartbeat, so that it notices a dead connection without waiting
    for TCP (it may reach node 1 before the promotion and be refused; see
    hastandby/testing/numbered_client.py).
    """
    c = ha(3)
    c[0].request("CREATE", "queue", "c")
    c[0].request("CREATE", "queue", "p")
    send_c, receive_c = cexamples.build("send"), cexamples.build("receive")
    app = {**os.environ, **auth.client_environment()}
    run = subprocess.run([str(send_c), "127.0.0.1", str(c[0].port), "c", "10000"], capture_output=True,
                         text=True, timeout=60, env=app)
    assert run.returncode == 0 and "10000 messages sent and acknowledged" in run.stdout, run.stdout + run.stderr

    sender = NumberedSender(c.url_list, "p", count=4000, rate=800, window=50, heartbeat=1, time_limit=60).start()
    assert sender.wait_accepted(500, timeout=15), f"sender stuck before the failure: {sender.errors}"
    killed_at = time.time()  # the client's clock
    c[0].kill()
    assert "is primary" in hastandby("promote", "-b", c[1].address)
    promoted_at = time.time()
    assert sender.join(timeout=60), "sender still running"
    assert sender.done, (f"sender: {sender.accepted_count} of {sender.count} accepted, errors {sender.errors}, "
                         f"connections {sender.connections}")
    assert not sender.rejected
    gap = sender.max_gap(since=killed_at - 0.5)
    print(f"promote took {promoted_at - killed_at:.2f} s after the kill; the sender saw no acceptance "
          f"for {gap:.2f} s; refusals {sender.refusals}, re-sent {sender.resent}")

    run = subprocess.run([str(receive_c), "127.0.0.1", str(c[1].port), "c", "10000"], capture_output=True,
                         text=True, timeout=60, env=app)
    assert run.returncode == 0 and "10000 messages received" in run.stdout, run.stdout[-2000:] + run.stderr
    assert sorted(set(c_sequences(run.stdout))) == list(range(1, 10001))

    receiver = drain([c[1].url], "p", sender.accepted_set)
    assert receiver.missing(sender.accepted_set) == []
    assert receiver.empty == []
    # The surviving backup follows the new primary, consumption included.
    c.wait_state(2, "backup")
    c.wait_depth(2, "p", c.queue(1, "p")["depth"])
    assert_running(c, 1, 2)


def test_backup_failover(ha):
    """A backup dies and comes back; then the primary dies and the surviving backup follows the new one.

    Killing a backup (kill -9) does not stop the primary: sends are still
    acknowledged at once, and the restarted backup catches up fully.  Then
    Qpid's scenario: the primary is killed and node 1 promoted, "c" is sent to
    node 1: the surviving backup, node 2, holds everything in order, and loses
    the first message when it is consumed on the new primary.
    """
    c = ha(3)
    c[0].request("CREATE", "queue", "q")
    send(c[0].address, "q", [Message(body=f"a{i}") for i in range(5)])
    c[2].kill()
    start = time.monotonic()
    outcomes = send(c[0].address, "q", [Message(body=f"b{i}") for i in range(5)])
    assert outcomes == [ACCEPTED] * 5, outcomes
    assert time.monotonic() - start < 1.5, "a dead backup held the primary's acknowledgements"
    c.restart(2)
    c.wait_state(2, "backup")
    expected = [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)]
    wait_bodies(c, 2, "q", expected)

    c[0].kill()
    c.promote(1)
    assert send(c[1].address, "q", [Message(body="c")]) == [ACCEPTED]
    wait_bodies(c, 2, "q", expected + ["c"])
    assert [m.body for m in receive(c[1].address, "q", 1)] == ["a0"]
    wait_bodies(c, 2, "q", expected[1:] + ["c"])
    assert_running(c, 1, 2)


def test_empty_backup_failover(ha):
    """Failover with no queues at all: the new primary goes active (QPID-5430) and serves."""
    c = ha(3)
    c[0].kill()
    c.promote(1)
    wait_detail(c, 1, "active", timeout=10)
    c.wait_state(2, "backup")
    c[1].request("CREATE", "queue", "q")
    assert send(c[1].address, "q", 3) == [ACCEPTED] * 3
    wait_bodies(c, 2, "q", ["m0", "m1", "m2"])
    assert_running(c, 1, 2)


def test_queue_hold(ha):
    """After failover the new primary holds acknowledgements until the backups it expects are back.

    Ours, with three nodes: the primary and one backup are killed, the other
    backup is promoted.  It expects the killed backup (it was ready in the last
    membership it saw), so sends to q1 (replicated before the failure) and to
    q2 (created after it) are not acknowledged, while receiving and browsing
    work.  Restarting the old primary, which was not expected, changes nothing;
    once the killed backup is restarted and caught up, both sends complete.
    """
    c = ha(3, "--backup-timeout", "60")
    c[0].request("CREATE", "queue", "q1")
    send(c[0].address, "q1", 10)
    c.wait_depth(2, "q1", 10)
    c[0].kill()
    c[2].kill()
    c.promote(1)
    assert cli_status(c, 1) == "primary (recovering)"
    c[1].request("CREATE", "queue", "q2")
    s1 = NumberedSender([c[1].url], "q1", count=10, window=10, time_limit=40).start()
    s2 = NumberedSender([c[1].url], "q2", count=10, window=10, time_limit=40).start()
    wait_for(lambda: s1.sent == 10 and s2.sent == 10, 10, "all 20 messages sent")
    time.sleep(0.5)
    assert (s1.accepted_count, s2.accepted_count) == (0, 0), "acknowledged before the expected backup is back"
    assert bodies(c[1].address, "q1", 10) == [f"m{i}" for i in range(10)]  # browsing is not blocked

    c.restart(0)
    c.wait_state(0, "backup")
    time.sleep(0.5)
    assert (s1.accepted_count, s2.accepted_count) == (0, 0), "released by a backup that was not expected"
    assert cli_status(c, 1) == "primary (recovering)"

    c.restart(2)
    assert s1.join(20) and s2.join(20), "held sends not released once the expected backup was back"
    assert s1.done and s2.done, (s1.accepted_count, s2.accepted_count)
    wait_detail(c, 1, "active", timeout=10)
    assert cli_status(c, 1) == "primary (active)"
    for backup in (0, 2):
        wait_bodies(c, backup, "q1", [f"m{i}" for i in range(10)] + list(range(1, 11)))
        wait_bodies(c, backup, "q2", list(range(1, 11)))
    assert_running(c, 0, 1, 2)


def test_expected_backup_timeout(ha):
    """An expected backup that does not return is dropped after --backup-timeout; held sends complete.

    Node 2 hangs (SIGSTOP) and the primary is killed; node 1 is promoted
    and expects node 2.  A send to a queue made after the failover is held
    until the timeout drops node 2; ``hastandby status`` goes from ``primary
    (recovering)`` to ``primary (active)``.  When node 2 resumes it is no longer
    expected: it reconnects, catches up again (Qpid's ready -> catchup), and
    is a backup once it has the message it missed.
    """
    c = ha(3, "--backup-timeout", "3")
    c[0].request("CREATE", "queue", "q")
    log = c[2].log_path
    c[2].signal(signal.SIGSTOP)
    try:
        c[0].kill()
        c.promote(1)
        promoted_at = time.time()  # the client's clock
        assert c.status(1)["detail"] == "recovering"
        c[1].request("CREATE", "queue", "q2")
        sender = NumberedSender([c[1].url], "q2", count=1, time_limit=20).start()
        wait_for(lambda: sender.sent == 1, 5, "the message sent")
        time.sleep(0.5)
        assert time.time() - promoted_at < 2.5, "too slow to see the hold"
        assert sender.accepted_count == 0, "not held for the expected backup"
        assert cli_status(c, 1) == "primary (recovering)"
        assert sender.join(10) and sender.done, "still held after the backup timeout"
        held = sender.accepted_at[0] - promoted_at
        print(f"held for {held:.2f} s after promotion (--backup-timeout 3)")
        assert 2.5 < held < 6.0
        assert cli_status(c, 1) == "primary (active)"
    finally:
        c[2].signal(signal.SIGCONT)
    wait_for(lambda: c.state(2) == "catchup" or "does not count this node as ready" in log.read_text(), 15,
             "node 2 catching up again", interval=0.02)
    c.wait_state(2, "backup")
    wait_bodies(c, 2, "q2", [1])
    assert_running(c, 1, 2)


def test_join_ready_cluster(ha):
    """A backup restarted into an active cluster gets everything, and is then a complete replacement.

    Ours differs from Qpid's (which checks promote rules for a joining node;
    see test_ha_core): wiring and messages made while node 2 was dead,
    consumption included, are all on it once it reports ``backup``; promoted
    after the other two die, it serves every message.
    """
    c = ha(3, "--backup-timeout", "1")  # node 2, promoted at the end, need not wait long for node 1
    c[0].request("CREATE", "queue", "q1")
    send(c[0].address, "q1", [Message(body=f"x{i}") for i in range(10)])
    c[2].kill()
    c[0].request("CREATE", "queue", "q2")
    c[0].request("CREATE", "exchange", "ex", {"exchange-type": "topic"})
    c[0].request("BIND", body={"exchange": "ex", "queue": "q2", "key": "k.#"})
    send(c[0].address, "q1", [Message(body=f"y{i}") for i in range(10)])
    send(c[0].address, "ex", [Message(subject="k.1", body="routed")])
    assert len(receive(c[0].address, "q1", 5)) == 5
    c.restart(2)
    c.wait_state(2, "backup")
    q1 = [f"x{i}" for i in range(5, 10)] + [f"y{i}" for i in range(10)]
    wait_bodies(c, 2, "q1", q1)
    wait_bodies(c, 2, "q2", ["routed"])
    assert {"exchange": "ex", "queue": "q2", "key": "k.#", "arguments": {}} in c.query(2)["bindings"]

    c[0].kill()
    c[1].kill()
    c.promote(2)
    assert [m.body for m in receive(c[2].address, "q1", len(q1))] == q1
    assert send(c[2].address, "ex", [Message(subject="k.2", body="routed2")]) == [ACCEPTED]
    assert [m.body for m in receive(c[2].address, "q2", 2)] == ["routed", "routed2"]
    assert c.queue(2, "q1")["depth"] == c.queue(2, "q2")["depth"] == 0
    assert_running(c, 2)


def test_stalled_backup(ha):
    """A hung (SIGSTOPped) backup delays producers only until the heartbeat drops it.

    The primary's idle timeout (--heartbeat, 2 s in a cluster) drops the
    stopped backup; sends are then acknowledged at once again.  While it is
    stopped 20,000 more messages arrive; after SIGCONT it reconnects and
    catches up, and it reports ``backup`` only once it has them all.
    """
    c = ha(3)
    c[0].request("CREATE", "queue", "q")
    send(c[0].address, "q", 10)
    c.wait_depth(1, "q", 10)
    stalled = c.status(1)["node_id"]
    c[1].signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        assert send(c[0].address, "q", 1) == [ACCEPTED]
        held = time.monotonic() - start
        print(f"first send after SIGSTOP acknowledged after {held:.2f} s")
        assert 0.5 < held < 6.0, "the stalled backup did not hold the send, or held it too long"
        start = time.monotonic()
        assert send(c[0].address, "q", 10) == [ACCEPTED] * 10
        assert time.monotonic() - start < 1.5, "still held after the stalled backup was dropped"
        members = [m["node_id"] for m in c.query(0)["ha"]["members"]]
        assert stalled not in members, "the stalled backup is still a member"
        run = cexamples.run_send("127.0.0.1", c[0].port, "q", 20000, timeout=60, env=auth.client_environment())
        assert cexamples.sent_count(run) == 20000, run.stdout
        assert [m.body for m in receive(c[0].address, "q", 1)] == ["m0"]  # messages can be fetched
    finally:
        c[1].signal(signal.SIGCONT)
    depth = c.queue(0, "q")["depth"]
    assert depth == 10 + 1 + 10 + 20000 - 1
    # Until node 1 hears from the primary again it cannot know it was dropped
    # (like Qpid, a backup keeps its state while its primary is away); once it
    # does, it is in catch-up, and says ``backup`` only with every message.
    log = c[1].log_path
    wait_for(lambda: c.state(1) == "catchup" or "does not count this node as ready" in log.read_text(), 15,
             "node 1 told it is catching up again", interval=0.02)

    def caught_up_or_honest() -> bool:
        state = c.state(1)
        replica = c.queue(1, "q")
        have = replica and replica["depth"]
        assert state != "backup" or have == depth, f"node 1 says backup with {have} of {depth} messages"
        return state == "backup" and have == depth

    wait_for(caught_up_or_honest, 30, "node 1 caught up", interval=0.02)
    c.wait_depth(2, "q", depth)
    assert_running(c, 0, 1, 2)


def test_failover_send_receive(ha):
    """Numbered senders and receivers on three queues across three primary kills (bounded, ~30 s).

    Each round waits for the primary to be active and the next node ready,
    kills the primary (-9), promotes the next node and restarts the killed one.
    After each round every receiver advances by 10, twice (no stall).  No
    receiver ever sees a gap, and at the end every number a sender was told
    ``accepted`` has been received (duplicates allowed).  The clients hold the
    URL list of all nodes; a refusing backup sends them on to the next URL
    (plain proton would loop on a live backup listed before the primary,
    which a rotating primary always produces; see hastandby/testing/numbered_client.py).
    """
    c = ha(3)
    queues = ["q0", "q1", "q2"]
    for name in queues:
        c[0].request("CREATE", "queue", name)
    options = dict(time_limit=90, heartbeat=1)
    senders = [NumberedSender(c.url_list, q, count=1_000_000, rate=150, window=10, **options) for q in queues]
    receivers = [NumberedReceiver(c.url_list, q, credit=20, **options) for q in queues]
    for client in senders + receivers:
        client.start()
    try:
        for receiver in receivers:
            assert receiver.wait_highest(20, timeout=15), f"{receiver.address}: not receiving"
        primary = 0
        for round_ in range(3):
            following = (primary + 1) % 3
            wait_detail(c, primary, "active")
            c.wait_state(following, "backup")
            killed_at = time.time()  # the clients' clock
            c[primary].kill()
            c.promote(following)
            c.restart(primary)
            for _ in range(2):
                for receiver in receivers:
                    target = receiver.highest + 10
                    assert receiver.wait_highest(target, timeout=20), (
                        f"round {round_}: {receiver.address} stalled at {receiver.highest}; running "
                        f"{receiver.running}, errors {receiver.errors}")
            gaps = [round(s.max_gap(since=killed_at - 0.5), 2) for s in senders]
            print(f"round {round_}: node {primary} killed, node {following} promoted; senders' longest "
                  f"wait for an acknowledgement: {gaps} s")
            primary = following
    finally:
        for sender in senders:
            sender.stop()
        for sender in senders:
            assert sender.join(10), "sender did not stop"
    for sender, receiver in zip(senders, receivers):
        assert not sender.errors and not sender.rejected, (sender.errors, sender.rejected)
        try:
            wait_for(lambda: sender.accepted_set <= receiver.seen, 20, f"{receiver.address} has every accepted")
        finally:
            receiver.stop()
            receiver.join(10)
        assert receiver.gaps == [], f"{receiver.address}: gaps {receiver.gaps[:10]}"
        assert receiver.empty == [], f"{receiver.address}: transfers with no message, tags {receiver.empty[:10]}"
        assert receiver.missing(sender.accepted_set) == []
        print(f"{sender.address}: {sender.accepted_count} accepted, {len(receiver.received)} received "
              f"({receiver.duplicates} duplicates, {len(receiver.empty)} empty)")
    assert_running(c, 0, 1, 2)
