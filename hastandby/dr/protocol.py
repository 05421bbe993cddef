"""What a DR replica and its source say to each other, over plain AMQP 1.0.

The replica opens a connection marked with the property
``hastandby.dr-replica`` (its node id and URL: a source HA cluster's backups
refuse it like any client, so a URL list finds the primary) and one receiving
link per replicated queue.  The link's source address is the queue; its
properties say the mode, the replication's key, the id-sequence *epoch* the
replica last saw and, in full mode, the ids it holds.

The source answers with its own link property ``hastandby.dr-epoch``: the
uuid of the queue (full) or of the tap queue (enqueue) whose ids the
messages carry.  A queue keeps its uuid across an HA failover, where ids
continue, and gets a new one when a standalone node restarts, where ids
start again, so a changed epoch tells the replica its ids mean nothing now.
Within one epoch, ids mean the same message only below the point where the
two sides' *lineages* diverge (``broker/queues/lineage.py``: a source cluster's
primary that was frozen may have given ids out that its successor gave to
other messages).  The replica sends the source lineage it adopted last
(``hastandby.dr-lineage``), the source answers with its own, and both
compute the divergence point: a full replica drops what it holds from there
on before the first batch arrives and the source trusts only the ids below
it; an enqueue replica moves its ``base`` so that the source's ids from there
on are new to it.

Messages travel as the producer's bytes with the source id as delivery tag.
Control deliveries are pre-settled: tag ``d...`` is a batch of dequeued ids
(full mode, as in hot standby), tag ``s...`` a status map (state, lag in
messages and seconds, overflow count) sent about once a second.

Acknowledgement.  A replica announces ``hastandby.dr-ack`` and opens a
second link on the same session, a sender to ``$dr.ack``: at most every
20 ms, when it has stored something new, it sends ``{"through": ID}``,
meaning every delivery up to that source id is stored for good.  An asynchronous source then sends its messages
pre-settled, sparing both nodes a disposition per message: in enqueue mode
the backlog keeps them until acknowledged this way; in full mode the id set
a reconnecting replica sends is what re-sends a lost one, and the
acknowledgements only measure lag.  A ``--sync`` link keeps per-message
``accepted``: the producer's acknowledgement waits on it.

A replica that stops replicating detaches with the condition
``hastandby:replication-stopped``: the source then forgets the replication
(and deletes its tap).  Any other detach or a lost connection keeps it.

Each message is a frozen dataclass here, checked where it arrives:
``from_wire`` raises ``ProtocolError`` (``replication/codec.py``) naming the
bad field, which the source turns into a refused attach and the replica into
a detach, and ``to_wire`` gives the map the sender puts on the wire:
``ReplicaIdentity`` (the connection property), ``LinkRequest`` (the data
link's properties), ``AttachReply``, ``StatusReport`` and ``Ack``.  Batches
and dequeues are the codec's; ``decode_ordered_batch`` adds what a replica
needs of a batch's ids besides.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from proton import symbol

from hastandby.broker.queues import lineage
from hastandby.broker.queues.idset import IdSet
from hastandby.broker.queues.lineage import Lineage
from hastandby.broker.message.values import plain
from hastandby.replication.codec import (
    IDS_PROPERTY,
    MAX_ID,
    ProtocolError,
    decode_batch,
    decode_ids,
    short,
)

REPLICA_PROPERTY = symbol("hastandby.dr-replica")
MODE_PROPERTY = symbol("hastandby.dr-mode")
KEY_PROPERTY = symbol("hastandby.dr-key")
EPOCH_PROPERTY = symbol("hastandby.dr-epoch")
LINEAGE_PROPERTY = symbol("hastandby.dr-lineage")
SYNC_PROPERTY = symbol("hastandby.dr-sync")
ACK_PROPERTY = symbol("hastandby.dr-ack")
ACK_ADDRESS = "$dr.ack"
MAX_COUNT_PROPERTY = symbol("hastandby.dr-max-backlog-count")
MAX_BYTES_PROPERTY = symbol("hastandby.dr-max-backlog-bytes")
STOPPED = "hastandby:replication-stopped"
STATUS_TAG = b"s"
MODES = ("full", "enqueue")

TAP_PREFIX = "$dr."
TAP_OF = "hastandby.dr-tap-of"
TAP_KEY = "hastandby.dr-key"

MAX_BOUND = 2**63 - 1
"""The largest backlog bound a replica may ask for (messages or bytes): an AMQP long."""


def tap_name(queue: str, key: str) -> str:
    """The source-side queue that holds an enqueue-mode replica's backlog."""
    return f"{TAP_PREFIX}{key}.{queue}"


def _string(value: Any, name: str) -> str:
    """An optional string field (absent: ``""``)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ProtocolError(name, f"{short(value)} is not a string")
    return str(value)


def _flag(value: Any, name: str) -> bool:
    """An optional boolean field (absent: False)."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ProtocolError(name, f"{short(value)} is not a boolean")
    return value


def _lineage(value: Any, name: str) -> Lineage:
    try:
        return lineage.from_wire(value)
    except (TypeError, ValueError) as error:
        raise ProtocolError(name, str(error)) from None


def _bound(value: Any, name: str) -> int | None:
    """A replica's bound on its backlog (messages or bytes), checked before the source sizes a queue by it.

    Absent or 0: no bound."""
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= MAX_BOUND:
        raise ProtocolError(name, f"{short(value)} is not a count (an integer 0..2**63-1)")
    return value or None


@dataclass(frozen=True)
class ReplicaIdentity:
    """The connection property ``hastandby.dr-replica``: which node replicates, for the source's logs and status.

    On the wire a map with ``node_id`` and ``url`` (absent when read: ``""``); other keys are ignored.
    """

    node_id: str = ""
    url: str = ""

    @property
    def name(self) -> str:
        """How the source names the replica: its URL, else its node id."""
        return self.url or self.node_id or "?"

    @classmethod
    def from_wire(cls, value: Any) -> ReplicaIdentity:
        """From the property's (plain) value; ProtocolError naming the bad field."""
        name = str(REPLICA_PROPERTY)
        if not isinstance(value, dict):
            raise ProtocolError(name, f"a replica's identity is a map, got {short(value)}")
        return cls(_string(value.get("node_id"), f"{name}.node_id"), _string(value.get("url"), f"{name}.url"))

    def to_wire(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "url": self.url}


@dataclass(frozen=True)
class LinkRequest:
    """A replica's data link attach: the link properties that say what it wants and what it holds.

    ``mode`` is ``full`` or ``enqueue``; ``key`` names the replication (an
    enqueue replica's tap: non-empty, without ``.``); ``epoch`` and
    ``lineage`` are the source's as the replica last adopted them (empty before
    the first); ``sync`` asks for per-batch acknowledgement, ``ack`` says the
    replica acknowledges cumulatively on ``$dr.ack``.  A full replica sends the
    ids it holds; an enqueue replica its backlog bounds, if any (absent or 0:
    none).  Absent optional fields read as their defaults; other keys are
    ignored.
    """

    mode: str
    key: str = ""
    epoch: str = ""
    lineage: Lineage = ()
    sync: bool = False
    ack: bool = False
    ids: IdSet = field(default_factory=IdSet)
    max_backlog_count: int | None = None
    max_backlog_bytes: int | None = None

    @classmethod
    def from_wire(cls, properties: dict[str, Any]) -> LinkRequest:
        """From the link's (plain) properties; ProtocolError naming the first bad property."""
        mode = properties.get(str(MODE_PROPERTY))
        if mode not in MODES:
            raise ProtocolError(str(MODE_PROPERTY),
                                f"invalid replication mode {short(mode)}: must be one of {', '.join(MODES)}")
        key = _string(properties.get(str(KEY_PROPERTY)), str(KEY_PROPERTY))
        if mode == "enqueue" and (not key or "." in key):
            raise ProtocolError(str(KEY_PROPERTY), f"an enqueue-mode replica needs a key without '.', got {key!r}")
        return cls(
            mode=str(mode),
            key=key,
            epoch=_string(properties.get(str(EPOCH_PROPERTY)), str(EPOCH_PROPERTY)),
            lineage=_lineage(properties.get(str(LINEAGE_PROPERTY)), str(LINEAGE_PROPERTY)),
            sync=_flag(properties.get(str(SYNC_PROPERTY)), str(SYNC_PROPERTY)),
            ack=_flag(properties.get(str(ACK_PROPERTY)), str(ACK_PROPERTY)),
            ids=decode_ids(properties.get(str(IDS_PROPERTY)), str(IDS_PROPERTY)),
            max_backlog_count=_bound(properties.get(str(MAX_COUNT_PROPERTY)), str(MAX_COUNT_PROPERTY)),
            max_backlog_bytes=_bound(properties.get(str(MAX_BYTES_PROPERTY)), str(MAX_BYTES_PROPERTY)),
        )

    def to_wire(self) -> dict[symbol, Any]:
        """The link properties: ids in full mode, the bounds that are set in enqueue mode."""
        wire: dict[symbol, Any] = {MODE_PROPERTY: self.mode, KEY_PROPERTY: self.key, EPOCH_PROPERTY: self.epoch,
                                   LINEAGE_PROPERTY: lineage.to_wire(self.lineage), SYNC_PROPERTY: self.sync,
                                   ACK_PROPERTY: self.ack}
        if self.mode == "full":
            wire[IDS_PROPERTY] = self.ids.to_wire()
        else:
            if self.max_backlog_count:
                wire[MAX_COUNT_PROPERTY] = self.max_backlog_count
            if self.max_backlog_bytes:
                wire[MAX_BYTES_PROPERTY] = self.max_backlog_bytes
        return wire


@dataclass(frozen=True)
class AttachReply:
    """The source's answer in its own attach: the epoch its ids belong to and the lineage they were assigned under."""

    epoch: str
    lineage: Lineage = ()

    @classmethod
    def from_wire(cls, properties: dict[str, Any]) -> AttachReply | None:
        """From the source's (plain) link properties; None without an epoch (a refusal: its detach follows).

        ProtocolError naming the bad property."""
        epoch = properties.get(str(EPOCH_PROPERTY))
        if epoch is None or epoch == "":
            return None
        if not isinstance(epoch, str):
            raise ProtocolError(str(EPOCH_PROPERTY), f"not a string: {short(epoch)}")
        return cls(str(epoch), _lineage(properties.get(str(LINEAGE_PROPERTY)), str(LINEAGE_PROPERTY)))

    def to_wire(self) -> dict[symbol, Any]:
        return {EPOCH_PROPERTY: self.epoch, LINEAGE_PROPERTY: lineage.to_wire(self.lineage)}


_STATUS_TYPES: dict[str, tuple[type, ...]] = {
    "state": (str,), "lag_messages": (int, type(None)), "lag_seconds": (int, float, type(None)),
    "overflow": (int, type(None)),
}


@dataclass(frozen=True)
class StatusReport:
    """A source's status map (tag ``s...``, about once a second): what both sides show of a replication.

    ``state`` is ``catching up``, ``live`` or ``overflow``; lags are messages
    and seconds (the age of the oldest unreplicated message), ``overflow`` the
    messages a full backlog dropped.  Fields the map lacks are None; keys this
    version does not know are ignored (a newer source may say more).  Integers
    are 0..2**63-2.
    """

    state: str | None = None
    lag_messages: int | None = None
    lag_seconds: float | None = None
    overflow: int | None = None

    @classmethod
    def from_wire(cls, body: Any) -> StatusReport:
        """From a status delivery's (decoded) body; ProtocolError naming ``status`` or ``status.<key>``."""
        if not isinstance(body, dict):
            raise ProtocolError("status", f"a status report is a map, got {type(body).__name__}")
        found: dict[str, Any] = {}
        for key, value in body.items():
            if not isinstance(key, str) or key not in _STATUS_TYPES:
                continue
            value = plain(value)
            if isinstance(value, bool) or not isinstance(value, _STATUS_TYPES[key]) or \
                    (isinstance(value, int) and not 0 <= value <= MAX_ID):
                raise ProtocolError(f"status.{key}", f"{short(value)} is not a valid {key}")
            found[str(key)] = value
        return cls(**found)

    def to_wire(self) -> dict[str, Any]:
        """The map the source sends: the fields that are set, in a fixed order."""
        wire = {"state": self.state, "lag_messages": self.lag_messages, "lag_seconds": self.lag_seconds,
                "overflow": self.overflow}
        return {key: value for key, value in wire.items() if value is not None}


@dataclass(frozen=True)
class Ack:
    """A cumulative acknowledgement on ``$dr.ack``: every delivery up to source id ``through`` is stored for good."""

    through: int = 0

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Ack:
        """From the control map (``codec.receive_controls``); ProtocolError naming ``ack.through``."""
        through = body.get("through", 0)
        if type(through) is not int or not 0 <= through <= MAX_ID:
            raise ProtocolError("ack.through", f"{short(through)} is not a message id (an integer 0..2**63-2)")
        return cls(through)

    def to_wire(self) -> dict[str, Any]:
        return {"through": self.through}


def decode_ordered_batch(data: bytes, base: int) -> tuple[array[int], list[bytes]]:
    """A batch as a replica takes it (``codec.decode_batch``): at least one message, ids strictly increasing,
    and ``base`` added to each still within 1..2**63-2 (an enqueue replica's local ids must fit too)."""
    ids, payloads = decode_batch(data)
    if not ids:
        raise ProtocolError("batch ids", "a batch of no messages")
    previous = 0
    for source_id in ids:
        if source_id > MAX_ID - base:
            raise ProtocolError("batch ids", f"id {source_id} is out of range (1..{MAX_ID - base})")
        if source_id <= previous:
            raise ProtocolError("batch ids", f"id {source_id} follows {previous}: ids must increase")
        previous = source_id
    return ids, payloads
