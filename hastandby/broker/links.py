"""The two kinds of client link, and the proton C calls every per-message link makes.

These are the per-message hot path, so they talk to the proton C engine
directly (``cproton.lib``) with the raw delivery pointers the driver hands
them, and keep payloads as opaque bytes.  A delivery tag is the message's
replication id in decimal, so a disposition names its message without a
lookup table.

This module and the driver are the only ones that import ``cproton``: the
replication links (``replication/``, ``ha/``, ``dr/``) use the C calls
bound below and the helpers beside them, so a proton upgrade that changes
the C binding is fixed in two files.
"""

from __future__ import annotations

from time import monotonic as _monotonic
from typing import TYPE_CHECKING, Any, Callable, Sequence

from cproton import PN_ACCEPTED, PN_MODIFIED, PN_REJECTED, PN_RELEASED, ffi, lib

from proton import Condition, Connection, Delivery, Endpoint, Link

from hastandby.broker.message import sections
from hastandby.broker.admission.backlog import Backlog
from hastandby.broker.queues.completion import Completion
from hastandby.broker.errors import BrokerError, InvalidArgument, NotFound
from hastandby.broker.admission.fence import Fence
from hastandby.broker.admission.memory import MemoryAlarm
from hastandby.broker.queues.queue import Queue

if TYPE_CHECKING:
    from hastandby.broker.queues.registry import Node, Registry

_OUTCOMES = (PN_ACCEPTED, PN_REJECTED, PN_RELEASED, PN_MODIFIED)

# The C calls of the per-message paths, bound once: ``lib.name`` is a lookup
# (about 30 ns) on every use.  Public: the replication links use them too.
pn_delivery = lib.pn_delivery
pn_delivery_tag = lib.pn_delivery_tag
pn_delivery_pending = lib.pn_delivery_pending
pn_link_current = lib.pn_link_current
pn_delivery_partial = lib.pn_delivery_partial
pn_delivery_readable = lib.pn_delivery_readable
pn_delivery_settled = lib.pn_delivery_settled
pn_delivery_update = lib.pn_delivery_update
pn_delivery_settle = lib.pn_delivery_settle
pn_link_credit = lib.pn_link_credit
pn_delivery_remote_state = lib.pn_delivery_remote_state
pn_link_flow = lib.pn_link_flow
pn_link_send = lib.pn_link_send
pn_link_recv = lib.pn_link_recv
pn_link_advance = lib.pn_link_advance
_from_buffer = ffi.from_buffer
_unpack = ffi.unpack


def delivery_tag(delivery: Any) -> bytes:
    """The delivery's tag; a peer may send an empty one, which proton gives as NULL."""
    tag = pn_delivery_tag(delivery)
    return _unpack(tag.start, tag.size) if tag.size else b""


def send_payload(link: Any, tag: bytes, data: bytes) -> Any:
    """Hot path: send ``data`` as one whole delivery tagged ``tag``; returns the raw delivery.

    ``data`` goes to the C call as it is, not through ``ffi.from_buffer``,
    which cost more than the send itself (0.62 vs 0.28 us per 100-byte message);
    so it must be ``bytes`` (cffi refuses a bytearray there).
    """
    delivery = pn_delivery(link, (len(tag), _from_buffer(tag)))
    pn_link_send(link, data, len(data))
    pn_link_advance(link)
    return delivery


def send_settled(link: Any, tag: bytes, data: bytes) -> None:
    """Send ``data`` pre-settled: a control message (status, wiring, dequeues) nobody acknowledges."""
    pn_delivery_settle(send_payload(link, tag, data))


def accept(delivery: Any) -> None:
    """Accept and settle an incoming delivery (a pre-settled one is only settled)."""
    if not pn_delivery_settled(delivery):
        pn_delivery_update(delivery, PN_ACCEPTED)
    pn_delivery_settle(delivery)


_RECEIVE_BUFFER_SIZE = 64 * 1024
_receive_buffer = ffi.new("char[]", _RECEIVE_BUFFER_SIZE)
"""Every delivery up to 64 KiB is read through this one buffer: all links run on
the driver's thread, and a fresh ``ffi.new`` per message (allocated, zeroed)
cost more than the copy out of it (0.36 vs 0.13 us per 150-byte read)."""


def take_payload(link: Any, size: int) -> bytes:
    """Hot path: the ``size`` bytes of a complete incoming delivery, and move the link on."""
    buf = _receive_buffer if size <= _RECEIVE_BUFFER_SIZE else ffi.new("char[]", size)
    pn_link_recv(link, buf, size)
    pn_link_advance(link)
    return _unpack(buf, size)


def take_whole(link: Any, delivery: Any) -> bytes | None:
    """The payload of the link's current delivery if it has arrived whole (the link moves on), else None."""
    if pn_delivery_partial(delivery) or not pn_delivery_readable(delivery):
        return None
    return take_payload(link, pn_delivery_pending(delivery))


def take_deliveries(link: Any, take: Callable[[Any], bool]) -> None:
    """Hot path: ``take`` the link's current delivery, then each one the link moves on to.

    Only the link's current delivery can be read (``pn_delivery_readable`` is
    false for any other), and a delivery event may name any of the link's
    deliveries.  A receiver that took just the delivery its event named stalled
    for good, about one 100,000-message durable run in 50:
    ``benchmarks/durable_fill.py`` caught a node's link with 971
    complete deliveries queued behind its current one, every later event naming
    a delivery that was not current yet, and the producer, out of credit, sent
    nothing more.  So every receiver takes every complete delivery from the
    link's current one on, whichever delivery the event named.

    ``take(delivery)`` either takes the delivery (``take_payload`` moves the
    link on) or leaves it (partial, not readable, fenced): then the link's
    current delivery has not moved and the pass ends; that delivery's next
    event comes back to it.  ``take`` returns True once the receiver has let go
    of the link (closed, failed or refused it): the pass ends without touching
    the link again.
    """
    current = pn_link_current(link)
    while current:
        if take(current):
            return
        following = pn_link_current(link)
        if following == current:
            return
        current = following


def receive_each(impl: Any, handle: Callable[[Delivery, bytes], None]) -> None:
    """For low-rate links (management, wiring, status, DR acknowledgements): ``handle(delivery, payload)``
    every complete delivery from the link's current one on, whichever delivery the event ``impl`` names
    (``take_deliveries``), giving back a credit for each.

    The pass ends when ``handle`` raises, or once it has closed the link or its connection: what is
    still queued on a link we closed is not for us to read.
    """
    link = Delivery.wrap(impl).link

    def take(current: Any) -> bool:
        if pn_delivery_partial(current) or not pn_delivery_readable(current):
            return False
        delivery = Delivery.wrap(current)
        data = link.recv(delivery.pending) or b""  # None for a transfer with no payload
        link.advance()
        link.flow(1)
        handle(delivery, data)
        return not (link.state & Endpoint.LOCAL_ACTIVE and link.connection.state & Endpoint.LOCAL_ACTIVE)

    take_deliveries(link._impl, take)



def close_link(link: Link, error: Exception) -> None:
    """Detach a link with an AMQP error naming what went wrong."""
    condition = error.condition if isinstance(error, BrokerError) else "amqp:internal-error"
    link.condition = Condition(condition, f"{error}")
    link.close()


class OutgoingLink:
    """A client's receiver on a queue: it acquires messages, or browses them."""

    def __init__(self, link: Link, queue: Queue, registry: "Registry", browsing: bool,
                 backlog: Backlog | None = None) -> None:
        self.link = link
        self._impl = link._impl
        self.queue = queue
        self.registry = registry
        self.browsing = browsing
        self.sees_acquired = False
        self.presettled = link.snd_settle_mode == Link.SND_SETTLED
        self.credit = 0
        self.unsettled: dict[bytes, int] = {}  # delivery tag (the message id in digits) -> its bytes
        self.closed = False
        self.backlog = backlog or Backlog()
        self.paused = False  # the connection's backlog is over its limit: no credit until it is written

    def start(self) -> None:
        self.queue.add_consumer(self)

    def deliver(self, queue: Queue, msg_id: int, data: bytes, delivery_count: int) -> None:
        impl = self._impl
        if delivery_count:
            data = sections.with_delivery_count(data, delivery_count)
        tag = b"%d" % msg_id
        delivery = send_payload(impl, tag, data)
        self.credit -= 1
        settled = self.presettled or self.browsing
        size = len(data)
        if self.presettled:
            pn_delivery_settle(delivery)
            if not self.browsing:
                queue.acknowledge(msg_id)
        elif not self.browsing:
            self.unsettled[tag] = size
        if self.backlog.sent(size, settled) and not self.paused:
            self.paused = True
            self.credit = 0
            self.backlog.paused.append(self)

    def deliver_run(self, queue: Queue, ids: Sequence[int], payloads: list[bytes | None]) -> None:
        """A run of consecutive messages, which the queue hands a browser that sees acquired ones
        (``sees_acquired``) in one call.  One by one here; a batching link takes a run in one go."""
        self.deliver_each(queue, ids, payloads)

    def deliver_each(self, queue: Queue, ids: Sequence[int], payloads: list[bytes | None]) -> None:
        """The messages of a run one by one, holes (removed messages, ``None``) left out."""
        for msg_id, payload in zip(ids, payloads):
            if payload is not None:
                self.deliver(queue, msg_id, payload, 0)

    def resume(self) -> None:
        """The connection's backlog was written down: take messages again, up to the credit left."""
        self.paused = False
        if not self.closed:
            self.flow()

    def flow(self) -> None:
        """The client granted credit (or asked to drain); while paused, ``resume`` reads it later."""
        if self.paused:
            return
        impl = self._impl
        self.credit = lib.pn_link_credit(impl)
        self.queue.dispatch()
        if self.credit > 0 and lib.pn_link_get_drain(impl):
            lib.pn_link_drained(impl)
            self.credit = 0

    def on_delivery(self, delivery: Any) -> None:
        """The client settled or updated a delivery: ack, reject or release it."""
        state = pn_delivery_remote_state(delivery)
        settled = pn_delivery_settled(delivery)
        if self.browsing:
            if settled or state:
                pn_delivery_settle(delivery)
            return
        if state not in _OUTCOMES and not settled:
            return  # no outcome yet (e.g. a 'received' state)
        raw = pn_delivery_tag(delivery)  # ``delivery_tag`` inlined: a consumer settles every message
        tag = _unpack(raw.start, raw.size) if raw.size else b""
        pn_delivery_settle(delivery)
        size = self.unsettled.pop(tag, None)
        if size is None:
            return  # not one of ours (a peer's transfer on our sending link: a protocol error), or settled already
        msg_id = int(tag)
        self.backlog.settled(size)
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
        for msg_id in sorted(map(int, self.unsettled)):
            queue.release(msg_id, delivery_failed=True)
        self.backlog.settled(sum(self.unsettled.values()))
        self.unsettled.clear()
        self.registry.consumers_changed(queue)


class IncomingLink:
    """A client's sender: each complete transfer is routed and acknowledged.

    The producer's credit is topped up once half its window is used, and the
    flow frame is written at once (``write``, the connection socket's flush)
    rather than when the pass of events ends.  A pass reads up to 256 KiB
    (driver.IO_CHUNK), more than a whole window of small messages, so a
    top-up left for the pass's end let the producer run dry and wait for the
    node to handle every message it had sent: send and handle took turns
    instead of overlapping.
    """

    def __init__(
        self,
        link: Link,
        node: "Node | None",
        registry: "Registry",
        max_message_size: int,
        fence: Fence,
        on_fenced: Callable[[Connection], None],
        memory: MemoryAlarm,
        starved: set["IncomingLink"],
        may_publish: Callable[[str], None] | None = None,
        window: int = 1000,
        write: Callable[[], None] = lambda: None,
    ) -> None:
        self.link = link
        self.fence = fence
        self.on_fenced = on_fenced
        self.memory = memory
        self.starved = starved  # the links denied credit during a memory alarm, topped up when it clears
        self.may_publish = may_publish  # the anonymous relay's check of each message's address
        self._impl = link._impl
        self.node = node  # None: anonymous relay, route on each message's 'to'
        self._queues = [node] if isinstance(node, Queue) else None  # a queue's route, the same for every message
        self.registry = registry
        self.max_message_size = max_message_size
        self.window = window
        self.write = write
        self.closed = False

    def start(self) -> None:
        self.refill()

    def refill(self) -> None:
        """Top the producer's credit up to the window, unless memory is short (memory.py)."""
        if self.closed:
            return
        if self.memory.blocked:
            self.starved.add(self)
            return
        credit = lib.pn_link_credit(self._impl)
        if credit < self.window:
            lib.pn_link_flow(self._impl, self.window - credit)

    def on_delivery(self, delivery: Any) -> None:
        """Every complete delivery from the link's current one on, whichever ``delivery`` the event names
        (``take_deliveries``)."""
        # The first event of a pass took every complete delivery: the link has no current one
        # for the events after it (a C call here, not a Python one each).
        if not self.closed and pn_link_current(self._impl):
            take_deliveries(self._impl, self._take)

    def _take(self, delivery: Any) -> bool:
        """One delivery, the link's current: taken (the link moves on), or left while partial or fenced.
        True once this link is closed (``take_deliveries``)."""
        impl = self._impl
        size = pn_delivery_pending(delivery)
        if pn_delivery_partial(delivery):
            if self.max_message_size and size > self.max_message_size:
                self._too_big(delivery)
            return self.closed
        if not pn_delivery_readable(delivery):
            return self.closed
        if self.max_message_size and size > self.max_message_size:
            self._too_big(delivery)
            return self.closed
        if _monotonic() > self.fence.until:
            # Past the fence: take nothing (fence.py).  The transfer stays
            # unsettled and the producer sends it again to the next primary.
            self.on_fenced(self.link.connection)
            return self.closed
        data = take_payload(impl, size)
        credit = pn_link_credit(impl)
        if credit < self.window // 2:
            if self.memory.blocked:
                self.starved.add(self)
            else:
                pn_link_flow(impl, self.window - credit)
                self.write()
        if not data:
            # proton's reconnect re-sends an in-doubt delivery as an empty transfer:
            # no message, nothing to queue (a consumer could not decode it).
            _reject(delivery, InvalidArgument("an empty transfer is not a message"))
            return self.closed
        if pn_delivery_settled(delivery):
            try:
                self._route(data, None)
            except BrokerError:
                pass  # at-most-once: the sender asked for no outcome
            pn_delivery_settle(delivery)
            return self.closed
        completion = Completion(self._accept, delivery, self._refused)
        try:
            self._route(data, completion)
        except BrokerError as error:
            _reject(delivery, error)
            return self.closed
        if completion.finish_unless_held() and not self.closed:
            # Nobody held it (no guard, no journal): accepted now, ``_accept`` without its fence
            # check, which this transfer passed above, in this same call.
            pn_delivery_update(delivery, PN_ACCEPTED)
            pn_delivery_settle(delivery)
        return self.closed

    def _route(self, data: bytes, completion: Completion | None) -> None:
        registry = self.registry
        if self._queues is not None:
            registry.deliver(self._queues, data, completion)
            return
        node = self.node
        if node is None:
            address = sections.to_address(data)
            node = registry.lookup(address or "")
            if node is None:
                raise NotFound(f"no such queue or exchange: {address!r}")
            if self.may_publish is not None:
                self.may_publish(node.name)
        registry.deliver(registry.route(node, data), data, completion)

    def _accept(self, delivery: Any) -> None:
        if self.closed:
            return  # the link is gone; the sender will resend after failover
        if _monotonic() > self.fence.until:
            return  # fenced: no longer sure to be the only primary; left unsettled
        pn_delivery_update(delivery, PN_ACCEPTED)
        pn_delivery_settle(delivery)

    def _refused(self, delivery: Any, error: Exception) -> None:
        """A holder could not keep the message (the journal could not write it): the producer hears why."""
        if self.closed:
            return  # the link is gone; the sender will resend
        _reject(delivery, error if isinstance(error, BrokerError) else BrokerError(str(error)))

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
        self.starved.discard(self)


def _reject(delivery: Any, error: BrokerError) -> None:
    wrapped = Delivery.wrap(delivery)
    wrapped.local.condition = Condition(error.condition, str(error))
    wrapped.update(Delivery.REJECTED)
    wrapped.settle()
