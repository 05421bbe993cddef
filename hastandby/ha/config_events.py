"""The wire vocabulary of configuration replication, and what counts as replicated wiring.

Every message is a plain dict of str / int / bool / list / dict, so it goes
over AMQP as a map body with no custom encoding:

``{"type": "snapshot", "queues": [Q...], "exchanges": [E...], "bindings": [B...]}``
    the whole replicated wiring of the primary, sent first on a link;
``{"type": "queue-created", **Q}`` / ``{"type": "exchange-created", **E}``
``{"type": "queue-deleted", "name": ..., "uuid": ...}`` (same for exchanges)
``{"type": "bound", **B}`` / ``{"type": "unbound", **B}``

where

``Q = {"name", "uuid", "arguments", "exclusive", "auto_delete", "alternate_exchange", "durable"}``
``E = {"name", "uuid", "exchange_type", "arguments", "alternate_exchange", "durable"}``
``B = {"exchange", "exchange_uuid", "queue", "queue_uuid", "key", "arguments"}``

An object is named by its name *and* its uuid, so a backup can tell a queue
deleted and recreated under the same name from the one it has (QPID-4428).
``alternate_exchange`` is ``""`` when there is none.  ``arguments`` are the
primary's verbatim and always carry the effective ``qpid.replicate``, so a
backup never depends on its own default.  Unknown extra keys are ignored, so a
newer primary may add fields.

``decode`` validates a received message completely before anything acts on it
and raises ValueError saying what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Union

from hastandby.broker.queues.exchange import EXCHANGE_TYPES, Binding, Exchange
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import BUILTIN_EXCHANGES, REPLICATE, TEMP_PREFIX
from hastandby.broker.vocabulary import LEVELS

SNAPSHOT = "snapshot"
QUEUE_CREATED = "queue-created"
QUEUE_DELETED = "queue-deleted"
EXCHANGE_CREATED = "exchange-created"
EXCHANGE_DELETED = "exchange-deleted"
BOUND = "bound"
UNBOUND = "unbound"
EVENT_TYPES = (QUEUE_CREATED, QUEUE_DELETED, EXCHANGE_CREATED, EXCHANGE_DELETED, BOUND, UNBOUND)

REPLICATED_LEVELS = ("configuration", "all")


# -- what is replicated --------------------------------------------------------


def queue_replicated(queue: Queue) -> bool:
    """A queue's existence is replicated at level configuration or all; temporary queues never are."""
    return queue.settings.replicate in REPLICATED_LEVELS and not queue.name.startswith(TEMP_PREFIX)


def exchange_replicated(exchange: Exchange) -> bool:
    """Built-in exchanges exist on every node and are never replicated."""
    return exchange.replicate in REPLICATED_LEVELS and not exchange.builtin


def binding_replicated(binding: Binding) -> bool:
    """Replicated when both ends are, unless its own arguments say ``qpid.replicate: none``."""
    return (
        binding.arguments.get(REPLICATE) != "none"
        and exchange_replicated(binding.exchange)
        and queue_replicated(binding.queue)
    )


# -- decoded forms --------------------------------------------------------------


@dataclass(frozen=True)
class QueueSpec:
    name: str
    uuid: str
    arguments: dict[str, Any]
    exclusive: bool
    auto_delete: bool
    alternate_exchange: str | None
    durable: bool

    @property
    def level(self) -> str:
        return str(self.arguments[REPLICATE])


@dataclass(frozen=True)
class ExchangeSpec:
    name: str
    uuid: str
    type: str
    arguments: dict[str, Any]
    alternate_exchange: str | None
    durable: bool


@dataclass(frozen=True)
class BindingSpec:
    exchange: str
    exchange_uuid: str
    queue: str
    queue_uuid: str
    key: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ObjectRef:
    """What a delete event names: the object's name and uuid."""

    name: str
    uuid: str


@dataclass(frozen=True)
class Snapshot:
    queues: tuple[QueueSpec, ...]
    exchanges: tuple[ExchangeSpec, ...]
    bindings: tuple[BindingSpec, ...]


@dataclass(frozen=True)
class Event:
    type: str
    subject: Union[QueueSpec, ExchangeSpec, BindingSpec, ObjectRef]


# -- encoding from registry objects ------------------------------------------------


def _queue_fields(queue: Queue) -> dict[str, Any]:
    s = queue.settings
    return {
        "name": queue.name,
        "uuid": queue.uuid,
        "arguments": dict(s.arguments),
        "exclusive": s.exclusive,
        "auto_delete": s.auto_delete,
        "alternate_exchange": s.alternate_exchange or "",
        "durable": s.durable,
    }


def _exchange_fields(exchange: Exchange) -> dict[str, Any]:
    return {
        "name": exchange.name,
        "uuid": exchange.uuid,
        "exchange_type": exchange.type,
        "arguments": dict(exchange.arguments),
        "alternate_exchange": exchange.alternate_exchange or "",
        "durable": exchange.durable,
    }


def _binding_fields(binding: Binding) -> dict[str, Any]:
    return {
        "exchange": binding.exchange.name,
        "exchange_uuid": binding.exchange.uuid,
        "queue": binding.queue.name,
        "queue_uuid": binding.queue.uuid,
        "key": binding.key,
        "arguments": dict(binding.arguments),
    }


def snapshot(queues: Iterable[Queue], exchanges: Iterable[Exchange], bindings: Iterable[Binding]) -> dict[str, Any]:
    return {
        "type": SNAPSHOT,
        "queues": [_queue_fields(q) for q in queues],
        "exchanges": [_exchange_fields(e) for e in exchanges],
        "bindings": [_binding_fields(b) for b in bindings],
    }


def queue_created(queue: Queue) -> dict[str, Any]:
    return {"type": QUEUE_CREATED, **_queue_fields(queue)}


def queue_deleted(queue: Queue) -> dict[str, Any]:
    return {"type": QUEUE_DELETED, "name": queue.name, "uuid": queue.uuid}


def exchange_created(exchange: Exchange) -> dict[str, Any]:
    return {"type": EXCHANGE_CREATED, **_exchange_fields(exchange)}


def exchange_deleted(exchange: Exchange) -> dict[str, Any]:
    return {"type": EXCHANGE_DELETED, "name": exchange.name, "uuid": exchange.uuid}


def bound(binding: Binding) -> dict[str, Any]:
    return {"type": BOUND, **_binding_fields(binding)}


def unbound(binding: Binding) -> dict[str, Any]:
    return {"type": UNBOUND, **_binding_fields(binding)}


# -- decoding with validation ----------------------------------------------------------


def decode(message: Any) -> Snapshot | Event:
    """Validate a received wiring message into its typed form, or raise ValueError."""
    if not isinstance(message, dict):
        raise ValueError(f"a wiring message is a map, got {type(message).__name__}")
    kind = message.get("type")
    if kind == SNAPSHOT:
        return _decode_snapshot(message)
    if kind == QUEUE_CREATED:
        return Event(kind, _decode_queue(message, f"{kind} event"))
    if kind == EXCHANGE_CREATED:
        return Event(kind, _decode_exchange(message, f"{kind} event"))
    if kind in (QUEUE_DELETED, EXCHANGE_DELETED):
        what = f"{kind} event"
        return Event(kind, ObjectRef(_text(message, "name", what), _text(message, "uuid", what)))
    if kind in (BOUND, UNBOUND):
        return Event(kind, _decode_binding(message, f"{kind} event"))
    known = ", ".join((SNAPSHOT,) + EVENT_TYPES)
    raise ValueError(f"unknown wiring message type {kind!r}: expected one of {known}")


def _decode_snapshot(message: dict[str, Any]) -> Snapshot:
    queues = tuple(
        _decode_queue(item, f"snapshot queue {index}")
        for index, item in enumerate(_list(message, "queues", "snapshot"))
    )
    exchanges = tuple(
        _decode_exchange(item, f"snapshot exchange {index}")
        for index, item in enumerate(_list(message, "exchanges", "snapshot"))
    )
    bindings = tuple(
        _decode_binding(item, f"snapshot binding {index}")
        for index, item in enumerate(_list(message, "bindings", "snapshot"))
    )
    uuids: dict[str, str] = {}
    specs: list[QueueSpec | ExchangeSpec] = [*queues, *exchanges]
    for spec in specs:
        if spec.name in uuids:
            raise ValueError(f"snapshot names {spec.name!r} twice")
        uuids[spec.name] = spec.uuid
    exchange_names = {e.name for e in exchanges}
    queue_names = {q.name for q in queues}
    for index, b in enumerate(bindings):
        if b.exchange not in exchange_names or uuids[b.exchange] != b.exchange_uuid:
            raise ValueError(
                f"snapshot binding {index} names exchange {b.exchange!r} ({b.exchange_uuid}) not in the snapshot"
            )
        if b.queue not in queue_names or uuids[b.queue] != b.queue_uuid:
            raise ValueError(f"snapshot binding {index} names queue {b.queue!r} ({b.queue_uuid}) not in the snapshot")
    return Snapshot(queues, exchanges, bindings)


def _decode_queue(message: Any, what: str) -> QueueSpec:
    _require_map(message, what)
    return QueueSpec(
        name=_text(message, "name", what),
        uuid=_text(message, "uuid", what),
        arguments=_object_arguments(message, what),
        exclusive=_flag(message, "exclusive", what),
        auto_delete=_flag(message, "auto_delete", what),
        alternate_exchange=_text(message, "alternate_exchange", what, empty_ok=True) or None,
        durable=_flag(message, "durable", what),
    )


def _decode_exchange(message: Any, what: str) -> ExchangeSpec:
    _require_map(message, what)
    name = _text(message, "name", what)
    if name in BUILTIN_EXCHANGES:
        raise ValueError(f"{what}: built-in exchange {name!r} is never replicated")
    kind = _text(message, "exchange_type", what)
    if kind not in EXCHANGE_TYPES:
        raise ValueError(f"{what}: exchange type {kind!r} is not one of {', '.join(EXCHANGE_TYPES)}")
    return ExchangeSpec(
        name=name,
        uuid=_text(message, "uuid", what),
        type=kind,
        arguments=_object_arguments(message, what),
        alternate_exchange=_text(message, "alternate_exchange", what, empty_ok=True) or None,
        durable=_flag(message, "durable", what),
    )


def _decode_binding(message: Any, what: str) -> BindingSpec:
    _require_map(message, what)
    arguments = _arguments(message, what)
    level = arguments.get(REPLICATE)
    if level is not None and (level not in LEVELS or level == "none"):
        raise ValueError(f"{what}: a replicated binding cannot have {REPLICATE} {level!r}")
    return BindingSpec(
        exchange=_text(message, "exchange", what),
        exchange_uuid=_text(message, "exchange_uuid", what),
        queue=_text(message, "queue", what),
        queue_uuid=_text(message, "queue_uuid", what),
        key=_text(message, "key", what, empty_ok=True),
        arguments=arguments,
    )


def _require_map(message: Any, what: str) -> None:
    if not isinstance(message, dict):
        raise ValueError(f"{what} must be a map, got {type(message).__name__}")


def _field(message: dict[str, Any], key: str, what: str) -> Any:
    if key not in message:
        raise ValueError(f"{what} has no {key!r}")
    return message[key]


def _text(message: dict[str, Any], key: str, what: str, empty_ok: bool = False) -> str:
    value = _field(message, key, what)
    if not isinstance(value, str) or (not value and not empty_ok):
        raise ValueError(f"{what}: {key!r} must be a {'' if empty_ok else 'non-empty '}string, got {value!r}")
    return str(value)


def _flag(message: dict[str, Any], key: str, what: str) -> bool:
    value = _field(message, key, what)
    if not isinstance(value, bool):
        raise ValueError(f"{what}: {key!r} must be true or false, got {value!r}")
    return value


def _list(message: dict[str, Any], key: str, what: str) -> list[Any]:
    value = _field(message, key, what)
    if not isinstance(value, list):
        raise ValueError(f"{what}: {key!r} must be a list, got {type(value).__name__}")
    return value


def _arguments(message: dict[str, Any], what: str) -> dict[str, Any]:
    value = _field(message, "arguments", what)
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{what}: 'arguments' must be a map with string keys, got {value!r}")
    return {str(k): v for k, v in value.items()}


def _object_arguments(message: dict[str, Any], what: str) -> dict[str, Any]:
    """A queue's or exchange's arguments: they must carry a replicated level."""
    arguments = _arguments(message, what)
    level = arguments.get(REPLICATE)
    if level not in REPLICATED_LEVELS:
        raise ValueError(
            f"{what}: arguments must carry {REPLICATE} of {' or '.join(REPLICATED_LEVELS)}, got {level!r}"
        )
    return arguments
