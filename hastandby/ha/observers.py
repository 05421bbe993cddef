"""Who is told when a cluster node's role changes, or its client service starts or stops: ``RoleObservers``.

``HaNode`` tells them; the host's role hooks (``host/role_hooks.py``, ``--on-role-change``), the virtual IP
(``host/virtual_ip.py``) and DR (``dr/service.py``) listen.  Observers only queue work of their own: a bug in
one is logged, and never stops a role change nor the next observer.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from hastandby.host.role_hooks import HALTED, role_name
from hastandby.lifecycle.standing import Standing
from hastandby.lifecycle.states import State

log = structlog.get_logger("hastandby.ha")


class RoleObservers:
    """The observers of one node, told on the reactor thread; they call nothing back."""

    def __init__(self) -> None:
        # Told the role (role_hooks.role_name, or "halted") and term on every change of state or detail,
        # before its actions run, and the first role once the node starts.
        self.on_role_change: list[Callable[[str, int], None]] = []
        # Told when client service starts or stops (admit_clients / exclude_clients): every way out of
        # primary (demoted, lost_lease, stop, a halt) excludes clients first.
        self.on_serving: list[Callable[[bool], None]] = []
        self._role_told: str | None = None

    def tell_role(self, standing: Standing) -> None:
        """Tell ``on_role_change`` the node's role, if it is not the one it was told last."""
        halted = standing.halted is not None and standing.status.state is not State.STOPPED
        role = HALTED if halted else role_name(standing.status)
        if role == self._role_told:
            return
        self._role_told = role
        for fn in self.on_role_change:
            try:
                fn(role, standing.status.term)
            except Exception:  # an observer only queues work; a bug there must not stop a role change
                log.exception("role change observer failed", role=role)

    def tell_serving(self, admitting: bool) -> None:
        for fn in self.on_serving:
            try:
                fn(admitting)
            except Exception:  # client service must change whatever an observer does
                log.exception("serving observer failed", admitting=admitting)
