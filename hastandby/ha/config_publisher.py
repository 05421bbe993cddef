"""Primary side of configuration replication: a snapshot, then every change, in order.

One ``WiringPublisher`` serves one backup link.  On construction it attaches
to the registry as an observer and, in the same step, sends the snapshot of
the replicated wiring; from then on it sends one event per create, delete,
bind or unbind of a replicated object.  The registry calls observers
synchronously on the broker's single thread, so nothing can change between
taking the snapshot and attaching, and everything goes out through the same
``send`` onto one AMQP link, which delivers in order: the backup always sees
the snapshot followed by exactly the changes made after it.

Qpid could not rely on that: its backup learned the initial state from QMF
query responses and the changes from QMF events, which travelled unsynchronised
through one queue, so it needed an ``UpdateTracker`` to decide which responses
were stale and which leftovers to delete (QPID-4391, QPID-7357).  With one
totally ordered stream the backup just applies messages in turn
(``hastandby.ha.config_reconcile``).
"""

from __future__ import annotations

from typing import Any, Callable

from hastandby.broker.queues.exchange import Binding
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Node, Registry

from hastandby.ha import config_events as events


class WiringPublisher:
    """Sends a registry's replicated wiring to one backup: snapshot first, then events."""

    def __init__(self, registry: Registry, send: Callable[[dict[str, Any]], None]) -> None:
        self.registry = registry
        self._send = send
        self._attached = True
        # Observer lists are rebound, never mutated, so attaching or closing from
        # inside a registry callback cannot disturb the iteration in progress.
        registry.observers = [*registry.observers, self]
        send(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        """The full current replicated wiring, as a snapshot message."""
        registry = self.registry
        return events.snapshot(
            [q for q in registry.queues.values() if events.queue_replicated(q)],
            [e for e in registry.exchanges.values() if events.exchange_replicated(e)],
            [b for b in registry.bindings() if events.binding_replicated(b)],
        )

    def close(self) -> None:
        """Stop publishing (the backup's link is gone)."""
        if self._attached:
            self._attached = False
            registry = self.registry
            registry.observers = [observer for observer in registry.observers if observer is not self]

    # -- RegistryObserver ------------------------------------------------------------

    def created(self, obj: Node) -> None:
        if isinstance(obj, Queue):
            if events.queue_replicated(obj):
                self._send(events.queue_created(obj))
        elif events.exchange_replicated(obj):
            self._send(events.exchange_created(obj))

    def deleted(self, obj: Node) -> None:
        if isinstance(obj, Queue):
            if events.queue_replicated(obj):
                self._send(events.queue_deleted(obj))
        elif events.exchange_replicated(obj):
            self._send(events.exchange_deleted(obj))

    def bound(self, binding: Binding) -> None:
        if events.binding_replicated(binding):
            self._send(events.bound(binding))

    def unbound(self, binding: Binding) -> None:
        if events.binding_replicated(binding):
            self._send(events.unbound(binding))
