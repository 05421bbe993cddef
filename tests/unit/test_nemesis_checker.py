"""The nemesis checker on hand-built histories and browses (no I/O)."""

from __future__ import annotations

import dataclasses

import pytest

from hastandby.testing.checker import QueueVerdict, ReplicaDiff, check_total_queue, compare_replicas


def test_a_clean_history_is_valid():
    verdict = check_total_queue(["a", "b", "c"], ["a", "b", "c"], ["c", "a", "b"])
    assert verdict.valid
    assert (verdict.attempted, verdict.acknowledged, verdict.received) == (3, 3, 3)
    assert not (verdict.lost or verdict.unexpected or verdict.duplicated or verdict.recovered)


def test_an_acknowledged_message_never_received_is_lost():
    verdict = check_total_queue(["a", "b"], ["a", "b"], ["a"])
    assert not verdict.valid
    assert verdict.lost == {"b"}


def test_a_message_nobody_sent_is_unexpected():
    verdict = check_total_queue(["a"], ["a"], ["a", "zz"])
    assert not verdict.valid
    assert verdict.unexpected == {"zz"}


def test_duplicates_are_allowed_and_counted():
    verdict = check_total_queue(["a", "b"], ["a", "b"], ["a", "a", "a", "b"])
    assert verdict.valid
    assert verdict.duplicated == {"a"}
    assert verdict.duplicates == 2
    assert verdict.received == 4


def test_attempted_twice_received_twice_is_still_a_duplicate():
    """A re-send of an in-doubt message is one more attempt; two copies arriving are one extra copy."""
    verdict = check_total_queue(["a", "a"], ["a"], ["a", "a"])
    assert verdict.valid and verdict.attempted == 1 and verdict.duplicates == 1


def test_received_but_never_acknowledged_is_recovered_not_an_error():
    verdict = check_total_queue(["a", "b", "c"], ["a"], ["a", "b"])
    assert verdict.valid
    assert verdict.recovered == {"b"}
    assert verdict.lost == set()


def test_attempted_never_acknowledged_never_received_is_fine():
    assert check_total_queue(["a", "b"], ["a"], ["a"]).valid


def test_lost_and_recovered_at_once_like_the_known_bug():
    """A rejoined node serves the in-doubt messages it held instead of the acknowledged ones."""
    attempted = [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)]
    acknowledged = [f"b{i}" for i in range(20)]
    received = [f"a{i}" for i in range(20)]
    verdict = check_total_queue(attempted, acknowledged, received)
    assert not verdict.valid
    assert len(verdict.lost) == 20 and len(verdict.recovered) == 20
    assert verdict.counts() == {"valid": False, "attempted": 40, "acknowledged": 20, "received": 20, "lost": 20,
                                "unexpected": 0, "duplicated": 0, "duplicates": 0, "recovered": 20}


def test_the_verdict_reads_well_and_is_frozen():
    verdict = check_total_queue(["a", "b"], ["a", "b"], ["a", "x"])
    text = str(verdict)
    assert text.startswith("INVALID: 2 acknowledged of 2 attempted, 2 received; lost 1, unexpected 1")
    assert "lost: b" in text and "unexpected: x" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.lost = frozenset()  # type: ignore[misc]
    assert isinstance(verdict, QueueVerdict)


def test_long_id_lists_are_cut_in_the_text():
    ids = [f"m{i:03d}" for i in range(30)]
    text = str(check_total_queue(ids, ids, []))
    assert "and 20 more" in text


def test_empty_history_is_valid():
    assert check_total_queue([], [], []).valid


def test_identical_replicas_have_no_diff():
    primary = {"q": {1: b"x", 2: b"y"}}
    assert compare_replicas(primary, {"n2": {"q": {1: b"x", 2: b"y"}}}) == []


def test_replica_missing_differing_and_extra_ids():
    primary = {"q": {1: b"x", 2: b"y", 3: b"z"}}
    backups = {"n2": {"q": {1: b"x", 2: b"Y", 4: b"w"}}, "n3": {"q": {1: b"x", 2: b"y", 3: b"z"}}}
    [diff] = compare_replicas(primary, backups)
    assert diff == ReplicaDiff(queue="q", backup="n2", missing=(3,), differing=(2,), extra=(4,))
    assert diff.mismatches == 2
    assert str(diff) == "n2 q: missing 1 (3) different bytes 1 (2) extra 1 (4)"


def test_extra_ids_alone_are_no_mismatch():
    [diff] = compare_replicas({"q": {1: b"x"}}, {"n2": {"q": {1: b"x", 2: b"y"}}})
    assert diff.extra == (2,) and diff.mismatches == 0


def test_a_queue_the_backup_lacks_counts_as_empty():
    [diff] = compare_replicas({"q": {1: b"x"}, "r": {}}, {"n2": {}})
    assert diff.queue == "q" and diff.missing == (1,)


def test_a_backup_with_another_lineage_is_a_mismatch_even_with_the_same_ids():
    primary = {"q": {1: "aa"}}
    diffs = compare_replicas(primary, {"n2": {"q": {1: "aa"}}}, {"q": ((5, "n1", 1),)},
                             {"n2": {"q": ((5, "n1", 1), (9, "n2", 2))}})
    assert len(diffs) == 1 and diffs[0].lineage and diffs[0].mismatches == 1
    assert "a different lineage" in str(diffs[0])
    assert compare_replicas(primary, {"n2": {"q": {1: "aa"}}}, {"q": ((5, "n1", 1),)},
                            {"n2": {"q": ((5, "n1", 1),)}}) == []
