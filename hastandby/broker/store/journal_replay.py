"""What one queue's journal records add up to: the replay behind ``Journal.recover``.

A restarted backup reads a million messages back before it can offer what it
holds, so the replay must not do Python work per message beyond what decoding
already does.  Ids are given out in increasing order and journaled in that
order, so the common case is kept in its cheapest form: the ids and payloads
as two lists that runs are appended to, and the dequeues as an ``IdSet`` of
removed ids, cut out of the lists once at the end (a FIFO queue's dequeues are
a few ranges).  A run that is not strictly above everything held (a backup
that took a retransmission, an id enqueued again after its dequeue) turns the
queue into a dict by id, the general form, for the rest of the replay.
Ttls come from the ``EXPIRY`` records beside the runs, kept per id for the
few messages that have one.

Pure logic, no I/O: the records come decoded from ``journal_format``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import islice
from operator import lt

from hastandby.broker.queues.idset import IdSet


class QueueReplay:
    """One queue's messages as its records, replayed in order, leave them."""

    __slots__ = ("_ids", "_payloads", "_removed", "_by_id", "_ttls", "_counts", "message_ids")

    def __init__(self) -> None:
        self._ids: list[int] = []  # strictly increasing while _by_id is None
        self._payloads: list[bytes] = []
        self._removed = IdSet()  # dequeued ids, all at most _ids[-1]
        self._by_id: dict[int, bytes] | None = None  # the general form, once a run went back
        self._ttls: dict[int, int] = {}  # id -> ttl (ms) of the messages that have one
        self._counts: dict[int, int] = {}  # id -> delivery-count of the messages whose delivery failed
        self.message_ids: dict[bytes, int] = {}  # a deduplicating queue's remembered ids: key -> ms (the latest)

    def enqueue(self, ids: list[int], payloads: list[bytes]) -> None:
        """Messages enqueued in this order (a later enqueue of a held id replaces its payload)."""
        if not ids:
            return
        if self._ttls:  # an id enqueued again has the ttl of its new record, if any
            for msg_id in ids:
                self._ttls.pop(msg_id, None)
        if self._counts:  # ... and no failed delivery yet
            for msg_id in ids:
                self._counts.pop(msg_id, None)
        by_id = self._by_id
        if by_id is None and (not self._ids or ids[0] > self._ids[-1]) and _increasing(ids):
            self._ids += ids
            self._payloads += payloads
            return
        if by_id is None:
            by_id = self._general()
        by_id.update(zip(ids, payloads))

    def expire(self, ttls: list[tuple[int, int]]) -> None:
        """The ttls (id, milliseconds) of messages just enqueued."""
        self._ttls.update(ttls)

    def remember(self, entries: list[tuple[bytes, int]]) -> None:
        """Message-ids (key, ms) a deduplicating queue remembered; the latest time for a key wins."""
        message_ids = self.message_ids
        for key, ms in entries:
            if message_ids.get(key, -1) < ms:
                message_ids[key] = ms

    def count(self, counts: list[tuple[int, int]]) -> None:
        """Delivery-counts (id, count) of messages held; the last one for an id wins."""
        self._counts.update(counts)

    def counts(self, ids: list[int]) -> dict[int, int]:
        """The delivery-counts of the messages ``ids`` (the held ones, ``result``'s) that have one."""
        found: dict[int, int] = {}
        for msg_id, count in self._counts.items():
            at = bisect_left(ids, msg_id)
            if count and at < len(ids) and ids[at] == msg_id:
                found[msg_id] = count
        return found

    def dequeue(self, ranges: list[tuple[int, int]]) -> None:
        """Messages dequeued: closed ranges of ids (ids not held are ignored)."""
        if self._by_id is not None:
            _remove(self._by_id, ranges)
            return
        if not self._ids:
            return
        last = self._ids[-1]
        for lo, hi in ranges:
            lo, hi = max(lo, 1), min(hi, last)  # above last nothing is held yet: a later enqueue must survive
            if lo <= hi:
                self._removed.add_range(lo, hi)

    def result(self) -> tuple[list[int], list[bytes], dict[int, int]]:
        """The messages held, in increasing id order, and the ttls of those that have one: (ids, payloads, ttls)."""
        ids, payloads = self._messages()
        ttls: dict[int, int] = {}
        for msg_id, ttl in self._ttls.items():
            at = bisect_left(ids, msg_id)
            if at < len(ids) and ids[at] == msg_id:
                ttls[msg_id] = ttl
        return ids, payloads, ttls

    def _messages(self) -> tuple[list[int], list[bytes]]:
        if self._by_id is not None:
            ids = sorted(self._by_id)
            return ids, [self._by_id[msg_id] for msg_id in ids]
        ids, payloads = self._ids, self._payloads
        if not self._removed:
            return ids, payloads
        kept_ids: list[int] = []
        kept_payloads: list[bytes] = []
        start = 0
        for lo, hi in self._removed.ranges():
            cut = bisect_left(ids, lo, start)
            kept_ids += ids[start:cut]
            kept_payloads += payloads[start:cut]
            start = bisect_right(ids, hi, cut)
        kept_ids += ids[start:]
        kept_payloads += payloads[start:]
        return kept_ids, kept_payloads

    def _general(self) -> dict[int, bytes]:
        ids, payloads = self._messages()
        self._by_id = dict(zip(ids, payloads))
        self._ids, self._payloads, self._removed = [], [], IdSet()
        return self._by_id


def _increasing(ids: list[int]) -> bool:
    """Strictly increasing, checked in C (one comparison per pair, no list built)."""
    return all(map(lt, ids, islice(ids, 1, None)))


def _remove(messages: dict[int, bytes], ranges: list[tuple[int, int]]) -> None:
    """Drop the ids in ``ranges``, in time linear in what is dropped or held, whichever is less."""
    for lo, hi in ranges:
        if hi - lo < len(messages):
            for msg_id in range(lo, hi + 1):
                messages.pop(msg_id, None)
        else:
            for msg_id in [i for i in messages if lo <= i <= hi]:
                del messages[msg_id]
