"""Queue lineages: which primary assigned which ids, and where two copies stop agreeing."""

from __future__ import annotations

import pytest

from hastandby.broker.queues.lineage import Epoch, divergence, epoch_of, extended, from_wire, to_wire

A5 = Epoch(5, "a", 1)


def test_epoch_of_is_a_step_function():
    lineage = (A5, Epoch(9, "b", 6))
    assert epoch_of(lineage, 1) == (5, "a")
    assert epoch_of(lineage, 5) == (5, "a")
    assert epoch_of(lineage, 6) == (9, "b")
    assert epoch_of(lineage, 10**9) == (9, "b")
    assert epoch_of((Epoch(3, "a", 10),), 9) is None
    assert epoch_of((), 1) is None


def test_identical_lineages_never_diverge():
    lineage = (A5, Epoch(9, "b", 6))
    assert divergence(lineage, lineage) is None


def test_a_frozen_primary_diverges_where_its_successor_began():
    """The issue's mechanism: the frozen primary kept assigning under term 5 from id 6 on."""
    frozen = (A5,)
    successor = (A5, Epoch(9, "b", 6))
    assert divergence(frozen, successor) == 6
    assert divergence(successor, frozen) == 6


def test_a_backup_that_missed_a_promotion_diverges_at_it():
    backup = (A5, Epoch(9, "b", 6))
    primary = (A5, Epoch(9, "b", 6), Epoch(11, "c", 30))
    # The backup may hold ids >= 30 that b gave out and c never had.
    assert divergence(backup, primary) == 30


def test_same_term_on_two_nodes_is_two_epochs():
    """Two manual promotions that picked the same term are told apart by the node."""
    assert divergence((A5, Epoch(6, "b", 9)), (A5, Epoch(6, "c", 9))) == 9


def test_nothing_in_common_diverges_at_the_first_epoch():
    assert divergence((), (A5,)) == 1
    assert divergence((Epoch(1, "x", 1),), (A5,)) == 1
    assert divergence((), ()) is None


def test_extended_appends_a_promotion():
    assert extended((A5,), Epoch(9, "b", 6)) == (A5, Epoch(9, "b", 6))


def test_extended_replaces_epochs_that_assigned_nothing():
    """A promotion at or below a later epoch's start: that epoch gave out nothing this node holds."""
    lineage = (A5, Epoch(9, "b", 26))
    assert extended(lineage, Epoch(11, "c", 20)) == (A5, Epoch(11, "c", 20))
    assert extended(lineage, Epoch(11, "c", 26)) == (A5, Epoch(11, "c", 26))


def test_extended_is_idempotent_for_the_same_epoch():
    lineage = (A5, Epoch(9, "b", 6))
    assert extended(lineage, Epoch(9, "b", 8)) == lineage


def test_wire_round_trip():
    lineage = (A5, Epoch(9, "b", 6))
    assert from_wire(to_wire(lineage)) == lineage
    assert from_wire(None) == ()
    assert from_wire([]) == ()


@pytest.mark.parametrize(
    "wire, message",
    [
        ("x", "is a list"),
        ([[1, "a"]], "entry 0 is not"),
        ([[1, "a", 0]], "first id >= 1"),
        ([[-1, "a", 1]], "term >= 0"),
        ([[True, "a", 1]], "term >= 0"),
        ([[1, "", 1]], "needs a node id"),
        ([[1, "a", 5], [2, "b", 5]], "does not start after"),
    ],
)
def test_bad_wire_lineages_are_refused_by_name(wire, message):
    with pytest.raises(ValueError, match=message):
        from_wire(wire)


def test_terms_and_ids_that_do_not_fit_an_amqp_long_are_refused():
    """A lying primary's lineage with a term of 2**64 was adopted, then could not be encoded on the next attach."""
    import pytest

    from hastandby.broker.queues.lineage import from_wire

    for wire in ([[2**63, "a", 1]], [[1, "a", 2**63]]):
        with pytest.raises(ValueError, match="below 2"):
            from_wire(wire)
