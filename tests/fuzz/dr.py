"""Kind ``dr``: a fake DR replica against a real source node (the DR protocol, source side).

The node is standalone, with ``fz.d1`` holding messages to replicate and
the reference queue.  Each case connects as ``peer`` (sometimes ``app`` or
``admin``, which must be refused as replicas) with a ``hastandby.dr-replica``
connection property, often mutated, then on one session:

- a data link (a receiver) on ``fz.d1``, the reference queue, a queue that
  does not exist, a tap's name or the ack address, with the link properties
  of ``dr/protocol.py`` (mode, key, epoch, lineage, sync, ack, ids, backlog
  limits) valid or mutated (wrong types, huge, empty, a key with a dot, an
  unknown mode, ids and lineages as in the ``replication`` kind);
- often the ack link (a sender on ``$dr.ack``), carrying ``{"through": N}``
  for what was received, or for ids that were never sent, huge, negative,
  of the wrong type, or maps and bytes that are not acknowledgements;
- the batches, dequeues and status reports the source sends are settled at
  random, credit granted and drained, raw frames injected;
- half the enqueue-mode cases end by detaching with
  ``hastandby:replication-stopped`` (the source forgets the replication and
  its tap); the other taps are deleted every ``CLEANUP_EVERY`` cases.

After each case the reference producer and consumer run on the source.
"""

from __future__ import annotations

import random
from typing import Any

from proton import Condition, Endpoint, Message, Terminus

from hastandby.replication.codec import IDS_PROPERTY
from hastandby.client import ManagementError
from hastandby.dr.protocol import (
    ACK_ADDRESS,
    ACK_PROPERTY,
    EPOCH_PROPERTY,
    KEY_PROPERTY,
    LINEAGE_PROPERTY,
    MAX_BYTES_PROPERTY,
    MAX_COUNT_PROPERTY,
    MODE_PROPERTY,
    REPLICA_PROPERTY,
    STOPPED,
    SYNC_PROPERTY,
)

from . import mutate, values
from .base import REFERENCE_QUEUE, CaseRecord, Kind
from .checks import admin_request
from .replication import (
    _ascii,
    _encodable,
    _FakeBackup,
    _fill,
    _links_of,
    _short,
    mutated_ids,
    mutated_lineage,
    raw_frame,
)
from .wire import Engine, WireError, raw_tag

SOURCE_QUEUE = "fz.d1"
CLEANUP_EVERY = 50
KEYS = ["k0", "k1", "k2", "k3"]


class _FakeReplica(_FakeBackup):
    """Settles what the source sends at random, and remembers the highest id received (for acks)."""

    def __init__(self, rng: random.Random, record: CaseRecord) -> None:
        super().__init__(rng, record)
        self.highest = 0

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        if not delivery.link.is_sender and delivery.readable and not delivery.partial:
            tag = raw_tag(delivery)
            if tag.startswith(b"b"):
                try:
                    self.highest = max(self.highest, int(tag[1:]))
                except ValueError:
                    pass
        super().on_delivery(event)


class DrSourceKind(Kind):
    name = "dr"
    summary = "a fake DR replica against a source: dr-replica property, data and ack links, acknowledgements"

    def setup(self) -> None:
        self.node = self.start_node("source")
        self.prepare(self.node)
        self.cases = 0

    def prepare(self, node: Any) -> None:
        super().prepare(node)
        admin_request(node, "CREATE", "queue", SOURCE_QUEUE)
        ids = admin_request(node, "IDS", "queue", SOURCE_QUEUE, {"limit": 1000})
        if not ids.get("depth"):
            _fill(node, SOURCE_QUEUE, 40)
            ids = admin_request(node, "IDS", "queue", SOURCE_QUEUE, {"limit": 1000})
        self.epoch = str(ids.get("uuid") or "")
        self.lineage = ids.get("lineage") or []
        self.depth = int(ids.get("depth") or 0)

    def cleanup(self) -> None:
        node = self.node
        assert node is not None
        for queue in admin_request(node, "QUERY").get("queues") or []:
            name = str(queue.get("name"))
            if name.startswith("$dr."):
                try:
                    admin_request(node, "DELETE", "queue", name)
                except ManagementError:
                    pass

    def run_case(self, rng: random.Random, index: int) -> CaseRecord:
        record = CaseRecord(target=self.node)
        node = self.node
        assert node is not None
        self.cases += 1
        if self.cases % CLEANUP_EVERY == 0:
            self.cleanup()
        user = rng.choice(["peer"] * 17 + ["app", "app", "admin"])
        info: Any = {"node_id": f"fz-replica-{rng.randrange(4)}", "url": f"127.0.0.1:{rng.randrange(1, 65536)}"}
        if rng.random() < 0.3:
            info = values.like(rng, info) if rng.random() < 0.8 else values.value(rng)
            record.note(f"hastandby.dr-replica -> {_short(info)}")
        properties: dict[Any, Any] = {REPLICA_PROPERTY: info} if rng.random() < 0.95 else {}
        record.note(f"as {user}")
        try:
            engine = Engine.connect(node.host, node.port, user, self.users.passwords[user], properties=properties,
                                    container=f"fz-replica-{index}")
        except WireError as error:
            record.conditions.append(f"connect: {error}")
            return record
        fake = _FakeReplica(rng, record)
        try:
            data_link, ack, mode = self._links(rng, engine, record)
            handles = len(list(_links_of(engine)))
            for _ in range(rng.choice([1, 2, 4])):
                engine.run_for(rng.choice([0.02, 0.1, 0.2]), fake)
                if ack is not None and ack.credit > 0 and rng.random() < 0.7:
                    self._ack(rng, ack, fake.highest, record)
                if rng.random() < 0.25 and not engine.peer_closed:
                    data, note = raw_frame(rng, handles)
                    record.note(note)
                    engine.inject(data)
            if data_link is not None and mode == "enqueue" and rng.random() < 0.5 \
                    and data_link.state & Endpoint.LOCAL_ACTIVE:
                data_link.condition = Condition(STOPPED, "fuzz case over")
                data_link.close()
                engine.run_for(0.05, fake)
                record.note("detached with replication-stopped")
            record.conditions += fake.closed
            record.note(f"{fake.batches} batch(es), {fake.controls} control(s) received")
        finally:
            engine.close(linger=0.1 if rng.random() < 0.7 else 0.0)
        return record

    def _links(self, rng: random.Random, engine: Engine, record: CaseRecord) -> tuple[Any, Any, Any]:
        session = engine.connection.session()
        session.open()
        mode: Any = rng.choice(["full", "enqueue"])
        queue = rng.choice([SOURCE_QUEUE] * 5 + [REFERENCE_QUEUE, "fz.none", f"$dr.k0.{SOURCE_QUEUE}", ACK_ADDRESS,
                                                  values.text(rng)])
        props: dict[Any, Any] = {MODE_PROPERTY: mode, KEY_PROPERTY: rng.choice(KEYS),
                                 EPOCH_PROPERTY: rng.choice(["", self.epoch, self.epoch]),
                                 LINEAGE_PROPERTY: mutated_lineage(rng, self.lineage) if rng.random() < 0.5
                                 else self.lineage,
                                 SYNC_PROPERTY: rng.random() < 0.2, ACK_PROPERTY: rng.random() < 0.8}
        if mode == "full":
            props[IDS_PROPERTY] = mutated_ids(rng, self.depth) if rng.random() < 0.5 else []
        elif rng.random() < 0.5:
            props[rng.choice([MAX_COUNT_PROPERTY, MAX_BYTES_PROPERTY])] = rng.choice([1, 10, 1000, 0])
        for _ in range(rng.choice([0, 0, 1, 2, 3])):
            key = rng.choice(list(props) + [values.ascii_symbol(rng, 6)])
            props[key] = values.like(rng, props.get(key, ""))
        if rng.random() < 0.05:
            props = values.value(rng)
        record.note(f"data link on {queue!r}: {_short(props)}")
        data_link = session.receiver(_ascii(f"hastandby.dr:{queue}:fz"))
        data_link.source.address = queue
        data_link.target.address = queue
        if (mode == "full") == (rng.random() < 0.9):
            data_link.source.distribution_mode = Terminus.DIST_MODE_COPY
        data_link.properties = props if _encodable(props) else {MODE_PROPERTY: "full"}
        data_link.open()
        data_link.flow(rng.choice([0, 1, 10, 500, 2**31 - 1]))
        ack = None
        if rng.random() < 0.7:
            ack = session.sender("hastandby.dr-ack:fz")
            ack.target.address = ACK_ADDRESS
            ack.snd_settle_mode = 1
            ack.open()
        return data_link, ack, mode

    def _ack(self, rng: random.Random, ack: Any, highest: int, record: CaseRecord) -> None:
        roll = rng.random()
        if roll < 0.5:
            body: Any = {"through": highest + rng.choice([0, 0, 0, 999])}
        elif roll < 0.8:
            body = {"through": rng.choice([0, -1, 2**63 - 1, 2**64 - 1, values.value(rng)])}
        else:
            body = values.like(rng, {"through": highest})
        data = bytes(Message(body=body).encode()) if _encodable(body) else b"\x00Sw\x40"
        if rng.random() < 0.1:
            data, notes = mutate.mutate_bytes(rng, data)
            record.note("ack bytes: " + "; ".join(notes))
        record.note(f"ack {_short(body)}")
        delivery = ack.delivery(b"a%d" % rng.randrange(10**6))
        ack.send(data)
        ack.advance()
        delivery.settle()
