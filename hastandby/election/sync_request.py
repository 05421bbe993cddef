"""The ``--min-sync`` round trip between the reactor and the election thread, written once: ``SyncRequest``.

The sync set (``cluster.py``) names the nodes that hold every acknowledged
message, the only ones that may be elected.  A primary under ``--min-sync``
must not acknowledge without a backup while etcd still names that backup
(it could be elected holding less), and must not count on a backup before
etcd names it.  The set is the primary's replication's to want and etcd's to
hold, so one request goes round the two threads:

0. election thread: an election is won with the sync set etcd held; its
   other members (``won_with``) may hold what the last primary acknowledged,
   so the new primary guards for them (``HaNode._serve_backups``).  Set
   before the win is handed to the reactor, read there;
1. reactor thread: the primary's replication (``PrimaryRole``) ``want``\\s the
   set it needs now (itself, its expected and ready backups, and leaving ones
   kept for ``min_sync``), each time that set changes, naming its term and
   what to call once etcd holds it;
2. election thread: each cycle ``decide()`` compares ``wanted`` with the set
   etcd holds and, if they differ, the loop writes it (``UpdateSync``: only
   the leader of that term may);
3. election thread: etcd took it, the loop calls ``written``, which hands the
   confirmation to the reactor (and the loop runs again at once: the wanted
   set may have moved on meanwhile);
4. reactor thread: the primary of that term, if it still is one, is told
   (``PrimaryRole.sync_confirmed``): leaving backups outside the set let go
   of what they held, and the quorum hold follows the set's size.  A
   confirmation for an older term, or after the primary stepped down
   (``withdraw``), is dropped.

Only ``wanted`` and ``won_with`` cross threads, frozen sets rebound whole;
the rest is the reactor's.  The election loop makes calls on it, but not vice-versa.
"""

from __future__ import annotations

from collections.abc import Callable

Confirm = Callable[[frozenset[str]], None]


class SyncRequest:
    """One node's request for a sync set in etcd; see the module doc for who calls what, on which thread."""

    def __init__(self, call_soon_threadsafe: Callable[[Callable[[], None]], None]) -> None:
        self._call_soon_threadsafe = call_soon_threadsafe
        self.wanted: frozenset[str] | None = None  # rebound whole: the election thread reads it
        self.won_with: frozenset[str] = frozenset()  # the other sync members of the last election won
        self._term = 0
        self._confirm: Confirm | None = None

    # -- the reactor thread ------------------------------------------------------------------

    def want(self, term: int, members: frozenset[str], confirm: Confirm) -> None:
        """The primary of ``term`` wants ``members`` in etcd; ``confirm`` is told (on this thread) once etcd holds
        a set it wrote."""
        self._term, self._confirm = term, confirm
        self.wanted = members

    def withdraw(self) -> None:
        """The primary stepped down: it wants nothing, and hears of no write still on its way."""
        self.wanted, self._confirm = None, None

    def _confirmed(self, term: int, members: frozenset[str]) -> None:
        if self._confirm is not None and self._term == term:
            self._confirm(members)

    # -- the election thread -----------------------------------------------------------------

    def won(self, others: frozenset[str]) -> None:
        """An election was won with the sync set {this node} | ``others``: the new primary guards for those."""
        self.won_with = others

    def written(self, term: int, members: frozenset[str]) -> None:
        """etcd holds ``members`` as the sync set, written as the leader of ``term``: tell the primary."""
        self._call_soon_threadsafe(lambda: self._confirmed(term, members))
