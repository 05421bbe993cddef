"""The role objects (ha/roles.py): ``BackupRole`` and ``PrimaryRole``, swapped by the table's actions.

The replications are real (a registry and a driver that is never run); what a role does with them is checked
here, and that HaNode's actions are the swaps (``start_guarding``: ``promote``; ``stop_serving_backups``:
``step_down``).  ``ClusterManagement`` needs only its narrow protocol: it no longer imports ``ha_node``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hastandby.broker.transport.driver import Driver
from hastandby.broker.admission.memory import MemoryAlarm
from hastandby.broker.queues.registry import Registry
from hastandby.ha.backup import BackupReplication
from hastandby.ha.primary import PrimaryReplication
from hastandby.election.cluster import Leader
from hastandby.ha.roles import BackupRole, PrimaryRole, Role

PACKAGE = Path(__file__).resolve().parents[2] / "hastandby"


def backup_role(checked: list[Any] | None = None, admin: bool = False) -> BackupRole:
    replication = BackupReplication(Registry("all", True), Driver(None), lambda: [], lambda: {"node_id": "me"},
                                    lambda: 0, container_id="test", heartbeat=2.0,
                                    on_connected=lambda term, hello: None, on_members=lambda term, members: None,
                                    on_lost=lambda reason: None, memory=MemoryAlarm(high=2**62))
    return BackupRole(replication, (checked if checked is not None else []).append, lambda connection: admin)


def primary_replication(registry: Registry | None = None, keeps_sync_set: bool = True) -> PrimaryReplication:
    registry = registry or Registry("all", True)
    registry.declare_queue("q")
    return PrimaryReplication(registry, Driver(None), me={"node_id": "p", "url": "h:1"}, term=7,
                              expected={"b": "h:2"}, backup_timeout=10.0, on_expected_done=lambda timed_out: None,
                              keeps_sync_set=keeps_sync_set)


def test_a_backup_promoted_is_a_primary_serving_what_serve_started() -> None:
    backup = backup_role()
    replication = primary_replication()
    primary = backup.promote(lambda: replication)
    assert isinstance(primary, PrimaryRole) and primary.replication is replication
    assert primary.members() == replication.members()
    assert primary.describe() == {"lag": replication.lag(), "lag_seconds": replication.lag_seconds(),
                                  "acks_held": replication.acks_held(), "not_storing": {}}


def test_a_primary_steps_down_to_the_backup_it_was_and_stops_serving() -> None:
    backup = backup_role()
    registry = Registry("all", True)
    replication = primary_replication(registry)
    primary = backup.promote(lambda: replication)
    assert replication in registry.observers
    assert primary.step_down() is backup
    assert replication not in registry.observers and replication.backups == {}


def test_promoting_a_primary_is_ignored_and_a_backup_serves_nobody() -> None:
    primary = backup_role().promote(primary_replication)
    started: list[PrimaryReplication] = []

    def serve() -> PrimaryReplication:
        started.append(primary_replication())
        return started[-1]

    assert primary.promote(serve) is primary
    assert started == []
    backup = backup_role()
    assert backup.step_down() is backup


def test_only_a_primary_that_keeps_a_sync_set_wants_one() -> None:
    assert backup_role().sync_wanted is None
    assert backup_role().promote(lambda: primary_replication(keeps_sync_set=False)).sync_wanted is None
    replication = primary_replication(keeps_sync_set=True)
    primary = backup_role().promote(lambda: replication)
    assert primary.sync_wanted == replication.sync_wanted == frozenset({"p", "b"})


def test_sync_confirmed_reaches_the_primary_of_that_term_only() -> None:
    replication = primary_replication(keeps_sync_set=True)
    primary = backup_role().promote(lambda: replication)
    backup = replication.backups["b"]
    replication._depart(backup)  # leaving: held until etcd confirms the set without it
    primary.sync_confirmed(6, frozenset({"p"}))
    assert "b" in replication.leaving
    primary.sync_confirmed(7, frozenset({"p"}))
    assert "b" not in replication.leaving
    backup_role().sync_confirmed(7, frozenset({"p"}))  # a backup keeps no sync set: nothing to do


def test_a_primary_follows_nobody_and_names_no_primary() -> None:
    primary = backup_role().promote(primary_replication)
    assert primary.follow(Leader("x", "h:9", 8), None) is False
    assert primary.primary_url is None


def test_a_backup_follows_etcds_leader() -> None:
    backup = backup_role()
    assert backup.follow(Leader("x", "h:9", 8), None) is True
    assert backup.primary_url is None  # no hello yet


def test_a_backup_checks_an_admins_links_and_a_primary_claims_its_backups() -> None:
    checked: list[Any] = []
    link = SimpleNamespace(connection=object())
    assert backup_role(checked, admin=True).attach(link) is None  # type: ignore[arg-type]
    assert checked == [link]
    checked.clear()
    assert backup_role(checked, admin=False).attach(link) is None  # type: ignore[arg-type]
    assert checked == []


def test_a_backup_shows_the_members_its_primary_told_it_and_no_replication_figures() -> None:
    backup = backup_role()
    assert backup.members() == []
    assert backup.describe() == {"lag": {}, "lag_seconds": {}, "not_storing": {},
                                 "acks_held": {"backups": {}, "quorum": {}, "waiting_for": None, "refusing": None}}


def test_every_role_answers_every_question() -> None:
    abstract = Role.__abstractmethods__
    assert {"attach", "members", "describe", "sync_wanted", "sync_confirmed", "primary_url", "follow", "stop",
            "look_for_primary", "promote", "step_down"} <= abstract
    assert not BackupRole.__abstractmethods__ and not PrimaryRole.__abstractmethods__


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.add(("." * node.level) + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_management_hooks_do_not_import_the_node() -> None:
    """ClusterManagement takes a ManagedNode (its protocol), as admission and the election loop do."""
    for module in ("ha/cluster_management.py", "ha/admission.py", "election/loop.py", "ha/roles.py"):
        imports = _imports(PACKAGE / module)
        assert ".node" not in imports and "hastandby.ha.node" not in imports, module


def test_the_table_actions_swap_the_role() -> None:
    """HaNode's start_guarding and stop_serving_backups are the swaps (read from its source)."""
    source = (PACKAGE / "ha" / "node.py").read_text()
    assert "self.role = self.role.promote(self._serve_backups)" in source
    assert "self.role = self.role.step_down()" in source
    assert re.search(r"self\.primary\b(?!_url)", source) is None  # no "if self.primary is not None"
