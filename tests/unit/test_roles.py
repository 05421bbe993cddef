"""The roles (ha/roles.py): ``BackupRole`` and ``PrimaryRole``, each *its* replication, swapped by the table's actions.

The replications are real (a registry and a driver that is never run); what a role does is checked here, and
that HaNode's actions are the swaps (``start_guarding``: ``promote``; ``stop_serving_backups``: ``step_down``),
that it forwards nothing to the role and keeps no backup of its own.  ``ClusterManagement``, admission, the
election loop and the node's other parts need only their narrow protocols: none imports ``ha/node.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hastandby.broker.queues.registry import Registry
from hastandby.election.cluster import Leader
from hastandby.election.sync_request import SyncRequest
from hastandby.ha.backup import BackupRole
from hastandby.ha.node import HaNode
from hastandby.ha.primary import PrimaryRole
from hastandby.ha.roles import Role, backup_of
from tests.unit.ha_roles import backup_role, primary_role

PACKAGE = Path(__file__).resolve().parents[2] / "hastandby"


def test_a_backup_promoted_is_the_primary_serve_started_which_holds_it() -> None:
    backup = backup_role()
    started: list[BackupRole] = []

    def serve(came_from: BackupRole) -> PrimaryRole:
        started.append(came_from)
        return primary_role(backup=came_from)

    primary = backup.promote(serve)
    assert isinstance(primary, PrimaryRole) and started == [backup] and primary.backup_role is backup
    assert backup_of(primary) is backup and backup_of(backup) is backup
    assert primary.describe() == {"lag": primary.lag(), "lag_seconds": primary.lag_seconds(),
                                  "acks_held": primary.acks_held(), "not_storing": {}}


def test_a_primary_steps_down_to_the_backup_it_was_and_stops_serving() -> None:
    backup = backup_role()
    registry = Registry("all", True)
    registry.declare_queue("q")
    primary = backup.promote(lambda came_from: primary_role(registry, backup=came_from))
    assert primary in registry.observers
    assert primary.step_down() is backup
    assert primary not in registry.observers and primary.backups == {}


def test_promoting_a_primary_is_ignored_and_a_backup_serves_nobody() -> None:
    primary = backup_role().promote(lambda came_from: primary_role(backup=came_from))
    started: list[PrimaryRole] = []

    def serve(came_from: BackupRole) -> PrimaryRole:
        started.append(primary_role(backup=came_from))
        return started[-1]

    assert primary.promote(serve) is primary
    assert started == []
    backup = backup_role()
    assert backup.step_down() is backup


def test_only_a_primary_that_keeps_a_sync_set_wants_one_until_it_steps_down() -> None:
    assert primary_role(keeps_sync_set=False).sync is None
    primary = primary_role(keeps_sync_set=True)
    sync = primary.sync
    assert sync is not None and sync.wanted == primary.sync_wanted == frozenset({"p", "b"})
    primary.step_down()
    assert sync.wanted is None and primary.sync is None


def test_etcds_confirmation_reaches_the_primary_of_that_term_only() -> None:
    handed: list[Any] = []
    sync = SyncRequest(handed.append)  # the reactor: run by hand below
    primary = primary_role(sync=sync)  # term 7
    assert sync.wanted == frozenset({"p", "b"})
    backup = primary.backups["b"]
    primary._depart(backup)  # leaving: held until etcd confirms the set without it
    sync.written(6, frozenset({"p"}))  # the election thread: an older term's write
    for fn in handed:
        fn()
    assert "b" in primary.leaving
    handed.clear()
    sync.written(7, frozenset({"p"}))
    assert "b" in primary.leaving  # not before the reactor ran it
    for fn in handed:
        fn()
    assert "b" not in primary.leaving
    primary.step_down()
    assert sync.wanted is None  # a primary that stepped down wants nothing (test_sync_request.py: nor hears)


def test_a_primary_names_no_primary_and_follows_nobody() -> None:
    primary = backup_role().promote(lambda came_from: primary_role(backup=came_from))
    assert primary.primary_url is None
    node = SimpleNamespace(role=primary, leader=None)
    HaNode.follow(node, Leader("x", "h:9", 8))  # type: ignore[arg-type]
    assert node.leader is None


def test_a_backup_follows_etcds_leader() -> None:
    backup = backup_role()
    node = SimpleNamespace(role=backup, leader=None)
    HaNode.follow(node, Leader("x", "h:9", 8))  # type: ignore[arg-type]
    assert node.leader == Leader("x", "h:9", 8)
    assert backup.primary_url is None  # no hello yet


def test_a_backup_checks_an_admins_links_and_a_primary_claims_its_backups() -> None:
    checked: list[Any] = []
    link = SimpleNamespace(connection=object())
    assert backup_role(check_admin_link=checked.append, is_admin=lambda c: True).attach(link) is None  # type: ignore[arg-type]
    assert checked == [link]
    checked.clear()
    assert backup_role(check_admin_link=checked.append, is_admin=lambda c: False).attach(link) is None  # type: ignore[arg-type]
    assert checked == []


def test_a_backup_shows_the_members_its_primary_told_it_and_no_replication_figures() -> None:
    backup = backup_role()
    assert backup.members() == []
    assert backup.describe() == {"lag": {}, "lag_seconds": {}, "not_storing": {},
                                 "acks_held": {"backups": {}, "quorum": {}, "waiting_for": None, "refusing": None}}


ROLE = {"attach", "members", "describe", "primary_url", "promote", "step_down"}


def test_a_role_is_what_both_answer_and_both_answer_it() -> None:
    """``Role`` is cut down to what truly differs (Qpid's Role has two or three methods); both roles are one."""
    declared = {name for name in vars(Role) if not name.startswith("_")}
    assert declared == ROLE
    for role in (BackupRole, PrimaryRole):
        assert all(callable(getattr(role, name, None)) or isinstance(getattr(role, name, None), property)
                   for name in ROLE), role


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.add(("." * node.level) + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_nodes_parts_do_not_import_the_node() -> None:
    """ClusterManagement takes a ManagedNode (its protocol), as admission, the election loop and the rest do."""
    for module in ("ha/cluster_management.py", "ha/admission.py", "election/loop.py", "ha/roles.py",
                   "ha/membership.py", "ha/journal.py", "ha/observers.py", "ha/addresses.py"):
        imports = _imports(PACKAGE / module)
        assert ".node" not in imports and "hastandby.ha.node" not in imports, module


HA_NODE = PACKAGE / "ha" / "node.py"


def test_the_table_actions_swap_the_role() -> None:
    """HaNode's start_guarding and stop_serving_backups are the swaps (read from its source)."""
    source = HA_NODE.read_text()
    assert "self.role = self.role.promote(self._serve_backups)" in source
    assert "self.role = self.role.step_down()" in source
    assert re.search(r"self\.primary\b(?!_url)", source) is None  # no "if self.primary is not None"
    assert re.search(r"self\._?backup\b", source) is None  # no backup kept behind the role's back


def _forwards_to_the_role(function: ast.FunctionDef) -> bool:
    """A method whose whole body (its docstring aside) is one call on, or one read of, ``self.role``."""
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)) or body[0].value is None:
        return False
    value = body[0].value
    target = value.func if isinstance(value, ast.Call) else value
    return (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute)
            and target.value.attr == "role" and isinstance(target.value.value, ast.Name)
            and target.value.value.id == "self")


def test_the_node_forwards_nothing_to_the_role_and_is_small() -> None:
    tree = ast.parse(HA_NODE.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HaNode")
    methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
    assert [m.name for m in methods if _forwards_to_the_role(m)] == []
    assert len(HA_NODE.read_text().splitlines()) <= 250


def test_the_forwarder_finder_finds_forwarders() -> None:
    tree = ast.parse("def f(self):\n    '''Doc.'''\n    return self.role.primary_url\n"
                     "def g(self, x):\n    self.role.stop(x)\n"
                     "def h(self):\n    self.role = self.role.step_down()\n")
    found = {f.name: _forwards_to_the_role(f) for f in tree.body if isinstance(f, ast.FunctionDef)}
    assert found == {"f": True, "g": True, "h": False}
