"""The role a node plays, as an object: ``BackupRole`` (``backup.py``) or ``PrimaryRole`` (``primary.py``).

After Qpid's HA module, where ``HaBroker`` holds one ``Role`` (``Backup`` or ``Primary``) and swaps it for the
one ``promote()`` returns: a role *is* its replication.  ``BackupRole`` holds the replicators of a node that
follows a primary; ``PrimaryRole`` holds the backups and their guards.  ``HaNode.role`` is the one place that
knows which one the node plays, and the state table's actions (``lifecycle/effects.py``) swap it:
``start_guarding`` is ``role = role.promote(...)``, ``stop_serving_backups`` is ``role = role.step_down()``.

``Role`` is only what both answer, each its own way:

- ``attach``: the broker's link claim.  A primary claims its backups' replication links; a backup lets an
  admin read it but not change what the primary replicates to it.
- ``members``, ``describe``: what QUERY's ``ha`` part shows (the members as the primary tells them, the lag
  and held acknowledgements of a primary's backups).
- ``primary_url``: the primary the node follows (a primary follows none).
- ``promote``, ``step_down``: the next role.  The backup role lives on while the node is primary: the primary
  holds it (``PrimaryRole.backup_role``) and gives it back when it steps down.

What only one side does is that side's own, asked of it where the node knows which it is: a backup
``follow``\\s etcd's leader, is stopped and started by ``stop_replication`` and ``look_for_primary``, and is
told when its journal cannot store; a primary wants its sync set through ``election/sync_request.py``.  A role
does no I/O beyond its replication and fires no event: events stay ``HaNode``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from proton import Link

from hastandby.ha.backup import BackupRole
from hastandby.ha.primary import PrimaryRole
from hastandby.election.cluster import ClusterSnapshot
from hastandby.ha.protocol import PeerMember


class Role(Protocol):
    """What differs between the roles; ``HaNode.role`` holds one (``NodeRole``), the table's actions swap it."""

    def attach(self, link: Link) -> Any:
        """The broker's claim on a link attached to this node: the endpoint that serves it, or None."""
        ...

    def members(self) -> list[PeerMember]:
        """The cluster's members as this role knows them (a primary: itself and its backups)."""
        ...

    def describe(self) -> dict[str, Any]:
        """QUERY's replication figures: ``lag``, ``lag_seconds``, ``acks_held`` (with why they are held, and why
        messages are refused) and ``not_storing`` (backups that left because they cannot store)."""
        ...

    @property
    def primary_url(self) -> str | None:
        """The primary this node follows, if known (from its hello); a primary follows none."""
        ...

    def promote(self, serve: Callable[[BackupRole], PrimaryRole]) -> PrimaryRole:
        """``start_guarding``: the primary ``serve`` starts (Qpid's ``promote()``); a primary stays itself."""
        ...

    def step_down(self) -> BackupRole:
        """``stop_serving_backups``: the backup this node is again, which replicates nothing until it looks."""
        ...


NodeRole = BackupRole | PrimaryRole
"""The role ``HaNode`` holds: one of the two, each a ``Role``."""

_backup: type[Role] = BackupRole  # mypy checks that each is a Role
_primary: type[Role] = PrimaryRole


def backup_of(role: NodeRole) -> BackupRole:
    """The node's backup role: the role itself, or the one a primary goes back to when it steps down."""
    return role if isinstance(role, BackupRole) else role.backup_role


def expected_backups(backup: BackupRole, me: str, won_with: frozenset[str] | None,
                     snapshot: ClusterSnapshot | None) -> dict[str, str]:
    """node id -> url of the backups a node promoted from ``backup`` guards for: those that may hold what was
    acknowledged before.  With etcd: the other members of the sync set the election was won with (``won_with``;
    their urls from ``snapshot``).  Without (``won_with`` None): the backups the last primary reported ready."""
    if won_with is not None:
        urls = {m.node_id: m.url for m in snapshot.members} if snapshot is not None else {}
        return {node_id: urls.get(node_id, "") for node_id in sorted(won_with)}
    return {m.node_id: m.url for m in backup.members() if m.ready and m.node_id and m.node_id != me}
