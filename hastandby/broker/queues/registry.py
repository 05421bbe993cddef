"""The broker's objects: queues, exchanges and bindings, and how a message is routed.

Declaring validates arguments once (a bad ``qpid.replicate`` or limit is refused
with a clear error before anything changes).  Observers hear of every create,
delete, bind and unbind: HA's wiring replication and the durable-wiring store
both plug in here (Qpid's BrokerObserver).
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any, Callable, Iterable, Protocol, Union

import structlog
from proton import symbol

from hastandby.broker.queues import scheduled
from hastandby.broker.message import sections
from hastandby.broker.queues.completion import Completion
from hastandby.broker.errors import (
    AlreadyExists,
    BrokerError,
    InvalidArgument,
    NotAllowed,
    NotFound,
    ResourceLimitExceeded,
)
from hastandby.broker.queues.exchange import EXCHANGE_TYPES, Binding, Exchange
from hastandby.broker.queues.queue import Queue, QueueSettings
from hastandby.broker.queues.queue_kinds import DeliveryLimitQueue, queue_class
from hastandby.broker.vocabulary import LEVELS

REPLICATE = "qpid.replicate"
BUILTIN_EXCHANGES = {"amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic"}
TEMP_PREFIX = "temp."
RESERVED_PREFIX = "$"  # $management, $ha.wiring: addresses the broker itself serves
INTERNAL = "hastandby.internal"  # the argument that lets the broker's own queues use a reserved name
PRIORITIES = "qpid.priorities"  # queue features (docs/queues.md, queue_kinds.py)
DELIVERY_LIMIT = "x-delivery-limit"
SINGLE_ACTIVE_CONSUMER = "x-single-active-consumer"
DEDUP_WINDOW = "x-dedup-window"
LVQ_KEY = "qpid.last_value_queue_key"
GROUP_HEADER = "qpid.group_header_key"  # message groups (qpid-config --group-header, --shared-groups)
SHARED_GROUPS = "qpid.shared_msg_group"
MAX_LVQ_KEY = 255  # UTF-8 bytes of a last-value queue's key name
MAX_DEDUP_WINDOW = 86_400  # seconds: a day of message-ids at most
MAX_PRIORITIES = 10
MAX_DELIVERY_LIMIT = 2**31 - 1
DEAD_LETTER_REASON = symbol("x-opt-dead-letter-reason")  # message annotations of a dead-lettered message
DEAD_LETTER_QUEUE = symbol("x-opt-dead-letter-queue")

log = structlog.get_logger("hastandby.registry")

_NO_SCHEDULE = sections.NO_SCHEDULE_PREFIXES  # scheduled delivery: the hot path's first question (sections.py)


Node = Union[Queue, Exchange]
Scheduler = Callable[[float, Callable[[], None]], Any]


class RegistryObserver(Protocol):
    """Hooks on the object registry (Qpid's BrokerObserver)."""

    def created(self, obj: Node) -> None: ...

    def deleted(self, obj: Node) -> None: ...

    def bound(self, binding: Binding) -> None: ...

    def unbound(self, binding: Binding) -> None: ...


def replication_level(arguments: dict[str, Any], default: str) -> str:
    """The ``qpid.replicate`` level of an object, refusing anything but the three levels."""
    level = arguments.get(REPLICATE, default)
    if not isinstance(level, str) or level not in LEVELS:
        raise InvalidArgument(f"invalid {REPLICATE} value {level!r}: must be one of {', '.join(LEVELS)}")
    return level


def _number(arguments: dict[str, Any], key: str, kind: type) -> Any:
    value = arguments.get(key)
    if value is None:
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{key} must be a number, got {value!r}") from None
    if number < 0:
        raise InvalidArgument(f"{key} must not be negative, got {value!r}")
    return number


def _whole(arguments: dict[str, Any], key: str, lowest: int, highest: int) -> int:
    """A whole-number argument from ``lowest`` to ``highest`` (0 when absent): an int, or a string of one."""
    value = arguments.get(key)
    if value is None:
        return 0
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = int(value)
    elif isinstance(value, str):
        # ASCII digits with at most one sign, and few of them: ``isdigit`` alone also takes "²" or "+-5",
        # which ``int`` refuses, and ``int`` refuses strings of more than 4,300 digits.
        text = value.strip()
        digits = text[1:] if text[:1] in ("+", "-") else text
        if digits.isascii() and digits.isdigit() and len(digits) <= 20:
            number = int(text)
    if number is None or not lowest <= number <= highest:
        raise InvalidArgument(f"{key} must be a whole number from {lowest} to {highest}, got {value!r}")
    return number


def _switch(arguments: dict[str, Any], key: str) -> bool:
    """A boolean argument: true or false (or the strings "true" and "false"); absent: false."""
    value = arguments.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidArgument(f"{key} must be true or false, got {value!r}")


def _property_name(arguments: dict[str, Any], key: str) -> str | None:
    """An argument naming an application property (a last-value key, a group header): 1-255 UTF-8 bytes;
    absent: None."""
    value = arguments.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value.encode("utf-8", "surrogatepass")) > MAX_LVQ_KEY:
        raise InvalidArgument(f"{key} must be the name of an application property (1 to {MAX_LVQ_KEY} "
                              f"bytes of text), got {value!r}")
    return value


def _shared_groups(arguments: dict[str, Any], header: str | None, priorities: int, single_active: bool) -> bool:
    """``qpid.shared_msg_group`` (qpid-config sets 1): true, false, 1 or 0; checked against the other options."""
    value = arguments.get(SHARED_GROUPS, False)
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        value = bool(value)
    elif isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        value = value.strip().lower() in ("true", "1")
    if not isinstance(value, bool):
        raise InvalidArgument(f"{SHARED_GROUPS} must be true or false (or 1 or 0), got {value!r}")
    if value and header is None:
        raise InvalidArgument(f"{SHARED_GROUPS} needs {GROUP_HEADER}: shared groups of which header? "
                              "(--shared-groups needs --group-header)")
    if header is not None and priorities:
        raise InvalidArgument(f"message groups ({GROUP_HEADER}) do not combine with {PRIORITIES}: "
                              "a group's messages go in arrival order")
    if header is not None and single_active:
        raise InvalidArgument(f"message groups ({GROUP_HEADER}) do not combine with {SINGLE_ACTIVE_CONSUMER}: "
                              "with one active consumer every group is already its")
    return value


def queue_settings(
    arguments: dict[str, Any] | None,
    *,
    default_replicate: str,
    exclusive: bool = False,
    auto_delete: bool = False,
    alternate_exchange: str | None = None,
    durable: bool = False,
) -> QueueSettings:
    """Validate a queue declaration's arguments into its settings."""
    args = {str(k): v for k, v in (arguments or {}).items()}
    if exclusive and auto_delete and not args.get("qpid.auto_delete_timeout") and REPLICATE not in args:
        # A private reply or subscription queue (Qpid's "temporary" queue) dies with
        # its consumer; replicating it would only cost, unless asked for explicitly.
        default_replicate = "none"
    policy = args.get("qpid.policy_type", "reject")
    if policy not in ("reject", "ring"):
        raise InvalidArgument(f"qpid.policy_type must be reject or ring, got {policy!r}")
    settings = QueueSettings(
        replicate=replication_level(args, default_replicate),
        max_count=_number(args, "qpid.max_count", int),
        max_size=_number(args, "qpid.max_size", int),
        policy=policy,
        exclusive=bool(exclusive or args.get("exclusive", False)),
        auto_delete=bool(auto_delete or args.get("auto-delete", False)),
        auto_delete_timeout=_number(args, "qpid.auto_delete_timeout", float) or 0.0,
        alternate_exchange=alternate_exchange or args.get("alternate-exchange"),
        durable=durable,
        priorities=_whole(args, PRIORITIES, 1, MAX_PRIORITIES),
        delivery_limit=_whole(args, DELIVERY_LIMIT, 1, MAX_DELIVERY_LIMIT),
        single_active_consumer=_switch(args, SINGLE_ACTIVE_CONSUMER),
        dedup_window=_whole(args, DEDUP_WINDOW, 1, MAX_DEDUP_WINDOW),
        lvq_key=_property_name(args, LVQ_KEY),
        group_header=_property_name(args, GROUP_HEADER),
    )
    settings.shared_groups = _shared_groups(args, settings.group_header, settings.priorities,
                                            settings.single_active_consumer)
    args[REPLICATE] = settings.replicate  # the effective level travels with the object
    settings.arguments = args
    return settings


class Registry:
    """All queues and exchanges of one node, and the routing between them."""

    def __init__(
        self,
        default_replicate: str = "none",
        auto_create: bool = True,
        scheduler: Scheduler | None = None,
    ) -> None:
        if default_replicate not in LEVELS:
            raise InvalidArgument(f"invalid replication default {default_replicate!r}")
        self.default_replicate = default_replicate
        self.auto_create = auto_create
        self.queues: dict[str, Queue] = {}
        self.exchanges: dict[str, Exchange] = {}
        self.observers: list[RegistryObserver] = []
        self.read_only: dict[str, str] = {}  # queue name -> why producers are refused (a DR replica)
        self.auto_created: set[str] = set()  # queues made by attaching to an unknown address (limits.py)
        # Asked before a message is enqueued anywhere; may refuse it (the journal when it cannot write).
        self.admission_checks: list[Callable[[list[Queue], bytes], None]] = []
        self._schedule = scheduler
        for name, kind in BUILTIN_EXCHANGES.items():
            self.exchanges[name] = Exchange(name, kind, builtin=True)

    # -- lookup ------------------------------------------------------------

    def lookup(self, address: str) -> Node | None:
        return self.queues.get(address) or self.exchanges.get(address)

    def queue(self, name: str) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise NotFound(f"no such queue: {name!r}")
        return queue

    def exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no such exchange: {name!r}")
        return exchange

    def resolve(self, address: str) -> Node:
        """The node an attach names, creating a queue for an unknown address if allowed."""
        node = self.lookup(address)
        if node is not None:
            return node
        if not self.auto_create:
            raise NotFound(f"no such queue or exchange: {address!r} (auto-create is off)")
        if address.startswith(RESERVED_PREFIX):
            raise NotFound(f"no such node: {address!r} (names starting with {RESERVED_PREFIX!r} are reserved)")
        queue, _ = self.declare_queue(address)
        self.auto_created.add(queue.name)
        return queue

    # -- queues --------------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        exclusive: bool = False,
        auto_delete: bool = False,
        alternate_exchange: str | None = None,
        durable: bool = False,
        object_uuid: str | None = None,
        settings: QueueSettings | None = None,
        require_alternate: bool = True,
    ) -> tuple[Queue, bool]:
        """Create a queue if absent; returns (queue, created).

        ``require_alternate=False`` lets a replica name an alternate exchange
        that has not arrived yet: routing looks alternates up by name anyway.
        """
        if not name:
            raise InvalidArgument("a queue needs a name")
        if name.startswith(RESERVED_PREFIX) and not (settings.arguments if settings else arguments or {}).get(INTERNAL):
            raise InvalidArgument(f"queue names starting with {RESERVED_PREFIX!r} are reserved")
        if name in self.exchanges:
            raise AlreadyExists(f"{name!r} is an exchange")
        if settings is None:
            settings = queue_settings(
                arguments,
                default_replicate=self.default_replicate,
                exclusive=exclusive,
                auto_delete=auto_delete,
                alternate_exchange=alternate_exchange,
                durable=durable,
            )
        existing = self.queues.get(name)
        if existing is not None:
            return existing, False
        if require_alternate and settings.alternate_exchange and settings.alternate_exchange not in self.exchanges:
            raise NotFound(f"alternate exchange {settings.alternate_exchange!r} does not exist")
        queue = queue_class(settings)(name, settings, object_uuid)
        queue.timers = self._schedule  # scheduled delivery's one timer per queue (scheduled.py)
        if isinstance(queue, DeliveryLimitQueue):
            queue.dead_letter = self.dead_letter
        self.queues[name] = queue
        for observer in self.observers:
            observer.created(queue)
        return queue, True

    def temporary_queue(self) -> Queue:
        """A private queue for a dynamic receiver: exclusive, auto-delete, never replicated."""
        settings = queue_settings({REPLICATE: "none"}, default_replicate="none", exclusive=True, auto_delete=True)
        queue, _ = self.declare_queue(TEMP_PREFIX + str(uuidlib.uuid4()), settings=settings)
        return queue

    def delete_queue(self, name: str, reroute: bool = True) -> None:
        """Delete a queue; its messages go to its alternate exchange if it has one.

        A replica deletes with ``reroute=False``: the primary's own reroutes
        reach it through replication.
        """
        queue = self.queue(name)
        self._remove_queue(queue, reroute)

    def _remove_queue(self, queue: Queue, reroute: bool) -> None:
        if self.queues.get(queue.name) is not queue:
            return
        self.auto_created.discard(queue.name)
        for exchange in self.exchanges.values():
            for binding in [b for b in exchange.bindings if b.queue is queue]:
                self._unbind(binding)
        alternate = queue.settings.alternate_exchange
        leftovers = [data for _, data in queue.messages()]
        queue.purge()
        del self.queues[queue.name]
        queue.deleted = True
        if reroute and alternate and alternate in self.exchanges:
            for data in leftovers:
                self.deliver(self._route_exchange(self.exchanges[alternate], data), data)
        for observer in self.observers:
            observer.deleted(queue)

    def consumers_changed(self, queue: Queue) -> None:
        """Delete an auto-delete queue once its last consumer is gone (after its timeout)."""
        settings = queue.settings
        if not settings.auto_delete or queue.consumers or queue.deleted or not queue.ever_consumed:
            return
        if settings.auto_delete_timeout > 0 and self._schedule is not None:
            self._schedule(settings.auto_delete_timeout, lambda: self._auto_delete(queue))
        else:
            self._auto_delete(queue)

    def _auto_delete(self, queue: Queue) -> None:
        if not queue.consumers and not queue.deleted:
            self._remove_queue(queue, reroute=True)

    # -- exchanges -------------------------------------------------------------

    def declare_exchange(
        self,
        name: str,
        type: str,
        arguments: dict[str, Any] | None = None,
        *,
        alternate_exchange: str | None = None,
        durable: bool = False,
        object_uuid: str | None = None,
        require_alternate: bool = True,
    ) -> tuple[Exchange, bool]:
        if not name:
            raise InvalidArgument("an exchange needs a name")
        if type not in EXCHANGE_TYPES:
            raise InvalidArgument(f"unknown exchange type {type!r}: must be one of {', '.join(EXCHANGE_TYPES)}")
        if name in self.queues:
            raise AlreadyExists(f"{name!r} is a queue")
        args = {str(k): v for k, v in (arguments or {}).items()}
        level = replication_level(args, self.default_replicate)
        args[REPLICATE] = level
        existing = self.exchanges.get(name)
        if existing is not None:
            if existing.type != type:
                raise AlreadyExists(f"exchange {name!r} exists with type {existing.type}")
            return existing, False
        alternate = alternate_exchange or args.get("alternate-exchange")
        if require_alternate and alternate and alternate not in self.exchanges:
            raise NotFound(f"alternate exchange {alternate!r} does not exist")
        exchange = Exchange(name, type, args, level, alternate, durable, object_uuid=object_uuid)
        self.exchanges[name] = exchange
        for observer in self.observers:
            observer.created(exchange)
        return exchange, True

    def delete_exchange(self, name: str) -> None:
        exchange = self.exchange(name)
        if exchange.builtin:
            raise NotAllowed(f"exchange {name!r} is built in and cannot be deleted")
        users = [q.name for q in self.queues.values() if q.settings.alternate_exchange == name]
        users += [e.name for e in self.exchanges.values() if e.alternate_exchange == name]
        if users:
            raise NotAllowed(f"exchange {name!r} is the alternate exchange of {', '.join(sorted(users))}")
        for binding in list(exchange.bindings):
            self._unbind(binding)
        del self.exchanges[name]
        for observer in self.observers:
            observer.deleted(exchange)

    # -- bindings ----------------------------------------------------------------

    def bind(self, exchange_name: str, queue_name: str, key: str = "", arguments: dict[str, Any] | None = None) -> tuple[Binding, bool]:
        exchange = self.exchange(exchange_name)
        queue = self.queue(queue_name)
        args = {str(k): v for k, v in (arguments or {}).items()}
        if REPLICATE in args:
            replication_level(args, "none")
        existing = exchange.find(queue_name, key)
        if existing is not None:
            return existing, False
        binding = Binding(exchange, queue, key, args)
        exchange.add(binding)
        for observer in self.observers:
            observer.bound(binding)
        return binding, True

    def unbind(self, exchange_name: str, queue_name: str, key: str = "") -> None:
        exchange = self.exchange(exchange_name)
        binding = exchange.find(queue_name, key)
        if binding is None:
            raise NotFound(f"no binding of {queue_name!r} to {exchange_name!r} with key {key!r}")
        self._unbind(binding)

    def _unbind(self, binding: Binding) -> None:
        binding.exchange.remove(binding)
        for observer in self.observers:
            observer.unbound(binding)

    def bindings(self) -> Iterable[Binding]:
        for exchange in self.exchanges.values():
            yield from exchange.bindings

    # -- routing -------------------------------------------------------------------

    def route(self, node: Node, data: bytes) -> list[Queue]:
        """The queues a message sent to ``node`` lands on."""
        if isinstance(node, Queue):
            return [node]
        return self._route_exchange(node, data)

    def _route_exchange(self, exchange: Exchange, data: bytes, depth: int = 0) -> list[Queue]:
        subject = None if exchange.type == "fanout" else sections.subject(data)
        queues = exchange.match(subject)
        if queues:
            exchange.routed += 1
            return queues
        alternate = self.exchanges.get(exchange.alternate_exchange or "")
        if alternate is not None and depth < 4:
            return self._route_exchange(alternate, data, depth + 1)
        exchange.dropped += 1
        return []

    def deliver(self, queues: list[Queue], data: bytes, completion: Completion | None = None) -> None:
        """Enqueue on every target queue, or on none if a reject-policy limit refuses (or the message asks for a
        delivery time the node refuses: ``_delivery_time``)."""
        held = False
        if not data.startswith(_NO_SCHEDULE) and sections.may_be_scheduled(data):
            data, held = self._delivery_time(queues, data)
        if self.read_only:
            for queue in queues:
                reason = self.read_only.get(queue.name)
                if reason:
                    raise NotAllowed(reason)
        size = len(data)
        for queue in queues:
            if queue.refuses_when_full:
                queue.check_capacity(size)
        for check in self.admission_checks:
            check(queues, data)
        ttl = sections.header_ttl(data)
        if held:
            for queue in queues:
                queue.start_scheduling()
        for queue in queues:
            queue.enqueue(data, completion, ttl)

    def _delivery_time(self, queues: list[Queue], data: bytes) -> tuple[bytes, bool]:
        """A message that mentions ``x-opt-delivery-time`` or ``x-opt-delivery-delay``: (its bytes, whether its
        queues hold it back).  A delay becomes an absolute ``x-opt-delivery-time`` here, once, on the node that
        first takes the message, and travels in its bytes (scheduled.py); a bad value or a queue that cannot
        hold a message back refuses it (``BadSchedule``: amqp:invalid-field), enqueuing nothing."""
        when, delay = sections.schedule_request(data)
        now = scheduled.wall_ms()
        if when is None:
            if not delay:
                return data, False
            when = now + delay
            if when > sections.MAX_DELIVERY_TIME:
                raise sections.BadSchedule(f"message annotation {sections.DELIVERY_DELAY} of {delay} ms ends past "
                                           "the latest delivery time a node keeps")
            data = sections.with_due_time(data, when)
            if sections.due_time(data) != when:
                raise sections.BadSchedule("the message's annotations could not be given its delivery time")
        if when <= now:
            return data, False  # its time has come: an ordinary message
        for queue in queues:
            why = scheduled.refusal(queue)
            if why is not None:
                raise sections.BadSchedule(why)
        return data, True

    def reject_to_alternate(self, queue: Queue, msg_id: int) -> None:
        """A consumer rejected a message: route it to the queue's alternate exchange, then drop it."""
        data = queue.get(msg_id)
        alternate = self.exchanges.get(queue.settings.alternate_exchange or "")
        queue.acknowledge(msg_id)
        if data is not None and alternate is not None:
            try:
                self.deliver(self._route_exchange(alternate, data), data)
            except ResourceLimitExceeded:
                alternate.dropped += 1

    def dead_letter(self, queue: Queue, data: bytes, reason: str) -> None:
        """A message left ``queue`` for ``reason`` (a delivery limit reached): to its alternate exchange,
        with message annotations saying why and from where; dropped, with a log line, if there is none."""
        alternate = self.exchanges.get(queue.settings.alternate_exchange or "")
        if alternate is None:
            log.warning("message dropped: it reached the queue's delivery limit and the queue has no alternate "
                        "exchange", queue=queue.name, reason=reason, delivery_limit=queue.settings.delivery_limit,
                        alternate_exchange=queue.settings.alternate_exchange)
            return
        annotated = sections.with_annotations(data, {DEAD_LETTER_REASON: reason, DEAD_LETTER_QUEUE: queue.name})
        try:
            self.deliver(self._route_exchange(alternate, annotated), annotated)
        except BrokerError as error:
            alternate.dropped += 1
            log.warning("dead-lettered message dropped: its alternate exchange's queues refused it",
                        queue=queue.name, alternate_exchange=alternate.name, reason=reason, error=str(error))

    def describe(self) -> dict[str, Any]:
        return {
            "queues": [q.describe() for q in self.queues.values()],
            "exchanges": [e.describe() for e in self.exchanges.values()],
            "bindings": [b.describe() for b in self.bindings()],
        }
