"""The replication protocol between a backup and its primary, over plain AMQP 1.0.

One connection per backup, marked with the connection property
``qpid.ha-backup`` (the backup's node id, URL and state), carries:

- one *wiring* link: a receiver on ``$ha.wiring``; the primary sends a
  ``hello`` (its node id, term and replication default), the wiring snapshot,
  then wiring events and ``members`` updates, in order;
- one *replicating browser* per replicated queue: a receiver on the queue in
  ``copy`` mode whose link properties say ``qpid.ha-replicate`` and carry the
  id set the backup already holds (``qpid.ha-ids``), the lineage of its copy
  (``qpid.ha-lineage``, ``broker/lineage.py``) and the term it expects.  The
  primary answers with its own lineage in its attach: both sides then know
  the divergence point below which ids name the same messages, and the
  backup drops its copy's tail from there before the first batch arrives.

The backup also opens a *status* link, a sender to ``$ha.status``: it tells
the primary its memory alarm (``{"memory_alarm": bool}``) when the link opens
and whenever it changes, and the primary holds its producers while any backup
is in alarm (``broker/memory.py``).

On a replicating browser messages travel in *batches*: every message the
primary's queue gave the browser during one pass of engine events goes in one
delivery (tag ``b`` + its first id), each message as the producer's bytes,
not re-encoded (``encode_batch``).  A delivery per message cost the primary a
delivery, a disposition and a settle each, and its sends to a backup ran at
about 0.55 of standalone; a batch pays those once.  The backup settles a
batch ``accepted`` once every message in it is on its replica: that is the
acknowledgement the primary's guard waits for.  A delivery whose tag starts
with ``d`` is a control message: a batch of dequeued ids (an AMQP list, the
IdSet wire form).  Batches and dequeues share the link, so they arrive in the
order the primary's queue saw them.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Any

from proton import Message, symbol

from hastandby.broker import lineage
from hastandby.broker.links import receive_whole
from hastandby.broker.values import plain

from hastandby.broker.idset import IdSet

BACKUP_PROPERTY = symbol("qpid.ha-backup")
ADMIN_PROPERTY = symbol("qpid.ha-admin")
REPLICATE_PROPERTY = symbol("qpid.ha-replicate")
IDS_PROPERTY = symbol("qpid.ha-ids")
TERM_PROPERTY = symbol("qpid.ha-term")
LINEAGE_PROPERTY = symbol("qpid.ha-lineage")
WIRING_ADDRESS = "$ha.wiring"
STATUS_ADDRESS = "$ha.status"
DEQUEUE_TAG = b"d"
BATCH_TAG = b"b"

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
            raise ProtocolError("dequeues", f"{_short(value)} is not an id (1..2**63-2)")
    try:
        return IdSet.from_wire(wire)
    except ValueError as error:
        raise ProtocolError("dequeues", str(error)) from None


def encode_control(body: dict[str, Any]) -> bytes:
    return bytes(Message(body=body).encode())


class ProtocolError(ValueError):
    """A peer's message is not the replication protocol: refuse it with ``condition``, naming ``field``."""

    def __init__(self, field: str, reason: str, condition: str = INVALID_FIELD) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.condition = condition


def _short(value: Any) -> str:
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
            raise ProtocolError("control message", f"key {_short(key)} is not a string")
    control: dict[str, Any] = plain(body)
    return control


def receive_control(impl: Any) -> dict[str, Any] | None:
    """The map of a complete control delivery on a low-rate link (settled here); None while partial.

    ProtocolError (a ValueError) if the delivery is not a control message."""
    received = receive_whole(impl)
    if received is None:
        return None
    delivery, data = received
    delivery.settle()
    return decode_control(data)


def decode_term(value: Any, field: str) -> int:
    """A term: an integer 0..2**63-2 (absent: 0)."""
    if value is None:
        return 0
    value = plain(value)
    if type(value) is not int or not 0 <= value <= MAX_ID:
        raise ProtocolError(field, f"{_short(value)} is not a term (an integer 0..2**63-2)")
    return value


def decode_status(body: dict[str, Any]) -> bool:
    """A backup's status message: its memory alarm."""
    alarm = body.get("memory_alarm", False)
    if not isinstance(alarm, bool):
        raise ProtocolError("status.memory_alarm", f"{_short(alarm)} is not a boolean")
    return alarm


MEMBER_PRIMARY = "primary"
"""The state a primary gives its own entry in a members list (its backups: ``BackupState``, browser/primary.py)."""
MEMBER_READY = "ready"
MEMBER_CATCHUP = "catchup"


@dataclass(frozen=True)
class PeerMember:
    """One node as a primary describes it: an entry of a members list (hello, ``members`` update, QUERY), or the
    hello's ``primary``.

    On the wire a map; ``node_id`` and ``url`` are always written (absent when read: ``""``), the others only
    when set.  ``state`` is ``"primary"`` for the primary's own entry and a ``BackupState`` value
    (``"catchup"``, ``"ready"``) for a backup's, but any string is taken: a newer primary may name states this
    node does not know, and only ``"ready"`` means anything here.  ``connected`` and ``expected`` are sent for
    backups; ``term`` is read if present (no primary sends it today).  Other keys are ignored, so a newer
    primary may add some.
    """

    node_id: str = ""
    url: str = ""
    state: str | None = None
    connected: bool | None = None
    expected: bool | None = None
    term: int | None = None

    @property
    def ready(self) -> bool:
        """The primary counts this backup as holding every replicated queue (it may be elected)."""
        return self.state == MEMBER_READY

    @classmethod
    def from_wire(cls, value: Any, field: str) -> PeerMember:
        """A member from a peer's (plain) map; ProtocolError naming ``field`` or ``field.<key>`` if it is not one."""
        if not isinstance(value, dict):
            raise ProtocolError(field, f"a member is a map, got {_short(value)}")
        node_id = value.get("node_id", "")
        if not isinstance(node_id, str):
            raise ProtocolError(f"{field}.node_id", f"{_short(value.get('node_id'))} is not a string")
        url = value.get("url", "")
        if not isinstance(url, str):
            raise ProtocolError(f"{field}.url", f"{_short(value.get('url'))} is not a string")
        state = value.get("state")
        if "state" in value and not isinstance(state, str):
            raise ProtocolError(f"{field}.state", f"{_short(value['state'])} is not a string")
        flags: dict[str, bool | None] = {}
        for key in ("connected", "expected"):
            flag = value.get(key)
            if flag is not None and not isinstance(flag, bool):
                raise ProtocolError(f"{field}.{key}", f"{_short(flag)} is not a boolean")
            flags[key] = flag
        term = decode_term(value["term"], f"{field}.term") if value.get("term") is not None else None
        return cls(node_id, url, state, flags["connected"], flags["expected"], term)

    def to_wire(self) -> dict[str, Any]:
        """The map a primary sends (and QUERY shows): ``node_id``, ``url``, then whichever others are set."""
        wire: dict[str, Any] = {"node_id": self.node_id, "url": self.url}
        for key in ("state", "connected", "expected", "term"):
            value = getattr(self, key)
            if value is not None:
                wire[key] = value
        return wire


def decode_member(value: Any, field: str) -> PeerMember:
    """One node as a primary describes it (``PeerMember.from_wire``)."""
    return PeerMember.from_wire(value, field)


def decode_members(value: Any, field: str = "members") -> list[PeerMember]:
    """A members list (absent: empty): maps as ``PeerMember.from_wire`` checks them."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError(field, f"a members list is a list, got {_short(value)}")
    return [PeerMember.from_wire(m, f"{field}[{i}]") for i, m in enumerate(value)]


@dataclass
class Hello:
    """A primary's hello on the wiring link.

    ``primary`` is the primary's own member (node id, URL); a hello without one gives an empty member
    (``node_id`` and ``url`` ``""``), as before, rather than None: the backup keeps it as the primary it follows.
    """

    primary: PeerMember
    term: int
    replicate_default: str | None
    members: list[PeerMember]


def decode_hello(body: dict[str, Any]) -> Hello:
    primary = body.get("primary")
    member = PeerMember.from_wire({} if primary is None else primary, "hello.primary")
    term = decode_term(body.get("term"), "hello.term")
    default = body.get("replicate_default")
    if default is not None and not isinstance(default, str):
        raise ProtocolError("hello.replicate_default", f"{_short(default)} is not a string")
    members = decode_members(body.get("members"), "hello.members")
    return Hello(member, term, default, members)


def decode_members_update(body: dict[str, Any]) -> tuple[int, list[PeerMember]]:
    """A ``members`` update: (term, members)."""
    return decode_term(body.get("term"), "members.term"), decode_members(body.get("members"))


@dataclass
class BrowserRequest:
    """What a backup's replicating browser attach says: the term it follows, the ids and lineage it holds."""

    term: int
    ids: IdSet
    lineage: Any


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
        raise ProtocolError(field, f"not a map: {_short(properties)}")
    found: dict[str, Any] = plain(properties)
    return found


def decode_ids(value: Any, field: str) -> IdSet:
    """The ids a peer says it holds (an IdSet's wire form of ids 1..2**63-2; absent: none)."""
    if value is None:
        return IdSet()
    if not isinstance(value, list):
        raise ProtocolError(field, f"an id set is a list, got {_short(value)}")
    for entry in value:
        if type(entry) is not int or not 1 <= entry <= MAX_ID:
            raise ProtocolError(field, f"{_short(entry)} is not an id (1..2**63-2)")
    try:
        return IdSet.from_wire(value)
    except ValueError as error:
        raise ProtocolError(field, str(error)) from None


def decode_browser_request(properties: dict[str, Any]) -> BrowserRequest:
    """The term, ids and lineage of a replicating browser's (plain) link properties."""
    term = decode_term(properties.get(str(TERM_PROPERTY)), str(TERM_PROPERTY))
    id_set = decode_ids(properties.get(str(IDS_PROPERTY)), str(IDS_PROPERTY))
    try:
        their_lineage = lineage.from_wire(properties.get(str(LINEAGE_PROPERTY)))
    except (TypeError, ValueError) as error:
        raise ProtocolError(str(LINEAGE_PROPERTY), str(error)) from None
    return BrowserRequest(term, id_set, their_lineage)
