"""The two kinds of client link: messages out of a queue, and messages into a node.

These are the per-message hot path.  Payloads stay opaque bytes; a delivery
tag is the message's replication id, so a disposition names its message
without any lookup table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proton import Condition, Delivery, Link

from . import sections
from .completion import Completion
from .errors import BrokerError, NotFound
from .queue import Queue

if TYPE_CHECKING:
    from .registry import Node, Registry

ACCEPTED = Delivery.ACCEPTED
REJECTED = Delivery.REJECTED
RELEASED = Delivery.RELEASED
MODIFIED = Delivery.MODIFIED
_OUTCOMES = (ACCEPTED, REJECTED, RELEASED, MODIFIED)


def _tag(msg_id: int) -> str:
    """Delivery tags are the decimal replication id (proton hands tags back as text)."""
    return str(msg_id)


class OutgoingLink:
    """A client's receiver on a queue: it acquires messages, or browses them."""

    def __init__(self, link: Link, queue: Queue, registry: "Registry", browsing: bool) -> None:
        self.link = link
        self.queue = queue
        self.registry = registry
        self.browsing = browsing
        self.sees_acquired = False
        self.presettled = link.snd_settle_mode == Link.SND_SETTLED
        self.credit = 0
        self.unsettled: set[int] = set()
        self.closed = False

    def start(self) -> None:
        self.queue.add_consumer(self)

    def deliver(self, queue: Queue, msg_id: int, data: bytes, delivery_count: int) -> None:
        link = self.link
        if delivery_count:
            data = sections.with_delivery_count(data, delivery_count)
        delivery = link.delivery(_tag(msg_id))
        link.send(data)
        link.advance()
        self.credit -= 1
        if self.presettled:
            delivery.settle()
            if not self.browsing:
                queue.acknowledge(msg_id)
        elif not self.browsing:
            self.unsettled.add(msg_id)

    def flow(self) -> None:
        """The client granted credit (or asked to drain)."""
        link = self.link
        self.credit = link.credit
        self.queue.dispatch()
        if link.drain_mode and self.credit > 0:
            link.drained()
            self.credit = 0

    def disposition(self, delivery: Delivery) -> None:
        """The client settled or updated a delivery: ack, reject or release it."""
        if self.browsing:
            if delivery.settled or delivery.remote_state:
                delivery.settle()
            return
        state = delivery.remote_state
        if state not in _OUTCOMES and not delivery.settled:
            return  # no outcome yet (e.g. a 'received' state)
        msg_id = int(delivery.tag)
        if msg_id not in self.unsettled:
            delivery.settle()
            return
        self.unsettled.discard(msg_id)
        queue = self.queue
        if state == ACCEPTED or state not in _OUTCOMES:
            queue.acknowledge(msg_id)
        elif state == REJECTED:
            self.registry.reject_to_alternate(queue, msg_id)
        elif state == RELEASED:
            queue.release(msg_id, delivery_failed=False)
        elif state == MODIFIED:
            queue.release(msg_id, delivery_failed=bool(delivery.remote.failed))
        delivery.settle()

    def close(self) -> None:
        """Link detached or connection lost: unsettled messages go back to the queue."""
        if self.closed:
            return
        self.closed = True
        queue = self.queue
        queue.remove_consumer(self)
        for msg_id in list(self.unsettled):
            queue.release(msg_id, delivery_failed=True)
        self.unsettled.clear()
        self.registry.consumers_changed(queue)


class IncomingLink:
    """A client's sender: each complete transfer is routed and acknowledged."""

    def __init__(
        self,
        link: Link,
        node: "Node | None",
        registry: "Registry",
        max_message_size: int,
        window: int = 500,
    ) -> None:
        self.link = link
        self.node = node  # None: anonymous relay, route on each message's 'to'
        self.registry = registry
        self.max_message_size = max_message_size
        self.window = window
        self.closed = False

    def start(self) -> None:
        self.link.flow(self.window)

    def receive(self, delivery: Delivery) -> None:
        link = self.link
        if delivery.partial:
            if self.max_message_size and delivery.pending > self.max_message_size:
                self._too_big(delivery)
            return
        if not delivery.readable:
            return
        size = delivery.pending
        if self.max_message_size and size > self.max_message_size:
            self._too_big(delivery)
            return
        data = link.recv(size)
        link.advance()
        if link.credit < self.window // 2:
            link.flow(self.window - link.credit)
        if delivery.settled:
            try:
                self._route(data, None)
            except BrokerError:
                pass  # at-most-once: the sender asked for no outcome
            delivery.settle()
            return
        completion = Completion(_accept, delivery)
        try:
            self._route(data, completion)
        except BrokerError as error:
            _reject(delivery, error)
            return
        completion.release()

    def _route(self, data: bytes, completion: Completion | None) -> None:
        registry = self.registry
        node = self.node
        if node is None:
            address = sections.to_address(data)
            node = registry.lookup(address or "")
            if node is None:
                raise NotFound(f"no such queue or exchange: {address!r}")
        registry.deliver(registry.route(node, data), data, completion)

    def _too_big(self, delivery: Delivery) -> None:
        self.link.condition = Condition(
            "amqp:link:message-size-exceeded",
            f"message larger than the maximum of {self.max_message_size} bytes",
        )
        self.link.close()
        delivery.settle()

    def close(self) -> None:
        self.closed = True


def _accept(delivery: Delivery) -> None:
    delivery.update(ACCEPTED)
    delivery.settle()


def _reject(delivery: Delivery, error: BrokerError) -> None:
    delivery.local.condition = Condition(error.condition, str(error))
    delivery.update(REJECTED)
    delivery.settle()

