"""The two kinds of client link: messages out of a queue, and messages into a node.

These are the per-message hot path, so they talk to the proton C engine
directly (``cproton.lib``) with the raw delivery pointers the driver hands
them, and keep payloads as opaque bytes.  A delivery tag is the message's
replication id in decimal, so a disposition names its message without a
lookup table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from cproton import PN_ACCEPTED, PN_MODIFIED, PN_REJECTED, PN_RELEASED, ffi, lib
from proton import Condition, Delivery, Link

from . import sections
from .completion import Completion
from .errors import BrokerError, InvalidArgument, NotFound
from .queue import Queue

if TYPE_CHECKING:
    from .registry import Node, Registry

_OUTCOMES = (PN_ACCEPTED, PN_REJECTED, PN_RELEASED, PN_MODIFIED)


def delivery_tag(delivery: Any) -> bytes:
    tag = lib.pn_delivery_tag(delivery)
    return ffi.unpack(tag.start, tag.size)


def send_payload(link: Any, tag: bytes, data: bytes) -> Any:
    """Hot path: send ``data`` as one whole delivery tagged ``tag``; returns the raw delivery."""
    delivery = lib.pn_delivery(link, (len(tag), ffi.from_buffer(tag)))
    lib.pn_link_send(link, ffi.from_buffer(data), len(data))
    lib.pn_link_advance(link)
    return delivery


def take_payload(link: Any, size: int) -> bytes:
    """Hot path: the ``size`` bytes of a complete incoming delivery, and move the link on."""
    buf = ffi.new("char[]", size)
    lib.pn_link_recv(link, buf, size)
    lib.pn_link_advance(link)
    return ffi.unpack(buf, size)


def receive_whole(impl: Any) -> tuple[Delivery, bytes] | None:
    """For low-rate links (management, wiring): the message of a complete delivery.

    Returns None while the delivery is still partial; otherwise reads it,
    moves the link on and gives back one credit.
    """
    delivery = Delivery.wrap(impl)
    if delivery.partial or not delivery.readable:
        return None
    link = delivery.link
    data = link.recv(delivery.pending)
    link.advance()
    link.flow(1)
    return delivery, data


def close_link(link: Link, error: Exception) -> None:
    """Detach a link with an AMQP error naming what went wrong."""
    condition = error.condition if isinstance(error, BrokerError) else "amqp:internal-error"
    link.condition = Condition(condition, f"{error}")
    link.close()


class OutgoingLink:
    """A client's receiver on a queue: it acquires messages, or browses them."""

    def __init__(self, link: Link, queue: Queue, registry: "Registry", browsing: bool) -> None:
        self.link = link
        self._impl = link._impl
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
        impl = self._impl
        if delivery_count:
            data = sections.with_delivery_count(data, delivery_count)
        delivery = send_payload(impl, b"%d" % msg_id, data)
        self.credit -= 1
        if self.presettled:
            lib.pn_delivery_settle(delivery)
            if not self.browsing:
                queue.acknowledge(msg_id)
        elif not self.browsing:
            self.unsettled.add(msg_id)

    def flow(self) -> None:
        """The client granted credit (or asked to drain)."""
        impl = self._impl
        self.credit = lib.pn_link_credit(impl)
        self.queue.dispatch()
        if self.credit > 0 and lib.pn_link_get_drain(impl):
            lib.pn_link_drained(impl)
            self.credit = 0

    def on_delivery(self, delivery: Any) -> None:
        """The client settled or updated a delivery: ack, reject or release it."""
        state = lib.pn_delivery_remote_state(delivery)
        settled = lib.pn_delivery_settled(delivery)
        if self.browsing:
            if settled or state:
                lib.pn_delivery_settle(delivery)
            return
        if state not in _OUTCOMES and not settled:
            return  # no outcome yet (e.g. a 'received' state)
        msg_id = int(delivery_tag(delivery))
        lib.pn_delivery_settle(delivery)
        if msg_id not in self.unsettled:
            return
        self.unsettled.discard(msg_id)
        queue = self.queue
        if state == PN_ACCEPTED or state not in _OUTCOMES:
            queue.acknowledge(msg_id)
        elif state == PN_REJECTED:
            self.registry.reject_to_alternate(queue, msg_id)
        elif state == PN_RELEASED:
            queue.release(msg_id, delivery_failed=False)
        else:
            failed = lib.pn_disposition_is_failed(lib.pn_delivery_remote(delivery))
            queue.release(msg_id, delivery_failed=bool(failed))

    def fail(self, error: Exception) -> None:
        self.close()
        close_link(self.link, error)

    def close(self) -> None:
        """Link detached or connection lost: unsettled messages go back to the queue."""
        if self.closed:
            return
        self.closed = True
        queue = self.queue
        queue.remove_consumer(self)
        for msg_id in sorted(self.unsettled):
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
        may_acknowledge: Callable[[], bool],
        window: int = 1000,
    ) -> None:
        self.link = link
        self.may_acknowledge = may_acknowledge
        self._impl = link._impl
        self.node = node  # None: anonymous relay, route on each message's 'to'
        self.registry = registry
        self.max_message_size = max_message_size
        self.window = window
        self.closed = False

    def start(self) -> None:
        lib.pn_link_flow(self._impl, self.window)

    def on_delivery(self, delivery: Any) -> None:
        impl = self._impl
        size = lib.pn_delivery_pending(delivery)
        if lib.pn_delivery_partial(delivery):
            if self.max_message_size and size > self.max_message_size:
                self._too_big(delivery)
            return
        if not lib.pn_delivery_readable(delivery):
            return
        if self.max_message_size and size > self.max_message_size:
            self._too_big(delivery)
            return
        data = take_payload(impl, size)
        credit = lib.pn_link_credit(impl)
        if credit < self.window // 2:
            lib.pn_link_flow(impl, self.window - credit)
        if not data:
            # proton's reconnect re-sends an in-doubt delivery as an empty transfer:
            # no message, nothing to queue (a consumer could not decode it).
            _reject(delivery, InvalidArgument("an empty transfer is not a message"))
            return
        if lib.pn_delivery_settled(delivery):
            try:
                self._route(data, None)
            except BrokerError:
                pass  # at-most-once: the sender asked for no outcome
            lib.pn_delivery_settle(delivery)
            return
        completion = Completion(self._accept, delivery)
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

    def _accept(self, delivery: Any) -> None:
        if self.closed:
            return  # the link is gone; the sender will resend after failover
        if not self.may_acknowledge():
            return  # fenced: no longer sure to be the only primary; left unsettled
        lib.pn_delivery_update(delivery, PN_ACCEPTED)
        lib.pn_delivery_settle(delivery)

    def _too_big(self, delivery: Any) -> None:
        lib.pn_delivery_settle(delivery)
        self.fail(BrokerError(f"message larger than the maximum of {self.max_message_size} bytes"),
                  "amqp:link:message-size-exceeded")

    def fail(self, error: Exception, condition: str | None = None) -> None:
        self.close()
        if condition is not None:
            self.link.condition = Condition(condition, str(error))
            self.link.close()
        else:
            close_link(self.link, error)

    def close(self) -> None:
        self.closed = True


def _reject(delivery: Any, error: BrokerError) -> None:
    wrapped = Delivery.wrap(delivery)
    wrapped.local.condition = Condition(error.condition, str(error))
    wrapped.update(Delivery.REJECTED)
    wrapped.settle()
