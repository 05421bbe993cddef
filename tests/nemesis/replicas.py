"""Replica comparison after a fault: the primary's replicated queues against each backup's copy.

It reads what ``hastandby verify`` reads (``hastandby.verify.read_copy``: the
management operation IDS, page by page): every message's replication id, a
digest of its bytes, and each queue's lineage.  ``hastandby verify`` asks
the primary which backups are ready; here the harness names the backups
itself (every node that reports state ``backup``), and pauses the load
first, so that ids on one side only are real differences.
"""

from __future__ import annotations

from collections.abc import Mapping

from hastandby.client import Login, ManagementClient, ManagementError
from hastandby.verify import read_copy

from hastandby.testing.checker import ReplicaDiff, compare_replicas


class BrowseError(RuntimeError):
    """A node could not be read; the message says which and why."""


def read_node(address: str, login: Login, only: list[str] | None = None) -> tuple[dict, dict]:
    """The node's replicated queues (or those of ``only`` it holds): (queue -> id -> digest, queue -> lineage)."""
    try:
        with ManagementClient(address, timeout=5, login=login) as client:
            held = sorted(q["name"] for q in client.request("QUERY")["queues"] if q.get("replicate") == "all")
            queues = held if only is None else [q for q in only if q in held]
            copies = {queue: read_copy(client, queue) for queue in queues}
    except ManagementError as error:
        raise BrowseError(f"{address}: {error}") from None
    return {q: c.digests for q, c in copies.items()}, {q: c.lineage for q, c in copies.items()}


def verify_replicas(primary: str, backups: Mapping[str, str], login: Login) -> list[ReplicaDiff]:
    """Compare the primary's replicated queues (``primary``: its address) with each backup's copy.

    ``backups`` maps node ids to addresses; ``login`` is an admin's.  A queue
    a backup lacks counts as empty.  Raises BrowseError if a node cannot be read.
    """
    digests, lineages = read_node(primary, login)
    copies, copy_lineages = {}, {}
    for node_id, address in backups.items():
        copies[node_id], copy_lineages[node_id] = read_node(address, login, sorted(digests))
    return compare_replicas(digests, copies, lineages, copy_lineages)
