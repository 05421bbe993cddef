"""Management requests: AMQP request/response on the ``$management`` address.

A request is a message whose application properties name the ``operation``
(CREATE, DELETE, BIND, UNBIND, PURGE, QUERY, STATUS, PING, IDS), the ``type``
(queue, exchange) and the ``name``; its body is a map of attributes.  The reply
goes to the request's ``reply-to`` with ``statusCode`` (HTTP-like: 200, 201,
400, 404, ...) and ``statusDescription`` application properties (and, for a
refusal, ``condition``: the AMQP error condition, e.g.
``amqp:unauthorized-access``) and the request's message-id as correlation-id.  This is the shape of the AMQP
Management draft, which qpid-dispatch and Artemis also speak.

Layers above the core add operations (HA adds PROMOTE, ...) with ``register``
and may veto every request but QUERY, STATUS and PING with ``guards`` (a
backup refuses to modify replicated objects, and sends user and ACL changes
to the primary).

Every request is authorized (``authority.py``) before it runs: CREATE,
DELETE and PURGE as those actions on the object named, BIND and UNBIND as
``bind`` on both the exchange and the queue, IDS as ``browse`` of the queue,
QUERY, STATUS and PING for any authenticated connection, and every operation
a layer above registers (PROMOTE, REPLICATE, USER-ADD, ACL-RELOAD, ...) as
``admin`` on the operation's name in lower case.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Any, Callable

import structlog
from proton import Condition, Connection, Delivery, Link, Message, MessageException

from hastandby.security.credentials import Credentials

from hastandby.broker.queues import lineage
from hastandby.broker.admission.authority import Authority, principal_of
from hastandby.broker.errors import BrokerError, InvalidArgument, NotFound
from hastandby.broker.admission.limits import Limits
from hastandby.broker.links import close_link, receive_each
from hastandby.broker.transport.peer import field
from hastandby.broker.queues.registry import Registry
from hastandby.broker.message.values import plain
from hastandby.broker.vocabulary import IDS_PAGE

Operation = Callable[["Request"], "tuple[int, Any] | Deferred"]
Guard = Callable[["Request"], None]
MUTATING = {"CREATE", "DELETE", "BIND", "UNBIND", "PURGE"}
READ_ONLY = {"QUERY", "STATUS", "PING"}
ON_OBJECT = {"CREATE": "create", "DELETE": "delete", "PURGE": "purge", "IDS": "browse"}
IDS_PAGE_MAX = 50_000

log = structlog.get_logger("hastandby.management")


class Request:
    """One decoded management request and the connection it came on."""

    def __init__(self, message: Message, connection: Connection) -> None:
        props = message.properties or {}
        if not isinstance(props, dict):
            raise InvalidArgument("a management request's application properties must be a map")
        self.operation = str(props.get("operation", "")).upper()
        self.type = str(props.get("type", "") or "")
        self.name = str(props.get("name", "") or "")
        body = message.body
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise InvalidArgument("a management request's body must be a map")
        self.body: dict[str, Any] = {str(k): v for k, v in body.items()}
        self.connection = connection

    def arguments(self) -> dict[str, Any]:
        args = self.body.get("arguments") or {}
        if not isinstance(args, dict):
            raise InvalidArgument("'arguments' must be a map")
        return {str(k): plain(v) for k, v in args.items()}


class Deferred:
    """A reply that comes later: an operation that must wait (etcd, another node) returns one,
    does its waiting off the reactor thread (``blocking.py``), and resolves it on the reactor."""

    def __init__(self) -> None:
        self._then: Callable[[int, Any, str, str | None], None] | None = None
        self._result: tuple[int, Any, str, str | None] | None = None

    def resolve(self, code: int, body: Any) -> None:
        self._settle((code, body, "OK", None))

    def fail(self, error: BrokerError) -> None:
        self._settle((error.status, error.body, str(error), error.condition))

    def then(self, callback: Callable[[int, Any, str, str | None], None]) -> None:
        self._then = callback
        if self._result is not None:
            callback(*self._result)

    def _settle(self, result: tuple[int, Any, str, str | None]) -> None:
        if self._result is not None:
            return
        self._result = result
        if self._then is not None:
            self._then(*result)


class Management:
    """Dispatches management requests to operations on the registry and beyond."""

    def __init__(self, registry: Registry, status: Callable[[], dict[str, Any]],
                 authority: Authority | None = None, limits: Limits | None = None) -> None:
        self.registry = registry
        self.authority = authority or Authority(Credentials(), allow_anonymous=True)
        self.limits = limits or Limits()
        self.guards: list[Guard] = []
        self.query_extras: dict[str, Callable[[], Any]] = {}
        self._operations: dict[str, Operation] = {
            "CREATE": self._create,
            "DELETE": self._delete,
            "BIND": self._bind,
            "UNBIND": self._unbind,
            "PURGE": self._purge,
            "QUERY": lambda request: (200, self.query()),
            "STATUS": lambda request: (200, status()),
            "PING": lambda request: (200, {}),
            "IDS": self._ids,
        }

    def register(self, operation: str, handler: Operation) -> None:
        self._operations[operation.upper()] = handler

    def handle(self, message: Message, connection: Connection, reply: Callable[[Message], None]) -> None:
        """Answer one request, now or (a Deferred operation) later; never raises for bad input."""
        try:
            request = Request(message, connection)
            operation = self._operations.get(request.operation)
            if operation is None:
                known = ", ".join(sorted(self._operations))
                raise InvalidArgument(f"unknown operation {request.operation!r}: expected one of {known}")
            self._authorize(request)
            if request.operation not in READ_ONLY:
                for guard in self.guards:
                    guard(request)
            outcome = operation(request)
        except BrokerError as error:
            outcome = Deferred()
            outcome.fail(error)
        except Exception as error:  # a bug must not take the node down with it
            log.exception("management request failed", operation=str(message.properties))
            outcome = Deferred()
            outcome.fail(BrokerError(f"internal error: {error}"))
        if not isinstance(outcome, Deferred):
            code, body = outcome
            outcome = Deferred()
            outcome.resolve(code, body)

        def send(code: int, body: Any, description: str, condition: str | None) -> None:
            properties: dict[str, Any] = {"statusCode": code, "statusDescription": description}
            if condition is not None:  # the AMQP error condition, as on a link: amqp:unauthorized-access ...
                properties["condition"] = condition
            if code >= 400:
                log.info("management request refused", status=code, reason=description, condition=condition)
            reply(Message(
                address=message.reply_to,
                correlation_id=message.id if message.id is not None else message.correlation_id,
                properties=properties,
                body=body,
            ))

        outcome.then(send)

    def _authorize(self, request: Request) -> None:
        operation, principal, check = request.operation, principal_of(request.connection), self.authority.check
        if operation in READ_ONLY:
            return
        if operation in ("BIND", "UNBIND"):
            exchange, queue, _ = self._binding_fields(request)
            check(principal, "bind", exchange)
            check(principal, "bind", queue)
        elif operation in ON_OBJECT:
            check(principal, ON_OBJECT[operation], request.name)
        else:
            check(principal, "admin", operation.lower())

    # -- operations ---------------------------------------------------------------

    def _create(self, request: Request) -> tuple[int, Any]:
        body = request.body
        if request.type == "queue":
            if request.name not in self.registry.queues:
                self.limits.check("queues", len(self.registry.queues), self.limits.queues)
            queue, created = self.registry.declare_queue(
                request.name,
                request.arguments(),
                exclusive=bool(body.get("exclusive", False)),
                auto_delete=bool(body.get("auto-delete", False)),
                alternate_exchange=body.get("alternate-exchange") or None,
                durable=bool(body.get("durable", False)),
            )
            return (201 if created else 200), queue.describe()
        if request.type == "exchange":
            exchange, created = self.registry.declare_exchange(
                request.name,
                str(body.get("exchange-type", "direct")),
                request.arguments(),
                alternate_exchange=body.get("alternate-exchange") or None,
                durable=bool(body.get("durable", False)),
            )
            return (201 if created else 200), exchange.describe()
        raise InvalidArgument(f"cannot create objects of type {request.type!r}: expected queue or exchange")

    def _delete(self, request: Request) -> tuple[int, Any]:
        if request.type == "queue":
            self.registry.delete_queue(request.name)
        elif request.type == "exchange":
            self.registry.delete_exchange(request.name)
        else:
            raise InvalidArgument(f"cannot delete objects of type {request.type!r}: expected queue or exchange")
        return 200, {}

    def _binding_fields(self, request: Request) -> tuple[str, str, str]:
        body = request.body
        exchange, queue = body.get("exchange"), body.get("queue")
        if not exchange or not queue:
            raise InvalidArgument("a binding needs 'exchange' and 'queue'")
        return str(exchange), str(queue), str(body.get("key") or "")

    def _bind(self, request: Request) -> tuple[int, Any]:
        exchange, queue, key = self._binding_fields(request)
        binding, created = self.registry.bind(exchange, queue, key, request.arguments())
        return (201 if created else 200), binding.describe()

    def _unbind(self, request: Request) -> tuple[int, Any]:
        self.registry.unbind(*self._binding_fields(request))
        return 200, {}

    def _purge(self, request: Request) -> tuple[int, Any]:
        return 200, {"purged": self.registry.queue(request.name).purge()}

    def _ids(self, request: Request) -> tuple[int, Any]:
        """One page of a queue's replication ids with a digest of each message's bytes, and its lineage.

        What ``hastandby verify`` compares between a primary and its backups;
        pages keep a long queue from holding up the node.
        """
        queue = self.registry.queue(request.name)
        after, limit = request.body.get("after", 0), request.body.get("limit", IDS_PAGE)
        if type(after) is not int or after < 0 or type(limit) is not int or not 0 < limit <= IDS_PAGE_MAX:
            raise InvalidArgument(f"IDS needs 'after' >= 0 and 0 < 'limit' <= {IDS_PAGE_MAX}")
        page = queue.page(after, limit)
        return 200, {
            "queue": queue.name,
            "uuid": queue.uuid,
            "lineage": lineage.to_wire(queue.lineage),
            "depth": queue.depth,
            "messages": [[msg_id, blake2b(payload, digest_size=8).hexdigest()] for msg_id, payload in page],
            "more": len(page) == limit,
        }

    def query(self) -> dict[str, Any]:
        result = self.registry.describe()
        for section, extra in self.query_extras.items():
            result[section] = extra()
        return result


class ManagementLink:
    """A client's sender to ``$management``: each message is a request."""

    def __init__(self, link: Link, management: Management, max_message_size: int) -> None:
        self.link = link
        self.management = management
        self.max_message_size = max_message_size

    def start(self) -> None:
        self.link.flow(20)

    def on_delivery(self, impl: Any) -> None:
        receive_each(impl, self._request)

    def _request(self, delivery: Delivery, data: bytes) -> None:
        link = self.link
        registry = self.management.registry
        try:
            if not data:
                raise InvalidArgument("a management request with no payload")
            if self.max_message_size and len(data) > self.max_message_size:
                raise InvalidArgument(f"request larger than the maximum of {self.max_message_size} bytes")
            request = Message()
            try:
                request.decode(data)
            except Exception as error:
                raise InvalidArgument(f"undecodable management request: {error}") from None
            # Header strings are decoded when read, and may not be UTF-8: read them here, where a bad one is refused.
            reply_to = field(lambda: request.reply_to, "reply-to")
            field(lambda: request.id, "message-id")
            field(lambda: request.correlation_id, "correlation-id")
            if not reply_to:
                raise InvalidArgument("a management request needs a reply-to address")
            if registry.lookup(reply_to) is None:
                raise NotFound(f"reply-to address {reply_to!r} does not exist")
            self.management.handle(request, link.connection, self._reply)
        except BrokerError as error:
            delivery.local.condition = Condition(error.condition, str(error))
            delivery.update(Delivery.REJECTED)
        else:
            delivery.update(Delivery.ACCEPTED)
        delivery.settle()

    def _reply(self, message: Message) -> None:
        """Deliver a reply to its reply-to queue, if that is still there (a deferred reply may outlive it)."""
        registry = self.management.registry
        node = registry.lookup(message.address or "")
        if node is None:
            return
        try:
            data = bytes(message.encode())
        except (OverflowError, TypeError, ValueError, MessageException) as error:
            # A value the node holds that AMQP cannot carry (a bug): the requester still gets an answer.
            log.warning("management reply not encodable", error=f"{type(error).__name__}: {error}")
            message.body = None
            message.properties = {"statusCode": 500,
                                  "statusDescription": f"internal error: the reply could not be encoded: {error}"}
            data = bytes(message.encode())
        registry.deliver(registry.route(node, data), data)

    def flow(self) -> None:
        pass

    def fail(self, error: Exception) -> None:
        close_link(self.link, error)

    def close(self) -> None:
        pass
