"""A HA node without a broker, for driving ``ElectionLoop`` by hand: ``FakeHaNode``.

It is what ``HaNode`` (``hastandby/ha/node.py``) is to the election
loop, and nothing more: an ``ElectedNode`` whose ``fire`` keeps a real
``NodeStatus`` through ``states.next_status`` and performs the transition's
actions with ``effects.perform`` (it is the ``RoleEffects``), recording each.
The effects that touch etcd do what ``HaNode``'s do, through ``election``
(the loop, once the test sets it): ``resign`` asks the loop to delete the
leader key of the current term, ``publish_status`` wakes it, ``revoke_lease``
stops it with its lease revoked.  The others (clients, replication, guards)
are only recorded.

There is no reactor: ``call_soon_threadsafe`` queues the callback, and the
test runs the queue with ``run_reactor()`` when it chooses, so it can look
at the moment between a decision and the role change it causes.  Replication
is not modelled either: the test fires ``CONNECTED_TO_PRIMARY``,
``CAUGHT_UP`` and the like itself, and sets ``wanted_sync`` for what a
primary's replication would want as its sync set.
"""

from __future__ import annotations

from collections.abc import Callable

from hastandby.election.cluster import Leader, Store
from hastandby.lifecycle.effects import RoleEffects, perform
from hastandby.election.loop import ElectedNode, ElectionLoop
from hastandby.lifecycle.states import (
    Action,
    Event,
    IllegalTransition,
    NodeStatus,
    State,
    Transition,
    initial_status,
    next_status,
)

# As HaNode's: a refusal of these is an answer (an older primary, an election won too late), not a broken role.
REFUSABLE = (Event.CONNECTED_TO_PRIMARY, Event.WON_ELECTION, Event.WON_ELECTION_NEW_CLUSTER)


class FakeHaNode:
    """``ElectedNode`` and ``RoleEffects`` in memory; see the module doc."""

    def __init__(self, node_id: str, status: NodeStatus | None = None, store: Store = Store()) -> None:
        self._node_id = node_id
        self.status: NodeStatus = status if status is not None else initial_status(clustered=True)
        self.leader: Leader | None = None
        self.store: Store = store
        self.wanted_sync: frozenset[str] | None = None  # reported as sync_wanted while primary
        self.election: ElectionLoop | None = None
        self.reactor: list[Callable[[], None]] = []
        self.effects: list[Action] = []  # every action performed, in order
        self.transitions: list[Transition] = []
        self.refused: list[IllegalTransition] = []
        self.halted: str | None = None  # as HaNode: an illegal transition that is not an answer
        self.followed: list[Leader] = []
        self.expected: frozenset[str] | None = None  # the sync members of the last election won
        self.confirmed_sync: list[tuple[int, frozenset[str]]] = []
        self.admitting = False

    # -- ElectedNode ----------------------------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def sync_wanted(self) -> frozenset[str] | None:
        return self.wanted_sync if self.status.state is State.PRIMARY else None

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        self.reactor.append(fn)

    def run_reactor(self) -> int:
        """Run the queued callbacks, and those they queue, in order; how many ran."""
        ran = 0
        while self.reactor:
            self.reactor.pop(0)()
            ran += 1
        return ran

    def fire(self, event: Event, term: int | None = None) -> bool:
        try:
            transition = next_status(self.status, event, term)
        except IllegalTransition as error:
            self.refused.append(error)
            if event not in REFUSABLE:
                self.halted = str(error)
            return False
        self.status = transition.status
        self.transitions.append(transition)
        perform(transition.actions, self)
        return True

    def won(self, event: Event, term: int, expected: frozenset[str]) -> bool:
        self.expected = expected
        return self.fire(event, term)

    def sync_confirmed(self, term: int, members: frozenset[str]) -> None:
        self.confirmed_sync.append((term, members))

    def follow(self, leader: Leader) -> None:
        if self.status.state is State.PRIMARY:
            return
        self.leader = leader
        self.followed.append(leader)

    # -- RoleEffects ------------------------------------------------------------------------------

    def exclude_clients(self) -> None:
        self.effects.append(Action.EXCLUDE_CLIENTS)
        self.admitting = False

    def admit_clients(self) -> None:
        self.effects.append(Action.ADMIT_CLIENTS)
        self.admitting = True

    def stop_replication(self) -> None:
        self.effects.append(Action.STOP_REPLICATION)

    def look_for_primary(self) -> None:
        self.effects.append(Action.LOOK_FOR_PRIMARY)

    def start_guarding(self) -> None:
        self.effects.append(Action.START_GUARDING)

    def stop_serving_backups(self) -> None:
        self.effects.append(Action.STOP_SERVING_BACKUPS)

    def resign(self) -> None:
        self.effects.append(Action.RESIGN)
        election, term = self.election, self.status.term
        if election is not None:
            election.request(lambda: election.coordinator.resign(term))

    def revoke_lease(self) -> None:
        self.effects.append(Action.REVOKE_LEASE)
        if self.election is not None:
            self.election.stop(revoke=True)

    def publish_status(self) -> None:
        self.effects.append(Action.PUBLISH_STATUS)
        if self.election is not None:
            self.election.wake()


# mypy checks that the fake still is what the loop and the interpreter need.
_elected: type[ElectedNode] = FakeHaNode
_effects: type[RoleEffects] = FakeHaNode
