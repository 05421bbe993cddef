"""A cluster node's journal: what a change of state means for it, and what the node does while it cannot write.

A backup that has caught up holds again what a damaged journal lost (the
primary compared the ids it holds with its own), and every state change
tells the journal the highest term seen.  While the journal cannot write (a
full, read-only or failing disk), a backup that cannot store leaves its primary at once, telling it why
(``BackupRole.cannot_store``), and is not ready until it writes again; then it
catches up (the table's ``store_failed`` and ``store_restored``).  A primary's
journal refuses durable messages meanwhile, and with etcd the primary hands
over to a ready backup of the sync set, which holds everything it
acknowledged: looked for again every second while the disk fails and no
backup is ready.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from hastandby import settings
from hastandby.broker.store.journal import Journal
from hastandby.election.loop import ElectionLoop
from hastandby.ha.roles import NodeRole, backup_of
from hastandby.lifecycle.standing import Standing
from hastandby.lifecycle.states import Event, NodeStatus, State
from hastandby.node import Node

log = structlog.get_logger("hastandby.ha")

HANDOVER_TTL = settings.HANDOVER_TTL.default  # seconds the handover to a backup that can write is offered
LOOK_AGAIN = 1.0  # seconds between looks for a backup that can take over


class JournaledNode(Protocol):
    """What the journal needs of the cluster node (``HaNode``)."""

    standing: Standing
    role: NodeRole
    election: ElectionLoop | None

    def fire(self, event: Event, term: int | None = None) -> bool: ...


class ClusterJournal:
    """The journal of one cluster node, and its ``on_writing`` observer.

    Contract: ``HaNode`` (``status_changed``) and the journal (``writing``) call it on the reactor thread; it tells the role, fires the table's event on the
    node and asks the election loop for a handover, and nothing it calls calls it back.
    """

    def __init__(self, ha: JournaledNode, node: Node, journal: Journal) -> None:
        self.ha = ha
        self.node = node
        self.journal = journal
        journal.on_writing.append(self.writing)
        if journal.full is not None:  # it could not even write at start: do not replicate until it can
            backup_of(ha.role).cannot_store(journal.full)

    def status_changed(self, status: NodeStatus) -> None:
        """The node's status changed (``HaNode.fire``)."""
        if status.state is State.BACKUP and self.journal.damage:
            # Caught up: the primary sent what the damage took (it compared the ids we hold with its own).
            self.journal.repaired(f"caught up from the primary {self.ha.role.primary_url}")
        self.journal.term_seen(status.term)

    def writing(self, reason: str | None) -> None:
        """The journal cannot write (``reason``), or writes again (None)."""
        ha = self.ha
        backup_of(ha.role).cannot_store(reason)
        state = ha.standing.status.state
        if reason is not None and state in (State.CONNECTING, State.CATCHUP, State.BACKUP):
            log.error("this node's journal cannot write: leaving the primary, not ready until it writes again",
                      error=reason, state=str(state), primary=ha.role.primary_url)
        ha.fire(Event.STORE_FAILED if reason is not None else Event.STORE_RESTORED)
        if reason is not None:
            self.hand_over()

    def hand_over(self) -> None:
        """A primary that cannot write refuses every durable message: hand over to a backup that can (the
        operator's handover, through etcd), and look again every second while the disk fails."""
        election = self.ha.election
        if self.journal.full is None or election is None or not self.ha.standing.is_primary:
            return
        target = election.hand_over_to_a_ready_backup(ttl=HANDOVER_TTL)
        if target is not None:
            log.error("this primary's journal cannot write: handing over to a backup that can",
                      error=self.journal.full, target=target)
        self.node.schedule(LOOK_AGAIN, self.hand_over)
