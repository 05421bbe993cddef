"""``hastandby verify``'s comparison of two copies of a queue (pure)."""

from __future__ import annotations

from hastandby.verify import Copy, Difference, compare, persistent

LINEAGE = ((3, "n1", 1), (9, "n2", 6))


def test_equal_copies_have_no_difference():
    copy = Copy(LINEAGE, {1: "aa", 2: "bb"})
    assert compare("q", "b:1", copy, Copy(LINEAGE, dict(copy.digests))) == []


def test_every_kind_of_difference_is_named():
    primary = Copy(LINEAGE, {1: "aa", 2: "bb", 3: "cc"})
    backup = Copy(LINEAGE[:1], {2: "XX", 3: "cc", 4: "dd"})
    found = {d.kind: d for d in compare("q", "b:1", primary, backup)}
    assert set(found) == {"lineage", "bytes", "missing", "extra"}
    assert found["bytes"].ids == (2,) and found["missing"].ids == (1,) and found["extra"].ids == (4,)
    assert "different bytes under the same id (1: 2)" in str(found["bytes"])


def test_only_differences_seen_twice_persist():
    """Ids in flight on a live cluster come and go; a wrong body or lineage stays."""
    first = [Difference("q", "b", "missing", (5, 6)), Difference("q", "b", "bytes", (2,)),
             Difference("q", "b", "extra", (9,))]
    second = [Difference("q", "b", "missing", (6, 7)), Difference("q", "b", "bytes", (2,)),
              Difference("q", "b", "lineage", detail="new")]
    assert persistent(first, second) == [Difference("q", "b", "missing", (6,)), Difference("q", "b", "bytes", (2,))]
