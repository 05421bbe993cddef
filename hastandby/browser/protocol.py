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
from typing import Any

from proton import Message, symbol

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


def decode_batch(data: bytes) -> tuple[array, list[bytes]]:
    """The ids and payloads of a batch; ``ValueError`` if it is not one."""
    if len(data) < _COUNT.size:
        raise ValueError("a message batch is shorter than its header")
    (count,) = _COUNT.unpack_from(data)
    start = _COUNT.size + 12 * count
    if start > len(data):
        raise ValueError(f"a message batch of {count} messages is cut short")
    ids, sizes = array("Q"), array("I")
    ids.frombytes(data[_COUNT.size:_COUNT.size + 8 * count])
    sizes.frombytes(data[_COUNT.size + 8 * count:start])
    if _SWAP:
        ids.byteswap()
        sizes.byteswap()
    if start + sum(sizes) != len(data):
        raise ValueError("a message batch's sizes do not add up to its length")
    payloads = []
    for size in sizes:
        payloads.append(data[start:start + size])
        start += size
    return ids, payloads


def encode_dequeues(ids: IdSet) -> bytes:
    return bytes(Message(body=ids.to_wire()).encode())


def decode_dequeues(data: bytes) -> IdSet:
    message = Message()
    message.decode(data)
    return IdSet.from_wire([int(x) for x in message.body])


def encode_control(body: dict[str, Any]) -> bytes:
    return bytes(Message(body=body).encode())


def decode_control(data: bytes) -> dict[str, Any]:
    message = Message()
    message.decode(data)
    if not isinstance(message.body, dict):
        raise ValueError("a wiring message must be a map")
    return plain(message.body)


def receive_control(impl: Any) -> dict[str, Any] | None:
    """The map of a complete control delivery on a low-rate link (settled here); None while partial."""
    received = receive_whole(impl)
    if received is None:
        return None
    delivery, data = received
    delivery.settle()
    return decode_control(data)
