"""The node's only door to etcd: membership, election, handover, lease, watch.

``Coordinator`` is the small interface the node loop programs against (so the
decisions stay testable with a fake); ``EtcdCoordinator``
(``etcd_coordinator.py``) implements it on etcd.  Key layout and value
format: ``cluster.py``.  This module loads neither gRPC nor etcd3: a node
without ``--etcd`` never does.

Threads and the ``notify`` contract.  The etcd3/gRPC machinery runs in
threads, and so do this coordinator's lease keepalive and watch.  Those
threads never call into broker or node code.  They only call the plain
``notify(event)`` callable given at construction, with a ``CoordinatorEvent``
saying *why* the node should run a decision cycle soon.  ``notify`` must be
thread-safe, must not block and must not raise: hand the event to the node's
own thread (a queue, a proton ``EventInjector``, ``call_soon_threadsafe``) and
return.  All other methods are blocking etcd calls bounded by
``request_timeout``; the node loop calls them from one thread of its own, not
from the proton reactor thread, and they raise ``CoordinatorError`` when etcd
cannot do what was asked.

The lease queries are the same arithmetic whatever keeps the lease:
``LeasedCoordinator`` holds it once, with the one set of defaults and
ranges (``settings.LEASE_TTL``, ``settings.LEASE_MARGIN``), and asks its subclass (``EtcdCoordinator``,
the tests' fake) only for what differs, through abstract ``_`` methods, as
Patroni's ``AbstractDCS`` does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

from hastandby import settings
from hastandby.election.cluster import ClusterSnapshot, Store
from hastandby.lifecycle.states import NodeStatus



class CoordinatorEvent(StrEnum):
    """Why ``notify`` was called: each means "run a decision cycle soon"."""

    #: Something under the cluster prefix changed, or a (re)established watch
    #: may have missed changes.
    CLUSTER_CHANGED = "cluster_changed"
    #: No refresh was confirmed within the safe lease age.
    LEASE_UNCONFIRMED = "lease_unconfirmed"
    #: etcd says the lease no longer exists.
    LEASE_LOST = "lease_lost"


Notify = Callable[[CoordinatorEvent], None]


class CoordinatorError(Exception):
    """etcd could not do what was asked: unreachable, timed out or refused."""


class CoordinatorUnavailable(CoordinatorError):
    """No etcd endpoint answered in time (each one tried was unreachable, hung or without a leader)."""


class Coordinator(Protocol):
    """What the node loop needs from the cluster store."""

    @property
    def safe_lease_age(self) -> float:
        """Seconds after the last confirmed refresh at which the lease counts as lost."""
        ...

    def publish_status(self, status: NodeStatus, store: Store = Store()) -> None:
        """Write this node's member key (url, state and store) under its lease,
        taking a fresh lease first if there is none."""
        ...

    def read_snapshot(self) -> ClusterSnapshot:
        """Leader, members and handover target, read at one revision."""
        ...

    def campaign(self, sync: frozenset[str], sync_revision: int) -> int | None:
        """Create the leader key under this node's lease if there is none, the
        handover target is absent or this node, and the sync key is still at
        ``sync_revision`` (0: absent); write the sync set ``sync`` in the same
        transaction.  Return the new term, or None if the conditions failed."""
        ...

    def update_sync(self, term: int, members: frozenset[str]) -> bool:
        """Write the sync set, only while this node holds the leader key of ``term``; True if written."""
        ...

    def force_sync(self) -> bool:
        """Operator's choice after a whole-cluster restart: while there is no leader, make the sync set this
        node alone, so it may start the cluster without the absent members; True if written."""
        ...

    def resign(self, term: int) -> bool:
        """Delete the leader key if its term is ``term``; True if deleted."""
        ...

    def set_handover(self, target: str, ttl: int) -> None:
        """Name the node that alone may campaign next, for ``ttl`` seconds."""
        ...

    def clear_handover(self) -> None:
        """Remove the handover target."""
        ...

    def watch(self) -> bool:
        """Start calling ``notify(CLUSTER_CHANGED)`` on changes to the cluster;
        True if the watch is already established."""
        ...

    def lease_confirmed_within(self, seconds: float) -> bool:
        """True if a lease refresh sent at most ``seconds`` ago was confirmed."""
        ...

    def last_lease_confirmation(self) -> float | None:
        """``time.monotonic()`` at which the last confirmed refresh was sent."""
        ...

    def revoke_lease(self) -> None:
        """Graceful stop: drop the lease, and with it every key it carries."""
        ...

    def close(self) -> None:
        """Stop the threads and the connection; a lease not revoked expires."""
        ...


class LeasedCoordinator(ABC):
    """The lease bookkeeping every coordinator shares: its checks, its defaults, and the lease queries.

    ``lease_ttl``: requested TTL in whole seconds.  ``lease_margin``: how long before the earliest possible
    server-side expiry a primary must already have stepped down (``settings.LEASE_MARGIN``); both are checked
    against ``settings`` (``SettingError``, a ``ValueError``).  A subclass keeps the lease
    itself and answers ``_lease_ttl``, ``_confirmed_at`` and ``_now``; the public queries of ``Coordinator``
    (``safe_lease_age``, ``lease_confirmed_within``, ``last_lease_confirmation``) are computed here only.
    """

    def __init__(self, lease_ttl: int = settings.LEASE_TTL.default,
                 lease_margin: float = settings.LEASE_MARGIN.default) -> None:
        settings.check_lease(lease_ttl, lease_margin)  # the CLI checked them already: the last line of defence
        self._requested_ttl = lease_ttl
        self._margin = lease_margin

    @property
    def safe_lease_age(self) -> float:
        """Seconds after the last confirmed refresh at which the lease counts as lost: its TTL less the margin."""
        return self._lease_ttl() - self._margin

    def lease_confirmed_within(self, seconds: float) -> bool:
        """True if a lease refresh sent at most ``seconds`` ago was confirmed."""
        confirmed = self.last_lease_confirmation()
        return confirmed is not None and self._now() - confirmed <= seconds

    def last_lease_confirmation(self) -> float | None:
        """When the last confirmed refresh was sent (``_now``'s clock); None without a lease."""
        return self._confirmed_at()

    def _unconfirmed_at(self, confirmed_at: float, ttl: float) -> float:
        """When a lease of ``ttl`` last confirmed at ``confirmed_at`` stops counting as confirmed (the fence closes)."""
        return confirmed_at + ttl - self._margin

    @abstractmethod
    def _lease_ttl(self) -> float:
        """The current lease's TTL as granted, or the requested one while there is none."""

    @abstractmethod
    def _confirmed_at(self) -> float | None:
        """When the current lease's last confirmed refresh was sent; None while there is no lease."""

    @abstractmethod
    def _now(self) -> float:
        """The clock that confirmations are read on (``time.monotonic()``; a fake's own)."""
