"""Kind ``management``: well-formed AMQP carrying mutated management requests, as admin and as a plain user.

Each case connects (PLAIN, as ``admin`` six times in ten, ``app`` three,
``peer`` one), attaches a sender to ``$management`` and a dynamic reply
queue, and sends one to three requests.  A request starts from a valid one
for an operation the node knows (CREATE, DELETE, BIND, UNBIND, PURGE, QUERY,
STATUS, PING, IDS, PROMOTE, REPLICATE, REPLICATE-STOP, USER-LIST, USER-ADD,
USER-PASSWD, USER-DEL, ACL-RELOAD), or one it does not, and is mutated:

- the application properties: operation, type and name changed to other
  strings, other types (numbers, lists, maps, binary), huge or missing;
- a queue CREATE's arguments, half of the time, include the queue features
  (``features.queue_arguments``: priorities, delivery limit, single active
  consumer, dedup window, last-value key, group header, shared groups;
  valid, at a boundary, strings that only look like numbers, wrong types,
  combinations the node refuses), which the node must take or refuse with
  a clear error (400), creating nothing;
- the body: keys dropped, values of the wrong type (a string for a number, a
  list for a map), huge or deeply nested values, extra keys, a body that is
  not a map at all;
- the envelope: no reply-to, a reply-to that does not exist, odd
  message-ids and correlation-ids;
- or the encoded request's bytes (bit flips, truncation, ...), sent as the
  transfer's payload; now and then a request of 1.5 MB, over the node's
  management request limit.

Destructive requests never name what the checks rely on: the reference
queue, and the ``admin``, ``app`` and ``peer`` users (a DELETE of the
reference queue or a new password for ``app`` would be the node obeying,
not failing).  Every ``CLEANUP_EVERY`` cases the node is tidied as admin:
replications the cases configured are stopped and the queues and exchanges
they made are deleted, so that a long run does not pile up retrying
replica links.
"""

from __future__ import annotations

import random
from typing import Any

from proton import Delivery, Endpoint, Message

from hastandby.client import ManagementError

from . import features, mutate, values
from .base import REFERENCE_QUEUE, CaseRecord, Kind
from .checks import admin_request
from .wire import Engine, WireError

OPERATIONS = ["CREATE", "DELETE", "BIND", "UNBIND", "PURGE", "QUERY", "STATUS", "PING", "IDS", "PROMOTE",
              "REPLICATE", "REPLICATE-STOP", "USER-LIST", "USER-ADD", "USER-PASSWD", "USER-DEL", "ACL-RELOAD"]
PROTECTED_USERS = {"admin", "app", "peer"}
CLEANUP_EVERY = 50
EXCHANGE_TYPES = ["direct", "topic", "fanout", "headers", "", "xml"]


def _name(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.6:
        return f"fz.m{rng.randrange(8)}"
    if roll < 0.7:
        return rng.choice(["fz.q", "fz.reply", "amq.direct", "amq.topic", "$management", "$dr.k.fz.m1", ""])
    return values.text(rng)


def request_for(rng: random.Random, operation: str) -> tuple[dict[str, Any], Any]:
    """A valid (or nearly) request of ``operation``: its application properties and body."""
    kind = rng.choice(["queue", "queue", "exchange", ""])
    name = _name(rng)
    body: dict[str, Any] = {}
    if operation == "CREATE" and kind == "exchange":
        body = {"exchange-type": rng.choice(EXCHANGE_TYPES), "arguments": {"qpid.replicate": "none"},
                "alternate-exchange": rng.choice([None, "", "amq.fanout", _name(rng)]), "durable": False}
    elif operation == "CREATE":
        arguments: dict[str, Any] = {}
        for key, make in (("qpid.replicate", lambda: rng.choice(["none", "configuration", "all"])),
                          ("qpid.max_count", lambda: rng.choice([1, 10, 1000])),
                          ("qpid.max_size", lambda: rng.choice([1, 100, 10**6])),
                          ("qpid.policy_type", lambda: rng.choice(["reject", "ring"])),
                          ("qpid.auto_delete_timeout", lambda: rng.choice([0, 0.5, 10]))):
            if rng.random() < 0.4:
                arguments[key] = make()
        if rng.random() < 0.5:  # queue features: valid, boundary, look-alike and wrong-typed values (features.py)
            arguments = features.queue_arguments(rng, arguments)
        body = {"arguments": arguments, "exclusive": rng.random() < 0.2, "auto-delete": rng.random() < 0.2,
                "durable": False}
    elif operation in ("BIND", "UNBIND"):
        body = {"exchange": rng.choice(["amq.direct", "amq.topic", "amq.fanout", _name(rng)]), "queue": _name(rng),
                "key": rng.choice(["", "k", "#", "a.*"]), "arguments": {}}
    elif operation == "IDS":
        body = {"after": rng.choice([0, 1, 5]), "limit": rng.choice([1, 10, 10000])}
    elif operation == "REPLICATE":
        body = {"source": rng.choice(["127.0.0.1:1", "127.0.0.1:1,127.0.0.1:2", "amqp://127.0.0.1:1", "nowhere",
                                      ""]),
                "mode": rng.choice(["full", "enqueue"]), "create": rng.random() < 0.7, "sync": rng.random() < 0.2,
                "max-backlog-count": rng.choice([None, 10, 0]), "arguments": {"qpid.replicate": "none"}}
    elif operation in ("USER-ADD", "USER-PASSWD", "USER-DEL"):
        body = {"user": rng.choice([f"fz-user{rng.randrange(4)}", values.text(rng)]),
                "password": rng.choice(["secret", "", "p" * 1000]), "groups": rng.choice([[], ["cluster"], ["x"]])}
    properties = {"operation": operation, "type": kind, "name": name}
    return properties, body


def _protect(properties: dict[str, Any], body: Any) -> None:
    """Keep the checks' own queue and users out of the cases' reach (see the module docstring)."""
    if properties.get("name") == REFERENCE_QUEUE:
        properties["name"] = "fz.m0"
    if isinstance(body, dict):
        for key in ("queue", "exchange"):
            if body.get(key) == REFERENCE_QUEUE:
                body[key] = "fz.m0"
        if isinstance(body.get("user"), str) and body["user"] in PROTECTED_USERS:
            body["user"] = "fz-user0"


def mutated_request(rng: random.Random, record: CaseRecord) -> tuple[dict[str, Any], Any, list[str]]:
    # CREATE weighs four times the others: queue arguments (features.py) are what most of it checks.
    operation = rng.choice(OPERATIONS + ["CREATE"] * 3) if rng.random() < 0.9 else values.text(rng)
    properties, body = request_for(rng, operation if isinstance(operation, str) else "")
    notes = [f"request {operation!r}"]
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        roll = rng.random()
        if roll < 0.25:
            key = rng.choice(["operation", "type", "name"])
            properties[key] = values.like(rng, properties.get(key, ""))
            notes.append(f"property {key} -> {_short(properties[key])}")
        elif roll < 0.3:
            key = rng.choice(["operation", "type", "name"])
            properties.pop(key, None)
            notes.append(f"property {key} dropped")
        elif roll < 0.35:
            properties[values.key(rng)] = values.value(rng)
            notes.append("an extra application property")
        elif roll < 0.8 and isinstance(body, dict):
            body = values.like(rng, body)
            notes.append(f"body -> {_short(body)}")
        elif roll < 0.9:
            body = values.value(rng)
            notes.append(f"body replaced: {_short(body)}")
        else:
            depth = rng.choice([10, 100, 200])
            nested: Any = {}
            for _ in range(depth):
                nested = rng.choice([{"k": nested}, [nested]])
            body = {"arguments": nested} if rng.random() < 0.5 else nested
            notes.append(f"body nested {depth} deep")
    _protect(properties, body)
    return properties, body, notes


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Session:
    """One management connection's links and what came back."""

    def __init__(self, engine: Engine) -> None:
        session = engine.connection.session()
        session.open()
        self.sender = session.sender("fz-mgmt")
        self.sender.target.address = "$management"
        self.sender.open()
        self.replies = session.receiver("fz-mgmt-replies")
        self.replies.source.dynamic = True
        self.replies.open()
        self.replies.flow(20)
        self.outcomes: list[str] = []
        self.statuses: list[str] = []
        self.closed: list[str] = []

    def ready(self) -> bool:
        return bool(self.sender.state & Endpoint.REMOTE_ACTIVE and self.sender.credit > 0
                    and self.replies.state & Endpoint.REMOTE_ACTIVE) or bool(self.closed)

    @property
    def reply_to(self) -> str | None:
        return self.replies.remote_source.address

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        if delivery.link == self.sender:
            if delivery.remote_state:
                condition = delivery.remote.condition
                self.outcomes.append(f"{delivery.remote_state}" + (f" {condition.name}" if condition else ""))
                delivery.settle()
            return
        if not delivery.readable or delivery.partial:
            return
        data = delivery.link.recv(delivery.pending)
        delivery.link.advance()
        message = Message()
        try:
            message.decode(data)
            props = message.properties or {}
            self.statuses.append(f"{props.get('statusCode')} {props.get('condition') or ''}".strip())
        except Exception as error:  # noqa: BLE001 - a reply that is not a message is noted, whatever fails
            self.statuses.append(f"undecodable reply: {error}")
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()

    def on_link_remote_close(self, event: Any) -> None:
        condition = event.link.remote_condition
        self.closed.append(f"detach: {condition.name if condition else None}")

    def on_connection_remote_close(self, event: Any) -> None:
        condition = event.connection.remote_condition
        self.closed.append(f"close: {condition.name if condition else None}")


class ManagementKind(Kind):
    name = "management"
    summary = "mutated management requests (operations, types, bodies, envelopes, bytes) as admin and as app"

    def setup(self) -> None:
        self.node = self.start_node("management")
        self.prepare(self.node)
        self.cases = 0

    def run_case(self, rng: random.Random, index: int) -> CaseRecord:
        record = CaseRecord(target=self.node)
        self.cases += 1
        if self.cases % CLEANUP_EVERY == 0:
            self.cleanup()
        user = rng.choice(["admin"] * 6 + ["app"] * 3 + ["peer"])
        record.note(f"as {user}")
        node = self.node
        assert node is not None
        try:
            engine = Engine.connect(node.host, node.port, user, self.users.passwords[user],
                                    container=f"fz-mgmt-{index}")
        except WireError as error:
            record.conditions.append(f"connect: {error}")
            return record
        try:
            session = _Session(engine)
            engine.run_until(session.ready, 2.0, session)
            sent = 0
            for number in range(rng.choice([1, 1, 2, 3])):
                if session.closed or not session.ready():
                    break
                self._send(rng, session, number, record)
                sent += 1
            engine.run_until(lambda: len(session.outcomes) >= sent or bool(session.closed),
                             rng.choice([0.3, 0.6]), session)
            if session.statuses and rng.random() < 0.5:
                engine.run_for(0.05, session)
            record.conditions += [f"outcome: {o}" for o in session.outcomes]
            record.conditions += [f"status: {s}" for s in session.statuses]
            record.conditions += session.closed
        finally:
            engine.close(linger=rng.choice([0.0, 0.1]))
        return record

    def _send(self, rng: random.Random, session: _Session, number: int, record: CaseRecord) -> None:
        properties, body, notes = mutated_request(rng, record)
        record.description.extend(notes)
        reply_to = session.reply_to
        roll = rng.random()
        if roll < 0.07:
            reply_to = None
            record.note("no reply-to")
        elif roll < 0.12:
            reply_to = rng.choice(["fz.nowhere", "", values.text(rng)])
            record.note(f"reply-to {reply_to!r}")
        message_id = f"fz-{number}" if rng.random() < 0.9 else values.value(rng)
        try:
            message = Message(properties=properties, body=body, reply_to=reply_to, id=message_id,
                              correlation_id=values.value(rng) if rng.random() < 0.05 else None)
            data = bytes(message.encode())
        except Exception as error:  # noqa: BLE001 - proton cannot encode it (e.g. a message-id of a type it refuses)
            record.note(f"unencodable ({type(error).__name__}): sent a minimal request instead")
            properties = {"operation": "PING"}
            data = bytes(Message(properties=properties, body={}, reply_to=reply_to).encode())
        if rng.random() < 0.15:
            data, byte_notes = mutate.mutate_bytes(rng, data)
            record.note("request bytes: " + "; ".join(byte_notes))
        elif rng.random() < 0.01:  # beyond the management_request limit (1 MiB): refused, not read
            data = bytes(Message(properties=properties, body={"x": "x" * (3 * 1024 * 1024 // 2)},
                                 reply_to=reply_to).encode())
            record.note(f"a request of {len(data)} bytes")
        sender = session.sender
        sender.delivery(b"fz-%d" % number)
        sender.send(data)
        sender.advance()

    def cleanup(self) -> None:
        """Stop the replications the cases configured and delete the objects they made (as admin)."""
        node = self.node
        assert node is not None
        query = admin_request(node, "QUERY")
        for replica in (query.get("replication") or {}).get("replicas") or []:
            try:
                admin_request(node, "REPLICATE-STOP", "queue", str(replica.get("queue")))
            except ManagementError:
                pass
        for queue in query.get("queues") or []:
            name = str(queue.get("name") if isinstance(queue, dict) else queue)
            if name not in (REFERENCE_QUEUE, "fz.q", "fz.reply") and not name.startswith("temp."):
                try:
                    admin_request(node, "DELETE", "queue", name)
                except ManagementError:
                    pass
        for exchange in query.get("exchanges") or []:
            name = str(exchange.get("name") if isinstance(exchange, dict) else exchange)
            if not name.startswith("amq.") and name:
                try:
                    admin_request(node, "DELETE", "exchange", name)
                except ManagementError:
                    pass
