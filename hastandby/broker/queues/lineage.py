"""Which primary assigned a queue's replication ids: the queue's *lineage*.

A replication id names a message only together with the primary that gave it
out.  A primary frozen past its lease (a VM stall, SIGSTOP, a partition from
etcd) may, when it resumes, enqueue messages under the same ids its successor
already gave to other messages; a backup may hold ids that a primary sent it
just before dying and that its successor never had, then reused.  Comparing
ids alone would keep those stale bodies as if they were the current ones.

So every replicated queue carries its lineage: the epochs, in id order, each
saying "from ``first_id`` on, ids were assigned by the primary of ``term``
(node ``node``)".  A primary appends its own epoch at promotion, starting at
the queue's next id; a queue created on a primary starts with that primary's
epoch.  A backup adopts its primary's lineage, and a DR replica its source's.
This is Kafka's leader-epoch cache (KIP-101) applied to queues.

Two copies of a queue agree on every id below their *divergence point*, the
first id at which their lineages name different epochs.  Catch-up compares
ids only below it: whatever a replica holds from the divergence point on was
assigned under an epoch its source does not share, so the replica drops it
and takes the source's messages instead.  Epochs are compared as (term,
node), never by order: etcd terms are unique, and the node id keeps two
manual promotions that picked the same term apart.

Why this is enough: a primary assigns each id of its epoch to one message,
and a node's lineage is only ever its own promotion appended to a lineage it
adopted after dropping what disagreed with it.  So on any node, the message
under id ``x`` is the one the primary of the epoch its lineage names for
``x`` assigned; two nodes whose lineages name the same epoch for ``x`` hold
the same message there.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Epoch:
    """Ids from ``first_id`` on were assigned by ``node`` as primary of ``term``."""

    term: int
    node: str
    first_id: int

    @property
    def key(self) -> tuple[int, str]:
        """What names the epoch (its start is where it began on this queue)."""
        return (self.term, self.node)


_MAX = 2**63 - 1  # terms and ids travel as AMQP longs: a peer's larger value could never be sent on

Lineage = tuple[Epoch, ...]
"""A queue's epochs with strictly increasing ``first_id``; empty for a queue no primary has claimed."""


def extended(lineage: Lineage, epoch: Epoch) -> Lineage:
    """``lineage`` with ``epoch`` appended (a promotion); an epoch that assigned nothing yet is replaced."""
    kept = tuple(e for e in lineage if e.first_id < epoch.first_id)
    if kept and kept[-1].key == epoch.key:
        return kept
    return kept + (epoch,)


def epoch_of(lineage: Lineage, msg_id: int) -> tuple[int, str] | None:
    """The (term, node) that assigned ``msg_id`` according to ``lineage``; None before its first epoch."""
    index = bisect_right([e.first_id for e in lineage], msg_id)
    return lineage[index - 1].key if index else None


def divergence(mine: Lineage, theirs: Lineage) -> int | None:
    """The first id at which the two lineages name different epochs; None if they never do.

    Ids below it mean the same message on both sides; ids from it on may not.
    """
    for first_id in sorted({e.first_id for e in mine} | {e.first_id for e in theirs}):
        if epoch_of(mine, first_id) != epoch_of(theirs, first_id):
            return first_id
    return None


def to_wire(lineage: Lineage) -> list[list[Any]]:
    """The AMQP form: a list of ``[term, node, first_id]``."""
    return [[e.term, e.node, e.first_id] for e in lineage]


def from_wire(wire: Any) -> Lineage:
    """Decode (and validate) a lineage sent by a peer; ValueError naming the bad entry."""
    if wire is None:
        return ()
    if not isinstance(wire, (list, tuple)):
        raise ValueError(f"a lineage is a list of [term, node, first_id], got {type(wire).__name__}")
    epochs: list[Epoch] = []
    for index, entry in enumerate(wire):
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise ValueError(f"lineage entry {index} is not [term, node, first_id]: {entry!r}")
        term, node, first_id = entry
        if type(term) is not int or not 0 <= term <= _MAX or type(first_id) is not int or not 1 <= first_id <= _MAX:
            raise ValueError(f"lineage entry {index} needs a term >= 0 and a first id >= 1, both below 2**63: {entry!r}")
        if not isinstance(node, str) or not node:
            raise ValueError(f"lineage entry {index} needs a node id: {entry!r}")
        if epochs and first_id <= epochs[-1].first_id:
            raise ValueError(f"lineage entry {index} does not start after the one before it: {entry!r}")
        epochs.append(Epoch(term, str(node), first_id))
    return tuple(epochs)


def describe(lineage: Lineage) -> str:
    """For logs: ``term 7 (n1) from 1, term 9 (n2) from 26``."""
    return ", ".join(f"term {e.term} ({e.node}) from {e.first_id}" for e in lineage) or "none"
