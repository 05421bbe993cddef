"""Until when a node may take producers' messages and acknowledge them.

A standalone node always may.  An HA primary elected through etcd may only
while its lease is confirmed with a margin: past that moment another node
may already be primary (its lease can expire on etcd's side).  The
coordinator moves ``until`` forward on every confirmed lease refresh and
sets it to the past when the lease is lost, from its own thread; the broker
reads it on the reactor thread for every producer's transfer and
acknowledgement.  A float attribute read and written whole needs no lock,
and one clock read per message costs far less than a locked query.

A node past its fence takes no producer message into a queue at all: a
message it enqueued but could not acknowledge would get a replication id
that the next primary may give to another message (``lineage.py``), and
nothing good can come of it.
"""

from __future__ import annotations

import math
import time


class Fence:
    """``time.monotonic()`` deadline for taking and acknowledging producers' messages."""

    __slots__ = ("until",)

    def __init__(self, until: float = math.inf) -> None:
        self.until = until

    def allows(self) -> bool:
        return time.monotonic() <= self.until

    def close(self) -> None:
        self.until = -math.inf
