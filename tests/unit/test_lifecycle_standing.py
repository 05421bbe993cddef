"""A node's standing beside the table (lifecycle/standing.py): what halts it, when it holds data, admits, is
primary, and what its primary's word on it fires."""

from __future__ import annotations

import pytest

from hastandby.lifecycle.standing import REFUSABLE, Standing
from hastandby.lifecycle.states import Detail, Event, IllegalTransition, NodeStatus, State, Transition


def test_an_answer_is_refused_without_halting() -> None:
    standing = Standing()
    assert isinstance(standing.fire(Event.CONNECTED_TO_PRIMARY, 5), Transition)
    refused = standing.fire(Event.CONNECTED_TO_PRIMARY, 3)  # an older primary's term
    assert isinstance(refused, IllegalTransition) and standing.halted is None
    assert standing.status == NodeStatus(State.CATCHUP, term=5)
    assert REFUSABLE == {Event.CONNECTED_TO_PRIMARY, Event.WON_ELECTION, Event.WON_ELECTION_NEW_CLUSTER}


def test_any_other_refusal_halts_and_a_halted_primary_is_no_primary() -> None:
    standing = Standing()
    assert isinstance(standing.fire(Event.WON_ELECTION_NEW_CLUSTER, 1), Transition)
    assert standing.is_primary
    refused = standing.fire(Event.CAUGHT_UP)  # not a primary's event
    assert isinstance(refused, IllegalTransition) and standing.halted == str(refused)
    assert standing.status.state is State.PRIMARY and not standing.is_primary


@pytest.mark.parametrize(("journal_term", "events", "holds"), [
    (0, [], False),
    (3, [], True),  # its journal brought back a store of this cluster
    (0, [(Event.CONNECTED_TO_PRIMARY, 1)], True),  # catchup: past connecting
    (0, [(Event.PRIMARY_LOST, None)], False),
])
def test_it_holds_data_once_past_connecting(journal_term: int, events: list[tuple[Event, int | None]],
                                            holds: bool) -> None:
    standing = Standing(holds_data=journal_term > 0)
    for event, term in events:
        standing.fire(event, term)
    assert standing.holds_data is holds


def test_client_service_changes_once() -> None:
    standing = Standing()
    assert standing.admit(True) and standing.admitting
    assert not standing.admit(True)
    assert standing.admit(False) and not standing.admitting


@pytest.mark.parametrize(("status", "ready", "expected", "event"), [
    (NodeStatus(State.CATCHUP, term=2), True, False, Event.CAUGHT_UP),
    (NodeStatus(State.BACKUP, term=2), True, False, None),
    (NodeStatus(State.BACKUP, term=2), False, False, Event.DROPPED_BY_PRIMARY),
    (NodeStatus(State.BACKUP, term=2), False, True, None),  # a new primary guards for it: it stays ready
    (NodeStatus(State.BACKUP, term=2), False, None, Event.DROPPED_BY_PRIMARY),
    (NodeStatus(State.CATCHUP, term=2), False, False, None),
    (NodeStatus(State.PRIMARY, Detail.ACTIVE, 2), True, None, None),
])
def test_what_the_primarys_word_fires(status: NodeStatus, ready: bool, expected: bool | None,
                                      event: Event | None) -> None:
    standing = Standing()
    standing.status = status
    assert standing.members_event(ready, expected) is event
