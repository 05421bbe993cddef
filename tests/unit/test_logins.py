"""Deciding logins off the reactor thread: the login pool, the cache, the throttle and their counters."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from hastandby.security.credentials import Credentials
from hastandby.security.login_pool import LoginPool
from hastandby.security.login_throttle import LoginThrottle
from hastandby.security.logins import Logins, Pending
from hastandby.security.sasl import Verification
from hastandby.security.source_rate import SourceRate


class Pool:
    """A login pool that runs nothing until the test says so (``run``), on the test's thread."""

    def __init__(self, limit: int = 10) -> None:
        self.limit = limit
        self.queued: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []

    @property
    def waiting(self) -> int:
        return len(self.queued)

    def submit(self, work: Callable[[], Any], done: Callable[[Any], None]) -> bool:
        if len(self.queued) >= self.limit:
            return False
        self.queued.append((work, done))
        return True

    def run(self, meanwhile: Callable[[], None] = lambda: None) -> None:
        """Do the work queued; ``meanwhile`` happens between a piece of work and its result's delivery."""
        queued, self.queued = self.queued, []
        for work, done in queued:
            result = work()
            meanwhile()
            done(result)


def logins(pool: Pool, **kwargs: Any) -> tuple[Logins, Credentials]:
    users = Credentials()
    users.add("alice", "wonder", [])
    return Logins(users, b"k" * 32, lambda delay, fn: None, pool, **kwargs), users  # type: ignore[arg-type]


def verify(gate: Logins, user: str, password: str | None, pending: Pending | None = None) -> list[Any]:
    verdicts: list[Any] = []
    gate.verify("10.0.0.1", Verification("PLAIN" if password else "SCRAM-SHA-256", user, password),
                pending or Pending(), lambda refusal, busy: verdicts.append((refusal, busy)))
    return verdicts


def test_a_password_is_checked_on_the_pool_and_a_login_that_worked_is_cached():
    pool = Pool()
    gate, _ = logins(pool)
    verdicts = verify(gate, "alice", "wonder")
    assert verdicts == [] and pool.waiting == 1  # nothing derived on this thread
    pool.run()
    assert verdicts == [(None, False)]
    assert verify(gate, "alice", "wonder") == [(None, False)] and pool.waiting == 0  # from the cache
    assert verify(gate, "alice", "wrong") == [] and pool.waiting == 1  # a wrong one is never cached
    pool.run()


def test_unknown_users_and_wrong_passwords_both_take_a_check():
    pool = Pool()
    gate, _ = logins(pool)
    unknown, wrong = verify(gate, "mallory", "x"), verify(gate, "alice", "x")
    assert pool.waiting == 2
    pool.run()
    assert unknown == [("unknown user 'mallory'", False)] and wrong == [("wrong password for user 'alice'", False)]


def test_a_check_overtaken_by_a_change_of_users_is_made_again_against_them():
    pool = Pool()
    gate, users = logins(pool)
    verdicts = verify(gate, "alice", "wonder")
    users.set_password("alice", "land")
    pool.run()  # right against the old secret: checked again
    assert verdicts == [] and pool.waiting == 1
    pool.run()
    assert verdicts == [("wrong password for user 'alice'", False)] and len(gate.cache) == 0


def test_a_verdict_nobody_waits_for_still_counts_against_its_source():
    pool = Pool()
    gate, _ = logins(pool, throttle=LoginThrottle(failures=1))
    pending = Pending()
    verdicts = verify(gate, "alice", "guess", pending)
    pool.run(meanwhile=pending.cancel)  # the client hung up while its password was checked
    assert verdicts == [] and gate.failed_logins == 1 and gate.throttle.delay("10.0.0.1") > 0
    assert verify(gate, "alice", "wonder", pending) == [] and pool.waiting == 0  # nothing started once cancelled


def test_a_full_pool_answers_busy_and_scram_needs_no_pool():
    pool = Pool(limit=1)
    gate, _ = logins(pool)
    verify(gate, "alice", "x")
    assert verify(gate, "alice", "y") == [("login checks busy: 1 waiting (limit login_checks)", True)]
    assert gate.busy == 1
    assert verify(gate, "alice", None) == [(None, False)]  # SCRAM: its proof is checked by the SASL server


def test_connections_wait_for_their_source_s_failures_and_tls_rate():
    gate, _ = logins(Pool(), throttle=LoginThrottle(failures=2), tls_rate=SourceRate(1))
    assert gate.wait_for("10.0.0.1", tls=False) == 0
    gate.failed("10.0.0.1", "wrong password")
    gate.failed("10.0.0.1", "wrong password")
    assert gate.wait_for("10.0.0.1", tls=False) > 0 and gate.wait_for("10.0.0.2", tls=False) == 0
    assert gate.wait_for("10.0.0.2", tls=True) == 0 and gate.wait_for("10.0.0.2", tls=True) > 0
    assert gate.describe()["throttled_sources"] == 1 and gate.describe()["held"] == 2


def test_the_login_pool_works_off_the_calling_thread_bounded():
    results: queue.Queue[Callable[[], None]] = queue.Queue()
    pool = LoginPool(results.put, workers=1, limit=2)
    release = threading.Event()
    done: list[Any] = []
    try:
        assert pool.submit(lambda: release.wait(5) and threading.get_ident(), done.append)
        assert pool.submit(lambda: threading.get_ident(), done.append)
        assert not pool.submit(lambda: None, done.append) and pool.waiting == 2  # full: refused, not queued
        release.set()
        for _ in range(2):
            results.get(timeout=5)()  # the reactor thread runs what the pool hands back
        assert pool.waiting == 0 and len(done) == 2 and threading.get_ident() not in done
    finally:
        release.set()
        pool.close()


def test_a_check_whose_client_left_before_its_turn_is_not_made():
    pool = Pool()
    gate, _ = logins(pool)
    pending = Pending()
    verdicts = verify(gate, "alice", "guess", pending)
    pending.cancel()  # gone while it waited for a login thread
    pool.run()
    assert verdicts == [] and gate.failed_logins == 0  # no PBKDF2, and nothing learned to count
