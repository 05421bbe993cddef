"""Which refused connections get a log line of their own, so that a flood of them cannot fill the disk.

Every connection refused before it authenticates (a wrong password, a
protocol error, a limit at accept) used to get a warning line: a few hundred
lines a second for as long as anyone cared to send bad logins.  Now a
refusal gets its own line while its source has had fewer than
``per_source`` in the current interval and the node fewer than
``per_node``; the others are counted, and at the end of the interval one
summary per source says how many went unlogged and the last reason (at most
``per_node`` sources are named; the rest are summed together).  So an
interval writes at most about ``2 * per_node + 1`` lines whatever comes in,
and the first refusals of every source, the ones worth reading, are whole.

Pure logic with an injected clock; the caller logs what it is told.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Callable

PER_SOURCE = 5
PER_NODE = 100
INTERVAL = 60.0  # seconds


@dataclass
class _Unlogged:
    count: int = 0
    last_reason: str = ""


@dataclass(frozen=True)
class Summary:
    """Refusals of one source (``source`` None: of every source not named) that had no line of their own."""

    source: str | None
    unlogged: int
    last_reason: str


class RefusalLog:
    """Decides per refusal whether it is logged whole, and sums up the rest once per interval."""

    def __init__(self, per_source: int = PER_SOURCE, per_node: int = PER_NODE, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_source = per_source
        self.per_node = per_node
        self.interval = interval
        self.clock = clock
        self._started = clock()
        self._logged: collections.Counter[str] = collections.Counter()  # lines of their own, per source
        self._logged_total = 0
        self._unlogged: dict[str, _Unlogged] = {}
        self._others = _Unlogged()  # of the sources past the ``per_node`` named ones

    def note(self, source: str, reason: str) -> bool:
        """A refusal from ``source``: True if it gets a line of its own."""
        if self._logged_total < self.per_node and self._logged.get(source, 0) < self.per_source:
            self._logged[source] += 1
            self._logged_total += 1
            return True
        entry = self._unlogged.get(source)
        if entry is None:
            entry = self._others if len(self._unlogged) >= self.per_node else self._unlogged.setdefault(
                source, _Unlogged())
        entry.count += 1
        entry.last_reason = reason
        return False

    def summaries(self) -> list[Summary]:
        """Once the interval is over: what went unlogged in it (and a new interval begins); else nothing."""
        now = self.clock()
        if now - self._started < self.interval:
            return []
        result = [Summary(source, entry.count, entry.last_reason) for source, entry in self._unlogged.items()]
        if self._others.count:
            result.append(Summary(None, self._others.count, self._others.last_reason))
        self._started = now
        self._logged.clear()
        self._logged_total = 0
        self._unlogged.clear()
        self._others = _Unlogged()
        return result
