"""Durable wiring: queues, exchanges and bindings declared durable survive a restart.

The *configuration* a user declared with ``--durable`` is written to
``<data-dir>/wiring.json`` on every change, atomically (file and directory
fsynced), and declared again at start-up under the same uuids: the journal
(``journal.py``) names queues by uuid, and an HA backup's replicas must stay
the same incarnation as the primary's queues, or a restarted backup would
drop what it holds and download everything again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from hastandby.files import write_atomically
from hastandby.broker.queues.exchange import Binding
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Node, Registry

log = structlog.get_logger("hastandby.store")


class WiringStore:
    """A registry observer that keeps the durable objects in a JSON file."""

    def __init__(self, registry: Registry, data_dir: Path) -> None:
        self.registry = registry
        self.path = Path(data_dir) / "wiring.json"

    def load(self) -> None:
        """Declare the stored objects (before clients connect and before observing)."""
        if not self.path.exists():
            return
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:
            raise SystemExit(f"cannot read {self.path}: {error}") from None
        registry = self.registry
        for exchange in saved.get("exchanges", []):
            registry.declare_exchange(
                exchange["name"],
                exchange["type"],
                exchange.get("arguments"),
                alternate_exchange=exchange.get("alternate_exchange"),
                durable=True,
                object_uuid=exchange.get("uuid"),
                require_alternate=False,
            )
        for queue in saved.get("queues", []):
            registry.declare_queue(
                queue["name"],
                queue.get("arguments"),
                exclusive=queue.get("exclusive", False),
                auto_delete=queue.get("auto_delete", False),
                alternate_exchange=queue.get("alternate_exchange"),
                durable=True,
                object_uuid=queue.get("uuid"),
                require_alternate=False,
            )
        for binding in saved.get("bindings", []):
            registry.bind(binding["exchange"], binding["queue"], binding["key"], binding.get("arguments"))
        log.info("durable wiring loaded", path=str(self.path), queues=len(saved.get("queues", [])))

    def snapshot(self) -> dict[str, Any]:
        registry = self.registry
        queues = [q for q in registry.queues.values() if q.settings.durable]
        exchanges = [e for e in registry.exchanges.values() if e.durable and not e.builtin]
        return {
            "queues": [
                {
                    "name": q.name,
                    "uuid": q.uuid,
                    "arguments": q.settings.arguments,
                    "exclusive": q.settings.exclusive,
                    "auto_delete": q.settings.auto_delete,
                    "alternate_exchange": q.settings.alternate_exchange,
                }
                for q in queues
            ],
            "exchanges": [
                {"name": e.name, "uuid": e.uuid, "type": e.type, "arguments": e.arguments,
                 "alternate_exchange": e.alternate_exchange}
                for e in exchanges
            ],
            "bindings": [
                b.describe()
                for b in registry.bindings()
                if b.queue.settings.durable and (b.exchange.durable or b.exchange.builtin)
            ],
        }

    def save(self) -> None:
        write_atomically(self.path, json.dumps(self.snapshot(), indent=1, sort_keys=True))

    # -- RegistryObserver ----------------------------------------------------

    def created(self, obj: Node) -> None:
        if _durable(obj):
            self.save()

    def deleted(self, obj: Node) -> None:
        if _durable(obj):
            self.save()

    def bound(self, binding: Binding) -> None:
        if binding.queue.settings.durable:
            self.save()

    def unbound(self, binding: Binding) -> None:
        if binding.queue.settings.durable:
            self.save()


def _durable(obj: Node) -> bool:
    return obj.settings.durable if isinstance(obj, Queue) else obj.durable
