"""Receivers take every complete delivery from their link's current one on (links.take_deliveries).

Only a link's current delivery can be read, and a delivery event may name
another: a receiver that took only the delivery its event named left the
current one, and everything queued behind it, unread for good (the durable
producer stall of ``benchmarks/durable_fill.py``).  Each receiver test here
gives a receiver one event naming the *second* of two complete deliveries on a
real proton link (two in-memory engines, no sockets) and checks it took both:
with the one-delivery-per-event code they take nothing.  The others check
where a pass ends: at a delivery left partial, or once the receiver let go of
its link (refused, fenced).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cproton import lib
from proton import Collector, Connection, Endpoint, Event, Link, Transport

from hastandby.broker.admission.fence import Fence
from hastandby.broker.links import IncomingLink, take_deliveries
from hastandby.broker.admission.memory import MemoryAlarm
from hastandby.broker.queues.queue import Queue, QueueSettings
from hastandby.replication.codec import encode_batch
from hastandby.ha.replicator import QueueReplicator
from hastandby.dr.config import ReplicationConfig
from hastandby.dr.protocol import EPOCH_PROPERTY, ReplicaIdentity
from hastandby.dr.replica import ReplicaLink


class Pair:
    """Two connected engines: ``near`` holds the receiver under test, ``far`` the sender feeding it."""

    def __init__(self) -> None:
        self.near, self.far = Connection(), Connection()
        self._near_t, self._far_t = Transport(), Transport(Transport.SERVER)
        self._near_t.bind(self.near)
        self._far_t.bind(self.far)
        self.events = Collector()
        self.near.collect(self.events)
        self.seen: dict[Any, list[Any]] = {}
        self.near.open()
        self.far.open()

    def pump(self) -> None:
        moved = True
        while moved:
            moved = False
            for source, sink in ((self._near_t, self._far_t), (self._far_t, self._near_t)):
                pending = source.pending()
                if pending > 0:
                    sink.push(source.peek(pending))
                    source.pop(pending)
                    moved = True

    def sender_for(self, name: str, properties: dict[Any, Any] | None = None) -> Link:
        """Answer the near side's attach of ``name``: open the far session and sending link."""
        self.pump()
        session = self.far.session_head(Endpoint.LOCAL_UNINIT)
        while session is not None:
            session.open()
            session = session.next(Endpoint.LOCAL_UNINIT)
        link = self.far.link_head(Endpoint.LOCAL_UNINIT)
        while link is not None and link.name != name:
            link = link.next(Endpoint.LOCAL_UNINIT)
        assert link is not None and link.is_sender
        link.source.address = link.remote_source.address
        link.target.address = link.remote_target.address
        if properties is not None:
            link.properties = properties
        link.open()
        self.pump()
        return link


def send(sender: Link, tag: bytes, data: bytes) -> None:
    sender.delivery(tag)
    sender.send(data)
    sender.advance()


def deliveries(pair: "Pair", impl: Any) -> list[Any]:
    """The deliveries the near side's events named on link ``impl`` so far, oldest first."""
    found = pair.seen.setdefault(impl, [])
    collector = pair.events
    while (event := collector.peek()) is not None:
        if event.type == Event.DELIVERY:
            delivery = event.delivery._impl
            if lib.pn_delivery_link(delivery) == impl and delivery not in found:
                found.append(delivery)
        collector.pop()
    return found


def test_take_deliveries_stops_where_the_link_does_not_move() -> None:
    pair = Pair()
    session = pair.near.session()
    session.open()
    receiver = session.receiver("r")
    receiver.source.address = receiver.target.address = "q"
    receiver.open()
    receiver.flow(10)
    sender = pair.sender_for("r")
    send(sender, b"1", b"one")
    send(sender, b"2", b"two")
    sender.delivery(b"3")
    sender.send(b"thr")  # not advanced: the third delivery stays partial
    pair.pump()
    impl = receiver._impl
    taken: list[bytes] = []

    def take(delivery: Any) -> bool:
        if lib.pn_delivery_partial(delivery):
            return False
        pending = lib.pn_delivery_pending(delivery)
        taken.append(receiver.recv(pending))
        receiver.advance()
        return False

    take_deliveries(impl, take)
    assert taken == [b"one", b"two"]
    assert lib.pn_link_current(impl) == deliveries(pair, impl)[2]  # the partial one, left for its next event

    sender.send(b"ee")
    sender.advance()
    send(sender, b"4", b"four")
    pair.pump()
    taken.clear()

    def take_then_let_go(delivery: Any) -> bool:
        take(delivery)
        return True  # e.g. refused: the receiver closed the link after taking this delivery

    take_deliveries(impl, take_then_let_go)
    assert taken == [b"three"]
    assert lib.pn_link_current(impl) == deliveries(pair, impl)[3]  # not touched again


def test_incoming_link_takes_what_queued_behind_the_current_delivery() -> None:
    pair = Pair()
    session = pair.near.session()
    session.open()
    link = session.receiver("producer")
    link.source.address = link.target.address = "q"
    link.open()
    routed: list[bytes] = []
    registry = SimpleNamespace(route=lambda node, data: node,
                               deliver=lambda node, data, completion: routed.append(data))
    incoming = IncomingLink(link, SimpleNamespace(name="q"), registry, 0, Fence(),  # type: ignore[arg-type]
                            lambda connection: None, MemoryAlarm(0), set(), window=10)
    incoming.start()
    sender = pair.sender_for("producer")
    send(sender, b"1", b"one")
    send(sender, b"2", b"two")
    pair.pump()
    incoming.on_delivery(deliveries(pair, link._impl)[1])  # an event naming the second, not the current one
    assert routed == [b"one", b"two"]
    assert not lib.pn_link_current(link._impl)


def test_replicator_takes_what_queued_behind_the_current_delivery() -> None:
    pair = Pair()
    session = pair.near.session()
    session.open()
    queue = Queue("q", QueueSettings(replicate="all"))
    replicator = QueueReplicator(queue)
    link = replicator.attach(session, 1)
    sender = pair.sender_for(link.name)
    send(sender, b"b1", encode_batch([1, 2], [b"m1", b"m2"]))
    send(sender, b"b2", encode_batch([3], [b"m3"]))
    pair.pump()
    replicator.on_delivery(deliveries(pair, link._impl)[1])
    assert replicator.received == 3 and list(queue.id_set()) == [1, 2, 3]
    assert not lib.pn_link_current(link._impl)


def test_replicator_refusal_ends_the_pass() -> None:
    pair = Pair()
    session = pair.near.session()
    session.open()
    queue = Queue("q", QueueSettings(replicate="all"))
    refused: list[Exception] = []
    replicator = QueueReplicator(queue, refuse=refused.append)
    link = replicator.attach(session, 1)
    sender = pair.sender_for(link.name)
    send(sender, b"b1", b"not a batch")
    send(sender, b"b2", encode_batch([3], [b"m3"]))
    pair.pump()
    replicator.on_delivery(deliveries(pair, link._impl)[1])
    assert len(refused) == 1 and replicator.received == 0 and queue.depth == 0


class _Driver:
    def __init__(self) -> None:
        self.endpoints: dict[Any, Any] = {}

    def register(self, link: Link, endpoint: Any) -> None:
        self.endpoints[link._impl] = endpoint

    def unregister(self, link: Link) -> None:
        self.endpoints.pop(link._impl, None)

    def schedule(self, delay: float, callback: Any) -> Any:
        return SimpleNamespace(cancel=lambda: None)


def _replica(pair: Pair, fence: Fence) -> tuple[ReplicaLink, Queue, Link]:
    queue = Queue("q", QueueSettings(replicate="all"))
    registry = SimpleNamespace(queue=lambda name: queue)
    replica = ReplicaLink(ReplicationConfig("q", "127.0.0.1:1"), registry, _Driver(), fence,  # type: ignore[arg-type]
                          ReplicaIdentity(), lambda config: None)
    replica.opened(pair.near)
    link = replica.link
    assert link is not None
    sender = pair.sender_for(link.name, {EPOCH_PROPERTY: "e1"})
    replica.on_link_remote_open(SimpleNamespace(link=link))  # type: ignore[arg-type]
    send(sender, b"b1", encode_batch([1, 2], [b"m1", b"m2"]))
    send(sender, b"b2", encode_batch([3], [b"m3"]))
    pair.pump()
    return replica, queue, link


def test_replica_takes_what_queued_behind_the_current_delivery() -> None:
    pair = Pair()
    replica, queue, link = _replica(pair, Fence())
    replica.on_delivery(deliveries(pair, link._impl)[1])
    assert replica.received == 3 and list(queue.id_set()) == [1, 2, 3]
    assert not lib.pn_link_current(link._impl)


def test_replica_that_drops_its_link_ends_the_pass() -> None:
    pair = Pair()
    fence = Fence()
    replica, queue, link = _replica(pair, fence)
    fence.close()  # fenced: the first batch fails the link, the second is left alone
    impl = link._impl
    second = deliveries(pair, impl)[1]
    replica.on_delivery(second)
    assert replica.link is None and replica.received == 0 and queue.depth == 0
    assert lib.pn_link_current(impl) == second
