"""When a queue's messages arrived, sampled, to tell how old a replica's lag is.

Used by every replicating browser (``replication/subscription.py``: hot-standby
backups and DR full mode) and by the DR tap feeder (``dr/source.py``).  The
browsers of one queue take their samples from one ``ArrivalFeed``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from hastandby.broker.queues.queue import Queue

RESOLUTION = 0.005  # seconds between two samples


class Arrivals:
    """When messages arrived, oldest first, to tell how old the replica's lag is.

    One sample per ``resolution`` seconds, not one per message: on the hot path
    a message then costs a clock read, and the age is off by at most that much.
    """

    def __init__(self, resolution: float = RESOLUTION) -> None:
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

    def sample(self, msg_id: int, now: float) -> None:
        """Note an arrival sampled elsewhere (``ArrivalFeed``)."""
        self._last = now
        self._times.append((msg_id, now))

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


class ArrivalFeed:
    """One queue's arrivals, sampled once for all the ``Arrivals`` that follow it (its replicas').

    Each replicating browser keeps its own samples, dropped as its replica
    acknowledges them; sampled by each browser, every message cost every
    backup an observer call and a clock read.  The feed is the queue's one
    observer for all of them.
    """

    follows_acquisitions = False  # QueueObserver: enqueues only

    def __init__(self, queue: "Queue", resolution: float = RESOLUTION) -> None:
        self.queue = queue
        self._followers: list[tuple[Arrivals, Callable[[int], bool]]] = []  # rebound, never changed in place
        self._resolution = resolution
        self._last = -resolution

    @staticmethod
    def of(queue: "Queue") -> "ArrivalFeed":
        """The queue's feed (a new one, not yet observing, if it has none)."""
        return queue.observer_of(ArrivalFeed) or ArrivalFeed(queue)

    def follow(self, arrivals: Arrivals, done: Callable[[int], bool]) -> None:
        """Sample into ``arrivals`` from now on, dropping its samples that ``done`` holds for as it goes."""
        if not self._followers:
            self.queue.add_observer(self)
        self._followers = [*self._followers, (arrivals, done)]

    def unfollow(self, arrivals: Arrivals) -> None:
        self._followers = [f for f in self._followers if f[0] is not arrivals]
        if not self._followers:
            self.queue.remove_observer(self)

    def enqueued(self, queue: "Queue", msg_id: int, data: bytes, completion: Any) -> None:
        now = time.monotonic()
        if now - self._last >= self._resolution:
            self._last = now
            for arrivals, done in self._followers:
                arrivals.sample(msg_id, now)
                # Drop the samples the replica is done with, or a primary nobody asks for
                # its lag would keep every sample it ever took.
                arrivals.oldest(done)
