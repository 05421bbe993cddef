"""Failed logins per source address, and how long that source's next attempts wait.

Anyone who can reach the port may try passwords.  After ``failures`` failed
logins from one address, each of its later attempts is answered only after
a delay that doubles with every further failure, from ``first_delay`` up to
``max_delay``: guessing from one address slows to a handful of tries per
delay (as many as it may have handshakes open: ``Limits.handshakes_per_source``),
and its attempts wait on a timer instead of costing the node a password
check each.  The right password still gets in, after the delay: the
throttle slows guessing, it locks no one out.

A source's failures are forgotten ``window`` seconds after its last one.  A
successful login from the source does not forget them: it would let anyone
who knows one account's password reset the count while guessing another's.
At most ``max_sources`` addresses are tracked; past that the one whose last
failure is oldest goes first.

Pure logic with an injected clock (the node passes ``time.monotonic``).
"""

from __future__ import annotations

import collections
import time
from typing import Callable

FAILURES = 5
WINDOW = 60.0  # seconds after a source's last failure that its failures are forgotten
FIRST_DELAY = 0.1  # seconds, once a source has had ``FAILURES`` failures; doubled by each failure after
MAX_DELAY = 5.0
MAX_SOURCES = 100_000


class LoginThrottle:
    """Failed logins per source, and the delay they have earned it."""

    def __init__(self, failures: int = FAILURES, max_delay: float = MAX_DELAY, window: float = WINDOW,
                 first_delay: float = FIRST_DELAY, max_sources: int = MAX_SOURCES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures  # 0: no throttle
        self.max_delay = max_delay
        self.window = window
        self.first_delay = min(first_delay, max_delay)
        self.max_sources = max_sources
        self.clock = clock
        # source -> [failures, time of the last one], the source failed longest ago first
        self._sources: collections.OrderedDict[str, list[float]] = collections.OrderedDict()

    def _record(self, source: str, now: float) -> list[float] | None:
        record = self._sources.get(source)
        if record is not None and now - record[1] > self.window:
            del self._sources[source]
            return None
        return record

    def delay(self, source: str) -> float:
        """Seconds an attempt from ``source`` waits before it is checked (0: none)."""
        if not self.failures:
            return 0.0
        record = self._record(source, self.clock())
        if record is None or record[0] < self.failures:
            return 0.0
        return min(self.max_delay, self.first_delay * 2 ** (record[0] - self.failures))

    def failed(self, source: str) -> bool:
        """A failed login from ``source``; True if that makes the source throttled (its first delay)."""
        now = self.clock()
        record = self._record(source, now)
        if record is None:
            record = self._sources[source] = [0, now]
        record[0] += 1
        record[1] = now
        self._sources.move_to_end(source)
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)
        return bool(self.failures) and record[0] == self.failures

    def throttled(self) -> int:
        """Sources whose next attempt would wait."""
        self.forget_old()
        return sum(1 for failures, _ in self._sources.values() if self.failures and failures >= self.failures)

    def forget_old(self) -> None:
        """Drop the sources whose last failure is older than the window."""
        now = self.clock()
        while self._sources:
            source, (_, last) = next(iter(self._sources.items()))
            if now - last <= self.window:
                return
            del self._sources[source]
