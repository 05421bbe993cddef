"""What an operator's ``PROMOTE`` does, decided from the node's status alone: the manual twin of ``decide()``.

``decide()`` is what the election loop does each cycle; this is what a
``hastandby promote`` asks of one node.  Both are pure, so every rule is
unit-tested without a broker or etcd; ``HaNode`` carries the plan out.

Rules, in order: a primary is already promoted (Qpid ignores it too); a
halted node, or one still catching up, is refused.  With etcd the election
stays the only way to primary: a ``backup`` asks the primary to hand over to
it, and ``--force`` lets a ``connecting`` node start a restarted cluster
without the absent sync members.  Without etcd the operator is the election:
a ``backup`` is promoted at once, and a ``connecting`` node only after no
other reachable node turns out to be past ``connecting`` (a brand-new
cluster, where nobody holds data to lose).  The new term is one past every
term this node knows.  A node whose journal was damaged, and that has not
caught up since, lacks acknowledged messages: only ``--force``, an operator
who accepts the loss, promotes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hastandby.lifecycle.states import Event, NodeStatus, State


@dataclass(frozen=True)
class AlreadyPrimary:
    """Nothing to do."""


@dataclass(frozen=True)
class Refuse:
    """Not promotable now; ``reason`` goes back to the operator."""

    reason: str


@dataclass(frozen=True)
class HandOver:
    """With etcd: name this node the handover target; the primary steps down and this node wins."""


@dataclass(frozen=True)
class ForceStart:
    """With etcd, ``--force``: make the sync set this node alone, so that it may start a restarted cluster."""


@dataclass(frozen=True)
class PromoteNow:
    """Without etcd: fire ``event`` with a new term (``operator_term``)."""

    event: Event


@dataclass(frozen=True)
class CheckThenPromote:
    """Without etcd, a ``connecting`` node: ask every other node first; promote only if none is past connecting."""

    event: Event = Event.PROMOTED_BY_OPERATOR_NEW_CLUSTER


Promotion = AlreadyPrimary | Refuse | HandOver | ForceStart | PromoteNow | CheckThenPromote


def plan_promotion(status: NodeStatus, halted: str | None, with_etcd: bool, force: bool,
                   damaged: str | None = None) -> Promotion:
    """The operator's ``PROMOTE`` (``force``: ``promote --force``) for a node in ``status``; ``damaged``: what
    its damaged journal lost, if it has not recovered it."""
    state = status.state
    if state is State.PRIMARY:
        return AlreadyPrimary()
    if halted:
        return Refuse(f"replication is halted: {halted}")
    if state is State.CATCHUP:
        return Refuse("still catching up, cannot be promoted")
    if state is State.STOPPED:
        return Refuse("the node is stopping")
    if damaged and not force:
        return Refuse(f"this node's journal was damaged and it lacks data ({damaged}): it catches up from a healthy "
                      "primary before it may be promoted; promote --force starts with what it has and loses the rest")
    if with_etcd:
        if force:
            if state is not State.CONNECTING:
                return Refuse(f"--force starts a restarted cluster; this node is {state}")
            return ForceStart()
        if state is not State.BACKUP:
            return Refuse(f"only a caught-up backup can take over; this node is {state}")
        return HandOver()
    if state is State.BACKUP:
        return PromoteNow(Event.PROMOTED_BY_OPERATOR)
    return CheckThenPromote()


def operator_term(status: NodeStatus, member_terms: Iterable[int]) -> int:
    """The term an operator's promotion takes without etcd: one past every term this node has seen or heard of."""
    return max([status.term, *member_terms]) + 1
