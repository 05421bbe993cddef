"""What came out of the cluster against what went in: pure functions, no I/O.

:func:`check_total_queue` is Jepsen's ``total-queue`` checker
(``jepsen/src/jepsen/checker.clj``) for one queue history.  From three
multisets of message ids, *attempted* (every send, re-sends included),
*acknowledged* (settled ``accepted`` by the broker) and *received* (every
delivery a consumer accepted, duplicates included), it sorts messages into:

- **lost**: acknowledged, never received.  The broker promised and broke it.
- **unexpected**: received, never attempted (a message nobody sent).
- **duplicated**: received more than once.  Allowed: delivery is
  at-least-once (a producer re-sends what it was not sure about, a consumer
  whose connection broke gets its unsettled messages again); counted.
- **recovered**: received but never acknowledged (in doubt at the producer,
  yet the broker kept it).

The history is **valid** iff nothing is lost and nothing is unexpected.
Precondition (as in Jepsen): the history drains the queue completely, so the
caller must have consumed everything every node that is up still held.

:func:`compare_replicas` compares one browse of the primary with browses of
its backups, replication id by replication id (see ``tests/nemesis/replicas.py`` for how
the browses are taken and when a difference counts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SAMPLE = 10  # ids shown per class in ``__str__``


@dataclass(frozen=True)
class QueueVerdict:
    """The four classes of a total-queue history, with the totals they came from."""

    attempted: int  # distinct ids attempted
    acknowledged: int  # distinct ids acknowledged
    received: int  # deliveries received, duplicates included
    lost: frozenset[str]
    unexpected: frozenset[str]
    duplicated: frozenset[str]
    duplicates: int  # extra copies received (received - distinct received)
    recovered: frozenset[str]

    @property
    def valid(self) -> bool:
        return not self.lost and not self.unexpected

    def counts(self) -> dict[str, int | bool]:
        """The figures, JSON-ready (the trace's ``checker`` record)."""
        return {"valid": self.valid, "attempted": self.attempted, "acknowledged": self.acknowledged,
                "received": self.received, "lost": len(self.lost), "unexpected": len(self.unexpected),
                "duplicated": len(self.duplicated), "duplicates": self.duplicates,
                "recovered": len(self.recovered)}

    def __str__(self) -> str:
        head = (f"{'valid' if self.valid else 'INVALID'}: {self.acknowledged} acknowledged of {self.attempted} "
                f"attempted, {self.received} received; lost {len(self.lost)}, unexpected {len(self.unexpected)}, "
                f"duplicated {len(self.duplicated)} ({self.duplicates} extra copies), "
                f"recovered {len(self.recovered)}")
        lines = [head]
        for name, ids in (("lost", self.lost), ("unexpected", self.unexpected)):
            if ids:
                shown = sorted(ids)[:SAMPLE]
                more = f" and {len(ids) - len(shown)} more" if len(ids) > len(shown) else ""
                lines.append(f"  {name}: {', '.join(shown)}{more}")
        return "\n".join(lines)


def check_total_queue(attempted: Iterable[str], acknowledged: Iterable[str],
                      received: Iterable[str]) -> QueueVerdict:
    """Classify one queue's history (each argument may repeat ids: they are multisets)."""
    tried = Counter(attempted)
    acked = set(acknowledged)
    got = Counter(received)
    return QueueVerdict(
        attempted=len(tried),
        acknowledged=len(acked),
        received=sum(got.values()),
        lost=frozenset(acked - got.keys()),
        unexpected=frozenset(got.keys() - tried.keys()),
        duplicated=frozenset(i for i, n in got.items() if n > 1),
        duplicates=sum(n - 1 for n in got.values()),
        recovered=frozenset((got.keys() & tried.keys()) - acked),
    )


@dataclass(frozen=True)
class ReplicaDiff:
    """One backup's copy of one queue against the primary's, by replication id."""

    queue: str
    backup: str
    missing: tuple[int, ...]  # the primary has them, the backup does not
    differing: tuple[int, ...]  # both have the id, with different message bytes
    extra: tuple[int, ...]  # the backup has them, the primary does not (not a mismatch, see below)
    lineage: bool = False  # the backup's lineage (which primary gave out which ids) is not the primary's

    @property
    def mismatches(self) -> int:
        """Ids whose message would be wrong or gone if this backup took over now (a wrong lineage counts one).

        ``extra`` ids are left out: a backup learns of dequeues after the
        primary, and a stale extra would only come back as a duplicate.
        """
        return len(self.missing) + len(self.differing) + int(self.lineage)

    def __str__(self) -> str:
        def ids(values: tuple[int, ...]) -> str:
            shown = ", ".join(str(v) for v in values[:SAMPLE])
            return shown + (f" and {len(values) - SAMPLE} more" if len(values) > SAMPLE else "")

        parts = [f"{self.backup} {self.queue}:"]
        if self.missing:
            parts.append(f"missing {len(self.missing)} ({ids(self.missing)})")
        if self.differing:
            parts.append(f"different bytes {len(self.differing)} ({ids(self.differing)})")
        if self.extra:
            parts.append(f"extra {len(self.extra)} ({ids(self.extra)})")
        if self.lineage:
            parts.append("a different lineage")
        return " ".join(parts) if len(parts) > 1 else f"{parts[0]} same"


Browse = Mapping[str, Mapping[int, str]]
"""One node's queues: queue name -> replication id -> a digest of the message's bytes."""


Lineages = Mapping[str, object]
"""One node's queues: queue name -> its lineage (any comparable value)."""


def compare_replicas(primary: Browse, backups: Mapping[str, Browse], primary_lineages: Lineages | None = None,
                     backup_lineages: Mapping[str, Lineages] | None = None) -> list[ReplicaDiff]:
    """Every (backup, queue) whose copy differs from the primary's; a queue a backup lacks counts as empty."""
    diffs = []
    for backup, queues in sorted(backups.items()):
        theirs_lineages = (backup_lineages or {}).get(backup, {})
        for queue in sorted(set(primary) | set(queues)):
            mine, theirs = primary.get(queue, {}), queues.get(queue, {})
            lineage = (primary_lineages is not None and queue in queues
                       and theirs_lineages.get(queue) != primary_lineages.get(queue))
            diff = ReplicaDiff(
                queue=queue, backup=backup,
                missing=tuple(sorted(mine.keys() - theirs.keys())),
                differing=tuple(sorted(i for i in mine.keys() & theirs.keys() if mine[i] != theirs[i])),
                extra=tuple(sorted(theirs.keys() - mine.keys())),
                lineage=lineage,
            )
            if diff.missing or diff.differing or diff.extra or diff.lineage:
                diffs.append(diff)
    return diffs
