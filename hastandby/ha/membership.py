"""What a backup's replication hears of its primary, as the state table's events (after Qpid's ``Membership``).

The primary's hello names its term: following it is ``connected_to_primary``, which the table refuses for a
term older than one this node knows (the role then lets that primary go).  Each members update says whether
the primary counts this node as ready (``Standing.members_event``: caught up, or dropped and catching up
again).  A lost primary is ``primary_lost`` for a node that follows one, and a reason for the election loop
to look at etcd again at once.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from hastandby.election.loop import ElectionLoop
from hastandby.ha.protocol import Hello, PeerMember
from hastandby.ha.roles import NodeRole
from hastandby.lifecycle.standing import Standing
from hastandby.lifecycle.states import Event, State

log = structlog.get_logger("hastandby.ha")


class MemberNode(Protocol):
    """What membership needs of the cluster node (``HaNode``)."""

    standing: Standing
    role: NodeRole
    election: ElectionLoop | None

    @property
    def node_id(self) -> str: ...

    def fire(self, event: Event, term: int | None = None) -> bool: ...


class Membership:
    """The callbacks of one node's ``BackupRole``.

    Contract: the backup role calls them on the reactor thread; they fire events on the node and wake the
    election loop, and nothing they call calls them back.
    """

    def __init__(self, ha: MemberNode) -> None:
        self.ha = ha

    def connected(self, term: int, hello: Hello) -> bool:
        """The primary's hello: whether this node follows it (False: an older term, refused)."""
        url = hello.primary.url or None
        if not self.ha.fire(Event.CONNECTED_TO_PRIMARY, term):
            log.warning("refusing a primary with an older term", primary=url, term=term,
                        known_term=self.ha.standing.status.term)
            return False
        log.info("following the primary", primary=url, term=term)
        return True

    def members(self, term: int, members: list[PeerMember]) -> None:
        """The members as the primary tells them; decoded and checked in ``protocol.PeerMember.from_wire``."""
        mine = next((m for m in members if m.node_id == self.ha.node_id), None)
        if mine is None:
            return
        event = self.ha.standing.members_event(mine.ready, mine.expected)
        if event is Event.DROPPED_BY_PRIMARY:
            log.warning("the primary does not count this node as ready: catching up again",
                        primary=self.ha.role.primary_url, reported=mine.state)
        if event is not None:
            self.ha.fire(event)

    def lost(self, reason: str) -> None:
        if self.ha.election is not None:
            self.ha.election.wake()
        if self.ha.standing.status.state in (State.CATCHUP, State.BACKUP, State.CONNECTING):
            self.ha.fire(Event.PRIMARY_LOST)
