"""Kind ``dr-replica``: a fake DR source that a real replica pulls from (the DR protocol, replica side).

The node is standalone and replicates two queues from our fake source's
port (``fz.dr.full`` in full mode, ``fz.dr.enq`` in enqueue mode, set up
with REPLICATE as admin).  Each case serves one of the replica's
connections (they alternate): our attach reply to its data link carries
``hastandby.dr-epoch`` and ``hastandby.dr-lineage`` (a new epoch and an
empty lineage, or mutated: the replica's own epoch, empty, not a string,
lineages of the wrong shape), then we send, pre-settled or not:

- batches (tag ``b``) valid or broken as in the ``backup`` kind (ids zero,
  repeated, decreasing, huge, no messages, counts that do not add up);
- dequeues (tag ``d``, full mode's id sets) valid or broken;
- delivery-count (``c``) and message-id (``u``) controls, valid or broken
  as in the ``backup`` kind (``features.py``);
- status reports (tag ``s``) with fields of the wrong type, not a map, or
  broken bytes (the replica shows them in QUERY, which the checks call);
- deliveries under other tags.

Then, when our attach reply was a valid new epoch and the link still
stands, a valid batch of fresh ids (above those of everything we sent in
the case that decodes as a batch), unsettled: once the replica accepts it,
its IDS (as admin) must hold every message of it (by id in full mode, by
digest in enqueue mode, whose local ids are the replica's own), or the
case counts a **loss**.  The enqueue replica is purged after each case.

The connection is held about a second, as in the ``backup`` kind.  After
each case: the replica must reconnect for the next case (else a hang), and
the usual checks run (the reference producer and consumer on its own queue,
STATUS and QUERY, which show what the source reported).
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

from proton import Endpoint, Message

from hastandby.replication.codec import COUNTS_TAG, DEQUEUE_TAG, MESSAGE_IDS_TAG, encode_batch
from hastandby.dr.protocol import (
    ACK_ADDRESS,
    EPOCH_PROPERTY,
    LINEAGE_PROPERTY,
    STATUS_TAG,
)

from . import values
from .backup import (
    HOLD,
    _short,
    batch_bytes,
    batch_ids,
    control_bytes,
    dequeue_bytes,
    encoded,
    mutate_map,
)
from .base import CaseRecord, Kind
from .checks import admin_request
from .fake import ACCEPT_TIMEOUT, FakePeer, Served, digest, send

QUEUES = {"fz.dr.full": "full", "fz.dr.enq": "enqueue"}
VERIFY_MESSAGES = 5


class DrReplica(Kind):
    name = "dr-replica"
    summary = "a fake DR source a replica pulls from: epochs, lineages, batches, dequeues, status reports"

    def setup(self) -> None:
        self.fake = FakePeer(self.users.users_file)
        self.fake.answer = self._answer
        self.node = self.start_node("replica")
        self.prepare(self.node)
        self.rng = random.Random(0)
        self.record: CaseRecord | None = None
        self.valid_epoch: dict[str, str] = {}

    def prepare(self, node: Any) -> None:
        super().prepare(node)
        for queue, mode in QUEUES.items():
            # The full replica deduplicates and counts deliveries, so the ``u`` and ``c`` controls reach a
            # queue that uses them.
            arguments = {"x-dedup-window": 60, "x-delivery-limit": 3} if mode == "full" else {}
            admin_request(node, "REPLICATE", "queue", queue, {"source": self.fake.address, "mode": mode,
                                                              "create": True, "arguments": arguments})

    def teardown(self) -> None:
        super().teardown()
        self.fake.close()

    # -- our side of the replica's attach ----------------------------------------------------

    def _answer(self, link: Any, served: Served) -> None:
        rng, record = self.rng, self.record
        if record is None or not link.is_sender:
            return
        address = link.remote_source.address or ""
        offered = served.attach_properties.get(address, {})
        epoch: Any = str(uuid.UUID(int=rng.getrandbits(128)))
        lineage: Any = []
        if rng.random() < 0.3:
            epoch = rng.choice([offered.get(EPOCH_PROPERTY), "", None, values.value(rng), values.text(rng)])
            lineage = rng.choice([[], offered.get(LINEAGE_PROPERTY), [[1, "fz-source", 1]], [[1, "a", 5], [1, "b", 2]],
                                  values.like(rng, [[1, "x", 1]]), values.value(rng)])
            record.note(f"attach reply for {address!r}: epoch {_short(epoch)}, lineage {_short(lineage)}")
        else:
            self.valid_epoch[address] = epoch
        properties = {EPOCH_PROPERTY: epoch, LINEAGE_PROPERTY: lineage}
        try:
            from proton import Data

            Data().put_object(properties)
        except Exception:  # noqa: BLE001 - a mutated value proton cannot encode (any of its errors)
            properties = {EPOCH_PROPERTY: "fz-unencodable"}
        link.properties = properties

    # -- one case ----------------------------------------------------------------------------

    def run_case(self, rng: random.Random, index: int) -> CaseRecord:
        record = CaseRecord(target=self.node)
        self.rng, self.record = rng, record
        self.valid_epoch.clear()
        served = self.fake.accept()
        if served is None:
            record.hang = f"the replica did not connect to its source within {ACCEPT_TIMEOUT:g} s"
            return record
        started = time.monotonic()
        try:
            self._serve(rng, served, record)
            left = HOLD - (time.monotonic() - started)
            if left > 0 and not served.engine.peer_closed:
                self.fake.run(served, left)
            record.conditions += served.closed
            acks = [data for address, data in served.received if address == ACK_ADDRESS]
            if acks:
                record.note(f"{len(acks)} cumulative ack(s) received")
        finally:
            served.engine.close(linger=0.1 if rng.random() < 0.8 else 0.0)
        if "fz.dr.enq" in served.links:
            try:
                admin_request(self.node, "PURGE", "queue", "fz.dr.enq")
            except Exception as error:  # noqa: BLE001 - noted on the case, whatever it is
                record.conditions.append(f"purge: {error}")
        return record

    def _serve(self, rng: random.Random, served: Served, record: CaseRecord) -> None:
        fake = self.fake
        if not fake.run(served, 2.0, lambda: any(q in served.links and served.links[q].credit > 0 for q in QUEUES)):
            record.conditions.append("no data link")
            return
        queue = next(q for q in QUEUES if q in served.links)
        link = served.links[queue]
        record.note(f"serving {queue} ({QUEUES[queue]} mode)")
        next_id, sent_ids, stored = 1, [], []
        for number in range(rng.choice([0, 1, 2, 3, 5])):
            if link.credit <= 0 or served.engine.peer_closed or link.state & Endpoint.REMOTE_CLOSED:
                break
            roll = rng.random()
            if roll < 0.5:
                data, ids = batch_bytes(rng, next_id, rng.choice([1, 3, 20]), record)
                tag = b"b%d" % (ids[0] if ids else 0)
                sent_ids += [i for i in ids if isinstance(i, int)]
                next_id += max(1, len(ids))
            elif roll < 0.65:
                data, tag = dequeue_bytes(rng, sent_ids, record), DEQUEUE_TAG + b"%d" % number
            elif roll < 0.8:  # delivery-counts and message-ids, as a source sends a full replica (features.py)
                data, tag = control_bytes(rng, sent_ids, record, counts=roll < 0.72, number=number)
            else:
                status = mutate_map(rng, {"state": "live", "lag_messages": 0, "lag_seconds": 0.0, "overflow": 0},
                                    record, "status")
                data, tag = encoded(rng, status, record, "status"), STATUS_TAG + b"%d" % number
            if rng.random() < 0.05:
                tag = rng.choice([b"", b"x", b"\xff" * 40, b"d", b"b", b"s", b"c", b"u"])
                record.note(f"tag {tag!r}")
            stored += batch_ids(tag, data, (DEQUEUE_TAG, STATUS_TAG, COUNTS_TAG, MESSAGE_IDS_TAG))
            send(link, tag, data, settled=rng.random() < 0.4)
            fake.run(served, rng.choice([0.0, 0.02]))
        fake.run(served, 0.1)
        if any(i >= 2**40 for i in stored):
            return  # no fresh ids above those (a new epoch drops them in full mode: a later case verifies)
        self._verify(served, queue, max([0, *stored]) + 1, record)

    def _verify(self, served: Served, queue: str, first: int, record: CaseRecord) -> None:
        link = served.links[queue]
        if queue not in self.valid_epoch or link.state & Endpoint.REMOTE_CLOSED or not \
                link.state & Endpoint.LOCAL_ACTIVE or served.engine.peer_closed or link.credit <= 0:
            return
        ids = list(range(first, first + VERIFY_MESSAGES))
        payloads = [bytes(Message(body=f"fz-dr-verify-{i}-{uuid.uuid4().hex[:8]}").encode()) for i in ids]
        tag = b"b%d" % first
        send(link, tag, encode_batch(ids, payloads))
        if not self.fake.run(served, 2.0, lambda: tag in served.outcomes):
            record.conditions.append("verification batch not settled")
            return
        if served.outcomes[tag] != 36:  # PN_ACCEPTED
            record.conditions.append(f"verification batch settled {served.outcomes[tag]}")
            return
        try:
            reply = admin_request(self.node, "IDS", "queue", queue, {"after": 0, "limit": 10000})
        except Exception as error:  # noqa: BLE001 - whatever the failure, an acknowledged batch is not shown held
            record.lost, record.loss = len(ids), f"accepted batch {first}.. on {queue}, then IDS failed: {error}"
            return
        held = {int(i): d for i, d in reply.get("messages") or []}
        if QUEUES[queue] == "full":
            missing = [i for i, p in zip(ids, payloads) if held.get(i) != digest(p)]
        else:
            digests = set(held.values())
            missing = [i for i, p in zip(ids, payloads) if digest(p) not in digests]
        if missing:
            record.lost = len(missing)
            record.loss = f"{queue}: accepted batch {first}..{ids[-1]} but IDS lacks source ids {missing}"
        record.verified = len(ids) - len(missing)
