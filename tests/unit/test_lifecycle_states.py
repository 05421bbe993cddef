"""Every (phase, event) pair of the lifecycle, decided explicitly.

The grid below restates the state table independently of the code.  Its
columns must be every phase and its rows every event, so adding a state or an
event without deciding each cell fails ``test_grid_decides_every_pair``; each
cell is then checked against ``next_status`` by a test parametrized over the
full product.  ``-`` means illegal.
"""

from __future__ import annotations

import itertools

import pytest

from hastandby.lifecycle.states import (
    PHASES,
    Action,
    Detail,
    Event,
    IllegalTransition,
    NodeStatus,
    Phase,
    State,
    accepts,
    initial_status,
    next_status,
)

GRID = """
event                            standalone connecting catchup    backup     recovering active     stopped
connected_to_primary             -          catchup    catchup    backup     -          -          -
caught_up                        -          -          backup     backup     -          -          -
won_election                     -          -          -          recovering -          -          -
won_election_new_cluster         -          recovering -          -          -          -          -
promoted_by_operator             -          -          -          recovering recovering active     -
promoted_by_operator_new_cluster -          recovering -          -          recovering active     -
primary_lost                     -          connecting catchup    backup     -          -          -
dropped_by_primary               -          -          catchup    catchup    -          -          -
expected_backups_ready           -          -          -          -          active     -          -
expected_backups_timed_out       -          -          -          -          active     -          -
lost_lease                       -          connecting catchup    backup     connecting connecting -
demoted                          -          -          -          -          connecting connecting -
stop                             stopped    stopped    stopped    stopped    stopped    stopped    stopped
store_failed                     standalone connecting catchup    catchup    recovering active     stopped
store_restored                   standalone connecting catchup    backup     recovering active     stopped
"""

A = Action
BECOME_PRIMARY = (A.STOP_REPLICATION, A.START_GUARDING, A.ADMIT_CLIENTS, A.PUBLISH_STATUS)
STEP_DOWN = (A.EXCLUDE_CLIENTS, A.STOP_SERVING_BACKUPS, A.RESIGN, A.PUBLISH_STATUS, A.LOOK_FOR_PRIMARY)

#: Actions of every legal cell that has any; the others must have none.
ACTIONS: dict[tuple[str, Event], tuple[Action, ...]] = {
    ("connecting", Event.CONNECTED_TO_PRIMARY): (A.PUBLISH_STATUS,),
    ("catchup", Event.CAUGHT_UP): (A.PUBLISH_STATUS,),
    ("backup", Event.WON_ELECTION): BECOME_PRIMARY,
    ("connecting", Event.WON_ELECTION_NEW_CLUSTER): BECOME_PRIMARY,
    ("backup", Event.PROMOTED_BY_OPERATOR): BECOME_PRIMARY,
    ("connecting", Event.PROMOTED_BY_OPERATOR_NEW_CLUSTER): BECOME_PRIMARY,
    ("backup", Event.DROPPED_BY_PRIMARY): (A.PUBLISH_STATUS,),
    ("recovering", Event.EXPECTED_BACKUPS_READY): (A.PUBLISH_STATUS,),
    ("recovering", Event.EXPECTED_BACKUPS_TIMED_OUT): (A.PUBLISH_STATUS,),
    ("recovering", Event.LOST_LEASE): STEP_DOWN,
    ("active", Event.LOST_LEASE): STEP_DOWN,
    ("recovering", Event.DEMOTED): STEP_DOWN,
    ("active", Event.DEMOTED): STEP_DOWN,
    ("connecting", Event.STOP): (A.STOP_REPLICATION, A.REVOKE_LEASE),
    ("catchup", Event.STOP): (A.STOP_REPLICATION, A.REVOKE_LEASE),
    ("backup", Event.STOP): (A.STOP_REPLICATION, A.REVOKE_LEASE),
    ("recovering", Event.STOP): (A.EXCLUDE_CLIENTS, A.STOP_SERVING_BACKUPS, A.REVOKE_LEASE),
    ("active", Event.STOP): (A.EXCLUDE_CLIENTS, A.STOP_SERVING_BACKUPS, A.REVOKE_LEASE),
    # A node that cannot store leaves its primary and is not ready; it looks for the primary once it writes.
    ("connecting", Event.STORE_FAILED): (A.STOP_REPLICATION, A.PUBLISH_STATUS),
    ("catchup", Event.STORE_FAILED): (A.STOP_REPLICATION, A.PUBLISH_STATUS),
    ("backup", Event.STORE_FAILED): (A.STOP_REPLICATION, A.PUBLISH_STATUS),
    ("connecting", Event.STORE_RESTORED): (A.LOOK_FOR_PRIMARY,),
    ("catchup", Event.STORE_RESTORED): (A.LOOK_FOR_PRIMARY,),
}

#: Events that bring a term, and how it must relate to the current one.
FOLLOWS_TERM = {Event.CONNECTED_TO_PRIMARY}
WINS_TERM = {
    Event.WON_ELECTION,
    Event.WON_ELECTION_NEW_CLUSTER,
    Event.PROMOTED_BY_OPERATOR,
    Event.PROMOTED_BY_OPERATOR_NEW_CLUSTER,
}
CURRENT_TERM = 7


def phase_name(phase: Phase) -> str:
    """Grid column name: the state, or the detail of a primary."""
    state, detail = phase
    return str(detail) if detail else str(state)


def parse_grid() -> tuple[list[str], dict[tuple[str, str], str]]:
    header, *rows = [line.split() for line in GRID.strip().splitlines()]
    columns = header[1:]
    cells = {}
    for event, *targets in rows:
        assert len(targets) == len(columns), f"row {event} has {len(targets)} cells"
        cells.update({(column, event): target for column, target in zip(columns, targets)})
    return columns, cells


COLUMNS, CELLS = parse_grid()
PHASES_BY_NAME = {phase_name(phase): phase for phase in PHASES}


def status_in(phase: Phase) -> NodeStatus:
    state, detail = phase
    return NodeStatus(state, detail, CURRENT_TERM)


def test_grid_decides_every_pair() -> None:
    assert COLUMNS == [phase_name(p) for p in PHASES]
    every_phase = {phase_name((state, None)) for state in State if state is not State.PRIMARY}
    every_phase |= {phase_name((State.PRIMARY, detail)) for detail in Detail}
    assert len(every_phase) == len(PHASES)
    assert set(COLUMNS) == every_phase
    assert {event for _, event in CELLS} == {event.value for event in Event}
    assert all(CELLS[(name, event.value)] != "-" for name, event in ACTIONS), "actions for an illegal cell"


def test_every_action_is_used() -> None:
    assert {action for actions in ACTIONS.values() for action in actions} == set(Action)


@pytest.mark.parametrize(
    ("phase", "event"),
    list(itertools.product(PHASES, Event)),
    ids=lambda value: phase_name(value) if isinstance(value, tuple) else str(value),
)
def test_transition(phase: Phase, event: Event) -> None:
    name = phase_name(phase)
    expected = CELLS[(name, event.value)]
    current = status_in(phase)
    term = CURRENT_TERM + 1 if event in FOLLOWS_TERM | WINS_TERM else None
    if expected == "-":
        assert not accepts(current, event)
        with pytest.raises(IllegalTransition) as raised:
            next_status(current, event, term)
        assert raised.value.current == current
        assert raised.value.event is event
        assert raised.value.target is None
        assert str(current.state) in str(raised.value) and str(event) in str(raised.value)
        return
    assert accepts(current, event)
    transition = next_status(current, event, term)
    assert phase_name(transition.status.phase) == expected
    assert transition.previous == current
    assert transition.event is event
    assert transition.actions == ACTIONS.get((name, event), ())
    assert transition.changed == (expected != name)
    adopts_term = event in FOLLOWS_TERM or (event in WINS_TERM and expected != name)
    assert transition.status.term == (term if adopts_term else CURRENT_TERM)


@pytest.mark.parametrize(
    "phase", [p for p in PHASES if CELLS[(phase_name(p), "connected_to_primary")] != "-"], ids=phase_name
)
def test_following_adopts_primary_term_and_refuses_an_older_one(phase: Phase) -> None:
    current = status_in(phase)
    assert next_status(current, Event.CONNECTED_TO_PRIMARY, CURRENT_TERM).status.term == CURRENT_TERM
    assert next_status(current, Event.CONNECTED_TO_PRIMARY, 9).status.term == 9
    with pytest.raises(IllegalTransition) as raised:
        next_status(current, Event.CONNECTED_TO_PRIMARY, CURRENT_TERM - 1)
    assert raised.value.target is not None and raised.value.target.term == CURRENT_TERM - 1
    assert "older" in raised.value.reason


@pytest.mark.parametrize(
    ("phase", "event"),
    [
        (PHASES_BY_NAME["backup"], Event.WON_ELECTION),
        (PHASES_BY_NAME["backup"], Event.PROMOTED_BY_OPERATOR),
        (PHASES_BY_NAME["connecting"], Event.WON_ELECTION_NEW_CLUSTER),
        (PHASES_BY_NAME["connecting"], Event.PROMOTED_BY_OPERATOR_NEW_CLUSTER),
    ],
)
def test_becoming_primary_needs_a_newer_term(phase: Phase, event: Event) -> None:
    current = status_in(phase)
    for stale in (CURRENT_TERM, CURRENT_TERM - 1):
        with pytest.raises(IllegalTransition) as raised:
            next_status(current, event, stale)
        assert raised.value.target == NodeStatus(State.PRIMARY, Detail.RECOVERING, stale)
    assert next_status(current, event, CURRENT_TERM + 1).status.term == CURRENT_TERM + 1


@pytest.mark.parametrize("event", sorted(FOLLOWS_TERM | WINS_TERM))
def test_events_that_bring_a_term_require_it(event: Event) -> None:
    phase = next(p for p in PHASES if CELLS[(phase_name(p), event.value)] not in ("-", phase_name(p)))
    with pytest.raises(ValueError, match="needs the term"):
        next_status(status_in(phase), event)


def test_promoting_a_primary_is_ignored_and_keeps_its_term() -> None:
    current = NodeStatus(State.PRIMARY, Detail.ACTIVE, CURRENT_TERM)
    transition = next_status(current, Event.PROMOTED_BY_OPERATOR, CURRENT_TERM + 5)
    assert transition.status == current
    assert transition.actions == ()
    assert not transition.changed


def test_stepping_down_keeps_the_term_and_excludes_clients_before_resigning() -> None:
    current = NodeStatus(State.PRIMARY, Detail.ACTIVE, CURRENT_TERM)
    transition = next_status(current, Event.LOST_LEASE)
    assert transition.status == NodeStatus(State.CONNECTING, None, CURRENT_TERM)
    assert transition.actions.index(A.EXCLUDE_CLIENTS) < transition.actions.index(A.RESIGN)


def test_a_new_primary_guards_before_admitting_clients() -> None:
    transition = next_status(NodeStatus(State.BACKUP, term=3), Event.WON_ELECTION, 4)
    assert transition.actions.index(A.START_GUARDING) < transition.actions.index(A.ADMIT_CLIENTS)


def test_catchup_cannot_be_promoted() -> None:
    catchup = NodeStatus(State.CATCHUP, term=3)
    assert not accepts(catchup, Event.PROMOTED_BY_OPERATOR)
    with pytest.raises(IllegalTransition, match="not allowed in catchup"):
        next_status(catchup, Event.PROMOTED_BY_OPERATOR, 4)


def test_initial_status() -> None:
    assert initial_status(clustered=True) == NodeStatus(State.CONNECTING)
    assert initial_status(clustered=False) == NodeStatus(State.STANDALONE)


@pytest.mark.parametrize(
    ("state", "detail"),
    [(State.PRIMARY, None), (State.BACKUP, Detail.ACTIVE), (State.CONNECTING, Detail.RECOVERING)],
)
def test_detail_goes_with_primary_only(state: State, detail: Detail | None) -> None:
    with pytest.raises(ValueError):
        NodeStatus(state, detail)


def test_status_reads_well_in_logs() -> None:
    assert str(NodeStatus(State.PRIMARY, Detail.RECOVERING, 12)) == "primary (recovering) term 12"
    assert str(NodeStatus(State.BACKUP, None, 12)) == "backup term 12"
