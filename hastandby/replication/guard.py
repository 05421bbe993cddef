"""Holding a producer's acknowledgement until one backup has the message (Qpid's QueueGuard).

The primary keeps one guard per (replicated queue, backup).  A guard holds the
ingress ``Completion`` of every message enqueued after it was attached, so the
producer is told ``accepted`` only once each guarding backup has the message.
A guard can exist before the backup subscribes: guards made at queue creation
or at promotion protect messages that arrive before the backup's replicating
subscription does.

Messages enqueued before the guard were possibly acknowledged already; they
are the catch-up a backup must finish before it is ready.  ``first_id`` marks
that boundary: the guard attaches itself to the queue *before* reading the
queue's next id, so no message can slip between the two (QPID-4159).

A held message is released exactly once, by whichever comes first:
``complete`` (the backup accepted it), a dequeue on the primary (consumed before
the backup got it: no need to wait), ``skip`` (the backup already had it), or
``cancel`` (the backup is gone: release everything and stop guarding).
"""

from __future__ import annotations

from hastandby.broker.completion import Completion
from hastandby.broker.idset import IdSet
from hastandby.broker.queue import Queue


class QueueGuard:
    """Delays completion of new messages on one queue until one backup has them."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._held: dict[int, Completion] = {}
        self._attached = True
        queue.add_observer(self)
        self.first_id = queue.next_id

    @property
    def pending(self) -> int:
        """How many messages this guard still holds back."""
        return len(self._held)

    def is_guarded(self, msg_id: int) -> bool:
        return msg_id in self._held

    def complete(self, msg_id: int) -> None:
        """The backup accepted ``msg_id`` (once per replicated message: ``_release`` inlined)."""
        completion = self._held.pop(msg_id, None)
        if completion is not None:
            completion.release()

    def skip(self, msg_id: int) -> None:
        """The backup already holds ``msg_id`` (catch-up), so it will not be sent."""
        self._release(msg_id)

    def skip_all(self, ids: IdSet) -> None:
        """``skip`` every id of ``ids``, walking whichever is smaller: the held messages or ``ids``
        (a restarted backup may hold a million messages and the guard only a few)."""
        held = self._held
        if len(ids) <= len(held):
            for msg_id in ids:
                self._release(msg_id)
        else:
            for msg_id in [msg_id for msg_id in held if msg_id in ids]:
                self._release(msg_id)

    def cancel(self) -> None:
        """The backup is dropped: release every held message and stop following the queue."""
        if self._attached:
            self._attached = False
            self.queue.remove_observer(self)
        held, self._held = self._held, {}
        for completion in held.values():
            completion.release()

    def _release(self, msg_id: int) -> None:
        completion = self._held.pop(msg_id, None)
        if completion is not None:
            completion.release()

    # -- QueueObserver ----------------------------------------------------------

    def enqueued(self, queue: Queue, msg_id: int, data: bytes, completion: Completion | None) -> None:
        if completion is None or completion.done or msg_id < self.first_id:
            return
        completion.hold()
        self._held[msg_id] = completion

    def acquired(self, queue: Queue, msg_id: int) -> None:
        """Acquisition changes nothing: the message is still unreplicated until dequeued."""

    def released(self, queue: Queue, msg_id: int) -> None:
        """A release back onto the queue changes nothing either."""

    def dequeued(self, queue: Queue, msg_id: int, reason: str) -> None:
        self._release(msg_id)
