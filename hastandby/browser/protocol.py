"""The replication protocol between a backup and its primary, over plain AMQP 1.0.

One connection per backup, marked with the connection property
``qpid.ha-backup`` (the backup's node id, URL and state), carries:

- one *wiring* link: a receiver on ``$ha.wiring``; the primary sends a
  ``hello`` (its node id, term and replication default), the wiring snapshot,
  then wiring events and ``members`` updates, in order;
- one *replicating browser* per replicated queue: a receiver on the queue in
  ``copy`` mode whose link properties say ``qpid.ha-replicate`` and carry the
  id set the backup already holds (``qpid.ha-ids``) and the term it expects.

On a replicating browser each message travels as the producer's bytes, with
its replication id as the delivery tag (decimal): no re-encoding, no extra
frame per message.  A delivery whose tag starts with ``d`` is a control
message: a batch of dequeued ids (an AMQP list, the IdSet wire form).  The
backup settles each message ``accepted`` once it is on its replica: that is
the acknowledgement the primary's guard waits for.
"""

from __future__ import annotations

from typing import Any

from proton import Message, symbol

from hastandby.broker.values import plain

from .idset import IdSet

BACKUP_PROPERTY = symbol("qpid.ha-backup")
ADMIN_PROPERTY = symbol("qpid.ha-admin")
REPLICATE_PROPERTY = symbol("qpid.ha-replicate")
IDS_PROPERTY = symbol("qpid.ha-ids")
TERM_PROPERTY = symbol("qpid.ha-term")
WIRING_ADDRESS = "$ha.wiring"
DEQUEUE_TAG = b"d"


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
