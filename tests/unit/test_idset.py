"""IdSet against Python's set on random data, plus edge cases and the wire form."""

from __future__ import annotations

import random

import pytest

from hastandby.broker.queues.idset import IdSet


def random_ids(rng: random.Random, universe: int) -> set[int]:
    """A mix of runs and scattered ids, so sets have both long ranges and single points."""
    ids: set[int] = set()
    for _ in range(rng.randint(0, 6)):
        lo = rng.randint(1, universe)
        ids.update(range(lo, min(universe, lo + rng.randint(0, 20)) + 1))
    ids.update(rng.randint(1, universe) for _ in range(rng.randint(0, 10)))
    return ids


def assert_same(idset: IdSet, expected: set[int]) -> None:
    assert list(idset) == sorted(expected)
    assert len(idset) == len(expected)
    wire = idset.to_wire()
    # Canonical: ranges ascend and never touch or overlap.
    assert all(wire[i] < wire[i + 1] - 1 for i in range(1, len(wire) - 1, 2))
    assert IdSet.from_wire(wire) == idset


def test_mutations_match_python_set():
    rng = random.Random(20240601)
    for _ in range(300):
        universe = rng.choice([10, 60, 500])
        idset, expected = IdSet(), set()
        for _ in range(40):
            op = rng.random()
            if op < 0.35:
                msg_id = rng.randint(1, universe)
                idset.add(msg_id)
                expected.add(msg_id)
            elif op < 0.6:
                lo = rng.randint(1, universe)
                hi = lo + rng.randint(0, 15)
                idset.add_range(lo, hi)
                expected.update(range(lo, hi + 1))
            else:
                msg_id = rng.randint(1, universe)
                idset.discard(msg_id)
                expected.discard(msg_id)
            probe = rng.randint(0, universe + 2)
            assert (probe in idset) == (probe in expected)
        assert_same(idset, expected)


def test_algebra_matches_python_set():
    rng = random.Random(7)
    for _ in range(500):
        universe = rng.choice([15, 100, 1000])
        a, b = random_ids(rng, universe), random_ids(rng, universe)
        set_a, set_b = IdSet.from_ids(a), IdSet.from_ids(b)
        assert_same(set_a, a)
        assert_same(set_a | set_b, a | b)
        assert_same(set_a & set_b, a & b)
        assert_same(set_a - set_b, a - b)
        assert_same(set_b - set_a, b - a)
        assert (set_a == set_b) == (a == b)
        assert set_a == IdSet.from_ids(sorted(a, reverse=True))


def test_catch_up_split():
    backup = IdSet.from_ids([1, 2, 3, 4, 5, 9, 10])
    primary = IdSet.from_ids([4, 5, 6, 7, 8, 9])
    assert list(backup - primary) == [1, 2, 3, 10]  # to send as dequeues
    assert list(backup & primary) == [4, 5, 9]  # to skip


def test_edge_cases():
    empty = IdSet()
    assert len(empty) == 0 and not empty and list(empty) == [] and empty.to_wire() == []
    assert 0 not in empty and 1 not in empty and "1" not in empty
    assert empty == IdSet.from_ids([]) == IdSet.from_wire([])
    s = IdSet()
    s.add_range(5, 7)
    s.add_range(1, 3)
    s.add(4)  # fills the gap: one run
    assert list(s.ranges()) == [(1, 7)]
    s.discard(1)
    s.discard(7)
    s.discard(4)
    s.discard(100)
    assert list(s.ranges()) == [(2, 3), (5, 6)]
    s.add_range(1, 10)
    assert list(s.ranges()) == [(1, 10)]
    assert repr(IdSet.from_ids([1, 2, 3, 7])) == "IdSet(1-3, 7)"
    assert IdSet() != [1]
    with pytest.raises(TypeError):
        hash(IdSet())
    with pytest.raises(ValueError):
        IdSet().add(0)
    with pytest.raises(ValueError):
        IdSet().add_range(5, 4)
    with pytest.raises(TypeError):
        IdSet().add(True)
    with pytest.raises(ValueError):
        IdSet.from_ids([3, 0])


def test_contiguous_ids_cost_nothing_per_id():
    """Ranges far larger than memory would allow per-id work still take no time."""
    huge = IdSet()
    huge.add_range(1, 10**15)
    huge.discard(500)
    other = IdSet()
    other.add_range(10**14, 2 * 10**15)
    assert len(huge) == 10**15 - 1
    assert (huge & other).to_wire() == [10**14, 10**15]
    assert (huge - other).to_wire() == [1, 499, 501, 10**14 - 1]
    assert len(huge | other) == 2 * 10**15 - 1
    assert 10**15 in huge and 500 not in huge


def test_from_ids_finds_runs_of_a_million():
    ids = list(range(1, 1_000_001))
    del ids[500_000]  # id 500001 consumed
    s = IdSet.from_ids(ids)
    assert s.to_wire() == [1, 500_000, 500_002, 1_000_000]
    assert len(s) == 999_999


def test_wire_round_trip_and_touching_ranges_merge():
    assert IdSet.from_wire([1, 3, 4, 6, 9, 9]).to_wire() == [1, 6, 9, 9]
    s = IdSet.from_wire([2, 2, 5, 8])
    assert list(s) == [2, 5, 6, 7, 8]
    assert IdSet.from_wire(s.to_wire()) == s


@pytest.mark.parametrize(
    "wire,message",
    [
        ("1,2", "list of integers"),
        ({1: 2}, "list of integers"),
        ([1], "even number"),
        ([1, 2, 3], "even number"),
        ([1, "2"], "entry 1"),
        ([1.0, 2], "entry 0"),
        ([True, 2], "entry 0"),
        ([0, 2], "positive"),
        ([-3, -1], "positive"),
        ([5, 4], "lo is greater than hi"),
        ([1, 5, 5, 8], "overlaps"),
        ([1, 5, 3, 4], "overlaps"),
        ([6, 8, 1, 2], "precedes"),
    ],
)
def test_invalid_wire_is_refused(wire, message):
    with pytest.raises(ValueError, match=message):
        IdSet.from_wire(wire)


def test_below_cuts_at_a_limit():
    ids = IdSet.from_ids([1, 2, 3, 7, 8, 20])
    assert ids.below(None) == ids
    assert ids.below(8) == IdSet.from_ids([1, 2, 3, 7])
    assert ids.below(7) == IdSet.from_ids([1, 2, 3])
    assert ids.below(3) == IdSet.from_ids([1, 2])
    assert ids.below(1) == IdSet()
    assert ids.below(100) == ids
    assert ids.below(8) is not ids


def test_discard_range_matches_discarding_each_id():
    rng = random.Random(11)
    for _ in range(300):
        universe = rng.randint(1, 60)
        values = random_ids(rng, universe)
        lo = rng.randint(1, universe + 3)
        hi = rng.randint(lo, universe + 5)
        ids = IdSet.from_ids(values)
        ids.discard_range(lo, hi)
        assert ids == IdSet.from_ids(values - set(range(lo, hi + 1))), (sorted(values), lo, hi)
    with pytest.raises(ValueError):
        IdSet().discard_range(5, 4)


def test_boundary_after_says_how_far_membership_holds():
    ids = IdSet.from_ids([3, 4, 5, 9])
    assert ids.boundary_after(1) == (False, 3)
    assert ids.boundary_after(3) == (True, 6)
    assert ids.boundary_after(5) == (True, 6)
    assert ids.boundary_after(6) == (False, 9)
    assert ids.boundary_after(9) == (True, 10)
    assert ids.boundary_after(10) == (False, None)
    assert IdSet().boundary_after(1) == (False, None)
    rng = random.Random(12)
    for _ in range(200):
        values = random_ids(rng, 40)
        ids = IdSet.from_ids(values)
        msg_id = rng.randint(1, 45)
        inside, boundary = ids.boundary_after(msg_id)
        assert inside == (msg_id in values)
        end = boundary if boundary is not None else 60
        assert all((i in values) == inside for i in range(msg_id, end))
        if boundary is not None:
            assert (boundary in values) != inside


@pytest.mark.parametrize("ids", [[], [1], [1, 2, 3, 7, 8, 20], list(range(5, 100_005)) + [200_000]])
def test_from_increasing_equals_from_ids(ids):
    assert IdSet.from_increasing(ids) == IdSet.from_ids(ids)
