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
primary's replication would want as its sync set (through the node's
``SyncRequest``, as ``PrimaryRole`` does); what etcd confirms is recorded
in ``confirmed_sync``.  Its ``Standing`` (``lifecycle/standing.py``) is
``HaNode``'s: the same rules decide what halts it.
"""

from __future__ import annotations

from collections.abc import Callable

from hastandby.election.cluster import Leader, Store
from hastandby.election.sync_request import SyncRequest
from hastandby.lifecycle.effects import RoleEffects, perform
from hastandby.election.loop import ElectedNode, ElectionLoop
from hastandby.lifecycle.standing import Standing
from hastandby.lifecycle.states import (
    Action,
    Event,
    IllegalTransition,
    NodeStatus,
    State,
    Transition,
)


class FakeHaNode:
    """``ElectedNode`` and ``RoleEffects`` in memory; see the module doc."""

    def __init__(self, node_id: str, status: NodeStatus | None = None, store: Store = Store()) -> None:
        self._node_id = node_id
        self.standing = Standing(holds_data=store.holds_data)
        if status is not None:
            self.standing.status = status
        self.leader: Leader | None = None
        self.store: Store = store
        self.sync = SyncRequest(self.call_soon_threadsafe)
        self._wanted_sync: frozenset[str] | None = None
        self.election: ElectionLoop | None = None
        self.reactor: list[Callable[[], None]] = []
        self.effects: list[Action] = []  # every action performed, in order
        self.transitions: list[Transition] = []
        self.refused: list[IllegalTransition] = []
        self.followed: list[Leader] = []
        self.confirmed_sync: list[tuple[int, frozenset[str]]] = []

    @property
    def status(self) -> NodeStatus:
        return self.standing.status

    @property
    def halted(self) -> str | None:
        """As HaNode's: why an illegal transition that is not an answer halted it."""
        return self.standing.halted

    @property
    def admitting(self) -> bool:
        return self.standing.admitting

    @property
    def expected(self) -> frozenset[str]:
        """The other sync members of the last election won, which a new primary guards for."""
        return self.sync.won_with

    @property
    def wanted_sync(self) -> frozenset[str] | None:
        return self._wanted_sync

    @wanted_sync.setter
    def wanted_sync(self, members: frozenset[str] | None) -> None:
        """What a primary's replication wants as the sync set (``PrimaryRole`` wants it through ``sync``)."""
        self._wanted_sync = members
        if members is None:
            self.sync.withdraw()
            return
        term = self.status.term
        self.sync.want(term, members, lambda confirmed: self.confirmed_sync.append((term, confirmed)))

    # -- ElectedNode ----------------------------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self._node_id

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
        transition = self.standing.fire(event, term)
        if isinstance(transition, IllegalTransition):
            self.refused.append(transition)
            return False
        self.transitions.append(transition)
        perform(transition.actions, self)
        return True

    def follow(self, leader: Leader) -> None:
        if self.status.state is State.PRIMARY:
            return
        self.leader = leader
        self.followed.append(leader)

    # -- RoleEffects ------------------------------------------------------------------------------

    def exclude_clients(self) -> None:
        self.effects.append(Action.EXCLUDE_CLIENTS)
        self.standing.admit(False)

    def admit_clients(self) -> None:
        self.effects.append(Action.ADMIT_CLIENTS)
        self.standing.admit(True)

    def stop_replication(self) -> None:
        self.effects.append(Action.STOP_REPLICATION)

    def look_for_primary(self) -> None:
        self.effects.append(Action.LOOK_FOR_PRIMARY)

    def start_guarding(self) -> None:
        self.effects.append(Action.START_GUARDING)

    def stop_serving_backups(self) -> None:
        self.effects.append(Action.STOP_SERVING_BACKUPS)
        self.sync.withdraw()  # as a primary's replication does when it stops

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
