"""An outgoing link that sends a queue's messages in batches, one delivery each.

Replication links (hot-standby subscriptions, DR source links) carry every
message of a queue to one peer that stores it and says so.  Sent a delivery
each, a message cost the sender a delivery, a disposition back and a settle,
and the Python call for each: with one backup a primary took producers at
about 0.55 of a standalone node's rate.  Batched, those costs are paid once
per batch, and a primary with one backup took them at 0.80-0.98 of
standalone (``benchmarks.ha_throughput``, two runs of five rounds).

The queue hands over a message (``deliver``) or a run of them
(``deliver_run``).  The batch is sent when full, or else once the current
pass of engine events is done (``Driver.after_events``), so a lone message
waits for no timer; a link that may ``linger`` sends it up to that long
after its first message instead (an asynchronous DR link: no producer waits
for it, and fuller batches cost the source less).  Link credit counts
batches; the queue sees credit in messages (``BATCH_MESSAGES`` per batch of
link credit).

A batch is acknowledged one of two ways, chosen per link:

- settled by the peer (``accepted``): the whole batch is stored;
- *cumulative*: sent pre-settled, and the peer reports "stored every message
  up to id N" on another link (DR's ``$dr.ack``), which ``acknowledged`` takes.

Either way ``stored(ids)`` tells the subclass which messages the peer holds.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from typing import Any, Sequence, cast

from proton import Link

from hastandby.broker.transport.driver import Driver
from hastandby.broker.links import (
    OutgoingLink,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_link_credit,
    send_payload,
)
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Registry

from hastandby.replication.codec import BATCH_TAG, encode_batch

BATCH_MESSAGES = 1000
"""At most this many messages per batch, and (below) about this many bytes:
bounds what one link credit lets the sender put in flight."""
BATCH_BYTES = 256 * 1024


class BatchingLink(OutgoingLink):
    """Sends what the queue delivers as batches and tracks which messages the peer has stored."""

    def __init__(
        self, link: Link, queue: Queue, registry: Registry, driver: Driver, browsing: bool, cumulative: bool,
        linger: float = 0.0,
    ) -> None:
        super().__init__(link, queue, registry, browsing=browsing)
        self.driver = driver
        self.cumulative = cumulative
        self.linger = linger
        # ``awaiting_accept`` holds the ids of batches awaiting their
        # accept; ``unacked`` the pre-settled batches awaiting a cumulative
        # acknowledgement, in id order, ``unacked_count`` the messages in them.
        self.awaiting_accept: set[int] = set()
        self.unacked: deque[list[int]] = deque()
        self.unacked_count = 0
        # The ids of each unsettled batch by its C delivery (which hashes by
        # address): an accept names its messages without decoding anything.
        self._batches: dict[Any, list[int]] = {}
        self.batch_ids: list[int] = []  # the batch being filled
        self._batch_data: list[bytes] = []
        self._batch_bytes = 0
        self._batch_due = False  # a send of the batch is scheduled

    # -- sending ---------------------------------------------------------------------------

    def deliver(self, queue: Queue, msg_id: int, data: bytes, delivery_count: int) -> None:
        """Add a message to the batch; the producer's bytes go unchanged (replicas store them)."""
        self.batch_ids.append(msg_id)
        self._batch_data.append(data)
        self._batch_bytes += len(data)
        self.credit -= 1
        if len(self.batch_ids) >= BATCH_MESSAGES or self._batch_bytes >= BATCH_BYTES:
            self.send_batch()
        elif not self._batch_due:
            self._send_later()

    def deliver_run(self, queue: Queue, ids: Sequence[int], payloads: list[bytes | None]) -> None:
        """``deliver`` for a run of messages at once: the queue hands over a browse
        (``Queue._dispatch_browser``) in one call, which took the per-message
        call off the DR source's bill.  From a hole (a removed message) on, the
        run goes message by message."""
        start, count = 0, len(ids)
        while start < count:
            stop = start + BATCH_MESSAGES - len(self.batch_ids)
            chunk = payloads[start:stop]
            try:
                size = sum(map(len, chunk))  # type: ignore[arg-type]
            except TypeError:  # len(None): no separate scan for holes on the hot path
                self.deliver_each(queue, ids[start:], payloads[start:])
                return
            whole = cast("list[bytes]", chunk)  # no hole in it: len() found none
            if self._batch_bytes + size >= BATCH_BYTES:  # large messages: let deliver cut the batch
                for msg_id, payload in zip(ids[start:stop], whole):
                    self.deliver(queue, msg_id, payload, 0)
            else:
                self.batch_ids.extend(ids[start:stop])
                self._batch_data.extend(whole)
                self._batch_bytes += size
                self.credit -= len(whole)
                if len(self.batch_ids) >= BATCH_MESSAGES:
                    self.send_batch()
            start = stop
        if self.batch_ids and not self._batch_due:
            self._send_later()

    def _send_later(self) -> None:
        """Send the batch just started once this pass of events is done, or ``linger`` seconds from now."""
        self._batch_due = True
        if self.linger:
            self.driver.schedule(self.linger, self._send_due_batch)
        else:
            self.driver.after_events(self._send_due_batch)

    def _send_due_batch(self) -> None:
        self._batch_due = False
        self.send_batch()

    def send_batch(self) -> None:
        """Send the batch being filled, if any (before anything else goes on the link)."""
        ids = self.batch_ids
        if not ids or self.closed:
            return
        data = encode_batch(ids, self._batch_data)
        self.batch_ids, self._batch_data, self._batch_bytes = [], [], 0
        delivery = send_payload(self._impl, BATCH_TAG + b"%d" % ids[0], data)
        if self.cumulative:
            pn_delivery_settle(delivery)
            self.unacked.append(ids)
            self.unacked_count += len(ids)
        else:
            self._batches[delivery] = ids
            self.awaiting_accept.update(ids)
        self.count_credit()

    def count_credit(self) -> None:
        """Messages the queue may still give us: whole batches the link has credit for."""
        self.credit = pn_link_credit(self._impl) * BATCH_MESSAGES - len(self.batch_ids)

    def flow(self) -> None:
        self.count_credit()
        self.queue.dispatch()

    # -- the peer's acknowledgements ----------------------------------------------------------

    def on_delivery(self, delivery: Any) -> None:
        """The peer settled a batch: it stored every message in it."""
        if not pn_delivery_settled(delivery) and not pn_delivery_remote_state(delivery):
            return
        pn_delivery_settle(delivery)
        ids = self._batches.pop(delivery, None)
        if ids is not None:
            self.awaiting_accept.difference_update(ids)
            self.stored(ids)

    def acknowledged(self, through: int) -> None:
        """The peer stored every message up to ``through`` (a cumulative acknowledgement)."""
        unacked = self.unacked
        while unacked and unacked[0][0] <= through:
            ids = unacked.popleft()
            if ids[-1] > through:  # part of a batch (not what a replica sends, but allowed)
                cut = bisect_right(ids, through)
                ids, rest = ids[:cut], ids[cut:]
                unacked.appendleft(rest)
            self.unacked_count -= len(ids)
            self.stored(ids)

    def stored(self, ids: list[int]) -> None:
        """The peer holds the messages ``ids`` (ascending) for good."""
        raise NotImplementedError

    def forget_sent(self) -> list[int]:
        """The link is gone: the ids of every message given to it that the peer did not acknowledge."""
        ids = sorted(self.awaiting_accept.union(self.batch_ids, *self.unacked))
        self.awaiting_accept.clear()
        self.unacked.clear()
        self.unacked_count = 0
        self._batches.clear()
        self.batch_ids, self._batch_data, self._batch_bytes = [], [], 0
        return ids
