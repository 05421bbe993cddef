"""The interpreter of the state table: every action has one effect, and every row is performed as written."""

from __future__ import annotations

import pytest

from hastandby.lifecycle.effects import EFFECTS, perform
from hastandby.lifecycle.states import TRANSITIONS, Action, Event, NodeStatus, Phase, next_status


class RecordingNode:
    """A fake node: each effect records its name."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def __getattr__(self, name: str):  # one recording method per effect
        return lambda: self.done.append(name)


def test_every_action_has_one_effect_and_it_is_the_method_of_its_name() -> None:
    assert set(EFFECTS) == set(Action)
    for action in Action:
        node = RecordingNode()
        perform([action], node)
        assert node.done == [action.value]


ROWS = [(phase, event) for phase, row in TRANSITIONS.items() for event in row]


@pytest.mark.parametrize(("phase", "event"), ROWS, ids=[f"{p[1] or p[0]}-{e}" for p, e in ROWS])
def test_a_transition_performs_exactly_its_rows_actions_in_order(phase: Phase, event: Event) -> None:
    state, detail = phase
    transition = next_status(NodeStatus(state, detail, 5), event, term=9)
    node = RecordingNode()
    perform(transition.actions, node)
    assert node.done == [action.value for action in TRANSITIONS[phase][event].actions]


def test_a_primary_that_steps_down_looks_for_the_next_primary_last() -> None:
    for phase, row in TRANSITIONS.items():
        for event, step in row.items():
            if phase[0] == "primary" and step.to[0] == "connecting":
                assert step.actions[0] is Action.EXCLUDE_CLIENTS  # clients go first: nothing more is acknowledged
                assert step.actions[-1] is Action.LOOK_FOR_PRIMARY, (phase, event)
