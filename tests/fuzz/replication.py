"""Kind ``replication``: a fake backup against a real primary (the replication protocol, primary side).

The node is a cluster member promoted by hand (``--ha-cluster``, its own
address as the brokers URL, then PROMOTE as admin), holding replicated
queues (``fuzz.ref``, the reference queue, is one of them; ``fz.r1`` holds
messages so that browsers get batches).  Each case connects as ``peer``
(sometimes as ``app`` or ``admin``, which must be refused as backups) with
a ``qpid.ha-backup`` connection property, often mutated (node id, URL,
state of the wrong types, not a map), and then, on one session:

- the wiring receiver on ``$ha.wiring`` (link properties sometimes mutated,
  credit from none to huge);
- a status sender on ``$ha.status``: memory-alarm maps with mutated values,
  or mutated bytes;
- up to three replicating browsers on queues that exist, do not, are not
  replicated or are the wiring address, with ``qpid.ha-replicate``,
  ``qpid.ha-ids`` (valid, odd-length, unordered, zero, negative, huge
  ranges, the wrong types), ``qpid.ha-lineage`` and ``qpid.ha-term``
  mutated;
- then, for a while, the batches and dequeues the primary sends are settled
  with a random outcome (accepted, rejected, released, modified, none),
  credit is granted and drained at random, and mutated dispositions, flows
  and transfers are injected as raw frames on the session's channel.

The connection then closes (gracefully or by dropping the socket), and the
reference producer and consumer run on the replicated reference queue: a
fake backup must hold nothing up once it is gone.
"""

from __future__ import annotations

import random
from typing import Any

from proton import Delivery, Endpoint, Message, Terminus, ulong

from hastandby.broker.queues.idset import IdSet
from hastandby.broker.vocabulary import ADMIN_PROPERTY
from hastandby.replication.codec import BACKUP_PROPERTY, IDS_PROPERTY
from hastandby.ha.protocol import (
    LINEAGE_PROPERTY,
    REPLICATE_PROPERTY,
    STATUS_ADDRESS,
    TERM_PROPERTY,
    WIRING_ADDRESS,
)

from . import amqp, mutate, values
from .base import FUZZ_QUEUE, REFERENCE_QUEUE, REPLY_QUEUE, CaseRecord, Kind
from .checks import admin_request
from .wire import Engine, WireError, raw_tag

BROWSED_QUEUE = "fz.r1"
CONFIG_QUEUE = "fz.rc"
OUTCOMES = [Delivery.ACCEPTED, Delivery.ACCEPTED, Delivery.REJECTED, Delivery.RELEASED, Delivery.MODIFIED, None]


def mutated_ids(rng: random.Random, depth: int) -> Any:
    """An id set for ``qpid.ha-ids``: valid (what a backup holding some of the queue sends) or broken."""
    roll = rng.random()
    if roll < 0.4:
        upto = rng.choice([0, 1, 5, depth, depth + 10])
        return IdSet.from_ids(range(1, upto + 1)).to_wire()
    if roll < 0.5:
        return [1, 2**63 - 1]
    if roll < 0.6:
        return [rng.choice([0, -1, 5, 2**64 - 1]), rng.choice([0, 1, 3, 2**62])]
    if roll < 0.7:
        return [1, 3, 2, 4]  # overlapping, out of order
    if roll < 0.75:
        return [ulong(2**64 - 1), ulong(2**64 - 1)]
    if roll < 0.8:
        return list(range(1, 20001))  # 10,000 ranges
    return values.like(rng, [1, depth])


def mutated_lineage(rng: random.Random, valid: Any) -> Any:
    roll = rng.random()
    if roll < 0.4:
        return valid
    if roll < 0.5:
        return []
    if roll < 0.6:
        return [[rng.choice([0, 1, 2**63 - 1]), "fz-other", rng.choice([1, 2, 2**62])]]
    if roll < 0.7:
        return [[1, "a", 5], [2, "b", 3]]  # not increasing
    if roll < 0.75:
        return [[i, f"n{i}", i + 1] for i in range(5000)]
    return values.like(rng, valid)


class _FakeBackup:
    """What a fake backup's session does with what the primary sends."""

    def __init__(self, rng: random.Random, record: CaseRecord) -> None:
        self.rng = rng
        self.record = record
        self.batches = 0
        self.controls = 0
        self.closed: list[str] = []

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        link = delivery.link
        if link.is_sender:
            if delivery.remote_state or delivery.settled:
                delivery.settle()
            return
        if not delivery.readable or delivery.partial:
            return
        tag = raw_tag(delivery)
        link.recv(delivery.pending)
        link.advance()
        if tag.startswith(b"b"):
            self.batches += 1
        else:
            self.controls += 1
        rng = self.rng
        if delivery.settled:
            delivery.settle()
            return
        roll = rng.random()
        if roll < 0.8:
            outcome = rng.choice(OUTCOMES)
            if outcome is not None:
                delivery.update(outcome)
            if rng.random() < 0.9:
                delivery.settle()
        if rng.random() < 0.2:
            link.flow(rng.choice([0, 1, 10, 2**31 - 1]))

    def on_link_remote_close(self, event: Any) -> None:
        condition = event.link.remote_condition
        self.closed.append(f"detach {event.link.name}: {condition.name if condition else None}")

    def on_connection_remote_close(self, event: Any) -> None:
        condition = event.connection.remote_condition
        self.closed.append(f"close: {condition.name if condition else None}")


def raw_frame(rng: random.Random, handles: int) -> tuple[bytes, str]:
    """A mutated disposition, flow or transfer for channel 0 and one of the session's handles."""
    handle = rng.randrange(max(1, handles + 1))
    roll = rng.random()
    if roll < 0.4:
        first = rng.choice([0, 1, 2**31, 2**32 - 1])
        frame = amqp.disposition(first, rng.choice([first, first + 1, 2**32 - 1]), role=rng.random() < 0.8,
                                 settled=rng.random() < 0.8,
                                 state=amqp.outcome(rng.choice([amqp.ACCEPTED, amqp.REJECTED, amqp.MODIFIED,
                                                                amqp.RECEIVED, 0x77])))
    elif roll < 0.75:
        frame = amqp.flow(handle, rng.choice([0, 1, 2**31 - 1, 2**32 - 1]), next_incoming=rng.choice([0, 1, 2**31]),
                          drain=rng.random() < 0.5)
    else:
        frame = amqp.transfer(handle, rng.choice([0, 7, 2**32 - 1]), b"x", amqp.message("wrong way"),
                              settled=rng.random() < 0.5)
    if rng.random() < 0.5:
        note = mutate.mutate_field(rng, frame)
    else:
        note = frame.name
    try:
        return frame.encode(), f"injected {note}"
    except Exception:  # noqa: BLE001 - a mutated field proton cannot encode (any of its errors)
        return amqp.flow(handle, 1).encode(), "injected flow"


class Replication(Kind):
    name = "replication"
    summary = "a fake backup against a primary: ha-backup property, wiring, status and browser links, acks"

    def setup(self) -> None:
        self.node = self.nodes.add(self._primary())
        self.node.start()
        self.prepare(self.node)

    def _primary(self) -> Any:
        from .node import FuzzNode

        node = FuzzNode(self.directory, self.users, "primary", "--backup-timeout", "1")
        node.extra += ["--ha-cluster", "--brokers-url", node.address]
        return node

    def prepare(self, node: Any) -> None:
        admin_request(node, "PROMOTE")
        for queue, level in ((REFERENCE_QUEUE, "all"), (BROWSED_QUEUE, "all"), (CONFIG_QUEUE, "configuration"),
                             (FUZZ_QUEUE, "none"), (REPLY_QUEUE, "none")):
            admin_request(node, "CREATE", "queue", queue, {"arguments": {"qpid.replicate": level}})
        if not admin_request(node, "IDS", "queue", BROWSED_QUEUE, {"limit": 1}).get("depth"):
            _fill(node, BROWSED_QUEUE, 40)
        ids = admin_request(node, "IDS", "queue", BROWSED_QUEUE, {"limit": 1000})
        self.lineage = ids.get("lineage") or []
        self.depth = int(ids.get("depth") or 0)
        self.term = int(admin_request(node, "STATUS").get("term") or 1)

    def run_case(self, rng: random.Random, index: int) -> CaseRecord:
        record = CaseRecord(target=self.node)
        node = self.node
        assert node is not None
        user = rng.choice(["peer"] * 17 + ["app", "app", "admin"])
        info: Any = {"node_id": f"fz-{rng.randrange(4)}", "url": f"127.0.0.1:{rng.randrange(1, 65536)}",
                     "state": rng.choice(["catchup", "ready", "backup"])}
        if rng.random() < 0.3:
            info = values.like(rng, info) if rng.random() < 0.8 else values.value(rng)
            record.note(f"qpid.ha-backup -> {_short(info)}")
        properties: dict[Any, Any] = {BACKUP_PROPERTY: info}
        if rng.random() < 0.1:
            properties[ADMIN_PROPERTY] = values.like(rng, True)
        if rng.random() < 0.05:
            properties = {}
            record.note("no qpid.ha-backup property")
        record.note(f"as {user}")
        try:
            engine = Engine.connect(node.host, node.port, user, self.users.passwords[user], properties=properties,
                                    container=f"fz-backup-{index}")
        except WireError as error:
            record.conditions.append(f"connect: {error}")
            return record
        fake = _FakeBackup(rng, record)
        try:
            self._links(rng, engine, record)
            handles = len(list(_links_of(engine)))
            for _ in range(rng.choice([1, 2, 4])):
                engine.run_for(rng.choice([0.02, 0.1, 0.2]), fake)
                if rng.random() < 0.3 and not engine.peer_closed:
                    data, note = raw_frame(rng, handles)
                    record.note(note)
                    engine.inject(data)
            record.conditions += fake.closed
            record.note(f"{fake.batches} batch(es), {fake.controls} control(s) received")
        finally:
            engine.close(linger=0.1 if rng.random() < 0.7 else 0.0)
        return record

    def _links(self, rng: random.Random, engine: Engine, record: CaseRecord) -> None:
        session = engine.connection.session()
        session.open()
        if rng.random() < 0.8:
            wiring = session.receiver("qpid.ha-wiring")
            wiring.source.address = WIRING_ADDRESS
            wiring.target.address = WIRING_ADDRESS
            if rng.random() < 0.2:
                wiring.properties = {REPLICATE_PROPERTY: values.like(rng, True)}
                record.note("wiring link with qpid.ha-replicate")
            wiring.open()
            wiring.flow(rng.choice([0, 1, 100, 2**31 - 1]))
        if rng.random() < 0.5:
            status = session.sender("qpid.ha-status")
            status.target.address = STATUS_ADDRESS
            status.snd_settle_mode = 1  # settled
            status.open()
            engine.run_until(lambda: status.credit > 0 or bool(status.state & Endpoint.REMOTE_CLOSED), 0.5)
            for number in range(rng.choice([1, 2, 3])):
                if status.credit <= 0:
                    break
                body: Any = {"memory_alarm": rng.choice([False, False, True, values.value(rng)])}
                if rng.random() < 0.3:
                    body = values.like(rng, body)
                data = bytes(Message(body=body).encode()) if _encodable(body) else b"\x00Sw\xa1\x01x"
                if rng.random() < 0.2:
                    data, notes = mutate.mutate_bytes(rng, data)
                    record.note("status bytes: " + "; ".join(notes))
                record.note(f"status {_short(body)}")
                delivery = status.delivery(b"s%d" % number)
                status.send(data)
                status.advance()
                delivery.settle()
            if rng.random() < 0.5:  # an alarm left set must end with the connection
                status.delivery(b"alarm")
                status.send(bytes(Message(body={"memory_alarm": True}).encode()))
                status.advance()
                record.note("status: alarm on")
        for number in range(rng.choice([0, 1, 1, 2, 3])):
            queue = rng.choice([BROWSED_QUEUE, BROWSED_QUEUE, REFERENCE_QUEUE, CONFIG_QUEUE, FUZZ_QUEUE, "fz.none",
                                WIRING_ADDRESS, values.text(rng)])
            browser = session.receiver(_ascii(f"qpid.ha-q:{queue}:{number}"))
            browser.source.address = queue
            browser.target.address = queue
            if rng.random() < 0.9:
                browser.source.distribution_mode = Terminus.DIST_MODE_COPY
            props: dict[Any, Any] = {REPLICATE_PROPERTY: True, IDS_PROPERTY: mutated_ids(rng, self.depth),
                                     LINEAGE_PROPERTY: mutated_lineage(rng, self.lineage),
                                     TERM_PROPERTY: rng.choice([self.term, self.term, 0, self.term + 1,
                                                                values.integer(rng), values.value(rng)])}
            if rng.random() < 0.2:
                props[REPLICATE_PROPERTY] = values.like(rng, True)
            if rng.random() < 0.1:
                props = values.like(rng, props)
            record.note(f"browser on {queue!r}: {_short(props)}")
            browser.properties = props if _encodable(props) else {REPLICATE_PROPERTY: True}
            browser.open()
            browser.flow(rng.choice([0, 1, 10, 200, 2**31 - 1]))


def _encodable(value: Any) -> bool:
    """Whether proton can send ``value`` as link properties (it makes their string keys symbols: ASCII)."""
    from proton import Data, symbol

    if isinstance(value, dict):
        value = {symbol(k) if isinstance(k, str) else k: v for k, v in value.items()}
    try:
        data = Data()
        data.put_object(value)
        data.encode()
    except Exception:  # noqa: BLE001 - any encoding failure means: not encodable
        return False
    return True


def _links_of(engine: Engine) -> Any:
    link = engine.connection.link_head(0)
    while link is not None:
        yield link
        link = link.next(0)


def _ascii(name: str) -> str:
    """A link name proton takes (it encodes names as ASCII)."""
    return name.encode("ascii", "replace").decode()[:200]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _fill(node: Any, queue: str, count: int) -> None:
    """Put ``count`` messages on ``queue`` as app (setup: the browsers' batches)."""
    engine = Engine.connect(node.host, node.port, "app", node.users.passwords["app"], container="fz-fill")
    try:
        session = engine.connection.session()
        session.open()
        sender = session.sender("fill")
        sender.target.address = queue
        sender.open()
        sent = [0]
        settled = [0]

        class Handler:
            def on_delivery(self, event: Any) -> None:
                if event.delivery.remote_state:
                    settled[0] += 1
                    event.delivery.settle()

        def done() -> bool:
            while sent[0] < count and sender.credit > 0:
                sender.delivery(b"%d" % sent[0])
                sender.send(bytes(Message(body=f"fill-{sent[0]}").encode()))
                sender.advance()
                sent[0] += 1
            return settled[0] >= count

        engine.run_until(done, 10.0, Handler())
    finally:
        engine.close(linger=0.2)
