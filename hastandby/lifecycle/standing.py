"""A cluster node's standing beside the table: its status, whether it halted, admits clients, holds data.

h11's rule 1 (``states.py``): everything that decides the node's state lives
in this package.  The table says which transitions are legal; ``Standing``
keeps the one current value and the few rules the table does not hold:

- a refused event is an *answer* when it is ``REFUSABLE`` (an older primary's
  term, which a backup refuses; an election won too late, whose key is given
  back), and otherwise a broken role: the node *halts* (no replication, no
  client service) rather than go on in an undefined role;
- the node *holds data* once its journal brought back a store of this cluster
  or it has been past connecting (a whole-cluster restart elects only such a
  node);
- it *admits* clients between the table's ``admit_clients`` and
  ``exclude_clients``, and is *primary* only while it is not halted;
- what a primary's members update means for a backup (``members_event``).

No I/O, no threads: ``HaNode`` (and the fake of ``hastandby/testing``) keep
one and do what it says.  Every field is read from the reactor thread; the
election thread reads ``status`` only, a frozen value rebound whole.
"""

from __future__ import annotations

from hastandby.lifecycle.states import (
    Event,
    IllegalTransition,
    NodeStatus,
    State,
    Transition,
    initial_status,
    next_status,
)

REFUSABLE = frozenset({Event.CONNECTED_TO_PRIMARY, Event.WON_ELECTION, Event.WON_ELECTION_NEW_CLUSTER})
"""Events whose refusal is an answer, not a broken role: an older primary's term (the backup refuses it), an
election won too late (the key is given back)."""

_WITH_DATA = (State.CATCHUP, State.BACKUP, State.PRIMARY)


class Standing:
    """One node's status and the rules beside the table; see the module doc."""

    def __init__(self, holds_data: bool = False, clustered: bool = True) -> None:
        self.status: NodeStatus = initial_status(clustered)
        self.halted: str | None = None  # why the node stopped replication and client service, or None
        self.admitting = False
        self.holds_data = holds_data

    @property
    def is_primary(self) -> bool:
        """A primary that has not halted: the only node that may serve clients."""
        return self.status.state is State.PRIMARY and self.halted is None

    def fire(self, event: Event, term: int | None = None) -> Transition | IllegalTransition:
        """Apply ``event`` (``states.next_status``): the transition taken, or why it was refused.

        A refusal of an event that is not ``REFUSABLE`` halts the node (``halted`` says why).
        """
        try:
            transition = next_status(self.status, event, term)
        except IllegalTransition as error:
            if event not in REFUSABLE:
                self.halted = str(error)
            return error
        self.status = transition.status
        if self.status.state in _WITH_DATA:
            self.holds_data = True
        return transition

    def admit(self, admitting: bool) -> bool:
        """Client service starts (True) or stops; whether that changed anything."""
        changed, self.admitting = admitting != self.admitting, admitting
        return changed

    def members_event(self, ready: bool, expected: bool | None) -> Event | None:
        """What the primary's word on this node (``ready``, ``expected``) fires, if anything.

        Ready: a catching-up node has caught up.  Not ready and not expected while ``backup``: the primary
        dropped it (heartbeat, backup timeout) or never expected it, and acknowledged messages without it
        meanwhile, so it must not stay promotable until it has them again (Qpid's ready -> catchup).
        """
        if ready:
            return Event.CAUGHT_UP if self.status.state is State.CATCHUP else None
        if self.status.state is State.BACKUP and not expected:
            return Event.DROPPED_BY_PRIMARY
        return None
