"""Kind ``backup``: a fake primary that a real backup connects to (the replication protocol, backup side).

The node runs ``--ha-cluster --brokers-url`` naming only our fake primary's
port, so it connects there, logs in as ``peer`` (checked by our SASL
server), and opens the wiring link and a status link.  Each case serves one
such connection:

- the wiring stream: a ``hello`` (primary, term, replication default,
  members), a ``snapshot`` of replicated queues, exchanges and bindings,
  then events (queue and exchange created or deleted, bound, unbound) and
  ``members`` updates; each message valid or mutated (a field of the wrong
  type, missing or huge, an unknown type, a binding to nothing, terms older,
  newer, negative or not numbers), or its encoded bytes broken;
- on each replicating browser the backup attaches (one per queue of level
  ``all``): our attach reply's ``qpid.ha-lineage`` (valid or mutated), then
  batches (``protocol.encode_batch``: valid, or with ids zero, repeated,
  decreasing or huge, counts and sizes that do not add up, no messages,
  bytes broken) and dequeue deliveries (``d`` tag: id sets empty, odd,
  overlapping, [1, 2**62], not lists), delivery-count controls (``c``:
  ids zero or past 2**63-2, counts past 2**32-1, odd lists) and
  message-id controls (``u``: keys empty or 70,000 bytes, negative times,
  durable flags that are not bools), pre-settled or not, under tags that
  are not ``b``, ``d``, ``c`` or ``u`` too (``features.py``); ``fz.b2``
  has queue features (priorities, delivery limit, dedup window, last-value
  key), and now and then a queue event declares a queue with feature
  arguments valid or not, which the backup takes or refuses cleanly;
- now and then the hello's term is older, newer, negative, past 2**63, or
  not a number (a newer term the backup follows: the later hellos carry it);
- then, if the browser on ``fz.b1`` is still attached, a valid batch of
  fresh ids (above every id the backup said it held when it attached, and
  every id of what we sent it since that decodes as a batch): once the
  backup settles it accepted, its IDS (as admin) must list every one of
  those ids with the digest of the bytes sent, or the case counts a
  **loss** (the backup acknowledged what it does not hold).  Every
  ``RENEW_EVERY`` cases, or once ids got large, the snapshot gives ``fz.b1``
  a new uuid: the backup replaces it, and ids start from 1 again.

The connection is held about a second (a backup reconnects at once after
a connection that lasted that long, and backs off after shorter ones), then
closed, gracefully or by dropping the socket.  The backup refuses clients,
so the checks after each case run as ``admin`` with ``qpid.ha-admin`` (which
a backup admits) on a local queue of level ``none``, and ask for STATUS and
QUERY (which show what the primary said: its term, members); the backup must also
connect again for the next case within ``fake.ACCEPT_TIMEOUT`` (else a
hang).
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

from proton import Endpoint, Message, ulong

from hastandby.replication.codec import (
    BACKUP_PROPERTY,
    COUNTS_TAG,
    DEQUEUE_TAG,
    IDS_PROPERTY,
    MESSAGE_IDS_TAG,
    decode_batch,
    encode_batch,
)
from hastandby.ha.protocol import LINEAGE_PROPERTY, WIRING_ADDRESS

from . import features, mutate, values
from .base import CHECK_TIMEOUT, REFERENCE_MESSAGES, CaseRecord, Kind
from .checks import CheckResult, admin_request, operations_answered, reference
from .fake import ACCEPT_TIMEOUT, FakePeer, Served, digest, send
from .node import FuzzNode

LOCAL_QUEUE = "fuzz.ref.local"  # the backup's own queue (level none) for the reference producer and consumer
HOLD = 1.05  # seconds a case keeps the connection (see the module docstring)
QUEUES = {"fz.b1": "all", "fz.b2": "all", "fz.b3": "configuration"}
# fz.b2 has queue features, so the ``c`` and ``u`` controls it is sent reach a queue that uses them.
QUEUE_ARGUMENTS = {"fz.b2": {"qpid.priorities": 5, "x-delivery-limit": 3, "x-dedup-window": 60,
                             "qpid.last_value_queue_key": "k"}}
CONTROL_TAGS = (DEQUEUE_TAG, COUNTS_TAG, MESSAGE_IDS_TAG)
VERIFY_QUEUE = "fz.b1"
VERIFY_MESSAGES = 5
VERIFY_ATTACH_WAIT = 2.0  # seconds the check waits for fz.b1's browser and its credit
RENEW_EVERY = 250  # cases between new incarnations of fz.b1 (ids from 1 again; the old queue goes)


def _uuid(name: str, generation: int = 0) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fuzz:{name}:{generation}"))


def queue_spec(name: str, level: str, generation: int = 0, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    arguments = {**QUEUE_ARGUMENTS.get(name, {}), **(arguments or {}), "qpid.replicate": level}
    return {"name": name, "uuid": _uuid(name, generation), "arguments": arguments,
            "exclusive": False, "auto_delete": False, "alternate_exchange": "", "durable": False}


def exchange_spec(name: str, generation: int = 0) -> dict[str, Any]:
    return {"name": name, "uuid": _uuid(name, generation), "exchange_type": "direct",
            "arguments": {"qpid.replicate": "all"}, "alternate_exchange": "", "durable": False}


def binding_spec(exchange: str, queue: str, key: str = "k", queue_generation: int = 0) -> dict[str, Any]:
    return {"exchange": exchange, "exchange_uuid": _uuid(exchange), "queue": queue,
            "queue_uuid": _uuid(queue, queue_generation), "key": key, "arguments": {}}


def batch_ids(tag: bytes, data: bytes, control_tags: tuple[bytes, ...]) -> list[int]:
    """The ids a delivery puts on a replica: those of the batch its bytes decode to, unless its tag
    makes it a control delivery (or it does not decode: the replica refuses it)."""
    if tag.startswith(control_tags):
        return []
    try:
        ids, _ = decode_batch(data)
    except ValueError:
        return []
    return list(ids)


def mutate_map(rng: random.Random, body: dict[str, Any], record: CaseRecord, what: str) -> Any:
    """Usually ``body`` itself; sometimes one or more of its fields changed, or something else entirely."""
    if rng.random() < 0.6:
        return body
    mutated: Any = body
    for _ in range(rng.choice([1, 1, 2, 3])):
        mutated = values.like(rng, mutated) if isinstance(mutated, (dict, list)) else values.value(rng)
    record.note(f"{what} -> {_short(mutated)}")
    return mutated


def encoded(rng: random.Random, body: Any, record: CaseRecord, what: str) -> bytes:
    try:
        data = bytes(Message(body=body).encode())
    except Exception:  # noqa: BLE001 - a mutated body proton cannot encode (any of its errors)
        data = bytes(Message(body={"type": "unencodable"}).encode())
    if rng.random() < 0.08:
        data, notes = mutate.mutate_bytes(rng, data)
        record.note(f"{what} bytes: " + "; ".join(notes))
    return data


def batch_bytes(rng: random.Random, first: int, count: int, record: CaseRecord) -> tuple[bytes, list[int]]:
    """A batch (valid, or broken in one of the ways the module docstring lists) and the ids it claims."""
    ids = list(range(first, first + count))
    payloads = [bytes(Message(body=f"fz-batch-{i}").encode()) for i in ids]
    roll = rng.random()
    if roll < 0.5:
        return encode_batch(ids, payloads), ids
    if roll < 0.6:
        ids = [rng.choice([0, 1, first, 2**63 - 1, 2**64 - 1]) for _ in ids]
        record.note(f"batch ids {ids[:5]}")
    elif roll < 0.65:
        ids, payloads = [], []
        record.note("empty batch")
    elif roll < 0.7:
        ids = list(reversed(ids))
        record.note("batch ids decreasing")
    elif roll < 0.75:
        payloads = [b"" for _ in payloads]
        record.note("batch of empty messages")
    elif roll < 0.8:
        payloads = [rng.randbytes(rng.choice([1, 10, 100])) for _ in payloads]
        record.note("batch of messages that are not AMQP")
    data = encode_batch(ids, payloads)
    if roll >= 0.8:
        data, notes = mutate.mutate_bytes(rng, data)
        record.note("batch bytes: " + "; ".join(notes))
    return data, ids


def dequeue_bytes(rng: random.Random, ids: list[int], record: CaseRecord) -> bytes:
    roll = rng.random()
    if roll < 0.4 and ids:
        body: Any = [ids[0], ids[0]]
    elif roll < 0.5:
        body = []
    elif roll < 0.6:
        body = [1, 2**62]
    elif roll < 0.7:
        body = [5, 3]
    elif roll < 0.75:
        body = [1, 2, 3]
    elif roll < 0.8:
        body = [ulong(2**64 - 1), ulong(2**64 - 1)]
    else:
        body = values.like(rng, [1, 2])
    record.note(f"dequeue {_short(body)}")
    return encoded(rng, body, record, "dequeue")


def control_bytes(rng: random.Random, ids: list[int], record: CaseRecord, counts: bool,
                  number: int) -> tuple[bytes, bytes]:
    """A ``c`` (delivery-counts) or ``u`` (message-ids) control delivery, valid or broken, and its tag."""
    body, how = features.counts_body(rng, ids) if counts else features.message_ids_body(rng)
    record.note(f"{'counts' if counts else 'message-ids'} control ({how}) {_short(body)}")
    data = features.control_bytes(body)
    if rng.random() < 0.08:
        data, notes = mutate.mutate_bytes(rng, data)
        record.note("control bytes: " + "; ".join(notes))
    return data, (COUNTS_TAG if counts else MESSAGE_IDS_TAG) + b"%d" % number


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


class Backup(Kind):
    name = "backup"
    summary = "a fake primary a backup connects to: hello, wiring snapshot and events, batches, dequeues"

    def setup(self) -> None:
        self.fake = FakePeer(self.users.users_file)
        self.fake.answer = self._answer
        node = FuzzNode(self.directory, self.users, "backup", "--ha-cluster", "--brokers-url", self.fake.address)
        self.node = self.nodes.add(node)
        node.start()
        self.prepare(node)
        self.term = 1
        self.max_id = 0  # the highest id fz.b1 may hold (fresh ids start above it)
        self.generation = 0  # of fz.b1: a new one (a new uuid in the snapshot) makes the backup start it afresh
        self.cases = 0
        self.served: Served | None = None
        self.record: CaseRecord | None = None
        self.rng = random.Random(0)

    def teardown(self) -> None:
        super().teardown()
        self.fake.close()

    def prepare(self, node: Any) -> None:
        admin_request(node, "CREATE", "queue", LOCAL_QUEUE, {"arguments": {"qpid.replicate": "none"}})

    def recover(self) -> None:
        super().recover()
        self.term, self.max_id = 1, 0

    def check(self, record: CaseRecord) -> CheckResult:
        """The reference producer and consumer (as admin, on the local queue), and STATUS and QUERY answered."""
        assert self.node is not None
        result = reference(self.node, LOCAL_QUEUE, REFERENCE_MESSAGES, CHECK_TIMEOUT, user="admin", admin_link=True)
        return operations_answered(self.node, result, ("STATUS", "QUERY"))

    # -- our side of the backup's attaches --------------------------------------------------

    def _answer(self, link: Any, served: Served) -> None:
        rng, record = self.rng, self.record
        if record is None or not link.is_sender:
            return
        address = link.remote_source.address or ""
        if address == WIRING_ADDRESS:
            return
        offered = served.attach_properties.get(address, {}).get(LINEAGE_PROPERTY)
        lineage: Any = offered if offered is not None else []
        if rng.random() < 0.2:
            lineage = rng.choice([[], [[self.term, "fz-primary", 1]], values.like(rng, lineage or [[1, "x", 1]]),
                                  values.value(rng)])
            record.note(f"lineage for {address!r} -> {_short(lineage)}")
        link.properties = {LINEAGE_PROPERTY: lineage}

    # -- one case ----------------------------------------------------------------------------

    def run_case(self, rng: random.Random, index: int) -> CaseRecord:
        record = CaseRecord(target=self.node)
        self.rng, self.record = rng, record
        served = self.fake.accept()
        if served is None:
            record.hang = f"the backup did not connect to its primary within {ACCEPT_TIMEOUT:g} s"
            return record
        started = time.monotonic()
        try:
            self._serve(rng, served, record)
            left = HOLD - (time.monotonic() - started)
            if left > 0 and not served.engine.peer_closed:
                self.fake.run(served, left)
            record.conditions += served.closed
        finally:
            served.engine.close(linger=0.1 if rng.random() < 0.8 else 0.0)
        return record

    def _serve(self, rng: random.Random, served: Served, record: CaseRecord) -> None:
        fake = self.fake
        if served.user != "peer":
            record.conditions.append(f"the backup logged in as {served.user!r}")
        info = served.properties.get(BACKUP_PROPERTY) or {}
        backup_id = str(info.get("node_id", "")) if isinstance(info, dict) else ""
        if not fake.run(served, 2.0, lambda: WIRING_ADDRESS in served.links
                        and served.links[WIRING_ADDRESS].credit > 0):
            record.conditions.append("no wiring link")
            return
        wiring = served.links[WIRING_ADDRESS]
        generation = rng.choice([0, 0, 0, 1])  # now and then the primary's objects are new incarnations
        me = {"node_id": "fz-primary", "url": fake.address}
        term: Any = self.term if self.term < 2**63 else ulong(self.term)
        if rng.random() < 0.15:
            term = rng.choice([values.encodable(self.term + 1), values.encodable(self.term - 1), 0, -1, 2**63 - 1,
                               values.integer(rng), values.value(rng)])
            record.note(f"hello term {_short(term)}")
        members = [dict(me, state="primary"), {"node_id": backup_id, "url": "", "state": "catchup",
                                               "connected": True, "expected": False}]
        hello = mutate_map(rng, {"type": "hello", "primary": me, "term": term, "replicate_default": "all",
                                 "members": members}, record, "hello")
        messages: list[Any] = [hello]
        self.cases += 1
        if self.max_id >= 2**40 or self.cases % RENEW_EVERY == 0:  # fz.b1 anew: fresh ids, and a bounded queue
            self.generation, self.max_id = self.generation + 1, 0
            record.note(f"{VERIFY_QUEUE} renewed (generation {self.generation})")
        queues = [queue_spec(name, level, generation if name != VERIFY_QUEUE else self.generation)
                  for name, level in QUEUES.items()]
        exchanges = [exchange_spec("fz.bx", generation)]
        bindings = [binding_spec("fz.bx", "fz.b1", queue_generation=self.generation)] if generation == 0 else []
        messages.append(mutate_map(rng, {"type": "snapshot", "queues": queues, "exchanges": exchanges,
                                         "bindings": bindings}, record, "snapshot"))
        for _ in range(rng.choice([0, 0, 1, 2, 4])):
            messages.append(mutate_map(rng, self._event(rng, backup_id, me), record, "event"))
        if rng.random() < 0.05:
            messages.insert(rng.randrange(len(messages) + 1), values.value(rng))
            record.note("a wiring message that is not a map")
        for number, body in enumerate(messages):
            if wiring.state & Endpoint.REMOTE_CLOSED or served.engine.peer_closed:
                break
            send(wiring, b"w%d" % number, encoded(rng, body, record, "wiring"), settled=True)
        said = hello.get("term") if isinstance(hello, dict) else None
        if isinstance(said, int) and not isinstance(said, bool) and self.term < said <= 2**63 - 2:
            # The backup follows that term from now on: later hellos must not be older.  A term past 2**63-2
            # it refuses (replication/codec.py decode_term), so it follows none of those: following one
            # made every later hello a refused one (seed 29: 83 of 150 cases, no browser ever attached).
            self.term = said
        fake.run(served, 0.3, lambda: all(name in served.links for name, level in QUEUES.items() if level == "all"))
        # Checked first on a connection no junk has reached yet (what earlier cases sent is still in the
        # backup), and again after this case's junk if the backup kept the connection: most junk makes
        # it drop the connection, and a check only after it ran in 4 of 10,000 cases (seed 5).
        held = served.attach_properties.get(VERIFY_QUEUE, {}).get(IDS_PROPERTY) or []
        self.max_id = max([self.max_id, *[x for x in held if isinstance(x, int) and x < 2**63]])
        self._verify(rng, served, record)
        sent_ids: list[int] = []
        for name, level in QUEUES.items():
            link = served.links.get(name)
            if link is None or level != "all" or not link.state & Endpoint.LOCAL_ACTIVE:
                continue
            held = [x for x in served.attach_properties.get(name, {}).get(IDS_PROPERTY) or [] if isinstance(x, int)]
            if name == VERIFY_QUEUE:
                self.max_id = max([self.max_id, *held])
            first = max([self.max_id, *held]) + 1
            for number in range(rng.choice([0, 1, 2, 3])):
                if link.credit <= 0 or served.engine.peer_closed:
                    break
                roll = rng.random()
                if roll < 0.65:
                    data, ids = batch_bytes(rng, first, rng.choice([1, 3, 20]), record)
                    tag = b"b%d" % (ids[0] if ids else 0)
                    sent_ids += [i for i in ids if isinstance(i, int)]
                    first += max(1, len(ids))
                elif roll < 0.8:
                    data, tag = dequeue_bytes(rng, sent_ids, record), DEQUEUE_TAG + b"%d" % number
                else:
                    data, tag = control_bytes(rng, sent_ids, record, counts=roll < 0.9, number=number)
                if rng.random() < 0.05:
                    tag = rng.choice([b"", b"x", b"\xff" * 40, b"d", b"b", b"c", b"u"])
                    record.note(f"tag {tag!r}")
                if name == VERIFY_QUEUE:
                    sent_ids += batch_ids(tag, data, CONTROL_TAGS)
                send(link, tag, data, settled=rng.random() < 0.3)
            fake.run(served, rng.choice([0.02, 0.1]))
        self.max_id = max([self.max_id, *[i for i in sent_ids if i < 2**63]])
        self._verify(rng, served, record)

    def _event(self, rng: random.Random, backup_id: str, me: dict[str, Any]) -> dict[str, Any]:
        roll = rng.random()
        name = rng.choice(["fz.b2", "fz.b4", "fz.b5"])
        if roll < 0.2:
            arguments = features.queue_arguments(rng) if rng.random() < 0.5 else None  # bad ones: refused, logged
            return {"type": "queue-created", **queue_spec(name, rng.choice(["all", "configuration"]), 0, arguments)}
        if roll < 0.35:
            return {"type": "queue-deleted", "name": name, "uuid": _uuid(name)}
        if roll < 0.5:
            return {"type": "exchange-created", **exchange_spec(rng.choice(["fz.bx", "fz.by"]))}
        if roll < 0.6:
            return {"type": "exchange-deleted", "name": "fz.by", "uuid": _uuid("fz.by")}
        if roll < 0.75:
            return {"type": rng.choice(["bound", "unbound"]), **binding_spec("fz.bx", rng.choice(["fz.b1", name]))}
        state = rng.choice(["catchup", "ready", "ready", "primary", "gone"])
        return {"type": "members", "term": values.encodable(self.term),
                "members": [dict(me, state="primary"), {"node_id": backup_id, "url": "", "state": state,
                                                        "connected": True, "expected": rng.random() < 0.5}]}

    def _verify(self, rng: random.Random, served: Served, record: CaseRecord) -> None:
        """A valid batch of fresh ids on fz.b1; once accepted, the backup must hold it."""

        def ready() -> bool:
            link = served.links.get(VERIFY_QUEUE)
            return link is not None and link.credit > 0 and bool(link.state & Endpoint.LOCAL_ACTIVE)

        # A loaded backup may take longer than the case's own 0.3 s to attach and grant credit: waited
        # for here, or on a busy machine almost no case checks what the backup acknowledged.
        self.fake.run(served, VERIFY_ATTACH_WAIT, lambda: ready() or served.engine.peer_closed)
        link = served.links.get(VERIFY_QUEUE)
        if link is None or not link.state & Endpoint.LOCAL_ACTIVE or link.state & Endpoint.REMOTE_CLOSED \
                or served.engine.peer_closed or link.credit <= 0 or self.max_id >= 2**40:
            return
        first = self.max_id + 1
        ids = list(range(first, first + VERIFY_MESSAGES))
        payloads = [bytes(Message(body=f"fz-verify-{i}", durable=False).encode()) for i in ids]
        tag = b"b%d" % first
        send(link, tag, encode_batch(ids, payloads))
        self.max_id = ids[-1]
        if not self.fake.run(served, 2.0, lambda: tag in served.outcomes):
            record.conditions.append("verification batch not settled")
            return
        state = served.outcomes[tag]
        if state != 36:  # PN_ACCEPTED
            record.conditions.append(f"verification batch settled {state}")
            return
        record.note(f"verified batch {first}..{ids[-1]} accepted")
        try:
            reply = admin_request(self.node, "IDS", "queue", VERIFY_QUEUE, {"after": first - 1, "limit": 100})
        except Exception as error:  # noqa: BLE001 - whatever the failure, an acknowledged batch is not shown held
            record.lost += len(ids)
            record.loss = f"accepted batch {first}..{ids[-1]}, then IDS failed: {error}"
            return
        held = {int(i): d for i, d in reply.get("messages") or []}
        missing = [i for i, p in zip(ids, payloads) if held.get(i) != digest(p)]
        if missing:
            record.lost += len(missing)
            record.loss = f"accepted batch {first}..{ids[-1]} but IDS lacks (or differs at) {missing}"
        record.verified += len(ids) - len(missing)
