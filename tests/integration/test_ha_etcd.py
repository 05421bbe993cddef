"""etcd-driven failover against real node processes and a real etcd server.

Every node is a real ``python -m hastandby serve --etcd URL --cluster NAME
--node-id ID --lease-ttl 2 --brokers-url ...`` process (hastandby/testing/nodes.py)
and etcd is the real server (hastandby/testing/etcd.py): nobody promotes anyone
by hand unless the test says so; etcd's leader key decides.  One etcd serves
the module, each test uses a cluster name of its own.

Timings (failover after kill -9, handover after SIGTERM, operator handover)
are printed (``pytest -s``) and bounded by assertions.  Two clocks are used:
the test's own polling (what a client would notice) and the nodes' JSON log
timestamps (what the nodes did), both against the wall-clock time of the
signal.  Every node is stopped by PID at teardown, SIGSTOPped ones included,
and every node's log is printed then (pytest shows it when a test fails).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from typing import Any, Callable

import pytest
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from hastandby.testing import cexamples
from hastandby.testing.numbered_client import NumberedSender, drain
from hastandby.client import ManagementClient, ManagementError
from hastandby.testing import auth
from hastandby.testing.clients import browse_ids
from hastandby.testing.etcd_ha import POLL, TTL
from hastandby.testing.nodes import REPO, NodeProcess
from hastandby.testing.waiting import wait_for

pytestmark = pytest.mark.etcd



def log_time(record: dict[str, Any]) -> float:
    """A log record's wall-clock time (structlog's ISO UTC timestamp) as a POSIX timestamp."""
    return datetime.fromisoformat(record["timestamp"]).timestamp()


def first_after(records: list[dict[str, Any]], since: float,
                match: Callable[[dict[str, Any]], bool] = lambda r: True) -> dict[str, Any] | None:
    return next((r for r in records if log_time(r) >= since and match(r)), None)


def hastandby(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run the ``hastandby`` CLI as an operator would."""
    return subprocess.run([sys.executable, "-m", "hastandby", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def status_json(node: NodeProcess) -> dict[str, Any]:
    result = hastandby("status", "--json", "-b", node.address, timeout=15)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# -- a producer tied to one node ------------------------------------------------------------------


class PinnedProducer(MessagingHandler):
    """Sends numbered messages to ONE url, no reconnect; records every outcome with its time.

    It keeps at most ``window`` messages unsettled; ``burst(n)`` sends ``n``
    more at once regardless of the window.  ``unsettled()``, ``accepted`` and
    the connection's fate may be read from the test's thread.
    """

    def __init__(self, url: str, address: str, window: int = 50, time_limit: float = 90.0, first: int = 1) -> None:
        super().__init__(auto_settle=True)
        self.url = url
        self.address = address
        self.window = window
        self.time_limit = time_limit
        self.lock = threading.Lock()
        self.in_flight: dict[int, float] = {}  # number -> monotonic time sent
        self.accepted: dict[int, float] = {}  # number -> monotonic time of the accepted outcome
        self.other_outcomes: dict[int, str] = {}  # rejected / released / modified
        self.closed: list[tuple[float, str]] = []  # (time, what) for remote closes and transport errors
        self.errors: list[str] = []
        self.flowing = True
        self._burst = 0
        self._next = first
        self._stop = threading.Event()
        self._sender: Any = None
        self._connection: Any = None
        self._started = 0.0
        self._thread = threading.Thread(target=self._run, name="PinnedProducer", daemon=True)

    # -- test thread ------------------------------------------------------------------------

    def start(self) -> "PinnedProducer":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def burst(self, count: int) -> None:
        with self.lock:
            self._burst += count

    def last_sent(self) -> int:
        with self.lock:
            return self._next - 1

    def sent_since(self, number: int) -> set[int]:
        """Numbers sent after ``number``."""
        with self.lock:
            return set(range(number + 1, self._next))

    def wait_unsettled(self, count: int, quiet: float, timeout: float) -> None:
        """Wait until ``count`` messages are unsettled and nothing was accepted for ``quiet`` s."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                last = max(self.accepted.values(), default=0.0)
                if len(self.in_flight) >= count and time.monotonic() - last >= quiet:
                    return
            assert time.monotonic() < deadline, (f"{len(self.in_flight)} of {count} unsettled after "
                                                 f"{timeout} s: {self.errors}")
            time.sleep(0.02)

    def wait_sent(self, number: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.last_sent() < number:
            assert time.monotonic() < deadline, f"only {self.last_sent()} of {number} sent in {timeout} s"
            time.sleep(0.01)

    def accepted_numbers(self) -> set[int]:
        with self.lock:
            return set(self.accepted)

    def unsettled(self) -> set[int]:
        with self.lock:
            return set(self.in_flight)

    def accepted_after(self, moment: float) -> dict[int, float]:
        with self.lock:
            return {n: t for n, t in self.accepted.items() if t > moment}

    def wait_accepted(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.accepted) >= count:
                    return
            time.sleep(0.02)
        raise AssertionError(f"only {len(self.accepted)} of {count} accepted in {timeout} s: {self.errors}")

    def _run(self) -> None:
        try:
            Container(self).run()
        except Exception as error:  # recorded for the assertion messages
            self.errors.append(f"{type(error).__name__}: {error}")

    # -- container thread -----------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        self._connection = event.container.connect(self.url, reconnect=False)
        self._sender = event.container.create_sender(self._connection, self.address)
        event.container.schedule(POLL, self)

    def on_timer_task(self, event: Any) -> None:
        if self._stop.is_set() or time.monotonic() - self._started > self.time_limit:
            if self._connection is not None:
                self._connection.close()
            return
        self._send()
        event.container.schedule(POLL, self)

    def on_sendable(self, event: Any) -> None:
        self._send()

    def _send(self) -> None:
        sender = self._sender
        if sender is None or self.closed:
            return
        with self.lock:
            while sender.credit > 0 and (self._burst > 0 or (self.flowing and len(self.in_flight) < self.window)):
                if self._burst > 0:
                    self._burst -= 1
                number = self._next
                self._next += 1
                sender.send(Message(body=number), tag=str(number))
                self.in_flight[number] = time.monotonic()

    def _outcome(self, event: Any, what: str) -> None:
        number = int(event.delivery.tag)
        with self.lock:
            self.in_flight.pop(number, None)
            if what == "accepted":
                self.accepted[number] = time.monotonic()
            else:
                self.other_outcomes[number] = what

    def on_accepted(self, event: Any) -> None:
        self._outcome(event, "accepted")
        self._send()

    def on_rejected(self, event: Any) -> None:
        self._outcome(event, "rejected")

    def on_released(self, event: Any) -> None:
        self._outcome(event, "released")

    def on_connection_remote_close(self, event: Any) -> None:
        self.closed.append((time.monotonic(), f"closed by the node: {event.connection.remote_condition}"))
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        self.closed.append((time.monotonic(), f"transport error: {event.transport.condition}"))

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f"link: {event.link.remote_condition}")


# -- the scenarios --------------------------------------------------------------------------------


def test_fresh_cluster_elects_exactly_one_primary(ha):
    """Three connecting nodes and no operator: etcd makes one primary, the others follow it."""
    started = time.monotonic()
    c = ha(3)
    primary = c.wait_settled()
    print(f"\nfresh cluster of 3 settled {time.monotonic() - started:.2f} s after the first start")
    leader = c.leader()
    assert leader is not None and leader[0] == c.ids[primary]
    term = leader[1]
    for _ in range(int(2 * TTL / 0.25)):  # stable for two TTLs: one primary, always the same one
        statuses = [c.status(i) for i in range(3)]
        assert [s and s["state"] for s in statuses].count("primary") == 1, statuses
        assert statuses[primary]["state"] == "primary"
        for index, status in enumerate(statuses):
            assert status["term"] == term, (index, status)
            if index != primary:
                assert status["state"] == "backup", (index, status)
                assert status["primary"] == c[primary].address, (index, status)
        time.sleep(0.25)
    assert c.leader() == leader
    wins = {c.ids[i]: len(c.events(i, "won the election")) for i in range(3)}
    assert wins == {c.ids[i]: int(i == primary) for i in range(3)}, wins


def test_kill_9_primary_fails_over_without_losing_acknowledged_messages(ha):
    """kill -9 the primary: a backup wins once the lease expires; every accepted message is there."""
    c = ha(3)
    old = c.wait_settled()
    old_term = c.status(old)["term"]
    c.create_queue(old, "q")
    sender = NumberedSender([c[old].url], "q", count=2000, time_limit=60).start()
    assert sender.join(60) and sender.done, (sender.accepted_count, sender.errors)
    assert not sender.missing()

    others = [i for i in range(3) if i != old]
    killed_at, killed_mono = time.time(), time.monotonic()
    c[old].kill()
    new, seen_at = c.wait_new_primary(others, timeout=4 * TTL + 5)
    polled = seen_at - killed_mono
    won = first_after(c.events(new, "won the election"), killed_at)
    assert won is not None
    logged = log_time(won) - killed_at
    print(f"\nkill -9 failover (TTL {TTL} s): {c.ids[new]} won {logged:.2f} s after the kill "
          f"(node log), seen primary by polling after {polled:.2f} s")
    assert logged < TTL + 2.5, "a killed primary's lease should expire about one TTL later"

    new_status = c.wait_state(new, "primary")
    assert new_status["term"] > old_term
    assert c.leader() == (c.ids[new], new_status["term"])
    survivor = next(i for i in others if i != new)
    follower = c.wait_following(survivor, new)
    assert follower["term"] == new_status["term"], follower

    receiver = drain([c[new].url], "q", sender.accepted_set, time_limit=30)
    assert not receiver.missing(sender.accepted_set), f"acknowledged messages lost: " \
        f"{receiver.missing(sender.accepted_set)[:20]}"
    print(f"all {len(sender.accepted_set)} accepted messages received from the new primary "
          f"({receiver.duplicates} duplicates)")


def test_catchup_node_is_never_elected_nor_promoted(ha):
    """The primary dies while the only other node is still catching up: nobody may win.

    A catchup replica is incomplete; electing it would lose messages.  So the
    cluster stays without a primary (Qpid's documented "hang" failure mode)
    rather than elect it, however many TTLs pass, and an operator's promote is
    refused with a clear message.
    """
    c = ha(2)
    primary = c.wait_settled()
    backup = 1 - primary
    term = c.status(primary)["term"]
    c.create_queue(primary, "big")
    sent = cexamples.run_send("127.0.0.1", c[primary].port, "big", 300_000, env=auth.client_environment())
    assert cexamples.sent_count(sent) == 300_000

    c[backup].kill()
    c.restart(backup)  # an empty replica: catching up 300,000 messages takes a while
    c.wait_state(backup, "catchup", timeout=15)
    killed_at = time.time()
    c[primary].kill()
    assert c.state(backup) == "catchup", "the node finished catching up before the primary died"

    refused = hastandby("promote", "-b", c[backup].address)
    assert refused.returncode != 0
    assert "still catching up" in refused.stderr, refused.stderr

    deadline = time.monotonic() + 4 * TTL
    seen = set()
    while time.monotonic() < deadline:
        state = c.state(backup)
        seen.add(state)
        assert state in ("catchup", "connecting"), f"a catchup node became {state}"
        # The dead primary's key lingers until its lease expires; nobody else's may appear.
        assert c.leader() in (None, (c.ids[primary], term)), "a leader was elected with no caught-up backup"
        time.sleep(0.2)
    assert c.leader() is None, "the dead primary's leader key did not expire"
    assert first_after(c.events(backup, "won the election"), killed_at) is None
    decisions = [r for r in c.events(backup, "election decision") if r["decision"] == "Campaign"]
    assert all(log_time(r) < killed_at for r in decisions), decisions
    status = c.status(backup)
    assert status["state"] in ("catchup", "connecting") and status["term"] == term, status
    print(f"\ncatchup node stayed {sorted(s for s in seen if s)} for {4 * TTL} s after kill -9 of the primary")


def test_sigstopped_primary_is_replaced_and_acknowledges_nothing_after_resuming(ha):
    """SIGSTOP the primary past its lease: another node wins; after SIGCONT the old one demotes.

    A producer stays connected to the old primary alone (one URL, no
    reconnect).  Messages it had in flight when the primary froze, and those
    it sends to the frozen primary and right after SIGCONT, must never come
    back accepted: the old primary's lease is gone, so its ack gate holds
    them, and it steps down and closes client connections.

    So that the in-flight messages are really held, not merely acknowledged
    by frames the primary had not written yet when it froze, one backup is
    frozen first for half a second: every message sent meanwhile waits for
    that backup.  The primary freezes with them all held; the backup resumes
    at once and accepts them, so the primary finds their completions waiting
    when it resumes, 5 s later, long after its lease expired.
    """
    c = ha(3)
    old = c.wait_settled()
    old_term = c.status(old)["term"]
    others = [i for i in range(3) if i != old]
    slow = others[0]
    c.create_queue(old, "q")
    producer = PinnedProducer(c[old].url, "q", window=50).start()
    try:
        producer.wait_accepted(500, timeout=30)
        c[slow].signal(signal.SIGSTOP)  # from now on every new message waits for this backup
        try:
            producer.wait_unsettled(50, quiet=0.3, timeout=10)
            stopped_at, stopped_mono = time.time(), time.monotonic()
            c[old].signal(signal.SIGSTOP)
        finally:
            c[slow].signal(signal.SIGCONT)
        in_flight = producer.unsettled()
        accepted_before = producer.accepted_numbers()
        assert len(in_flight) == 50, "the frozen primary should hold a full window of messages"

        new, _ = c.wait_new_primary(others, timeout=4 * TTL + 5)
        won = first_after(c.events(new, "won the election"), stopped_at)
        assert won is not None
        print(f"\nSIGSTOP failover: {c.ids[new]} won {log_time(won) - stopped_at:.2f} s after SIGSTOP "
              f"(TTL {TTL} s); {len(in_flight)} messages held by the frozen primary")
        time.sleep(max(0.0, stopped_at + 4.8 - time.time()))
        # Ten more go out to the frozen node, so that it surely reads them after resuming.
        last_before_burst = producer.last_sent()
        producer.burst(10)
        producer.wait_sent(last_before_burst + 10, timeout=5)
        time.sleep(max(0.0, stopped_at + 5.0 - time.time()))  # frozen for 5 s in all

        last_before_resume = producer.last_sent()
        resumed_at, resumed_mono = time.time(), time.monotonic()
        c[old].signal(signal.SIGCONT)
        producer.burst(10)  # and ten more right after SIGCONT, unless the node closed the connection first
        time.sleep(3.0)  # give the old primary every chance to (wrongly) acknowledge
        late = {n: (round(t - stopped_mono, 3), round(t - resumed_mono, 3))
                for n, t in sorted(producer.accepted_after(stopped_mono).items())}
        closed = [(round(t - resumed_mono, 3), what) for t, what in producer.closed]
        assert not late, (f"the deposed primary acknowledged {len(late)} messages after it froze "
                          f"(number: (s after SIGSTOP, s after SIGCONT)): {dict(list(late.items())[:10])}; "
                          f"connection: {closed}")
        after_resume = producer.sent_since(last_before_resume)
        sent_to_frozen = producer.sent_since(last_before_burst) - after_resume
        assert not producer.accepted_numbers() & (in_flight | sent_to_frozen | after_resume)
        print(f"after SIGCONT: none of {len(in_flight)} held + {len(sent_to_frozen)} sent while frozen + "
              f"{len(after_resume)} of 10 sent after SIGCONT was accepted; {len(producer.unsettled())} unsettled; "
              f"other outcomes {sorted(set(producer.other_outcomes.values()))}; connection (s after SIGCONT): "
              f"{closed or 'still open'}")
    finally:
        producer.stop()

    # The old primary stepped down (lost its lease), then followed the new primary as a backup.
    changes = [r for r in c.events(old, "state change") if log_time(r) >= resumed_at]
    assert changes, "the old primary logged no state change after resuming"
    assert changes[0]["previous"].startswith("primary") and changes[0]["now"].startswith("connecting"), changes
    assert changes[0]["trigger"] == "lost_lease", changes
    new_term = c.status(new)["term"]
    status = c.wait_following(old, new)
    assert status["term"] == new_term > old_term, status
    assert any(r["now"] == f"backup term {new_term}" for r in changes[1:]), changes

    # Every message the producer saw accepted is on the new primary.
    receiver = drain([c[new].url], "q", accepted_before, time_limit=30)
    assert not receiver.missing(accepted_before), receiver.missing(accepted_before)[:20]


def test_frozen_primary_rejoins_without_its_stale_messages_and_loses_nothing_once_elected(ha):
    """The divergence of issue 11, reproduced: ids are compared across terms.

    A producer attached to primary P1 writes 20 messages into P1's socket
    while P1 is frozen past its lease; P2 is elected and accepts 20 others.
    When P1 resumes it must take none of the 20 it finds waiting (it may no
    longer acknowledge), rejoin as a backup holding exactly what P2 holds
    under every id, and, once promoted, give consumers every accepted message.
    """
    c = ha(3)
    p1 = c.wait_settled()
    others = [i for i in range(3) if i != p1]
    c.create_queue(p1, "q")
    pinned = PinnedProducer(c[p1].url, "q", window=5).start()
    try:
        pinned.wait_accepted(5, timeout=20)
        pinned.flowing = False
        wait_for(lambda: not pinned.unsettled(), 10, "the first messages settled")
        before, last = pinned.accepted_numbers(), pinned.last_sent()
        c[p1].signal(signal.SIGSTOP)
        pinned.burst(20)  # into the frozen primary's socket
        pinned.wait_sent(last + 20, timeout=10)
        p2, _ = c.wait_new_primary(others, timeout=4 * TTL + 5)
        p3 = next(i for i in others if i != p2)
        on_p2 = PinnedProducer(c[p2].url, "q", window=20, first=1001)
        on_p2.flowing = False
        on_p2.start()
        try:
            on_p2.burst(20)
            on_p2.wait_accepted(20, timeout=20)
        finally:
            on_p2.stop()
        c[p1].signal(signal.SIGCONT)
        c.wait_following(p1, p2, timeout=30)
        time.sleep(1.0)  # the frozen node's socket has been read; its producer's fate is settled
    finally:
        c[p1].signal(signal.SIGCONT)
        pinned.stop()
    assert pinned.accepted_numbers() == before, "the frozen primary acknowledged something"
    accepted = before | set(range(1001, 1021))

    copies = {index: browse_ids(c[index].address, "q") for index in (p1, p2, p3)}
    assert copies[p1] == copies[p2] == copies[p3], {c.ids[i]: copies[i] for i in copies}
    assert set(copies[p2].values()) == accepted
    checked = hastandby("verify", "--json", "-b", c[p1].address)  # any node: it finds the primary
    report = json.loads(checked.stdout)
    assert checked.returncode == 0 and report["equal"], checked.stdout + checked.stderr
    assert report["primary"] == c[p2].address and len(report["backups"]) == 2
    assert report["compared"] == 2 * len(copies[p2])

    result = hastandby("promote", "-b", c[p1].address)
    assert result.returncode == 0, result.stdout + result.stderr
    c.wait_state(p1, "primary")
    receiver = drain([c[p1].url], "q", accepted, time_limit=30)
    assert not receiver.missing(accepted), f"acknowledged messages lost: {receiver.missing(accepted)}"
    assert set(receiver.seen) <= accepted | set(range(last + 1, last + 21)), set(receiver.seen) - accepted


def test_a_node_keeps_answering_while_etcd_hangs_under_a_management_request(ha, etcd):
    """etcd frozen (SIGSTOP): a REPLICATE request must store its configuration there, which blocks for
    seconds; it waits on a worker thread, and the node answers everyone else meanwhile (bound: 0.5 s)."""
    c = ha(3)
    primary = c.wait_settled()
    c.create_queue(primary, "dr")
    outcome: dict[str, Any] = {}

    def replicate() -> None:
        started = time.monotonic()
        try:
            outcome["reply"] = c[primary].request("REPLICATE", "queue", "dr", {"source": "127.0.0.1:9"})
        except ManagementError as error:
            outcome["error"] = str(error)
        outcome["took"] = time.monotonic() - started

    with ManagementClient(c[primary].address, timeout=5) as other:  # connected before: its set-up is not timed
        etcd.pause()
        try:
            requester = threading.Thread(target=replicate, daemon=True)
            requester.start()
            answers = []
            while requester.is_alive() and len(answers) < 100:
                started = time.monotonic()
                assert other.request("STATUS")["state"]  # any state: without etcd it steps down
                answers.append(time.monotonic() - started)
                time.sleep(0.05)
            requester.join(15)
        finally:
            etcd.resume()
    print(f"\nREPLICATE with etcd frozen: {outcome}; {len(answers)} STATUS requests meanwhile, "
          f"slowest {max(answers) * 1000:.0f} ms")
    assert "took" in outcome, "the REPLICATE request never finished"
    assert len(answers) >= 5 and max(answers) < 0.5, answers
    assert "cannot store the replication configuration" in outcome.get("error", ""), outcome


def test_stale_term_primary_is_not_followed(ha):
    """After a SIGSTOP failover the resumed old primary has an older term: the backups ignore it.

    ``status --json`` shows the terms: the new primary's is newer; the other
    backup keeps following the new primary, never the resumed one; the old
    primary ends as a backup in the new term.
    """
    c = ha(3)
    old = c.wait_settled()
    old_term = status_json(c[old])["term"]
    others = [i for i in range(3) if i != old]
    stopped_at = time.time()
    c[old].signal(signal.SIGSTOP)
    new, _ = c.wait_new_primary(others, timeout=4 * TTL + 5)
    third = next(i for i in others if i != new)
    new_term = c.wait_state(new, "primary")["term"]
    assert new_term > old_term
    assert c.wait_following(third, new)["term"] == new_term

    c[old].signal(signal.SIGCONT)
    resumed_at = time.time()
    first_seen = c.status(old)  # may still say primary, in its old term, for an instant
    assert first_seen is not None and first_seen["term"] in (old_term, new_term), first_seen
    if first_seen["state"] == "primary":
        assert first_seen["term"] == old_term
    samples = []
    deadline = time.monotonic() + 1.5 * TTL
    while time.monotonic() < deadline:
        backup, primary = status_json(c[third]), status_json(c[new])
        samples.append((backup["state"], backup["term"], primary["state"], primary["term"]))
        assert backup["state"] == "backup" and backup["term"] == new_term, backup
        assert backup["primary"] == c[new].address, backup
        assert primary["state"] == "primary" and primary["term"] == new_term, primary
        assert c.leader() == (c.ids[new], new_term)
    final = c.wait_following(old, new)
    assert final["term"] == new_term, final
    print(f"\nterms: old primary {old_term}, new primary {new_term}; resumed old primary first reported "
          f"{first_seen['state']} term {first_seen['term']}; {len(samples)} samples of the others in term {new_term}")

    # Nobody followed the old term after the failover; the old primary stepped down from it.
    for index in (third, new):
        late = [r for r in c.events(index, "following the primary") if log_time(r) >= stopped_at]
        assert all(r["term"] == new_term for r in late), late
    down = first_after(c.events(old, "state change"), resumed_at - 0.5,
                       lambda r: r["previous"].startswith("primary") and r["previous"].endswith(f"term {old_term}"))
    assert down is not None and down["now"] == f"connecting term {old_term}", down
    assert c.leader() == (c.ids[new], new_term)


def test_sigterm_primary_hands_over_fast(ha):
    """A graceful stop revokes the lease: a backup wins at once, not a TTL later."""
    c = ha(3)
    old = c.wait_settled()
    c.create_queue(old, "q")
    sender = NumberedSender([c[old].url], "q", count=500, time_limit=60).start()
    assert sender.join(60) and sender.done, (sender.accepted_count, sender.errors)

    others = [i for i in range(3) if i != old]
    signalled_at, signalled_mono = time.time(), time.monotonic()
    c[old].signal(signal.SIGTERM)
    new, seen_at = c.wait_new_primary(others, timeout=TTL + 5)
    polled = seen_at - signalled_mono
    won = first_after(c.events(new, "won the election"), signalled_at)
    stopping = first_after(c.events(old, "node stopping"), signalled_at)
    assert won is not None and stopping is not None
    logged = log_time(won) - signalled_at
    print(f"\nSIGTERM handover: {c.ids[new]} won {logged * 1000:.0f} ms after SIGTERM "
          f"({(log_time(won) - log_time(stopping)) * 1000:.0f} ms after the old primary began stopping; "
          f"seen by polling after {polled:.2f} s)")
    assert logged < 1.0, f"graceful handover took {logged:.2f} s: the lease was not revoked?"
    assert c[old].proc.wait(10) == 0

    survivor = next(i for i in others if i != new)
    c.wait_following(survivor, new)
    receiver = drain([c[new].url], "q", sender.accepted_set, time_limit=30)
    assert not receiver.missing(sender.accepted_set)


def test_operator_promote_hands_over_to_a_backup(ha):
    """``hastandby promote -b BACKUP``: the primary steps down, the backup takes over, nothing lost."""
    c = ha(3)
    old = c.wait_settled()
    old_term = c.status(old)["term"]
    c.create_queue(old, "q")
    sender = NumberedSender([c[old].url], "q", count=500, time_limit=60).start()
    assert sender.join(60) and sender.done, (sender.accepted_count, sender.errors)

    target = (old + 1) % 3
    third = (old + 2) % 3
    started_at, started = time.time(), time.monotonic()
    result = hastandby("promote", "-b", c[target].address)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    status = c.status(target)
    assert status["state"] == "primary" and status["term"] > old_term, status
    assert result.stdout.strip() == f"{c[target].address} is primary (term {status['term']})"
    won = first_after(c.events(target, "won the election"), started_at)
    demoted = first_after(c.events(old, "state change"), started_at, lambda r: r["trigger"] == "demoted")
    assert won is not None and demoted is not None
    assert demoted["previous"].startswith("primary") and demoted["now"].startswith("connecting"), demoted
    print(f"\noperator handover: {c.ids[target]} won {log_time(won) - started_at:.2f} s after the promote "
          f"command started ({(log_time(won) - log_time(demoted)) * 1000:.0f} ms after the old primary "
          f"stepped down); the command returned after {took:.2f} s")

    assert c.leader() == (c.ids[target], status["term"])
    for index in (old, third):
        follower = c.wait_following(index, target)
        assert follower["term"] == status["term"], follower
    again = hastandby("promote", "-b", c[target].address)
    assert again.returncode == 0 and "is primary" in again.stdout, again

    receiver = drain([c[target].url], "q", sender.accepted_set, time_limit=30)
    assert not receiver.missing(sender.accepted_set)


# -- DR: the replica site is an etcd cluster ---------------------------------------------------------


def test_dr_replication_survives_replica_cluster_failover(ha, node_factory):
    """The replica is an HA primary; kill -9 it and the new primary takes both replications over
    from etcd: the full replica converges, the enqueue replica gets each message exactly once."""
    from hastandby.testing.clients import browse, receive, send

    source = node_factory(name="dr-source")
    cluster = ha(2)
    primary = cluster.wait_settled()
    other = 1 - primary
    cluster.wait_following(other, primary)
    for queue, mode in (("qf", "full"), ("qe", "enqueue")):
        subprocess.run([sys.executable, "-m", "hastandby", "add", "queue", queue, "-b", source.address],
                       cwd=REPO, check=True, timeout=30)
        result = subprocess.run([sys.executable, "-m", "hastandby", "replicate", "-b",
                                 cluster[primary].address, source.address, queue, "--create", "--mode", mode],
                                cwd=REPO, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0 and "live" in result.stdout, result.stdout + result.stderr
        send(source.address, queue, [Message(body=f"{queue}{i}") for i in range(100)])
    receive(source.address, "qf", 40)

    def replica_bodies(index: int, queue: str) -> list[str]:
        return [m.body for m in browse(cluster[index].address, queue, 500, timeout=0.5, admin=True)]

    def wait_bodies(index: int, queue: str, expected: list[str]) -> None:
        deadline = time.monotonic() + 30
        seen: list[str] = []
        while time.monotonic() < deadline:
            seen = replica_bodies(index, queue)
            if seen == expected:
                return
            time.sleep(0.2)
        raise AssertionError(f"{queue} on {cluster.ids[index]}: {seen[:5]}... ({len(seen)}) != {len(expected)}")

    wait_bodies(other, "qf", [f"qf{i}" for i in range(40, 100)])  # the backup holds the replicas too
    wait_bodies(other, "qe", [f"qe{i}" for i in range(100)])
    cluster[primary].kill()
    new_primary, _ = cluster.wait_new_primary([other], timeout=20)
    for queue in ("qf", "qe"):
        send(source.address, queue, [Message(body=f"{queue}{i}") for i in range(100, 150)])
    receive(source.address, "qf", 10)
    wait_bodies(new_primary, "qf", [f"qf{i}" for i in range(50, 150)])
    wait_bodies(new_primary, "qe", [f"qe{i}" for i in range(150)])
    status = cluster.status(new_primary)
    assert {r["queue"]: r["state"] for r in status["replication"]["replicas"]} == {"qf": "live", "qe": "live"}
