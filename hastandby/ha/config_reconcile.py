"""Backup side of configuration replication: make the local registry match the primary's.

``WiringReplica.apply`` takes the messages of one publisher link in order: a
snapshot, then events (see ``hastandby.ha.config_publisher`` for why that order
is total).  Objects are matched by name *and* uuid; a same-named object with
another uuid is an older incarnation and is replaced (QPID-4428).

Applying is idempotent: an event for something already in that state, or the
same snapshot twice, changes nothing.  A snapshot also deletes local
replicated objects the primary no longer has (they were deleted while this
backup was not listening), so after a snapshot the replicated wiring equals
the primary's.

Backup-specific rules, after Qpid's BrokerReplicator:

* Queues are deleted without rerouting their messages to an alternate
  exchange: the primary's own reroutes reach the backup as ordinary replicated
  messages (QPID-4349, QPID-5404).
* A queue or exchange may name an alternate exchange the backup does not have
  yet: it is declared with ``require_alternate=False``, and since routing
  looks an alternate up by name when it needs one, the link comes alive
  when that exchange arrives (what Qpid needed an AlternateExchangeSetter for).
* Exchanges still used as an alternate are kept when a snapshot no longer
  lists them, as the registry refuses to delete them.
* Exclusive and auto-delete queues are created as declared; a backup admits
  no consumers, so neither property can bite before promotion.

A snapshot starts a replication session with a (possibly new) primary, so it
reports *every* queue of level ``all`` it lists to ``on_queue_replicated``,
kept or new: each needs a replicating browser on this session.  Events report
the queues they create.  ``on_queue_dropped`` hears of an ``all`` queue before
it is deleted.

A message that does not fit the local state (a binding whose queue or exchange
the backup lacks) raises ValueError: the stream was broken, and the caller
should resynchronise by reconnecting for a fresh snapshot.
"""

from __future__ import annotations

from typing import Any, Callable

from hastandby.broker.errors import NotAllowed
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Registry, queue_settings

from hastandby.ha import config_events as events
from hastandby.ha.config_events import BindingSpec, Event, ExchangeSpec, ObjectRef, QueueSpec, Snapshot

QueueCallback = Callable[[Queue], None]


class WiringReplica:
    """Applies a primary's wiring messages to a backup's registry."""

    def __init__(self, registry: Registry, on_queue_replicated: QueueCallback, on_queue_dropped: QueueCallback) -> None:
        self.registry = registry
        self._on_queue_replicated = on_queue_replicated
        self._on_queue_dropped = on_queue_dropped

    def apply(self, message: dict[str, Any]) -> None:
        """Validate one wiring message (ValueError if malformed) and apply it."""
        decoded = events.decode(message)
        if isinstance(decoded, Snapshot):
            self._apply_snapshot(decoded)
        else:
            self._apply_event(decoded)

    # -- snapshot ---------------------------------------------------------------------

    def _apply_snapshot(self, snapshot: Snapshot) -> None:
        registry = self.registry
        queue_uuids = {q.name: q.uuid for q in snapshot.queues}
        exchange_uuids = {e.name: e.uuid for e in snapshot.exchanges}
        # Remove stale objects first, queues before exchanges, so an exchange is
        # no longer anyone's alternate when its turn comes.
        for queue in list(registry.queues.values()):
            if events.queue_replicated(queue) and queue_uuids.get(queue.name) != queue.uuid:
                self._drop_queue(queue)
        stale = [
            e
            for e in registry.exchanges.values()
            if events.exchange_replicated(e) and exchange_uuids.get(e.name) != e.uuid
        ]
        # An exchange can go once no remaining object uses it as its alternate;
        # repeat until no more can go.  Any left are still the alternate of
        # something kept, and Qpid keeps those too.
        while stale:
            in_use = []
            for exchange in stale:
                try:
                    registry.delete_exchange(exchange.name)
                except NotAllowed:
                    in_use.append(exchange)
            if len(in_use) == len(stale):
                break
            stale = in_use
        for exchange_spec in snapshot.exchanges:
            self._ensure_exchange(exchange_spec)
        for queue_spec in snapshot.queues:
            self._ensure_queue(queue_spec)
        self._align_bindings(snapshot.bindings)
        for queue_spec in snapshot.queues:
            if queue_spec.level == "all":
                self._on_queue_replicated(registry.queues[queue_spec.name])

    def _align_bindings(self, wanted: tuple[BindingSpec, ...]) -> None:
        by_identity = {(b.exchange, b.queue, b.key): b for b in wanted}
        for binding in list(self.registry.bindings()):
            spec = by_identity.get((binding.exchange.name, binding.queue.name, binding.key))
            if events.binding_replicated(binding) and (spec is None or spec.arguments != binding.arguments):
                self.registry.unbind(binding.exchange.name, binding.queue.name, binding.key)
        for spec in wanted:
            self._ensure_binding(spec)

    # -- events -----------------------------------------------------------------------

    def _apply_event(self, event: Event) -> None:
        subject = event.subject
        if isinstance(subject, QueueSpec):
            queue = self._ensure_queue(subject)
            if queue is not None and subject.level == "all":
                self._on_queue_replicated(queue)
        elif isinstance(subject, ExchangeSpec):
            self._ensure_exchange(subject)
        elif isinstance(subject, BindingSpec):
            if event.type == events.BOUND:
                self._ensure_binding(subject)
            else:
                self._remove_binding(subject)
        elif event.type == events.QUEUE_DELETED:
            self._delete_queue(subject)
        else:  # exchange-deleted
            self._delete_exchange(subject)

    def _delete_queue(self, ref: ObjectRef) -> None:
        queue = self.registry.queues.get(ref.name)
        if queue is not None and queue.uuid == ref.uuid:
            self._drop_queue(queue)

    def _delete_exchange(self, ref: ObjectRef) -> None:
        exchange = self.registry.exchanges.get(ref.name)
        if exchange is not None and exchange.uuid == ref.uuid:
            self.registry.delete_exchange(exchange.name)

    # -- objects --------------------------------------------------------------------------

    def _ensure_queue(self, spec: QueueSpec) -> Queue | None:
        """Make the queue ``spec`` describes present; returns it if it had to be created."""
        registry = self.registry
        existing = registry.queues.get(spec.name)
        if existing is not None:
            if existing.uuid == spec.uuid:
                return None
            self._drop_queue(existing)
        if spec.name in registry.exchanges:
            registry.delete_exchange(spec.name)
        settings = queue_settings(
            spec.arguments,
            default_replicate=registry.default_replicate,
            exclusive=spec.exclusive,
            auto_delete=spec.auto_delete,
            alternate_exchange=spec.alternate_exchange,
            durable=spec.durable,
        )
        queue, _ = registry.declare_queue(
            spec.name, settings=settings, object_uuid=spec.uuid, require_alternate=False
        )
        return queue

    def _ensure_exchange(self, spec: ExchangeSpec) -> None:
        registry = self.registry
        existing = registry.exchanges.get(spec.name)
        if existing is not None:
            if existing.uuid == spec.uuid:
                return
            registry.delete_exchange(existing.name)
        clash = registry.queues.get(spec.name)
        if clash is not None:
            self._drop_queue(clash)
        registry.declare_exchange(
            spec.name,
            spec.type,
            spec.arguments,
            alternate_exchange=spec.alternate_exchange or None,
            durable=spec.durable,
            object_uuid=spec.uuid,
            require_alternate=False,
        )

    def _drop_queue(self, queue: Queue) -> None:
        if queue.settings.replicate == "all":
            self._on_queue_dropped(queue)
        self.registry.delete_queue(queue.name, reroute=False)

    # -- bindings ----------------------------------------------------------------------------

    def _ensure_binding(self, spec: BindingSpec) -> None:
        registry = self.registry
        exchange = registry.exchanges.get(spec.exchange)
        queue = registry.queues.get(spec.queue)
        if exchange is None or exchange.uuid != spec.exchange_uuid or not events.exchange_replicated(exchange):
            raise ValueError(
                f"binding to exchange {spec.exchange!r} ({spec.exchange_uuid}): the backup has no such exchange"
            )
        if queue is None or queue.uuid != spec.queue_uuid or not events.queue_replicated(queue):
            raise ValueError(f"binding of queue {spec.queue!r} ({spec.queue_uuid}): the backup has no such queue")
        existing = exchange.find(queue.name, spec.key)
        if existing is not None:
            if existing.arguments == spec.arguments:
                return
            registry.unbind(exchange.name, queue.name, spec.key)
        registry.bind(exchange.name, queue.name, spec.key, spec.arguments)

    def _remove_binding(self, spec: BindingSpec) -> None:
        exchange = self.registry.exchanges.get(spec.exchange)
        if exchange is None or exchange.uuid != spec.exchange_uuid:
            return
        binding = exchange.find(spec.queue, spec.key)
        if binding is not None and binding.queue.uuid == spec.queue_uuid:
            self.registry.unbind(exchange.name, spec.queue, spec.key)
