"""The role a node plays, as an object: ``BackupRole`` or ``PrimaryRole``, swapped by the state table's actions.

After Qpid's HA module, where ``HaBroker`` holds one ``Role`` (``Backup`` or ``Primary``) and swaps it for the
one ``promote()`` returns: ``HaNode.role`` is the one place that knows which role the node plays, and every
difference between the roles is a method of both, so nobody asks which one it is:

- ``attach``: the broker's attach hook.  A primary claims its backups' replication links; a backup lets an
  admin read it but not change what the primary replicates to it.
- ``members``, ``describe``: what QUERY's ``ha`` part shows (the members as the primary tells them, the lag
  and held acknowledgements of a primary's backups).
- ``sync_wanted``, ``sync_confirmed``: the sync set a primary's replication wants in etcd, and etcd's word that
  it holds it.
- ``follow``, ``primary_url``: a backup replicates from etcd's leader; a primary follows nobody.
- ``stop``, ``look_for_primary``: a backup's replication from the primary, stopped and started again.
- ``promote``, ``step_down``: the next role.

The state table (``states.py``) still decides every role change, and its actions (``effects.py``, carried out
by ``HaNode``) are what swap the object: ``start_guarding`` is ``role = role.promote(...)``,
``stop_serving_backups`` is ``role = role.step_down()``.  A role does no I/O of its own beyond the
replication it holds (``primary.py``, ``backup.py``), and fires no event: events stay ``HaNode``'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import structlog
from proton import Link

from hastandby.ha.backup import BackupReplication
from hastandby.ha.primary import PrimaryReplication
from hastandby.ha.protocol import PeerMember
from hastandby.broker.transport.address import split_hostport

from hastandby.election.cluster import Leader

log = structlog.get_logger("hastandby.ha")

#: What QUERY shows of a role without backups to report on.
_NO_HOLDS: dict[str, Any] = {"backups": {}, "quorum": {}, "waiting_for": None, "refusing": None}


class Role(ABC):
    """What differs between the roles; ``HaNode`` holds one (``HaNode.role``) and the table's actions swap it."""

    @abstractmethod
    def attach(self, link: Link) -> Any:
        """The broker's attach hook for a link of this node: the endpoint that claims it, or None."""

    @abstractmethod
    def members(self) -> list[PeerMember]:
        """The cluster's members as this role knows them (a primary: itself and its backups)."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """QUERY's replication figures: ``lag``, ``lag_seconds``, ``acks_held`` (with why they are held, and why
        messages are refused) and ``not_storing`` (backups that left because they cannot store) of
        ``PrimaryReplication``."""

    @property
    @abstractmethod
    def sync_wanted(self) -> frozenset[str] | None:
        """The sync set this role wants in etcd (read by the election thread); None: it keeps none."""

    @abstractmethod
    def sync_confirmed(self, term: int, members: frozenset[str]) -> None:
        """etcd holds ``members`` as the sync set, written by this node as primary of ``term``."""

    @property
    @abstractmethod
    def primary_url(self) -> str | None:
        """The primary this node follows, if known (from its hello)."""

    @abstractmethod
    def follow(self, leader: Leader, previous: Leader | None) -> bool:
        """etcd names ``leader`` the primary (``previous``: the one named before); True if this role follows it."""

    @abstractmethod
    def stop(self) -> None:
        """``stop_replication``: stop replicating from the primary, keeping every replica."""

    @abstractmethod
    def look_for_primary(self) -> None:
        """``look_for_primary``: look for the primary and replicate from it."""

    @abstractmethod
    def promote(self, serve: Callable[[], PrimaryReplication]) -> Role:
        """``start_guarding``: the next role, a primary whose replication ``serve`` starts (Qpid's ``promote()``)."""

    @abstractmethod
    def step_down(self) -> Role:
        """``stop_serving_backups``: the next role, a backup that replicates nothing until it looks for a primary."""


class BackupRole(Role):
    """A node that is not primary (connecting, catchup, backup): it replicates from the primary, if it has one.

    ``replication`` is the node's one ``BackupReplication``, kept across roles: a primary that steps down
    follows the next primary with it (what it last heard of the members included).
    """

    def __init__(self, replication: BackupReplication, check_admin_link: Callable[[Link], None],
                 is_admin: Callable[[Any], bool]) -> None:
        self.replication = replication
        self._check_admin_link = check_admin_link
        self._is_admin = is_admin

    def attach(self, link: Link) -> Any:
        if self._is_admin(link.connection):
            self._check_admin_link(link)  # raises for what would change a replica
        return None

    def members(self) -> list[PeerMember]:
        return self.replication.members

    def describe(self) -> dict[str, Any]:
        return {"lag": {}, "lag_seconds": {}, "acks_held": dict(_NO_HOLDS), "not_storing": {}}

    @property
    def sync_wanted(self) -> frozenset[str] | None:
        return None

    def sync_confirmed(self, term: int, members: frozenset[str]) -> None:
        pass  # written by a primary that this node no longer is

    @property
    def primary_url(self) -> str | None:
        primary = self.replication.primary
        return (primary.url or None) if primary is not None else None

    def follow(self, leader: Leader, previous: Leader | None) -> bool:
        log.info("leader from etcd", leader=leader.node_id, url=leader.url, term=leader.term)
        if self.replication.not_storing is not None:
            return True  # known, not followed: it replicates nothing until its journal writes again
        outbound = self.replication.outbound
        if outbound.connected and outbound.address == split_hostport(leader.url):
            return True
        if previous != leader or not outbound.connected:
            outbound.redirect()
        return True

    def stop(self) -> None:
        self.replication.stop()

    def look_for_primary(self) -> None:
        self.replication.start()

    def promote(self, serve: Callable[[], PrimaryReplication]) -> Role:
        return PrimaryRole(serve(), self)

    def step_down(self) -> Role:
        return self  # serves no backups


class PrimaryRole(Role):
    """A primary: it serves its backups (``PrimaryReplication``) and follows nobody.

    ``backup`` is the role it came from, which it goes back to (its replication stopped) when it steps down.
    """

    def __init__(self, replication: PrimaryReplication, backup: BackupRole) -> None:
        self.replication = replication
        self._backup = backup

    def attach(self, link: Link) -> Any:
        return self.replication.attach(link)  # an admin's links are not checked: the primary's objects are its own

    def members(self) -> list[PeerMember]:
        return self.replication.members()

    def describe(self) -> dict[str, Any]:
        replication = self.replication
        return {"lag": replication.lag(), "lag_seconds": replication.lag_seconds(),
                "acks_held": replication.acks_held(), "not_storing": dict(replication.not_storing)}

    @property
    def sync_wanted(self) -> frozenset[str] | None:
        replication = self.replication
        return replication.sync_wanted if replication.keeps_sync_set else None

    def sync_confirmed(self, term: int, members: frozenset[str]) -> None:
        if self.replication.term == term:
            self.replication.sync_confirmed(members)

    @property
    def primary_url(self) -> str | None:
        return None  # it is the primary: it follows none

    def follow(self, leader: Leader, previous: Leader | None) -> bool:
        return False

    def stop(self) -> None:
        pass  # its replication from a primary stopped when it was promoted

    def look_for_primary(self) -> None:
        pass  # the table steps a primary down first (``step_down``), and that role looks

    def promote(self, serve: Callable[[], PrimaryReplication]) -> Role:
        return self  # promoting a primary is ignored, as in Qpid

    def step_down(self) -> Role:
        self.replication.stop()
        return self._backup

