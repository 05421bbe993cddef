"""A set of replication ids kept as sorted, disjoint ranges.

Replication ids name messages across nodes (Qpid QPID-4348).  Sets of them
travel in two places: on (re)subscribe the backup sends the ids it holds, and
the primary answers with dequeues for ``backup - primary`` and skips
``backup & primary``; and dequeues reach backups as batched id sets.  Queues
are mostly contiguous runs of ids, so a set is stored as the boundaries of its
runs and every operation costs per *range*, never per id: a million contiguous
ids are one range.

Internally the runs are half-open ``[start, stop)`` pairs in one flat, strictly
increasing list ``[start1, stop1, start2, stop2, ...]``.  An id is in the set
exactly when an odd number of boundaries are ``<=`` it, so membership, insertion
and removal are one or two bisections and one slice assignment, and the
strictly increasing form is canonical (touching runs are always merged), which
makes equality a list comparison.  The wire form is the same list with closed
ranges: ``[lo1, hi1, lo2, hi2, ...]``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Callable, Iterable, Iterator, Sequence


class IdSet:
    """A mutable set of positive replication ids, stored as ranges."""

    __slots__ = ("_bounds",)
    __hash__ = None  # type: ignore[assignment]  # mutable

    def __init__(self) -> None:
        self._bounds: list[int] = []

    # -- building ------------------------------------------------------------

    @classmethod
    def from_ids(cls, ids: Iterable[int]) -> "IdSet":
        """The set of ``ids`` (any order, duplicates allowed).

        Sorting and de-duplication run in C; runs are then found by galloping,
        so a sorted contiguous million ids cost a few dozen Python steps.
        """
        values = sorted(set(ids))
        if values and values[0] < 1:
            raise ValueError(f"replication ids are positive, got {values[0]!r}")
        result = cls()
        result._bounds = _runs(values)
        return result

    @classmethod
    def from_increasing(cls, ids: Sequence[int]) -> "IdSet":
        """The set of ``ids``, which the caller knows to be strictly increasing (no sort, no copy).

        A restarted node's journal hands back a million such ids: ``from_ids``
        would hash and sort them all again.
        """
        if ids and ids[0] < 1:
            raise ValueError(f"replication ids are positive, got {ids[0]!r}")
        result = cls()
        result._bounds = _runs(ids)
        return result

    @classmethod
    def from_wire(cls, wire: list[int]) -> "IdSet":
        """Decode ``[lo1, hi1, lo2, hi2, ...]`` (closed, ascending, disjoint ranges).

        Ranges that merely touch (``lo2 == hi1 + 1``) are accepted and merged.
        Raises ValueError naming the first problem found.
        """
        if not isinstance(wire, (list, tuple)):
            raise ValueError(f"an id set on the wire is a list of integers, got {type(wire).__name__}")
        if len(wire) % 2:
            raise ValueError(f"an id set on the wire needs an even number of entries (lo, hi pairs), got {len(wire)}")
        for index, value in enumerate(wire):
            if type(value) is not int:  # bool is an int subclass, and not an id
                raise ValueError(f"id set entry {index} is {value!r}, not an integer")
        bounds: list[int] = []
        previous_hi = 0
        for index in range(0, len(wire), 2):
            lo, hi = wire[index], wire[index + 1]
            pair = index // 2
            if lo < 1:
                raise ValueError(f"id set range {pair} [{lo}, {hi}]: replication ids are positive")
            if lo > hi:
                raise ValueError(f"id set range {pair} [{lo}, {hi}]: lo is greater than hi")
            if lo <= previous_hi:
                raise ValueError(
                    f"id set range {pair} [{lo}, {hi}] overlaps or precedes the range before it"
                    f" (ending at {previous_hi})"
                )
            if bounds and bounds[-1] == lo:
                bounds[-1] = hi + 1
            else:
                bounds += (lo, hi + 1)
            previous_hi = hi
        result = cls()
        result._bounds = bounds
        return result

    def to_wire(self) -> list[int]:
        """``[lo1, hi1, lo2, hi2, ...]``: closed ranges, ascending, never touching."""
        bounds = self._bounds
        wire = bounds[:]
        for index in range(1, len(wire), 2):
            wire[index] -= 1
        return wire

    # -- changing ------------------------------------------------------------

    def add(self, msg_id: int) -> None:
        self.add_range(msg_id, msg_id)

    def add_range(self, lo: int, hi: int) -> None:
        """Add every id from ``lo`` to ``hi`` inclusive."""
        _check_range(lo, hi)
        bounds = self._bounds
        start, stop = lo, hi + 1
        i = bisect_left(bounds, start)
        j = bisect_right(bounds, stop)
        # An odd index means that end lies inside (or touches) an existing run, which absorbs it.
        bounds[i:j] = ([start] if i % 2 == 0 else []) + ([stop] if j % 2 == 0 else [])

    def discard(self, msg_id: int) -> None:
        """Remove ``msg_id`` if present."""
        _check_range(msg_id, msg_id)
        bounds = self._bounds
        start, stop = msg_id, msg_id + 1
        i = bisect_left(bounds, start)
        j = bisect_right(bounds, stop)
        # The mirror image of add_range: an odd index cuts a run, so it becomes a boundary.
        bounds[i:j] = ([start] if i % 2 else []) + ([stop] if j % 2 else [])

    def discard_range(self, lo: int, hi: int) -> None:
        """Remove every id from ``lo`` to ``hi`` inclusive (those present)."""
        _check_range(lo, hi)
        bounds = self._bounds
        start, stop = lo, hi + 1
        i = bisect_left(bounds, start)
        j = bisect_right(bounds, stop)
        bounds[i:j] = ([start] if i % 2 else []) + ([stop] if j % 2 else [])

    # -- reading ------------------------------------------------------------

    def boundary_after(self, msg_id: int) -> tuple[bool, int | None]:
        """Whether ``msg_id`` is in the set, and the first id above it where that changes (None: never).

        Inside a run that is the run's end (exclusive), outside it the next run's start: every id from
        ``msg_id`` up to it is in the set, or none is.
        """
        bounds = self._bounds
        index = bisect_right(bounds, msg_id)
        return index % 2 == 1, bounds[index] if index < len(bounds) else None

    def __contains__(self, msg_id: object) -> bool:
        if type(msg_id) is not int:
            return False
        return bisect_right(self._bounds, msg_id) % 2 == 1

    def __bool__(self) -> bool:
        """Cheaper than ``len``: an empty set has no bounds."""
        return bool(self._bounds)

    def __len__(self) -> int:
        bounds = self._bounds
        return sum(bounds[1::2]) - sum(bounds[0::2])

    def __iter__(self) -> Iterator[int]:
        bounds = self._bounds
        for index in range(0, len(bounds), 2):
            yield from range(bounds[index], bounds[index + 1])

    def ranges(self) -> Iterator[tuple[int, int]]:
        """The runs of the set as closed ``(lo, hi)`` pairs, ascending."""
        bounds = self._bounds
        for index in range(0, len(bounds), 2):
            yield bounds[index], bounds[index + 1] - 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IdSet):
            return NotImplemented
        return self._bounds == other._bounds

    def __repr__(self) -> str:
        runs = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges())
        return f"IdSet({runs})"

    def copy(self) -> "IdSet":
        result = IdSet()
        result._bounds = self._bounds[:]
        return result

    def below(self, limit: int | None) -> "IdSet":
        """The ids smaller than ``limit`` (all of them for None): what a lineage check still trusts."""
        result = IdSet()
        if limit is None:
            result._bounds = self._bounds[:]
            return result
        bounds = self._bounds
        index = bisect_left(bounds, limit)
        result._bounds = bounds[:index] + ([limit] if index % 2 else [])
        return result

    # -- set algebra ----------------------------------------------------------

    def __or__(self, other: "IdSet") -> "IdSet":
        if not isinstance(other, IdSet):
            return NotImplemented
        return self._combine(other, lambda a, b: a or b)

    def __and__(self, other: "IdSet") -> "IdSet":
        if not isinstance(other, IdSet):
            return NotImplemented
        return self._combine(other, lambda a, b: a and b)

    def __sub__(self, other: "IdSet") -> "IdSet":
        if not isinstance(other, IdSet):
            return NotImplemented
        return self._combine(other, lambda a, b: a and not b)

    def _combine(self, other: "IdSet", keep: Callable[[bool, bool], bool]) -> "IdSet":
        """Sweep both boundary lists once, emitting a boundary wherever ``keep`` flips."""
        a, b = self._bounds, other._bounds
        len_a, len_b = len(a), len(b)
        i = j = 0
        inside = False
        out: list[int] = []
        while i < len_a or j < len_b:
            if j == len_b or (i < len_a and a[i] <= b[j]):
                point = a[i]
            else:
                point = b[j]
            if i < len_a and a[i] == point:
                i += 1
            if j < len_b and b[j] == point:
                j += 1
            now = keep(i % 2 == 1, j % 2 == 1)
            if now != inside:
                out.append(point)
                inside = now
        result = IdSet()
        result._bounds = out
        return result


def _check_range(lo: int, hi: int) -> None:
    if type(lo) is not int or type(hi) is not int:
        raise TypeError(f"replication ids are integers, got {lo!r} and {hi!r}")
    if lo < 1:
        raise ValueError(f"replication ids are positive, got {lo}")
    if lo > hi:
        raise ValueError(f"empty range: {lo} > {hi}")


def _runs(values: Sequence[int]) -> list[int]:
    """Half-open run boundaries of strictly increasing ``values``.

    ``values[k] - values[start] == k - start`` holds exactly while the run from
    ``start`` is unbroken, so each run's end is found by galloping then bisecting:
    the cost grows with the number of runs and the log of their lengths.
    """
    bounds: list[int] = []
    count = len(values)
    start = 0
    while start < count:
        first = values[start]
        end = start
        step = 1
        while end + step < count and values[end + step] - first == end + step - start:
            end += step
            step *= 2
        hi = min(end + step, count) - 1
        while end < hi:
            mid = (end + hi + 1) // 2
            if values[mid] - first == mid - start:
                end = mid
            else:
                hi = mid - 1
        bounds += (first, values[end] + 1)
        start = end + 1
    return bounds
