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

The guards of one queue share one observer (``QueueGuards``): a primary with
two backups holds every new message twice, and asked each guard separately
that cost two observer calls and two ``hold`` calls per message, and as many
on each dequeue.  A backup's acknowledgement releases its whole batch at once
(``complete_all``).
"""

from __future__ import annotations

from collections.abc import Iterable

from hastandby.broker.queues.completion import Completion, release_all
from hastandby.broker.queues.idset import IdSet
from hastandby.broker.queues.queue import Queue


class QueueGuard:
    """Delays completion of new messages on one queue until one backup has them."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._held: dict[int, Completion] = {}
        self._attached = True
        QueueGuards.of(queue).add(self)
        self.first_id = queue.next_id

    @property
    def pending(self) -> int:
        """How many messages this guard still holds back."""
        return len(self._held)

    def is_guarded(self, msg_id: int) -> bool:
        return msg_id in self._held

    def complete(self, msg_id: int) -> None:
        """The backup accepted ``msg_id``."""
        self._release(msg_id)

    def complete_all(self, ids: Iterable[int]) -> None:
        """The backup accepted every message of ``ids`` (a batch): released together."""
        held = self._held
        release_all([held.pop(msg_id) for msg_id in ids if msg_id in held])

    def skip(self, msg_id: int) -> None:
        """The backup already holds ``msg_id`` (catch-up), so it will not be sent."""
        self._release(msg_id)

    def skip_all(self, ids: IdSet) -> None:
        """``skip`` every id of ``ids``, walking whichever is smaller: the held messages or ``ids``
        (a restarted backup may hold a million messages and the guard only a few)."""
        held = self._held
        if len(ids) <= len(held):
            self.complete_all(ids)
        else:
            self.complete_all([msg_id for msg_id in held if msg_id in ids])

    def cancel(self) -> None:
        """The backup is dropped: release every held message and stop following the queue."""
        if self._attached:
            self._attached = False
            QueueGuards.of(self.queue).remove(self)
        held, self._held = self._held, {}
        release_all(held.values())

    def fail(self, error: Exception) -> None:
        """The backup will not take what this guard holds (it cannot store): each message fails (its producer
        hears ``error``) and leaves the queue, which was never allowed to acknowledge it.  The guard goes on."""
        held, self._held = self._held, {}
        for msg_id, completion in held.items():
            completion.fail(error)
            self.queue.dequeue(msg_id, "not-replicated")

    def _release(self, msg_id: int) -> None:
        completion = self._held.pop(msg_id, None)
        if completion is not None:
            completion.release()


class QueueGuards:
    """The queue's one observer on behalf of all its guards: holds each new message for every guard
    whose first id it reaches, and releases it from every guard when it is dequeued."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.guards: list[QueueGuard] = []  # rebound, never changed in place: safe inside a callback

    follows_acquisitions = False  # QueueObserver: who holds a message changes nothing

    @staticmethod
    def of(queue: Queue) -> "QueueGuards":
        """The queue's guards (an empty set, not yet observing, if it has none)."""
        return queue.observer_of(QueueGuards) or QueueGuards(queue)

    def add(self, guard: QueueGuard) -> None:
        if not self.guards:
            self.queue.add_observer(self)
        self.guards = [*self.guards, guard]

    def remove(self, guard: QueueGuard) -> None:
        self.guards = [g for g in self.guards if g is not guard]
        if not self.guards:
            self.queue.remove_observer(self)

    # -- QueueObserver ----------------------------------------------------------

    def enqueued(self, queue: Queue, msg_id: int, data: bytes, completion: Completion | None) -> None:
        if completion is None or completion.done:
            return
        guards = self.guards
        # A guard made after the message's id (its first_id) does not hold it: catch-up covers it.
        # Guards join in order of first_id (a queue's next_id only grows): the newest has the highest.
        holding = guards if msg_id >= guards[-1].first_id else [g for g in guards if msg_id >= g.first_id]
        completion.hold(len(holding))
        for guard in holding:
            guard._held[msg_id] = completion

    def dequeued(self, queue: Queue, msg_id: int, reason: str) -> None:
        """Consumed (or dropped) here before a backup had it: no backup need have it."""
        for guard in self.guards:  # ``QueueGuard._release`` inlined: a call less per guard per dequeue
            completion = guard._held.pop(msg_id, None)
            if completion is not None:
                completion.release()
