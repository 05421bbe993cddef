"""Deciding logins without stalling the node: what a client that cannot log in may cost it.

The driver's handshakes (``broker/transport/handshake.py``) come here for three things:

- ``wait_for``: how long a connection just accepted from a source waits
  before the node reads it at all: as long as that source has earned by
  failing to log in (``LoginThrottle``), and for TLS, until its turn among
  that source's TLS handshakes (``SourceRate``).  Its bytes wait in the
  kernel meanwhile: a held connection costs an accept and a timer, no work.
- ``verify``: the SASL step that decides a password login pauses
  (``sasl.Verification``).  For PLAIN, the ``LoginCache`` answers at once
  when the same user and password logged in before under the same users;
  else the password is checked on the ``LoginPool`` (PBKDF2 off the reactor
  thread), against a decoy secret for an unknown user so that it costs and
  takes the same; a full pool answers "busy" (SASL outcome sys-temp).  The
  verdict comes back on the reactor thread.  One reached for a connection
  that has gone meanwhile still counts as a failure of its source, so
  closing early does not escape the throttle.
- ``failed`` and ``refused``: failed logins feed the throttle; refusals
  before authentication are logged through a ``RefusalLog`` (whole lines
  for each source's first few, then one summary per source per interval).

``describe`` is the ``logins`` section of the node's status, and of its
metrics (failed logins, throttled sources).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import structlog

from hastandby.security.login_cache import LoginCache
from hastandby.security.login_pool import LoginPool
from hastandby.security.login_throttle import LoginThrottle
from hastandby.security.refusal_log import RefusalLog
from hastandby.security.sasl import Users, Verification, check_password
from hastandby.security.source_rate import SourceRate

log = structlog.get_logger("hastandby.logins")

TICK = 1.0  # seconds between summaries checks and throttle clean-ups

Verdict = Callable[[str | None, bool], None]
"""``done(refusal, busy)``: ``refusal`` None to go on, else why not; ``busy``: refused for lack of capacity."""


class VersionedUsers(Users, Protocol):
    """The users, with a number that changes whenever they do (``Credentials.generation``)."""

    generation: int


class Skipped:
    """A check not made: its connection had gone before a login thread came to it."""


SKIPPED = Skipped()


class Pending:
    """One verification under way; ``cancel`` when its connection goes, so that nothing more is done for it."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Logins:
    """The node's logins: throttle, cache, the login pool, bounded logging, counters."""

    def __init__(self, users: VersionedUsers, decoy_key: bytes, schedule: Callable[[float, Callable[[], Any]], Any],
                 pool: LoginPool, throttle: LoginThrottle | None = None, tls_rate: SourceRate | None = None,
                 cache: LoginCache | None = None, refusals: RefusalLog | None = None) -> None:
        self.users = users
        self.decoy_key = decoy_key
        self._schedule = schedule
        self.pool = pool
        self.throttle = LoginThrottle() if throttle is None else throttle
        self.tls_rate = SourceRate(0) if tls_rate is None else tls_rate
        self.cache = LoginCache() if cache is None else cache
        self.refusals = RefusalLog() if refusals is None else refusals
        self.failed_logins = 0
        self.accept_refusals: dict[str, int] = {}  # the limit -> sockets closed at accept for it
        self.busy = 0  # attempts refused because the login pool was full
        self.held = 0  # connections held unread: their source's delay, or its turn for a TLS handshake
        self._schedule(TICK, self._tick)

    def wait_for(self, source: str, tls: bool) -> float:
        """Seconds a connection just accepted from ``source`` (on a TLS port: ``tls``) waits before it is read."""
        delay = max(self.throttle.delay(source), self.tls_rate.wait(source) if tls else 0.0)
        if delay > 0:
            self.held += 1
        return delay

    def verify(self, source: str, verification: Verification, pending: Pending, done: Verdict) -> None:
        """Decide ``verification`` for a connection from ``source``: ``done`` on the reactor thread, perhaps
        before this returns; never once ``pending`` is cancelled (a failure then still counts as ``source``'s)."""
        if pending.cancelled:
            return
        user, password = verification.user, verification.password
        if password is None:  # SCRAM: its proof is checked by the SASL server itself, cheaply
            done(None, False)
            return
        generation = self.users.generation
        if self.cache.knows(user, password, generation):
            done(None, False)
            return
        secret, decoy_key = self.users.secret(user), self.decoy_key

        def check() -> str | None | Skipped:  # on a login thread
            if pending.cancelled:  # its client left while it waited: no PBKDF2 for a client that is gone
                return SKIPPED
            return check_password(secret, decoy_key, user, password)

        def checked(refusal: str | None | Skipped) -> None:  # back on the reactor thread
            if isinstance(refusal, Skipped):
                return
            if self.users.generation != generation:  # users changed while it was checked: again, against them
                self.verify(source, verification, pending, done)
                return
            if refusal is None:
                self.cache.remember(user, password, generation)
            if not pending.cancelled:
                done(refusal, False)
            elif refusal is not None:
                self.failed(source, refusal)

        if not self.pool.submit(check, checked):
            done(self.busy_refusal(), True)

    def busy_refusal(self) -> str:
        """The login pool is full: count an attempt refused for it, and say why."""
        self.busy += 1
        return f"login checks busy: {self.pool.waiting} waiting (limit login_checks)"

    def failed(self, source: str, reason: str) -> None:
        """A failed login from ``source`` (wrong credentials)."""
        self.failed_logins += 1
        if self.throttle.failed(source):
            log.warning("source throttled", source=source, failures=self.throttle.failures,
                        reason=f"{self.throttle.failures} failed logins: its next connections wait, "
                               f"{self.throttle.first_delay:g} s doubling up to {self.throttle.max_delay:g} s")

    def refused(self, source: str, peer: str, reason: str) -> None:
        """A connection from ``source`` refused before it authenticated: logged, unless its source had its share."""
        if self.refusals.note(source, reason):
            log.warning("connection not authenticated", peer=peer, reason=reason)

    def refused_at_accept(self, source: str, peer: str, limit: str, reason: str) -> None:
        """A socket closed at accept because of ``limit``."""
        self.accept_refusals[limit] = self.accept_refusals.get(limit, 0) + 1
        self.refused(source, peer, reason)

    def describe(self) -> dict[str, Any]:
        return {"failed": self.failed_logins, "throttled_sources": self.throttle.throttled(), "held": self.held,
                "busy": self.busy, "login_checks": self.pool.waiting, "cached": len(self.cache),
                "refused_at_accept": dict(self.accept_refusals)}

    def _tick(self) -> None:
        for summary in self.refusals.summaries():
            log.warning("connections not authenticated, summary", source=summary.source or "other sources",
                        unlogged=summary.unlogged, interval_s=self.refusals.interval, last_reason=summary.last_reason)
        self.throttle.forget_old()
        self.tls_rate.forget_full()
        self._schedule(TICK, self._tick)
