"""The one interpreter of the state table's actions: each ``Action`` is one method of ``RoleEffects``.

``states.py`` says what a role change must do; this module is where that is
done, and nothing else is: ``HaNode.fire`` applies an event with
``next_status`` and hands the transition's actions here, in the table's
order.  A role change that needed an effect the table does not name would
have to add an ``Action`` and a method below, so the table stays the whole
truth (h11's rule: the table is the behaviour).

``RoleEffects`` is what a node must offer; ``HaNode`` is the real one, and
the unit tests drive every row of the table through a recording fake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from hastandby.lifecycle.states import Action


class RoleEffects(Protocol):
    """One method per ``Action``; each does what the action's comment in ``states.py`` says."""

    def exclude_clients(self) -> None: ...

    def admit_clients(self) -> None: ...

    def stop_replication(self) -> None: ...

    def look_for_primary(self) -> None: ...

    def start_guarding(self) -> None: ...

    def stop_serving_backups(self) -> None: ...

    def resign(self) -> None: ...

    def revoke_lease(self) -> None: ...

    def publish_status(self) -> None: ...


EFFECTS: dict[Action, Callable[[RoleEffects], None]] = {
    Action.EXCLUDE_CLIENTS: lambda node: node.exclude_clients(),
    Action.ADMIT_CLIENTS: lambda node: node.admit_clients(),
    Action.STOP_REPLICATION: lambda node: node.stop_replication(),
    Action.LOOK_FOR_PRIMARY: lambda node: node.look_for_primary(),
    Action.START_GUARDING: lambda node: node.start_guarding(),
    Action.STOP_SERVING_BACKUPS: lambda node: node.stop_serving_backups(),
    Action.RESIGN: lambda node: node.resign(),
    Action.REVOKE_LEASE: lambda node: node.revoke_lease(),
    Action.PUBLISH_STATUS: lambda node: node.publish_status(),
}
"""Each action's effect; every ``Action`` has one (checked by the unit tests)."""


def perform(actions: Iterable[Action], node: RoleEffects) -> None:
    """Do ``actions`` on ``node``, in order."""
    for action in actions:
        EFFECTS[action](node)
