"""An operator's PROMOTE, planned from the node's status alone (lifecycle/promotion.py)."""

from __future__ import annotations

import pytest

from hastandby.lifecycle.promotion import (
    AlreadyPrimary,
    CheckThenPromote,
    ForceStart,
    HandOver,
    PromoteNow,
    Refuse,
    operator_term,
    plan_promotion,
)
from hastandby.lifecycle.states import Detail, Event, NodeStatus, State

CONNECTING = NodeStatus(State.CONNECTING, term=3)
CATCHUP = NodeStatus(State.CATCHUP, term=3)
BACKUP = NodeStatus(State.BACKUP, term=3)
PRIMARY = NodeStatus(State.PRIMARY, Detail.ACTIVE, term=3)
STOPPED = NodeStatus(State.STOPPED, term=3)


@pytest.mark.parametrize("with_etcd", [False, True])
@pytest.mark.parametrize("force", [False, True])
def test_a_primary_is_promoted_already_and_a_catching_up_or_halted_node_is_refused(with_etcd: bool,
                                                                                 force: bool) -> None:
    assert plan_promotion(PRIMARY, None, with_etcd, force) == AlreadyPrimary()
    assert plan_promotion(PRIMARY, "a reason", with_etcd, force) == AlreadyPrimary()
    assert plan_promotion(CATCHUP, None, with_etcd, force) == Refuse("still catching up, cannot be promoted")
    assert plan_promotion(BACKUP, "bad term", with_etcd, force) == Refuse("replication is halted: bad term")
    assert isinstance(plan_promotion(STOPPED, None, with_etcd, force), Refuse)


def test_without_etcd_the_operator_is_the_election() -> None:
    assert plan_promotion(BACKUP, None, with_etcd=False, force=False) == PromoteNow(Event.PROMOTED_BY_OPERATOR)
    assert plan_promotion(CONNECTING, None, with_etcd=False, force=False) == CheckThenPromote(
        Event.PROMOTED_BY_OPERATOR_NEW_CLUSTER)
    assert plan_promotion(BACKUP, None, with_etcd=False, force=True) == PromoteNow(Event.PROMOTED_BY_OPERATOR)


def test_with_etcd_a_backup_asks_for_a_handover_and_force_starts_only_a_connecting_node() -> None:
    assert plan_promotion(BACKUP, None, with_etcd=True, force=False) == HandOver()
    assert plan_promotion(CONNECTING, None, with_etcd=True, force=False) == Refuse(
        "only a caught-up backup can take over; this node is connecting")
    assert plan_promotion(CONNECTING, None, with_etcd=True, force=True) == ForceStart()
    assert plan_promotion(BACKUP, None, with_etcd=True, force=True) == Refuse(
        "--force starts a restarted cluster; this node is backup")


def test_the_operators_term_is_one_past_every_term_known() -> None:
    assert operator_term(BACKUP, []) == 4
    assert operator_term(BACKUP, [1, 7, 2]) == 8
    assert operator_term(NodeStatus(State.BACKUP, term=9), [1, 7]) == 10


def test_a_node_whose_journal_lost_data_is_promoted_only_by_force() -> None:
    for with_etcd in (True, False):
        refused = plan_promotion(CONNECTING, None, with_etcd, False, damaged="lost 4096 bytes")
        assert isinstance(refused, Refuse) and "lost 4096 bytes" in refused.reason and "--force" in refused.reason
    assert plan_promotion(CONNECTING, None, True, True, damaged="lost 4096 bytes") == ForceStart()
    assert plan_promotion(CONNECTING, None, False, True, damaged="lost 4096 bytes") == CheckThenPromote()
