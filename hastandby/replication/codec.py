"""What every replication link says, for hot standby (``ha/``) and DR (``dr/``) alike.

Messages travel in *batches*: every message a queue gave the link during one
pass of engine events goes in one delivery (tag ``b`` + a sequence number),
each message as the producer's bytes, not re-encoded (``encode_batch``).  A
delivery per message cost the sender a delivery, a disposition and a settle
each, and a primary's sends to a backup ran at about 0.55 of standalone; a
batch pays those once.  A delivery whose tag starts with ``d`` is a batch of
dequeued ids (an AMQP list, the ``IdSet`` wire form); one whose tag starts
with ``c`` carries delivery-counts, an AMQP list ``[id, count, id, count,
...]`` of messages the receiver holds whose delivery failed (a delivery limit
counts on across failover).  Batches, dequeues and counts share the link, so
they arrive in the order the source queue saw them.

A replicating link's attach carries the ids its receiver already holds
(``qpid.ha-ids``); control messages (hello, wiring, status) are AMQP maps
with string keys.  Everything a peer sends is checked here, at the boundary:
a bad field is a ``ProtocolError`` naming it, which the link turns into a
detach with that condition.

The connection properties ``qpid.ha-backup`` and ``qpid.ha-admin`` mark the
cluster's own peers (a backup, an operator's tool); every service that
admits connections reads them.
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import Any, Callable

from proton import Delivery, Message, symbol

from hastandby.broker.queues.idset import IdSet
from hastandby.broker.links import receive_each
from hastandby.broker.message.values import plain

BACKUP_PROPERTY = symbol("qpid.ha-backup")
STORE_FAILED = "hastandby:store-failed"  # a backup closes its connection so when its journal cannot write
IDS_PROPERTY = symbol("qpid.ha-ids")
DEQUEUE_TAG = b"d"
BATCH_TAG = b"b"
COUNTS_TAG = b"c"
MESSAGE_IDS_TAG = b"u"  # message-ids a deduplicating queue remembers
MAX_KEY = 65_535  # bytes of one remembered message-id key (its type byte and value)
MAX_MS = 2**63 - 1
MAX_COUNT = 2**32 - 1  # a delivery-count is an AMQP uint

MAX_ID = 2**63 - 2
"""The highest replication id we take: a queue keeps its ids, and its next id, as signed 64-bit integers."""
DECODE_ERROR = "amqp:decode-error"
INVALID_FIELD = "amqp:invalid-field"

_COUNT = struct.Struct("<I")
_SWAP = sys.byteorder == "big"  # the wire is little-endian


def encode_batch(ids: list[int], payloads: list[bytes]) -> bytes:
    """Messages ``payloads`` with replication ``ids``, as one delivery's bytes.

    Layout (little-endian): message count (u32), the ids (u64 each), the sizes
    (u32 each), then the payloads back to back.  Ids and sizes go through
    ``array`` in one call each rather than a ``struct.pack`` per message.
    """
    id_array = array("Q", ids)
    sizes = array("I", map(len, payloads))
    if _SWAP:
        id_array.byteswap()
        sizes.byteswap()
    return b"".join([_COUNT.pack(len(ids)), id_array.tobytes(), sizes.tobytes(), *payloads])


def decode_batch(data: bytes) -> tuple[array[int], list[bytes]]:
    """The ids and payloads of a batch; ``ValueError`` if it is not one."""
    if data is None:
        raise ProtocolError("batch", "an empty delivery", DECODE_ERROR)
    if len(data) < _COUNT.size:
        raise ProtocolError("batch", "a message batch is shorter than its header", DECODE_ERROR)
    (count,) = _COUNT.unpack_from(data)
    start = _COUNT.size + 12 * count
    if start > len(data):
        raise ProtocolError("batch", f"a message batch of {count} messages is cut short", DECODE_ERROR)
    ids, sizes = array("Q"), array("I")
    ids.frombytes(data[_COUNT.size:_COUNT.size + 8 * count])
    sizes.frombytes(data[_COUNT.size + 8 * count:start])
    if _SWAP:
        ids.byteswap()
        sizes.byteswap()
    if start + sum(sizes) != len(data):
        raise ProtocolError("batch", "a message batch's sizes do not add up to its length", DECODE_ERROR)
    for msg_id in ids:
        if not 1 <= msg_id <= MAX_ID:
            raise ProtocolError("batch ids", f"id {msg_id} is out of range (1..2**63-2)")
    payloads = []
    for size in sizes:
        payloads.append(data[start:start + size])
        start += size
    return ids, payloads


def encode_dequeues(ids: IdSet) -> bytes:
    return bytes(Message(body=ids.to_wire()).encode())


def decode_dequeues(data: bytes | None) -> IdSet:
    """A dequeue delivery's ids: an AMQP list (the IdSet wire form) of ids 1..2**63-2."""
    body = decode_body(data, "dequeues")
    if not isinstance(body, (list, tuple)):
        raise ProtocolError("dequeues", f"an id set is a list, got {type(body).__name__}")
    wire = [plain(x) for x in body]
    for value in wire:
        if type(value) is not int or not 1 <= value <= MAX_ID:
            raise ProtocolError("dequeues", f"{short(value)} is not an id (1..2**63-2)")
    try:
        return IdSet.from_wire(wire)
    except ValueError as error:
        raise ProtocolError("dequeues", str(error)) from None


def encode_counts(counts: dict[int, int]) -> bytes:
    """Delivery-counts (id -> count) as a ``c`` delivery's bytes: a flat list, ids ascending."""
    flat: list[int] = []
    for msg_id in sorted(counts):
        flat += (msg_id, counts[msg_id])
    return bytes(Message(body=flat).encode())


def decode_counts(data: bytes | None) -> list[tuple[int, int]]:
    """A counts delivery's (id, count) pairs: ids 1..2**63-2, counts 0..2**32-1."""
    body = decode_body(data, "delivery-counts")
    if not isinstance(body, (list, tuple)) or len(body) % 2:
        raise ProtocolError("delivery-counts", f"a list of id, count pairs, got {short(body)}")
    flat = [plain(x) for x in body]
    pairs = list(zip(flat[0::2], flat[1::2]))
    for msg_id, count in pairs:
        if type(msg_id) is not int or not 1 <= msg_id <= MAX_ID:
            raise ProtocolError("delivery-counts", f"{short(msg_id)} is not an id (1..2**63-2)")
        if type(count) is not int or not 0 <= count <= MAX_COUNT:
            raise ProtocolError("delivery-counts", f"{short(count)} is not a delivery-count (0..2**32-1)")
    return pairs


def encode_message_ids(entries: list[tuple[bytes, int, bool]]) -> bytes:
    """Remembered message-ids (key, ms since the epoch, durable) as a ``u`` delivery's bytes: a flat list."""
    flat: list[Any] = []
    for key, ms, durable in entries:
        flat += (key, ms, durable)
    return bytes(Message(body=flat).encode())


def decode_message_ids(data: bytes | None) -> list[tuple[bytes, int, bool]]:
    """A ``u`` delivery's (key, ms, durable) triples: keys of 1..65535 bytes, ms 0..2**63-1."""
    if not data:
        raise ProtocolError("message-ids", "an empty delivery", DECODE_ERROR)
    message = Message()  # kept while the keys are read: proton gives binaries as views of its buffer
    try:
        message.decode(data)
        body = message.body
    except Exception as error:  # noqa: BLE001 - proton raises many types on a peer's bytes
        raise ProtocolError("message-ids", f"not an AMQP message we can read ({type(error).__name__}: {error})",
                            DECODE_ERROR) from None
    if not isinstance(body, (list, tuple)) or len(body) % 3:
        raise ProtocolError("message-ids", f"a list of key, time, durable triples, got {short(body)}")
    triples = []
    for at in range(0, len(body), 3):
        key, ms, durable = body[at], plain(body[at + 1]), body[at + 2]
        if not isinstance(key, (bytes, memoryview)) or not 1 <= len(key) <= MAX_KEY:
            shown = bytes(key) if isinstance(key, memoryview) else key
            raise ProtocolError("message-ids", f"{short(shown)} is not a message-id key (1..{MAX_KEY} bytes)")
        if type(ms) is not int or not 0 <= ms <= MAX_MS:
            raise ProtocolError("message-ids", f"{short(ms)} is not a time in milliseconds")
        if not isinstance(durable, bool):
            raise ProtocolError("message-ids", f"{short(durable)} is not true or false")
        triples.append((bytes(key), ms, durable))
    return triples


def encode_control(body: dict[str, Any]) -> bytes:
    return bytes(Message(body=body).encode())


class ProtocolError(ValueError):
    """A peer's message is not the replication protocol: refuse it with ``condition``, naming ``field``."""

    def __init__(self, field: str, reason: str, condition: str = INVALID_FIELD) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.condition = condition


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def decode_body(data: bytes | None, field: str) -> Any:
    """The body of the AMQP message in ``data``; ProtocolError (amqp:decode-error) if it is not one."""
    if not data:
        raise ProtocolError(field, "an empty delivery", DECODE_ERROR)
    message = Message()
    try:
        message.decode(data)
        return message.body
    except Exception as error:  # noqa: BLE001 - proton raises many types on a peer's bytes (binary map keys ...)
        raise ProtocolError(field, f"not an AMQP message we can read ({type(error).__name__}: {error})",
                            DECODE_ERROR) from None


def decode_control(data: bytes | None) -> dict[str, Any]:
    """A control message (wiring, status): a map with string keys, as plain values."""
    body = decode_body(data, "control message")
    if not isinstance(body, dict):
        raise ProtocolError("control message", f"a control message is a map, got {type(body).__name__}")
    for key in body:
        if not isinstance(key, str):
            raise ProtocolError("control message", f"key {short(key)} is not a string")
    control: dict[str, Any] = plain(body)
    return control


def receive_controls(impl: Any, handle: Callable[[dict[str, Any]], None]) -> None:
    """``handle`` the map of each complete control delivery of a low-rate link (``receive_each``), settled.

    ProtocolError (a ValueError) if a delivery is not a control message: the pass ends there."""

    def take(delivery: Delivery, data: bytes) -> None:
        delivery.settle()
        handle(decode_control(data))

    receive_each(impl, take)


def decode_term(value: Any, field: str) -> int:
    """A term: an integer 0..2**63-2 (absent: 0)."""
    if value is None:
        return 0
    value = plain(value)
    if type(value) is not int or not 0 <= value <= MAX_ID:
        raise ProtocolError(field, f"{short(value)} is not a term (an integer 0..2**63-2)")
    return value


def link_properties(read: Any, field: str) -> dict[str, Any]:
    """A peer's properties (``read()``, proton's reading of them) as a plain map with string keys."""
    try:
        properties = read()
    except Exception as error:  # noqa: BLE001 - proton fails on some legal maps (binary keys)
        raise ProtocolError(field, f"not a map we can read ({type(error).__name__}: {error})",
                            DECODE_ERROR) from None
    if properties is None:
        return {}
    if not isinstance(properties, dict):
        raise ProtocolError(field, f"not a map: {short(properties)}")
    found: dict[str, Any] = plain(properties)
    return found


def decode_ids(value: Any, field: str) -> IdSet:
    """The ids a peer says it holds (an IdSet's wire form of ids 1..2**63-2; absent: none)."""
    if value is None:
        return IdSet()
    if not isinstance(value, list):
        raise ProtocolError(field, f"an id set is a list, got {short(value)}")
    for entry in value:
        if type(entry) is not int or not 1 <= entry <= MAX_ID:
            raise ProtocolError(field, f"{short(entry)} is not an id (1..2**63-2)")
    try:
        return IdSet.from_wire(value)
    except ValueError as error:
        raise ProtocolError(field, str(error)) from None
