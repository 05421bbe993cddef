"""At most so many of something per second from one source address: how long the next one waits.

For TLS handshakes.  Each makes the node do a private-key operation (on its
login pool, but CPU all the same), and a client may make them as fast as it
likes without ever trying to log in, so the failed-login throttle never
sees it.  A token bucket per source: ``rate`` a second, in bursts of up to
``rate``; one past it waits (its connection is held unread, as a throttled
source's are) until its turn.  A host opening many TLS connections at once
(an application's connection pool) gets a second's worth at once and the
rest at ``rate`` a second.

At most ``max_sources`` addresses are tracked, the one seen longest ago
going first; pure logic with an injected clock.
"""

from __future__ import annotations

import collections
import time
from typing import Callable

MAX_SOURCES = 100_000


class SourceRate:
    """A token bucket per source address."""

    def __init__(self, rate: float, max_sources: int = MAX_SOURCES, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate  # 0: no bound
        self.max_sources = max_sources
        self.clock = clock
        self._sources: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()  # tokens, when

    def wait(self, source: str) -> float:
        """One more from ``source``: seconds it waits for its turn (0: none)."""
        if not self.rate:
            return 0.0
        now = self.clock()
        tokens, then = self._sources.pop(source, (self.rate, now))
        tokens = min(self.rate, tokens + (now - then) * self.rate) - 1
        self._sources[source] = (tokens, now)
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)
        return 0.0 if tokens >= 0 else -tokens / self.rate

    def forget_full(self) -> None:
        """Drop the sources whose bucket has filled up again (they would start afresh anyway)."""
        now = self.clock()
        while self._sources:
            source, (tokens, then) = next(iter(self._sources.items()))
            if tokens + (now - then) * self.rate < self.rate:
                return
            del self._sources[source]
