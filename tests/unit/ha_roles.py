"""The roles as the unit tests make them: a ``BackupRole`` never started, a ``PrimaryRole`` on a fresh registry.

Their drivers never run; what a test needs of one is given by keyword, the rest are quiet defaults.
"""

from __future__ import annotations

from typing import Any, Callable

from proton import Connection, Link

from hastandby.broker.admission.memory import MemoryAlarm
from hastandby.broker.queues.registry import Registry
from hastandby.broker.transport.driver import Driver
from hastandby.election.sync_request import SyncRequest
from hastandby.ha.backup import BackupRole
from hastandby.ha.primary import PrimaryRole
from hastandby.ha.protocol import Hello, PeerMember


def backup_role(registry: Registry | None = None, *,
                on_connected: Callable[[int, Hello], bool] = lambda term, hello: True,
                on_members: Callable[[int, list[PeerMember]], None] = lambda term, members: None,
                check_admin_link: Callable[[Link], None] = lambda link: None,
                is_admin: Callable[[Connection], bool] = lambda connection: False) -> BackupRole:
    return BackupRole(registry or Registry("all", True), Driver(None), lambda: [], lambda: {"node_id": "me"},
                      lambda: 0, container_id="test", heartbeat=2.0, on_connected=on_connected,
                      on_members=on_members, on_lost=lambda reason: None, memory=MemoryAlarm(high=2**62),
                      check_admin_link=check_admin_link, is_admin=is_admin)


def at_once(fn: Callable[[], None]) -> None:
    """A reactor that runs what it is handed at once (``SyncRequest``'s confirmation)."""
    fn()


def primary_role(registry: Registry | None = None, *, backup: BackupRole | None = None, term: int = 7,
                 expected: dict[str, str] | None = None, keeps_sync_set: bool = False,
                 sync: SyncRequest | None = None, **options: Any) -> PrimaryRole:
    """A primary ``p`` (``h:1``) of ``term`` expecting ``expected`` (default: backup ``b`` at ``h:2``) and guarding
    queue ``q``; ``keeps_sync_set``: it wants its sync set through a ``SyncRequest`` (``primary.sync``: ``sync``, or
    one whose confirmations run at once)."""
    if registry is None:
        registry = Registry("all", True)
        registry.declare_queue("q")
    return PrimaryRole(registry, Driver(None), backup or backup_role(), me={"node_id": "p", "url": "h:1"}, term=term,
                       expected=expected if expected is not None else {"b": "h:2"}, backup_timeout=10.0,
                       on_expected_done=lambda timed_out: None,
                       sync=sync or (SyncRequest(at_once) if keeps_sync_set else None), **options)
