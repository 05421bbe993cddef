"""When a queue's messages arrived, sampled, to tell how old a replica's lag is.

Used by every replicating browser (``replication/subscription.py``: hot-standby
backups and DR full mode) and by the DR tap feeder (``dr/source.py``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable


class Arrivals:
    """When messages arrived, oldest first, to tell how old the replica's lag is.

    One sample per ``resolution`` seconds, not one per message: on the hot path
    a message then costs a clock read, and the age is off by at most that much.
    """

    def __init__(self, resolution: float = 0.005) -> None:
        self._times: deque[tuple[int, float]] = deque()
        self._resolution = resolution
        self._last = -resolution

    def add(self, msg_id: int) -> bool:
        """Note an arrival; True if it was sampled (at most once per ``resolution``)."""
        now = time.monotonic()
        if now - self._last >= self._resolution:
            self._last = now
            self._times.append((msg_id, now))
            return True
        return False

    def oldest(self, done: Callable[[int], bool]) -> tuple[int, float] | None:
        """The oldest (id, arrival) that ``done(id)`` does not hold for yet."""
        times = self._times
        while times and done(times[0][0]):
            times.popleft()
        return times[0] if times else None

    def age(self, done: Callable[[int], bool]) -> float:
        """Seconds since the oldest arrival not done yet."""
        oldest = self.oldest(done)
        return round(time.monotonic() - oldest[1], 3) if oldest else 0.0
