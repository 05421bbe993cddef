"""Exchanges route a message to the queues bound to them, on the message subject.

``direct`` matches the subject exactly, ``fanout`` ignores it, ``topic``
matches dotted words against patterns where ``*`` is one word and ``#`` zero or
more.  Each exchange caches its answer per subject, so steady traffic on a few
subjects does no pattern matching at all.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hastandby.broker.queues.queue import Queue

EXCHANGE_TYPES = ("direct", "fanout", "topic")


@dataclass(eq=False)
class Binding:
    exchange: "Exchange"
    queue: "Queue"
    key: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "exchange": self.exchange.name,
            "queue": self.queue.name,
            "key": self.key,
            "arguments": dict(self.arguments),
        }


def topic_matches(pattern: str, subject: str) -> bool:
    """Does a topic binding pattern match a dotted subject?

    Walks the pattern's words keeping the set of subject positions reachable
    so far: ``*`` advances by exactly one word, ``#`` by any number.
    """
    words = subject.split(".")
    reachable = {0}
    for word in pattern.split("."):
        if word == "#":
            reachable = set(range(min(reachable), len(words) + 1))
        else:
            reachable = {
                j + 1 for j in reachable if j < len(words) and (word == "*" or word == words[j])
            }
        if not reachable:
            return False
    return len(words) in reachable


class Exchange:
    """A named router with bindings to queues."""

    def __init__(
        self,
        name: str,
        type: str,
        arguments: dict[str, Any] | None = None,
        replicate: str = "none",
        alternate_exchange: str | None = None,
        durable: bool = False,
        builtin: bool = False,
        object_uuid: str | None = None,
    ) -> None:
        self.name = name
        self.type = type
        self.arguments = dict(arguments or {})
        self.replicate = replicate
        self.alternate_exchange = alternate_exchange
        self.durable = durable
        self.builtin = builtin
        self.uuid = object_uuid or str(uuidlib.uuid4())
        self.bindings: list[Binding] = []
        self.routed = 0
        self.dropped = 0
        self._cache: dict[str | None, list["Queue"]] = {}

    def add(self, binding: Binding) -> None:
        self.bindings.append(binding)
        self._cache.clear()

    def remove(self, binding: Binding) -> None:
        self.bindings.remove(binding)
        self._cache.clear()

    def find(self, queue_name: str, key: str) -> Binding | None:
        for binding in self.bindings:
            if binding.queue.name == queue_name and binding.key == key:
                return binding
        return None

    def match(self, subject: str | None) -> list["Queue"]:
        """The queues a message with this subject goes to (each once)."""
        cached = self._cache.get(subject)
        if cached is not None:
            return cached
        if self.type == "fanout":
            hits = [b.queue for b in self.bindings]
        elif self.type == "direct":
            hits = [b.queue for b in self.bindings if b.key == (subject or "")]
        else:
            text = subject or ""
            hits = [b.queue for b in self.bindings if topic_matches(b.key, text)]
        unique = list(dict.fromkeys(hits))
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[subject] = unique
        return unique

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "uuid": self.uuid,
            "replicate": self.replicate,
            "durable": self.durable,
            "alternate_exchange": self.alternate_exchange,
            "arguments": dict(self.arguments),
            "bindings": len(self.bindings),
            "routed": self.routed,
            "dropped": self.dropped,
        }
