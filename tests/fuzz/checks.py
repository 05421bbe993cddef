"""What must hold after every case: the node answers, and a reference producer and consumer lose nothing.

``reference(node, ...)`` opens one authenticated connection (``app``; on an HA
backup, which refuses clients, ``admin`` marked ``qpid.ha-admin`` on a local
queue), asks ``$management`` for a PING, sends ``count`` messages to the
reference queue, waits until each is accepted, and receives them all back
(in order, each exactly once, each accepted).  Every wait is bounded: a node
that does not answer within ``timeout`` is a hang.  A message the node
accepted and did not give back is a loss; one it gives back later is
counted as late, and one that was never sent as conjured.

The same connection is fresh for every check, so it also proves the node
still takes new connections and logins.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from proton import Delivery, Endpoint, Message, symbol

from hastandby.testing.auth import ADMIN

from .wire import Engine, WireError, raw_tag

ADMIN_PROPERTY = symbol("qpid.ha-admin")
_serial = itertools.count(1)
_STATES = {Delivery.ACCEPTED: "ACCEPTED", Delivery.REJECTED: "REJECTED", Delivery.RELEASED: "RELEASED",
           Delivery.MODIFIED: "MODIFIED", Delivery.RECEIVED: "RECEIVED"}


@dataclass
class CheckResult:
    ok: bool
    hang: bool = False
    lost: int = 0
    late: int = 0
    conjured: int = 0
    error: str = ""
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)


class _Reference:
    """The handler of one reference connection."""

    def __init__(self, engine: Engine, queue: str, count: int, tag: str) -> None:
        self.engine = engine
        self.count = count
        self.tag = tag
        session = engine.connection.session()
        session.open()
        self.sender = session.sender(f"ref-sender-{tag}")
        self.sender.target.address = queue
        self.sender.open()
        self.receiver = session.receiver(f"ref-receiver-{tag}")
        self.receiver.source.address = queue
        self.receiver.open()
        self.receiver.flow(count)
        self.mgmt = session.sender(f"ref-mgmt-{tag}")
        self.mgmt.target.address = "$management"
        self.mgmt.open()
        self.replies = session.receiver(f"ref-replies-{tag}")
        self.replies.source.dynamic = True
        self.replies.open()
        self.replies.flow(5)
        self.sent: list[str] = []
        self.outcomes: dict[str, str] = {}
        self.received: list[str] = []
        self.foreign: list[str] = []
        self.ping: int | None = None
        self.ping_sent = False
        self.error = ""

    # -- progress ------------------------------------------------------------------

    def step(self) -> None:
        """Send what can be sent now (messages as credit allows, the PING once the reply queue exists)."""
        if self.sender.state & Endpoint.REMOTE_ACTIVE:
            while len(self.sent) < self.count and self.sender.credit > 0:
                body = f"ref:{self.tag}:{len(self.sent)}"
                delivery = self.sender.delivery(body.encode())
                self.sender.send(Message(body=body, durable=False).encode())
                self.sender.advance()
                self.sent.append(body)
                delivery.hs_body = body  # type: ignore[attr-defined]
        reply_to = self.replies.remote_source.address if self.replies.state & Endpoint.REMOTE_ACTIVE else None
        if not self.ping_sent and reply_to and self.mgmt.state & Endpoint.REMOTE_ACTIVE and self.mgmt.credit > 0:
            request = Message(properties={"operation": "PING", "type": "", "name": ""}, body={}, reply_to=reply_to,
                              id=f"ping-{self.tag}")
            self.mgmt.delivery(b"ping")
            self.mgmt.send(request.encode())
            self.mgmt.advance()
            self.ping_sent = True

    def done(self) -> bool:
        self.step()
        if self.error:
            return True
        return (len(self.outcomes) == self.count and len(self.received) >= self.count and self.ping is not None)

    # -- events ---------------------------------------------------------------------

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        link = delivery.link
        if link.is_sender:
            if delivery.remote_state and delivery.link == self.sender:
                body = raw_tag(delivery).decode(errors="replace")
                self.outcomes[body] = _STATES.get(delivery.remote_state, str(delivery.remote_state))
                delivery.settle()
            elif delivery.remote_state or delivery.remote_settled:
                delivery.settle()
            return
        if not delivery.readable or delivery.partial:
            return
        data = link.recv(delivery.pending)
        link.advance()
        message = Message()
        try:
            message.decode(data)
        except Exception as error:  # noqa: BLE001 - a node that sends garbage: the check fails, saying so
            self.error = f"undecodable message from the node: {error}"
            return
        if link == self.replies:
            props = message.properties or {}
            self.ping = int(props.get("statusCode", 0) or 0)
            if self.ping != 200:
                self.error = f"PING answered {self.ping}: {props.get('statusDescription')}"
        else:
            body = str(message.body)
            if body.startswith(f"ref:{self.tag}:"):
                self.received.append(body)
            else:
                self.foreign.append(body)
                link.flow(1)  # it took one of our credits
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()

    def _closed(self, what: str, endpoint: Any) -> None:
        condition = endpoint.remote_condition
        self.error = self.error or f"{what} closed by the node: " + (
            f"{condition.name}: {condition.description}" if condition else "no condition")

    def on_link_remote_close(self, event: Any) -> None:
        self._closed(f"link {event.link.name}", event.link)

    def on_session_remote_close(self, event: Any) -> None:
        self._closed("session", event.session)

    def on_connection_remote_close(self, event: Any) -> None:
        self._closed("connection", event.connection)


def reference(node: Any, queue: str, count: int = 10, timeout: float = 5.0, user: str = "app",
              admin_link: bool = False) -> CheckResult:
    """Ping the node and run ``count`` messages through ``queue`` as ``user``; see the module docstring."""
    started = time.monotonic()
    properties = {ADMIN_PROPERTY: True} if admin_link else None
    try:
        engine = Engine.connect(node.host, node.port, user, node.users.passwords[user], properties=properties,
                                container=f"fuzz-reference-{next(_serial)}", timeout=timeout)
    except (WireError, OSError) as error:
        hang = "within" in str(error) or "timed out" in str(error)
        return CheckResult(False, hang=hang, error=f"reference connection: {error}",
                           seconds=time.monotonic() - started)
    tag = f"{next(_serial)}"
    handler = _Reference(engine, queue, count, tag)
    try:
        finished = engine.run_until(handler.done, max(0.1, timeout - (time.monotonic() - started)), handler)
    finally:
        engine.close(linger=0.2)
    seconds = time.monotonic() - started
    accepted = [body for body, state in handler.outcomes.items() if state == "ACCEPTED"]
    outcomes: dict[str, int] = {}
    for state in handler.outcomes.values():
        outcomes[state] = outcomes.get(state, 0) + 1
    received = set(handler.received)
    lost = sum(1 for body in accepted if body not in received)
    conjured = sum(1 for body in handler.received if body not in handler.sent) + \
        (len(handler.received) - len(received))
    late = sum(1 for body in handler.foreign if body.startswith("ref:"))
    result = CheckResult(True, lost=lost, late=late, conjured=conjured, seconds=seconds, outcomes=outcomes)
    if handler.error:
        result.ok, result.error = False, handler.error
    elif not finished:
        result.ok, result.hang = False, True
        result.error = (f"no answer within {timeout:g} s: {len(handler.sent)}/{count} sent, "
                        f"{len(handler.outcomes)} settled, {len(handler.received)} received, ping {handler.ping}")
    elif len(accepted) != count:
        result.ok, result.error = False, f"messages not accepted: {outcomes}"
    elif lost or conjured:
        result.ok, result.error = False, f"{lost} lost, {conjured} conjured"
    elif handler.received != handler.sent:
        result.ok, result.error = False, "messages out of order"
    return result


def ping(node: Any, user: str = ADMIN, timeout: float = 3.0, admin_link: bool = True) -> tuple[bool, str]:
    """A management PING as ``user``: (answered 200 within ``timeout``, why not)."""
    status, description = request(node, "PING", user, timeout, admin_link)
    return status == 200, description


def request(node: Any, operation: str, user: str = ADMIN, timeout: float = 3.0,
            admin_link: bool = True) -> tuple[int | None, str]:
    """One management request on a fresh connection: (its statusCode, or None without an answer; words)."""
    properties = {ADMIN_PROPERTY: True} if admin_link else None
    try:
        engine = Engine.connect(node.host, node.port, user, node.users.passwords[user], properties=properties,
                                container=f"fuzz-request-{next(_serial)}", timeout=timeout)
    except (WireError, OSError) as error:
        return None, str(error)
    try:
        session = engine.connection.session()
        session.open()
        sender = session.sender("request")
        sender.target.address = "$management"
        sender.open()
        replies = session.receiver("request-replies")
        replies.source.dynamic = True
        replies.open()
        replies.flow(1)
        answer: dict[str, Any] = {}
        closed: list[str] = []

        class Handler:
            def on_delivery(self, event: Any) -> None:
                delivery = event.delivery
                if delivery.link == replies and delivery.readable and not delivery.partial:
                    message = Message()
                    message.decode(replies.recv(delivery.pending))
                    replies.advance()
                    answer.update(message.properties or {})
                    answer.setdefault("statusCode", 0)
                    delivery.update(Delivery.ACCEPTED)
                    delivery.settle()
                elif delivery.link == sender and delivery.remote_state:
                    delivery.settle()

            def on_link_remote_close(self, event: Any) -> None:
                condition = event.link.remote_condition
                closed.append(f"{event.link.name} closed by the node: {condition.name if condition else None}: "
                              f"{condition.description if condition else ''}")

        sent = [False]

        def done() -> bool:
            if not sent[0] and sender.credit > 0 and replies.state & Endpoint.REMOTE_ACTIVE:
                message = Message(properties={"operation": operation, "type": "", "name": ""}, body={},
                                  reply_to=replies.remote_source.address, id=operation.lower())
                sender.delivery(b"request")
                sender.send(message.encode())
                sender.advance()
                sent[0] = True
            return bool(answer) or bool(closed)

        if not engine.run_until(done, timeout, Handler()):
            return None, f"no {operation} reply within {timeout:g} s"
        if closed and not answer:
            return 0, closed[0]
        status = int(answer.get("statusCode", 0) or 0)
        return status, f"{operation} answered {status}: {answer.get('statusDescription')}"
    finally:
        engine.close(linger=0.1)


def operations_answered(node: Any, result: CheckResult, operations: tuple[str, ...],
                        timeout: float = 5.0) -> CheckResult:
    """``result``, failed unless each management operation is answered 200 (as admin) within ``timeout``."""
    for operation in operations:
        if not result.ok:
            break
        status, description = request(node, operation, timeout=timeout)
        if status != 200:
            result.ok, result.error, result.hang = False, description, status is None
    return result


def admin_request(node: Any, operation: str, type: str = "", name: str = "", body: dict | None = None,
                  timeout: float = 10.0) -> Any:
    """A setup request as ``admin`` through the product's own client; raises ManagementError."""
    from hastandby.client import ManagementClient

    with ManagementClient(node.address, timeout=timeout, login=node.users.login(ADMIN)) as client:
        return client.request(operation, type, name, body)
