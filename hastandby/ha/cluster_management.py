"""What a cluster node adds to management: ``PROMOTE``, a backup's guard on replicated objects, and the ``ha``
parts of ``STATUS`` and ``QUERY``.

Kept apart from ``HaNode`` (the role and its state table) because these are
the operator's door, not the node's role: what an operator's promotion is
allowed to do is ``promotion.plan_promotion``'s pure decision, and this class
carries the plan out (a handover through etcd, a forced start, a promotion
now or after asking the other nodes).  A backup's admins may read it (browse,
query) but not change what the primary replicates to it.

What it needs of the node is ``ManagedNode`` (``HaNode`` is the real one), as
``admission.ClusterRole`` and ``election.ElectedNode`` are for theirs: the
standing (``lifecycle/standing.py``), the role object (``roles.Role``: the
primary it follows, its members and replication figures),
and the election loop's two operator requests (``OperatorElection``); it never
touches the coordinator or a role's replication itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, assert_never

import structlog
from proton import Link, Terminus

from hastandby import settings
from hastandby.broker.errors import BrokerError, NotAllowed, NotPrimary
from hastandby.broker.management import MUTATING, Deferred, Request
from hastandby.broker.transport.address import Address
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import REPLICATE
from hastandby.client import Login, ManagementClient, ManagementError
from hastandby.node import Node

from hastandby.election.cluster import ClusterSnapshot
from hastandby.election.coordinator import CoordinatorError
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
from hastandby.ha.admission import ClusterRole
from hastandby.lifecycle.states import Event

log = structlog.get_logger("hastandby.ha")

CLUSTER_STATE = frozenset({"USER-ADD", "USER-PASSWD", "USER-DEL", "ACL-RELOAD"})
"""Operations on what every node shares (ha/access_replica.py): a backup sends them to the primary."""


class NotPromotable(BrokerError):
    condition = "amqp:precondition-failed"
    status = 409


class OperatorElection(Protocol):
    """What an operator's promotion asks of the election loop (``election.ElectionLoop``)."""

    @property
    def snapshot(self) -> ClusterSnapshot | None:
        """The cluster as the loop read it last; None before the first read, or when etcd was unreadable."""
        ...

    def hand_over(self, target: str, ttl: int) -> None:
        """Name ``target`` the handover target for ``ttl`` seconds (on the election thread)."""
        ...

    def force_sync(self, answer: Callable[[bool | CoordinatorError], None]) -> None:
        """Make the sync set this node alone while there is no leader; ``answer`` is told (on the election
        thread) whether it was written, or etcd's error."""
        ...


class ManagedNode(ClusterRole, Protocol):
    """What the management hooks need of the cluster node (``HaNode``): what admission needs (its url,
    standing, status and role: QUERY shows the role's members and replication), and the operator's levers."""

    @property
    def election(self) -> OperatorElection | None:
        """The election loop with etcd; None without (the operator is the election then)."""
        ...

    def fire(self, event: Event, term: int | None = None) -> bool: ...

    def publish_status(self) -> None:
        """Have the election loop write the member key again (its store changed)."""
        ...

    def other_addresses(self) -> list[Address]: ...

    def member_addresses(self) -> list[str]: ...


class ClusterManagement:
    """The management hooks of one cluster node (``HaNode.management``).

    Contract: the broker's management calls it on the reactor thread; it reads the node's standing and role and
    fires events on the node, which never call it back.  It asks the election loop for a handover or a forced
    sync set; the loop's thread answers the latter, and the answer is handed to the reactor
    (``call_soon_threadsafe``) before it touches the reply.

    ``etcd``: the etcd endpoints the node was given, as STATUS shows them (None without etcd).
    """

    def __init__(self, ha: ManagedNode, node: Node, etcd: str | None = None) -> None:
        self.ha = ha
        self.node = node
        self.etcd = etcd
        management = node.management
        management.guards.append(self.guard)
        management.register("PROMOTE", self.promote)
        management.query_extras["ha"] = self.describe
        node.status_extras.append(self.status)

    def promote(self, request: Request) -> tuple[int, Any] | Deferred:
        """``PROMOTE``: the plan is ``promotion.plan_promotion``'s; this carries it out."""
        ha = self.ha
        force = bool(request.body.get("force"))
        journal = self.node.journal
        damaged = journal.damage_summary() if journal is not None else None
        plan = plan_promotion(ha.status, ha.standing.halted, ha.election is not None, force, damaged)
        match plan:
            case AlreadyPrimary():
                return 200, {"state": "primary", "message": "already primary"}
            case Refuse(reason=reason):
                raise NotPromotable(reason)
            case ForceStart():
                return self._force_start()
            case HandOver():
                return self._hand_over()
            case PromoteNow(event=event):
                return self._promote_now(event)
            case CheckThenPromote(event=event):
                return self._check_then_promote(event, accepting=damaged)
            case _:
                assert_never(plan)

    def _check_then_promote(self, event: Event, accepting: str | None = None) -> Deferred:
        """Ask the other nodes first, off the reactor thread (they may not answer for a while); ``accepting``:
        the loss of a damaged journal that a forced promotion accepts once it is done."""
        reply = Deferred()

        def checked(_: Any, error: Exception | None) -> None:
            try:
                if isinstance(error, BrokerError):
                    raise error
                if error is not None:
                    raise NotPromotable(f"cannot check the other nodes: {error}")
                code, body = self._promote_now(event)
            except BrokerError as failure:
                reply.fail(failure)
                return
            if accepting:
                self._accept_loss()
                body = dict(body, message=f"promoted; what the damaged journal lost is lost: {accepting}")
            reply.resolve(code, body)

        addresses, login = self.ha.other_addresses(), self._peer_login()
        self.node.blocking.run(lambda: _check_fresh_cluster(addresses, login), checked)
        return reply

    def _promote_now(self, event: Event) -> tuple[int, Any]:
        # No primary sends a member's term today (ha/primary.py members()): this is the node's own term + 1.
        term = operator_term(self.ha.status, (m.term or 0 for m in self.ha.role.members()))
        if not self.ha.fire(event, term):
            raise NotPromotable(f"cannot promote from {self.ha.status}")
        log.info("promoted by operator", term=term)
        return 200, self.status()

    def _hand_over(self) -> tuple[int, Any]:
        """With etcd, promotion is a handover: the primary steps down, this node wins."""
        state = self.ha.status.state
        election = self.ha.election
        assert election is not None
        election.hand_over(self.node.node_id, ttl=settings.HANDOVER_TTL.default)
        return 202, {"state": str(state), "message": "handover requested; the primary steps down"}

    def _force_start(self) -> Deferred:
        """``promote --force``: a restarted cluster waits for a sync member that holds the latest store; the
        operator names this node instead.  The sync set becomes this node alone (only while there is no
        leader), so it may start the cluster; what only the absent members held is lost if they never return."""
        state = self.ha.status.state
        election = self.ha.election
        assert election is not None
        snapshot = election.snapshot
        absent = sorted(snapshot.sync.members - {m.node_id for m in snapshot.members}) \
            if snapshot is not None and snapshot.sync is not None else []
        journal = self.node.journal
        damaged = journal.damage_summary() if journal is not None else None
        reply = Deferred()

        def answered(written: bool | CoordinatorError) -> None:  # on the election thread
            if isinstance(written, CoordinatorError):
                refused = NotPromotable(f"etcd refused the forced start: {written}")
                self.node.driver.call_soon_threadsafe(lambda: reply.fail(refused))
                return
            if not written:
                self.node.driver.call_soon_threadsafe(
                    lambda: reply.fail(NotPromotable("the cluster has a leader already: nothing to force")))
                return
            risk = (f"messages that only {', '.join(absent)} held are lost if it does not come back first"
                    if absent else "no absent member was named in the sync set")
            if damaged:
                risk += f"; what this node's damaged journal lost is lost ({damaged})"

            def accepted() -> None:
                self._accept_loss()
                reply.resolve(202, {"state": str(state), "message": f"forced: this node may start the cluster; {risk}"})

            self.node.driver.call_soon_threadsafe(accepted)

        election.force_sync(answered)
        return reply

    def _accept_loss(self) -> None:
        """The operator forced this node on: what its damaged journal lost is given up, and it may be elected."""
        journal = self.node.journal
        if journal is not None and journal.damage:
            journal.repaired("the operator accepted the loss (promote --force)")
            self.ha.publish_status()

    def _peer_login(self) -> Login:
        config = self.node.config
        tls = config.tls
        return Login(config.peer_user, config.peer_password, str(tls.ca_file) if tls.ca_file else None,
                     str(tls.cert_file) if tls.cert_file else None, str(tls.key_file) if tls.key_file else None,
                     tls=config.peer_tls)

    def check_admin_link(self, link: Link) -> None:
        """Admins may read a backup (browse, query); writes to replicated objects belong to the primary."""
        registry = self.node.registry
        if link.is_sender:
            source = link.remote_source
            if source.dynamic or source.distribution_mode == Terminus.DIST_MODE_COPY:
                return
            node = registry.lookup(source.address or "")
            if isinstance(node, Queue) and node.settings.replicate != "none":
                raise NotAllowed(f"{self.ha.url} is a backup: consuming from replicated queue "
                                 f"{node.name!r} would change it; browse it instead")
            return
        address = link.remote_target.address or ""
        if address == "$management":
            return
        node = registry.lookup(address)
        if node is None or _level(node) != "none":
            raise NotAllowed(f"{self.ha.url} is a backup: send to {address!r} on the primary")

    def guard(self, request: Request) -> None:
        if self.ha.standing.is_primary:
            return
        if request.operation in CLUSTER_STATE:
            primary = self.ha.role.primary_url
            where = f"the primary, {self._reachable(primary)}" if primary else "the primary (none is known now)"
            raise NotPrimary(f"{self.ha.url} is a backup ({self.ha.status.state}): users and the ACL are "
                             f"cluster state, changed on {where}",
                             self._reachable(primary) if primary else None)
        if request.operation not in MUTATING:
            return
        registry = self.node.registry
        replicated = False
        if request.operation == "CREATE":
            level = request.arguments().get(REPLICATE, registry.default_replicate)
            replicated = level != "none"
        elif request.operation in ("DELETE", "PURGE"):
            node = registry.lookup(request.name)
            replicated = node is not None and _level(node) != "none"
        else:
            for name in (request.body.get("exchange"), request.body.get("queue")):
                node = registry.lookup(str(name or ""))
                replicated = replicated or (node is not None and _level(node) != "none")
        if replicated:
            raise NotAllowed(f"{self.ha.url} is a backup ({self.ha.status.state}): change replicated objects "
                             "on the primary")

    def status(self) -> dict[str, Any]:
        primary = self.ha.url if self.ha.standing.is_primary else self.ha.role.primary_url
        return {
            "state": str(self.ha.status.state),
            "detail": str(self.ha.status.detail) if self.ha.status.detail else None,
            "term": self.ha.status.term,
            "primary": self._reachable(primary) if primary else None,
            "brokers": [self._reachable(a) for a in self.ha.member_addresses()],
            "halted": self.ha.standing.halted,
            "etcd": self.etcd,  # the endpoints
            "not_ready_because": self._not_ready_because(),
            **self._held(),
        }

    def _held(self) -> dict[str, Any]:
        """On a primary: why producers' acknowledgements wait, and why messages are refused (None: they are not)."""
        held = self.ha.role.describe()["acks_held"]
        return {"acks_waiting_for": held.get("waiting_for"), "refusing": held.get("refusing")}

    def _not_ready_because(self) -> str | None:
        """Why this node may not take over now although it is a cluster member, for ``status`` (None: no
        store reason)."""
        journal = self.node.journal
        if self.ha.standing.is_primary or journal is None:
            return None
        reasons = []
        if journal.full is not None:
            reasons.append(f"its journal cannot write ({journal.full}): it left the primary until it writes again")
        summary = journal.damage_summary()
        if summary:
            reasons.append(f"its journal was damaged ({summary}): it lacks data until it has caught up from a "
                           "healthy primary, and is not elected meanwhile")
        return "; ".join(reasons) or None

    def _reachable(self, address: str) -> str:
        """A member's HOST:PORT as tools must dial it: ``amqps://`` when the members speak TLS."""
        return f"amqps://{address}" if self.node.config.peer_tls else address

    def describe(self) -> dict[str, Any]:
        role = self.ha.role
        return {
            "state": str(self.ha.status.state),
            "term": self.ha.status.term,
            "members": [dict(m.to_wire(), url=self._reachable(m.url)) for m in role.members()],
            **role.describe(),  # lag, lag_seconds, acks_held
        }


FRESH_CHECK_TIMEOUT = 5.0
"""Seconds another node has to answer before a connecting node's promotion is refused: off the
reactor thread it may be generous (under load, 1 s made a busy backup look hung)."""


def _check_fresh_cluster(addresses: list[Address], login: Login) -> None:
    """A connecting node may only be promoted if no reachable node is past connecting (blocking: a worker thread)."""
    unknown = []
    for host, port in addresses:
        try:
            with ManagementClient(f"{host}:{port}", timeout=FRESH_CHECK_TIMEOUT, login=login) as client:
                state = client.request("STATUS").get("state")
        except ManagementError as error:
            if not error.unreachable:
                # Something is there but could not be asked (TLS, credentials, a hung node): it may be a primary.
                unknown.append(f"{host}:{port} ({error})")
            continue  # nothing listens there: that node holds nothing we could lose
        if state != "connecting":
            raise NotPromotable(f"{host}:{port} is {state}: promote a backup, not a connecting node")
    if unknown:
        raise NotPromotable(f"cannot tell what {', '.join(unknown)} is: stop it, or promote a backup")


def _level(node: Any) -> str:
    return node.settings.replicate if isinstance(node, Queue) else node.replicate
