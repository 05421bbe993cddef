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
two sides' *lineages* diverge (``broker/lineage.py``: a source cluster's
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
"""

from __future__ import annotations

from proton import symbol

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


def tap_name(queue: str, key: str) -> str:
    """The source-side queue that holds an enqueue-mode replica's backlog."""
    return f"{TAP_PREFIX}{key}.{queue}"

