"""A producer's credit top-up is written at once, not when the pass of events ends (links.IncomingLink).

A pass may carry a whole window of a producer's messages; a top-up written
only after the node had handled all of them left the producer idle meanwhile.
These tests hand an ``IncomingLink`` one event for several transfers on a real
proton link (two in-memory engines) and look at what its connection had to
write at the moment the link asked for its output to be written.
"""

from __future__ import annotations

from types import SimpleNamespace

from proton import Transport

from hastandby.broker.admission.fence import Fence
from hastandby.broker.links import IncomingLink
from hastandby.broker.admission.memory import MemoryAlarm
from tests.unit.test_take_deliveries import Pair, deliveries, send


def _producer(pair: Pair, writes: list[int], window: int) -> tuple[IncomingLink, object]:
    session = pair.near.session()
    session.open()
    link = session.receiver("producer")
    link.source.address = link.target.address = "q"
    link.open()
    registry = SimpleNamespace(route=lambda node, data: [node], deliver=lambda queues, data, completion: None)
    near_transport: Transport = pair._near_t  # noqa: SLF001 - the engine whose output the link writes

    def write() -> None:
        writes.append(link.credit)
        assert near_transport.pending() > 0  # the flow frame is there to be written

    incoming = IncomingLink(link, SimpleNamespace(name="q"), registry, 0, Fence(),  # type: ignore[arg-type]
                            lambda connection: None, MemoryAlarm(0), set(), window=window, write=write)
    incoming.start()
    return incoming, link


def test_top_up_is_written_in_the_middle_of_the_pass() -> None:
    pair = Pair()
    writes: list[int] = []
    incoming, link = _producer(pair, writes, window=4)
    sender = pair.sender_for("producer")
    for n in range(4):  # the whole window in one pass
        send(sender, str(n).encode(), b"m%d" % n)
    pair.pump()
    incoming.on_delivery(deliveries(pair, link._impl)[0])
    # Credit fell under half the window before the first message was handled: topped up and
    # written then, once, not after the fourth.
    assert writes == [4]


def test_no_write_while_credit_is_above_half_the_window() -> None:
    pair = Pair()
    writes: list[int] = []
    incoming, link = _producer(pair, writes, window=10)
    sender = pair.sender_for("producer")
    send(sender, b"1", b"one")
    pair.pump()
    incoming.on_delivery(deliveries(pair, link._impl)[0])
    assert writes == []
