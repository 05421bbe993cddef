"""The node lifecycle: one table of legal role transitions, and nothing else.

Rule 1 (after h11's ``_state.py``): everything that decides whether a node may
change role, and what it must do when it does, lives in this file, as far as
possible in the ``TRANSITIONS`` table.  Rule 2: this module is pure.  It does
no I/O, starts no threads and holds no mutable state: the HA node loop keeps
the current ``NodeStatus``, feeds ``next_status()`` an ``Event`` and performs
the ``Action`` values of the returned ``Transition`` in order.

States (the user-visible vocabulary, Qpid's in brackets): ``standalone``;
``connecting`` (joining) looks for the primary; ``catchup`` replicates from it
but is not yet complete; ``backup`` (ready) is caught up and may be promoted;
``primary`` serves clients, with detail ``recovering`` while it still guards
messages for the backups it expects, then ``active``.  ``stopped`` is internal
and terminal: a node never reports it.

Where we part from Qpid: a primary can leave ``primary`` (``lost_lease``,
``demoted``), because etcd gives no external fencing and a primary that cannot
prove it still holds the leader lease must stop acknowledging; and every state
has a graceful ``stop``.  Like Qpid, a backup whose primary dies keeps its
state (``catchup`` or ``backup``) while it reconnects: its replicas are as good
as they were, and a caught-up backup must stay eligible for the election that
replaces the dead primary.

Terms fence.  ``NodeStatus.term`` is the highest leader term (the leader key's
etcd revision) the node has seen: the term of the primary it follows, or the
term it won.  It never goes down: a node refuses to follow an older primary or
to take a term that is not newer than one it knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum


class State(StrEnum):
    """A node's role."""

    STANDALONE = "standalone"
    CONNECTING = "connecting"
    CATCHUP = "catchup"
    BACKUP = "backup"
    PRIMARY = "primary"
    STOPPED = "stopped"


class Detail(StrEnum):
    """How far a primary is: guarding for expected backups, or done."""

    RECOVERING = "recovering"
    ACTIVE = "active"


class Event(StrEnum):
    """Something that happened to the node; the node loop reports it here."""

    #: The link to the primary is open and its term is known.
    CONNECTED_TO_PRIMARY = "connected_to_primary"
    #: Every replicated queue and the wiring have caught up with the primary.
    CAUGHT_UP = "caught_up"
    #: A caught-up backup created the leader key.
    WON_ELECTION = "won_election"
    #: A connecting node created the leader key while every member was
    #: connecting: a brand-new cluster, nobody holds data to lose.
    WON_ELECTION_NEW_CLUSTER = "won_election_new_cluster"
    #: An operator (or external resource manager) promoted a caught-up backup.
    PROMOTED_BY_OPERATOR = "promoted_by_operator"
    #: An operator promoted a connecting node after checking that no reachable
    #: node is past connecting.
    PROMOTED_BY_OPERATOR_NEW_CLUSTER = "promoted_by_operator_new_cluster"
    #: The primary this node replicates from went away.
    PRIMARY_LOST = "primary_lost"
    #: The primary no longer counts this backup as ready (it did not reconnect
    #: within the backup timeout, or the primary never expected it).
    DROPPED_BY_PRIMARY = "dropped_by_primary"
    #: Every backup a recovering primary expected is ready.
    EXPECTED_BACKUPS_READY = "expected_backups_ready"
    #: The backup timeout passed; expected backups that did not connect are dropped.
    EXPECTED_BACKUPS_TIMED_OUT = "expected_backups_timed_out"
    #: The lease could not be confirmed in time, or the leader key is not ours.
    LOST_LEASE = "lost_lease"
    #: The primary steps down on purpose (operator handover).
    DEMOTED = "demoted"
    #: Graceful shutdown.
    STOP = "stop"
    #: This node's journal cannot write (a full, read-only or failing disk).
    STORE_FAILED = "store_failed"
    #: This node's journal writes again (a probe of real size worked).
    STORE_RESTORED = "store_restored"


class Action(StrEnum):
    """Work the node loop must do for a transition, in the order given: every effect a role change has.

    ``effects.perform`` is the one interpreter.  Actions take their parameters
    from the new ``NodeStatus`` (e.g. the term) or from the node loop's latest
    cluster snapshot (e.g. expected backups).  What causes an event is not an
    action of it: replication from a primary starts with the primary's hello,
    which is what ``connected_to_primary`` reports, and a recovering primary's
    replication drops the expected backups that never reconnected when its
    backup timeout fires, which ``expected_backups_timed_out`` then reports.
    """

    #: Close client connections, so that no acknowledgement leaves this node
    #: any more, and refuse new ones (admin connections excepted).
    EXCLUDE_CLIENTS = "exclude_clients"
    #: Accept client connections.
    ADMIT_CLIENTS = "admit_clients"
    #: Close replication from the primary; keep every replica as it is.
    STOP_REPLICATION = "stop_replication"
    #: Look for the primary and replicate from it (a primary that stepped down
    #: becomes a backup of the next one).
    LOOK_FOR_PRIMARY = "look_for_primary"
    #: Guard every replicated queue for the expected backups (the members that
    #: are ``backup`` in the latest snapshot) before clients are admitted.
    START_GUARDING = "start_guarding"
    #: Close the replicating subscriptions of all backups and cancel their
    #: guards without completing held messages (a primary stepping down).
    STOP_SERVING_BACKUPS = "stop_serving_backups"
    #: Delete the leader key if it still has ``status.term``; best effort.
    RESIGN = "resign"
    #: Revoke the lease: member key and leader key vanish at once.
    REVOKE_LEASE = "revoke_lease"
    #: Write the new state into this node's member key.
    PUBLISH_STATUS = "publish_status"


class _TermRule(Enum):
    """What an event does to ``NodeStatus.term``."""

    KEEP = "keep"  # the event carries no term (any term given is ignored)
    FOLLOW = "follow"  # adopt the primary's term; must not be older
    WIN = "win"  # adopt a newly won term; must be newer than any seen


Phase = tuple[State, Detail | None]
"""A table row key: the state, plus the detail for a primary."""

STANDALONE: Phase = (State.STANDALONE, None)
CONNECTING: Phase = (State.CONNECTING, None)
CATCHUP: Phase = (State.CATCHUP, None)
BACKUP: Phase = (State.BACKUP, None)
PRIMARY_RECOVERING: Phase = (State.PRIMARY, Detail.RECOVERING)
PRIMARY_ACTIVE: Phase = (State.PRIMARY, Detail.ACTIVE)
STOPPED: Phase = (State.STOPPED, None)
PHASES: tuple[Phase, ...] = (
    STANDALONE, CONNECTING, CATCHUP, BACKUP, PRIMARY_RECOVERING, PRIMARY_ACTIVE, STOPPED,
)


@dataclass(frozen=True)
class _Row:
    to: Phase
    actions: tuple[Action, ...] = ()
    term: _TermRule = _TermRule.KEEP


_A = Action
_BECOME_PRIMARY = (_A.STOP_REPLICATION, _A.START_GUARDING, _A.ADMIT_CLIENTS, _A.PUBLISH_STATUS)
# Clients go first: once they are excluded this node acknowledges nothing, and
# only then may the leader key go to someone else.
_STEP_DOWN = (_A.EXCLUDE_CLIENTS, _A.STOP_SERVING_BACKUPS, _A.RESIGN, _A.PUBLISH_STATUS, _A.LOOK_FOR_PRIMARY)
_PRIMARY_STOP = (_A.EXCLUDE_CLIENTS, _A.STOP_SERVING_BACKUPS, _A.REVOKE_LEASE)
_BACKUP_STOP = (_A.STOP_REPLICATION, _A.REVOKE_LEASE)
# A node that cannot store must not tell a primary it holds what it is sent: it leaves the primary (which
# acknowledges without it under --min-sync, or refuses) and is no longer ready, until its disk writes again.
_LEAVE_PRIMARY = (_A.STOP_REPLICATION, _A.PUBLISH_STATUS)
_BACK_TO_PRIMARY = (_A.LOOK_FOR_PRIMARY,)


def _store_noted(phase: Phase) -> dict[Event, _Row]:
    """Nothing to do: a primary's or standalone node's journal refuses durable messages itself while it cannot
    write; a stopped node does nothing."""
    return {Event.STORE_FAILED: _Row(phase), Event.STORE_RESTORED: _Row(phase)}


#: Every legal transition.  A (phase, event) pair not in here is illegal.
TRANSITIONS: dict[Phase, dict[Event, _Row]] = {
    STANDALONE: {
        Event.STOP: _Row(STOPPED),
        **_store_noted(STANDALONE),
    },
    CONNECTING: {
        Event.CONNECTED_TO_PRIMARY: _Row(CATCHUP, (_A.PUBLISH_STATUS,), _TermRule.FOLLOW),
        Event.WON_ELECTION_NEW_CLUSTER: _Row(PRIMARY_RECOVERING, _BECOME_PRIMARY, _TermRule.WIN),
        Event.PROMOTED_BY_OPERATOR_NEW_CLUSTER: _Row(
            PRIMARY_RECOVERING, _BECOME_PRIMARY, _TermRule.WIN
        ),
        Event.PRIMARY_LOST: _Row(CONNECTING),
        # A non-primary's lease only carries its member key; the node loop
        # publishes it again under a fresh lease.
        Event.LOST_LEASE: _Row(CONNECTING),
        Event.STOP: _Row(STOPPED, _BACKUP_STOP),
        Event.STORE_FAILED: _Row(CONNECTING, _LEAVE_PRIMARY),
        Event.STORE_RESTORED: _Row(CONNECTING, _BACK_TO_PRIMARY),
    },
    CATCHUP: {
        # Reconnected, possibly to a new primary: carry on catching up.
        Event.CONNECTED_TO_PRIMARY: _Row(CATCHUP, (), _TermRule.FOLLOW),
        Event.CAUGHT_UP: _Row(BACKUP, (_A.PUBLISH_STATUS,)),
        # Stays catchup while reconnecting (as in Qpid); never campaigns,
        # never promoted: "still catching up".  Its replication reconnects by
        # itself, keeping every replica.
        Event.PRIMARY_LOST: _Row(CATCHUP),
        Event.DROPPED_BY_PRIMARY: _Row(CATCHUP),
        Event.LOST_LEASE: _Row(CATCHUP),
        Event.STOP: _Row(STOPPED, _BACKUP_STOP),
        Event.STORE_FAILED: _Row(CATCHUP, _LEAVE_PRIMARY),
        Event.STORE_RESTORED: _Row(CATCHUP, _BACK_TO_PRIMARY),
    },
    BACKUP: {
        # A new primary that expected this backup guards for it, so the backup
        # stays ready; one that did not says so with DROPPED_BY_PRIMARY.
        Event.CONNECTED_TO_PRIMARY: _Row(BACKUP, (), _TermRule.FOLLOW),
        Event.CAUGHT_UP: _Row(BACKUP),
        Event.WON_ELECTION: _Row(PRIMARY_RECOVERING, _BECOME_PRIMARY, _TermRule.WIN),
        Event.PROMOTED_BY_OPERATOR: _Row(PRIMARY_RECOVERING, _BECOME_PRIMARY, _TermRule.WIN),
        # Stays backup, and so eligible, while the primary is replaced.
        Event.PRIMARY_LOST: _Row(BACKUP),
        Event.DROPPED_BY_PRIMARY: _Row(CATCHUP, (_A.PUBLISH_STATUS,)),
        Event.LOST_LEASE: _Row(BACKUP),
        Event.STOP: _Row(STOPPED, _BACKUP_STOP),
        # No longer ready: what it is sent from now on it cannot keep.  It catches up again once it writes.
        Event.STORE_FAILED: _Row(CATCHUP, _LEAVE_PRIMARY),
        Event.STORE_RESTORED: _Row(BACKUP),  # (unreachable: a backup that cannot store is catchup)
    },
    PRIMARY_RECOVERING: {
        Event.EXPECTED_BACKUPS_READY: _Row(PRIMARY_ACTIVE, (_A.PUBLISH_STATUS,)),
        Event.EXPECTED_BACKUPS_TIMED_OUT: _Row(PRIMARY_ACTIVE, (_A.PUBLISH_STATUS,)),
        # Qpid ignores promoting a primary; so do we.
        Event.PROMOTED_BY_OPERATOR: _Row(PRIMARY_RECOVERING),
        Event.PROMOTED_BY_OPERATOR_NEW_CLUSTER: _Row(PRIMARY_RECOVERING),
        Event.LOST_LEASE: _Row(CONNECTING, _STEP_DOWN),
        Event.DEMOTED: _Row(CONNECTING, _STEP_DOWN),
        Event.STOP: _Row(STOPPED, _PRIMARY_STOP),
        **_store_noted(PRIMARY_RECOVERING),
    },
    PRIMARY_ACTIVE: {
        Event.PROMOTED_BY_OPERATOR: _Row(PRIMARY_ACTIVE),
        Event.PROMOTED_BY_OPERATOR_NEW_CLUSTER: _Row(PRIMARY_ACTIVE),
        Event.LOST_LEASE: _Row(CONNECTING, _STEP_DOWN),
        Event.DEMOTED: _Row(CONNECTING, _STEP_DOWN),
        Event.STOP: _Row(STOPPED, _PRIMARY_STOP),
        **_store_noted(PRIMARY_ACTIVE),
    },
    STOPPED: {
        Event.STOP: _Row(STOPPED),
        **_store_noted(STOPPED),
    },
}


@dataclass(frozen=True)
class NodeStatus:
    """A node's lifecycle value: state, primary detail, highest term seen."""

    state: State
    detail: Detail | None = None
    term: int = 0

    def __post_init__(self) -> None:
        if (self.state is State.PRIMARY) != (self.detail is not None):
            raise ValueError(f"a detail goes with state primary only: {self.state}/{self.detail}")
        if self.term < 0:
            raise ValueError(f"term must not be negative: {self.term}")

    @property
    def phase(self) -> Phase:
        return (self.state, self.detail)

    def __str__(self) -> str:
        shown = f"{self.state} ({self.detail})" if self.detail else str(self.state)
        return f"{shown} term {self.term}"


@dataclass(frozen=True)
class Transition:
    """The outcome of one event: the new status and what to do about it."""

    previous: NodeStatus
    event: Event
    status: NodeStatus
    actions: tuple[Action, ...]

    @property
    def changed(self) -> bool:
        """True when state or detail changed (a term change alone is not)."""
        return self.previous.phase != self.status.phase


class IllegalTransition(Exception):
    """The event is not allowed in the current status.

    ``target`` is the status the event would have led to, or None when the
    table has no entry at all.  The node loop logs it and stops replication.
    """

    def __init__(
        self, current: NodeStatus, event: Event, target: NodeStatus | None, reason: str
    ) -> None:
        self.current = current
        self.event = event
        self.target = target
        self.reason = reason
        towards = f" -> {target}" if target else ""
        super().__init__(f"illegal transition {current}{towards} on {event}: {reason}")


def initial_status(clustered: bool) -> NodeStatus:
    """Where a node starts: ``connecting`` in a cluster, else ``standalone``."""
    return NodeStatus(State.CONNECTING if clustered else State.STANDALONE)


def accepts(current: NodeStatus, event: Event) -> bool:
    """Whether the table allows ``event`` now (terms not checked).

    For refusing requests politely, e.g. promoting a ``catchup`` node.
    """
    return event in TRANSITIONS[current.phase]


def next_status(current: NodeStatus, event: Event, term: int | None = None) -> Transition:
    """Apply ``event`` to ``current``.

    ``term`` is required by events that bring one (connected to a primary,
    won an election, promoted) and ignored by the others.  Raises
    ``IllegalTransition`` if the table forbids the event or the term would
    go backwards.
    """
    row = TRANSITIONS[current.phase].get(event)
    if row is None:
        raise IllegalTransition(current, event, None, f"{event} is not allowed in {current.state}")
    new_term = current.term
    if row.term is not _TermRule.KEEP:
        if term is None:
            raise ValueError(f"{event} needs the term it happened under")
        new_term = term
    state, detail = row.to
    target = NodeStatus(state, detail, new_term)
    if row.term is _TermRule.FOLLOW and new_term < current.term:
        raise IllegalTransition(
            current, event, target, f"primary's term {new_term} is older than term {current.term}"
        )
    if row.term is _TermRule.WIN and new_term <= current.term:
        raise IllegalTransition(
            current, event, target, f"won term {new_term} is not newer than term {current.term}"
        )
    return Transition(current, event, target, row.actions)
