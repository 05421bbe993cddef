"""``hastandby verify``: are the ready backups' copies equal to the primary's?

The command an operator runs after an incident, and the replica check of the
fault suite (``tests/nemesis``).  For every queue of level ``all`` it
reads, page by page (management ``IDS``), each message's replication id and a
digest of its bytes, plus the queue's lineage, on the primary and on every
backup the primary reports ready, and compares:

- ``lineage``: a ready backup has adopted the primary's lineage, always;
- ``bytes``: an id both hold names the same message, always;
- ``missing`` / ``extra``: ids only the primary, or only the backup, holds.
  On a cluster under load these come and go (a message on its way to the
  backup, a dequeue not yet applied), so they are read again after
  ``settle`` seconds and only those seen both times are reported.

Nothing is changed anywhere; the pages keep a long queue from holding up the
primary (each page is one management request).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hastandby.broker.vocabulary import IDS_PAGE
from hastandby.client import Login, ManagementClient, ManagementError
from hastandby.connect_timeout import CONNECT_TIMEOUT


@dataclass(frozen=True)
class Copy:
    """One node's copy of a queue: its lineage (wire form) and id -> digest."""

    lineage: tuple[tuple[Any, ...], ...]
    digests: dict[int, str]


@dataclass(frozen=True)
class Difference:
    """Something about ``queue`` on backup ``backup`` that is not as on the primary."""

    queue: str
    backup: str
    kind: str  # lineage | bytes | missing | extra
    ids: tuple[int, ...] = ()
    detail: str = ""

    def __str__(self) -> str:
        shown = ", ".join(map(str, self.ids[:10])) + (" ..." if len(self.ids) > 10 else "")
        what = {"lineage": "lineage differs", "bytes": "different bytes under the same id",
                "missing": "ids the backup lacks", "extra": "ids only the backup has"}[self.kind]
        return f"{self.queue} on {self.backup}: {what}" + (f" ({len(self.ids)}: {shown})" if self.ids else "") \
            + (f": {self.detail}" if self.detail else "")


@dataclass
class Report:
    """What was compared and every difference found."""

    primary: str
    backups: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    compared: int = 0  # (message, backup) pairs compared
    differences: list[Difference] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        return {"primary": self.primary, "backups": self.backups, "queues": self.queues,
                "compared": self.compared, "equal": self.equal,
                "differences": [{"queue": d.queue, "backup": d.backup, "kind": d.kind, "ids": list(d.ids),
                                 "detail": d.detail} for d in self.differences]}


def compare(queue: str, backup: str, primary_copy: Copy, backup_copy: Copy) -> list[Difference]:
    """Every way ``backup_copy`` differs from ``primary_copy`` (pure)."""
    found = []
    if primary_copy.lineage != backup_copy.lineage:
        found.append(Difference(queue, backup, "lineage",
                                detail=f"primary {list(primary_copy.lineage)}, backup {list(backup_copy.lineage)}"))
    mine, theirs = primary_copy.digests, backup_copy.digests
    changed = tuple(sorted(i for i in mine.keys() & theirs.keys() if mine[i] != theirs[i]))
    if changed:
        found.append(Difference(queue, backup, "bytes", changed))
    missing = tuple(sorted(mine.keys() - theirs.keys()))
    if missing:
        found.append(Difference(queue, backup, "missing", missing))
    extra = tuple(sorted(theirs.keys() - mine.keys()))
    if extra:
        found.append(Difference(queue, backup, "extra", extra))
    return found


def persistent(first: list[Difference], second: list[Difference]) -> list[Difference]:
    """Differences of ``second`` also seen in ``first``: for missing/extra, only the ids seen both times."""
    earlier = {(d.queue, d.backup, d.kind): set(d.ids) for d in first}
    kept = []
    for difference in second:
        key = (difference.queue, difference.backup, difference.kind)
        if key not in earlier:
            continue
        if difference.kind in ("missing", "extra"):
            ids = tuple(i for i in difference.ids if i in earlier[key])
            if ids:
                kept.append(Difference(difference.queue, difference.backup, difference.kind, ids))
        else:
            kept.append(difference)
    return kept


def read_copy(client: ManagementClient, queue: str, page: int = IDS_PAGE) -> Copy:
    """A node's copy of ``queue``, read a page at a time."""
    digests: dict[int, str] = {}
    after, lineage = 0, None
    while True:
        reply = client.request("IDS", name=queue, body={"after": after, "limit": page})
        if lineage is None:
            lineage = tuple(tuple(epoch) for epoch in reply["lineage"])
        for msg_id, digest in reply["messages"]:
            digests[int(msg_id)] = str(digest)
        if not reply["more"] or not reply["messages"]:
            return Copy(lineage, digests)
        after = int(reply["messages"][-1][0])


def find_primary(broker: str, timeout: float = 5.0, login: Login | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT) -> str:
    """HOST:PORT of the primary, asking ``broker`` (the primary itself, or a backup that follows one)."""
    with ManagementClient(broker, timeout=timeout, login=login, connect_timeout=connect_timeout) as client:
        status = client.request("STATUS")
    if status.get("state") == "primary":
        return broker
    primary = status.get("primary")
    if not primary:
        raise ManagementError(f"{broker} is {status.get('state')} and knows no primary")
    return str(primary)


def verify(broker: str, settle: float = 1.0, page: int = IDS_PAGE, timeout: float = 10.0,
           login: Login | None = None, connect_timeout: float = CONNECT_TIMEOUT) -> Report:
    """Compare every ``all`` queue of the primary with every ready backup's copy.

    Each node has ``connect_timeout`` s to answer a connect: a backup behind a
    cut link fails the run after that, with its address, instead of holding it.
    """
    primary = find_primary(broker, timeout, login, connect_timeout)

    def connect(address: str) -> ManagementClient:
        return ManagementClient(address, timeout=timeout, login=login, connect_timeout=connect_timeout)

    with connect(primary) as client:
        query = client.request("QUERY")
    queues = sorted(q["name"] for q in query.get("queues", []) if q.get("replicate") == "all")
    members = (query.get("ha") or {}).get("members", [])
    backups = sorted(str(m["url"]) for m in members if m.get("state") == "ready")
    report = Report(primary, backups, queues)

    def differences() -> list[Difference]:
        found: list[Difference] = []
        with connect(primary) as source:
            originals = {queue: read_copy(source, queue, page) for queue in queues}
        for backup in backups:
            with connect(backup) as client:
                for queue in queues:
                    try:
                        copy = read_copy(client, queue, page)
                    except ManagementError as error:
                        found.append(Difference(queue, backup, "missing", detail=str(error)))
                        continue
                    report.compared += len(originals[queue].digests.keys() | copy.digests.keys())
                    found.extend(compare(queue, backup, originals[queue], copy))
        return found

    first = differences()
    if first and settle > 0:
        time.sleep(settle)
        first = persistent(first, differences())
    report.differences = first
    return report
