"""Runs a schedule's ops against a live cluster and records each in the trace.

Roles (``primary``, ``backup``) are resolved when an op runs, from what the
status pollers see; labels (``@f1``) name the node an earlier op acted on.
The schedule rules (``schedule.py``) are checked again here, against the
real cluster rather than the generator's timeline: a node goes down only
when no other node is down or still rejoining (waiting, bounded, for a
restarted node to report ``backup``), and a fault is never applied to a node
already frozen or down (a node whose disk failed counts as down until its
repair).  An op that cannot run is recorded as ``skipped``
with the reason; one whose wait runs out as ``timeout``.  Neither stops the
schedule: what happened is in the trace and the final phase still heals,
drains and checks.  An ``assert`` op that does not hold is recorded as
``violated: <what was seen>`` and fails the schedule (``violated``).  Every
wait is bounded, and so is the whole op phase (``OPS_BUDGET``): ops left when
it is spent are skipped.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from hastandby.testing.checker import ReplicaDiff
from hastandby.testing.netns import Network
from hastandby.testing.netns_cluster import Cluster, ClusterError, NodeExited
from hastandby.testing.netns_workload import Workload

from .replicas import BrowseError, verify_replicas
from .schedule import (
    ASSERTIONS,
    CHECK,
    CLIENTS_PRIMARY,
    DISK_REPAIR,
    ELECT_EACH,
    HEAL,
    PRIMARY_ALL,
    PRIMARY_BACKUPS,
    PRIMARY_ETCD,
    PROMOTE,
    RESTART,
    RESTART_EXCEPT,
    ROT_POSITIONS,
    SIGCONT,
    SLEEP,
    Op,
)
from .trace import REPLICA_CHECK, Trace

OPS_BUDGET = 60.0  # s for all ops of a schedule (the schedules' sleeps add up to at most ~35 s)
RESOLVE_TIMEOUT = 10.0  # s to wait for a node in the role an op targets
REJOIN_TIMEOUT = 25.0  # s a kill or SIGTERM waits for a restarted node to be a backup again
SETTLE_TIMEOUT = 20.0  # s for one primary with every live node its backup, before a check
QUIET_TIMEOUT = 5.0  # s for the paused load to settle before browsing
RECHECK = 3.0  # s a replica mismatch may take to go away (a backup applying the last changes)
PROMOTE_WAIT = 20.0  # s for a promoted node to be primary
FINAL_SETTLE = 20.0  # s after every fault is undone for the cluster to settle
ANSWER_TIMEOUT = 20.0  # s an assertion about a started node waits for it to answer STATUS
ACKING_SHARE = 0.25  # `assert acking`: at least this share of the offered rate acknowledged


@dataclass
class Binding:
    """What an op labelled ``@name`` acted on."""

    node: str | None
    pairs: list[tuple[str, str]] = field(default_factory=list)  # a partition's cut host pairs
    nodes: list[str] = field(default_factory=list)  # every node a kill9-all killed
    primary: str | None = None  # a kill9-all's: the node that was primary
    rejected: int | None = None  # the producers' refused messages when the op ran (a disk-fail's)


class Skip(Exception):
    """An op cannot run now; the message says why."""


class Executor:
    """Interprets ops; ``checks`` collects every replica comparison."""

    def __init__(self, cluster: Cluster, network: Network, workload: Workload, trace: Trace,
                 rng: random.Random) -> None:
        self.cluster = cluster
        self.network = network
        self.workload = workload
        self.trace = trace
        self.rng = rng
        self.bindings: dict[str, Binding] = {}
        self.checks: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.failed: list[str] = []  # ops during which a node exited unasked
        self.timeouts: list[str] = []  # ops whose bounded wait ran out
        self.violated: list[str] = []  # assertions that did not hold: each fails the schedule
        self.assertions: list[dict[str, Any]] = []  # every assert op: op, node, result
        self.node_ids = list(cluster.nodes)
        self.last_op = "start"  # the op a check follows, for its record
        self.deadline: float | None = None  # time.monotonic() by which the op phase's waits end

    # -- the op phase ---------------------------------------------------------------------------------

    def run(self, ops: tuple[Op, ...]) -> None:
        """The ops in order; every wait in them ends by the op phase's deadline."""
        self.deadline = deadline = time.monotonic() + OPS_BUDGET
        for op in ops:
            if time.monotonic() >= deadline:
                self._record(op, time.time(), None, f"skipped: the op phase's {OPS_BUDGET:g} s are spent")
                continue
            if op.kind == SLEEP:
                time.sleep(min(op.seconds, max(0.0, deadline - time.monotonic())))
                continue
            self.run_op(op)
        self.deadline = None

    def _limit(self, timeout: float) -> float:
        """``timeout``, cut to what is left of the op phase (at least a moment, so a wait still looks once)."""
        if self.deadline is None:
            return timeout
        return max(0.1, min(timeout, self.deadline - time.monotonic()))

    def run_op(self, op: Op) -> None:
        t = time.time()
        handler = getattr(self, f"_op_{op.kind.replace('-', '_')}")
        try:
            node, result, fields = handler(op)
        except Skip as why:
            node, result, fields = None, f"skipped: {why}", {}
        except NodeExited as error:
            node, result, fields = None, f"failed: {error}", {}
        except (ClusterError, BrowseError) as error:
            node, result, fields = None, f"timeout: {error}", {}
        self._record(op, t, node, result, **fields)

    def _record(self, op: Op, t: float, node: str | None, result: str, **fields: Any) -> None:
        if result.startswith("skipped"):
            self.skipped.append(f"{op}: {result}")
        elif result.startswith("failed"):
            self.failed.append(f"{op}: {result}")
        elif result.startswith("timeout"):
            self.timeouts.append(f"{op}: {result}")
        elif result.startswith("violated"):
            self.violated.append(f"{op} ({node}): {result}")
        if op.kind == "assert":
            self.assertions.append({"op": str(op), "node": node, "result": result})
        self.trace.nemesis(t, op.kind, node, result, time.time(), target=op.target or None, label=op.label or None,
                           arg=op.arg or None, **fields)
        if op.kind != CHECK:
            self.last_op = f"{op} ({node or '-'}: {result})"

    # -- resolving targets ---------------------------------------------------------------------------

    def _resolve(self, target: str) -> str:
        if target.startswith("@"):
            binding = self.bindings.get(target[1:])
            if binding is None or binding.node is None:
                raise Skip(f"{target} is not bound (the op that binds it did not run)")
            return binding.node
        if target in self.node_ids:
            return target
        if target == "primary":
            return self.cluster.wait(self.cluster.primary, self._limit(RESOLVE_TIMEOUT), "a primary to target")
        if target == "backup":  # a node reporting `backup`, whether or not its primary is alive
            def candidates() -> list[str]:
                faulted = set(self.cluster.faulted())
                return [n for n, state in self.cluster.states().items() if state == "backup" and n not in faulted]

            found = self.cluster.wait(candidates, self._limit(RESOLVE_TIMEOUT), "a backup to target")
            return self.rng.choice(sorted(found))
        raise ValueError(f"unknown target {target!r}")

    def _bind(self, op: Op, node: str | None, pairs: list[tuple[str, str]] | None = None) -> None:
        if op.label:
            self.bindings[op.label] = Binding(node, pairs or [])

    def _healthy(self, node_id: str) -> None:
        node = self.cluster.nodes[node_id]
        if node.down:
            raise Skip(f"{node_id} is down")
        if node.frozen:
            raise Skip(f"{node_id} is frozen")

    def _may_go_down(self, node_id: str) -> None:
        """At most one node down or rejoining at a time: wait (bounded) for the last one to be a backup."""
        others = lambda: [n for n in self.cluster.down_or_rejoining() if n != node_id]  # noqa: E731
        try:
            self.cluster.wait(lambda: not others(), self._limit(REJOIN_TIMEOUT),
                              "the restarted node to be a backup")
        except ClusterError:
            raise Skip(f"{','.join(others())} still down or rejoining") from None

    # -- node faults -------------------------------------------------------------------------------------

    def _op_kill9(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        self._may_go_down(node)
        if self.cluster.nodes[node].down:
            raise Skip(f"{node} is down")
        pid = self.cluster.kill(node)
        self._bind(op, node)
        return node, "ok", {"pid": pid}

    def _op_sigterm(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        self._healthy(node)
        self._may_go_down(node)
        pid, code = self.cluster.terminate(node)
        self._bind(op, node)
        return node, "ok", {"pid": pid, "exit_code": code}

    def _op_kill9_all(self, op: Op) -> tuple[str | None, str, dict[str, Any]]:
        """kill -9 every node that runs, frozen ones included, at once; a node already down stays down.

        No rule about other nodes down or rejoining: that is the point.  The
        trace's ``node`` is the node that was primary (or the first killed).
        """
        primary = self.cluster.primary()
        frozen = [n for n, node in self.cluster.nodes.items() if node.frozen and node.running]
        already_down = [n for n, node in self.cluster.nodes.items() if node.down or not node.running]
        pids = self.cluster.kill_all()
        if not pids:
            raise Skip("no node is running")
        killed = list(pids)
        self.bindings[op.label or "-"] = Binding(None, nodes=killed, primary=primary)
        node = primary if primary in pids else killed[0]
        return node, "ok", {"killed": killed, "pids": pids, "already_down": already_down, "frozen": frozen,
                            "primary": primary}

    def _op_restart(self, op: Op) -> tuple[str | None, str, dict[str, Any]]:
        binding = self.bindings.get(op.target[1:]) if op.target.startswith("@") else None
        if binding is not None and binding.nodes:  # a kill9-all: every node it killed, at once
            left = self._left_down(op.arg)
            down = [n for n in binding.nodes if self.cluster.nodes[n].down and n not in left]
            if not down:
                raise Skip(f"none of {','.join(n for n in binding.nodes if n not in left)} is down")
            pids = {n: self.cluster.restart(n) for n in down}
            return None, "ok", {"restarted": down, "pids": pids, **({"left_down": sorted(left)} if left else {})}
        node = self._resolve(op.target)
        if not self.cluster.nodes[node].down:
            raise Skip(f"{node} is not down")
        return node, "ok", {"pid": self.cluster.restart(node)}

    def _left_down(self, arg: str) -> set[str]:
        """The nodes a restart's ``except @L,...`` leaves down (none if a label is not bound)."""
        if not arg.startswith(RESTART_EXCEPT):
            return set()
        left = set()
        for target in arg[len(RESTART_EXCEPT):].split(","):
            try:
                left.add(self._resolve(target.strip()))
            except Skip:
                pass
        return left

    def _op_sigstop(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        self._healthy(node)
        pid = self.cluster.freeze(node)
        self._bind(op, node)
        return node, "ok", {"pid": pid}

    def _op_sigcont(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        if not self.cluster.nodes[node].frozen:
            raise Skip(f"{node} is not frozen")
        return node, "ok", {"pid": self.cluster.thaw(node)}

    def _op_promote(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        self._healthy(node)
        state = self.cluster.nodes[node].state
        code, output = self.cluster.promote(node, force=op.arg == "force")
        result = "ok" if code == 0 else f"refused: {output.splitlines()[-1] if output else code}"
        return node, result, {"state_before": state, "exit_code": code}

    # -- disk faults -------------------------------------------------------------------------------------

    def _down_target(self, target: str) -> str:
        """The node a rot acts on: a node id or label, or ``@L:primary`` / ``@L:backup`` for one that a
        kill9-all ``@L`` killed: the one that was primary, or one that was a backup; in either case a member of
        the sync set if there is one (the node a restarted cluster would trust)."""
        name, _, which = target.lstrip("@").partition(":")
        binding = self.bindings.get(name) if target.startswith("@") else None
        if binding is None or not binding.nodes:
            return self._resolve(target)
        try:
            sync, _ = self.cluster.etcd_view()
        except Exception:  # noqa: BLE001 - without the sync set: any killed node of the role
            sync = None
        killed = [n for n in binding.nodes if self.cluster.nodes[n].down]
        if which in ("", "primary") and binding.primary in killed:
            return binding.primary
        others = [n for n in killed if n != binding.primary] or killed
        members = [n for n in others if sync is None or n in sync]
        if not (members or others):
            raise Skip(f"none of {','.join(binding.nodes)} is down")
        return self.rng.choice(sorted(members or others))

    def _op_rot(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        """Flip bytes of a down node's journal (or checkpoint), before it is started again."""
        if op.arg not in ROT_POSITIONS:
            raise ValueError(f"unknown rot position {op.arg!r}")
        node = self._down_target(op.target)
        if not self.cluster.nodes[node].down or self.cluster.nodes[node].running:
            raise Skip(f"{node} is not down")
        sync: frozenset[str] | None = None
        sync_error: str | None = None
        try:
            sync, _ = self.cluster.etcd_view()
        except Exception as failure:  # noqa: BLE001 - recorded; the rot goes on
            sync_error = str(failure)
        try:
            done = self.cluster.rot(node, op.arg)
        except ClusterError as failure:
            raise Skip(str(failure)) from None
        self._bind(op, node)
        return node, "ok", {**done, "sync_set": sorted(sync) if sync is not None else None,
                            "in_sync_set": (node in sync) if sync is not None else None,
                            **({"sync_error": sync_error} if sync_error else {})}

    def _op_disk_fail(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        """The node's file system fails: the kernel turns it read-only (every write EROFS)."""
        if self.cluster.disks is None:
            raise Skip("the nodes have no disks of their own (Schedule.disks)")
        node = self._resolve(op.target)
        self._healthy(node)
        if self.cluster.nodes[node].disk_failed:
            raise Skip(f"{node}'s disk has failed already")
        self._may_go_down(node)
        state = self.cluster.nodes[node].state
        rejected = self._rejected()
        device = self.cluster.fail_disk(node)
        if op.label:
            self.bindings[op.label] = Binding(node, rejected=rejected)
        return node, "ok", {"device": device, "state_before": state, "rejected_before": rejected}

    def _op_disk_repair(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        """kill -9 the node, repair its file system (umount, e2fsck, mount) and start it again."""
        node = self._resolve(op.target)
        if not self.cluster.nodes[node].disk_failed:
            raise Skip(f"{node}'s disk has not failed")
        fields = self.cluster.repair_disk(node)
        fields["restarted_pid"] = self.cluster.restart(node)
        return node, "ok", fields

    # -- assertions ------------------------------------------------------------------------------------

    def _rejected(self) -> int:
        """Messages the background producers had refused (``rejected``) so far."""
        return sum(int(self.workload.client(name).get("rejected") or 0) for name in self.workload.background)

    def _acked(self) -> int:
        return sum(int(self.workload.client(name).get("acked") or 0) for name in self.workload.background)

    def _answering(self, node: str, timeout: float) -> dict[str, Any]:
        """The node's STATUS once it answers with its journal (bounded; ClusterError if it does not)."""
        def answer() -> dict[str, Any] | None:
            status = self.cluster.status_of(node) if self.cluster.nodes[node].state is not None else None
            return status if status is not None and status.get("journal") is not None else None

        return self.cluster.wait(answer, self._limit(timeout), f"{node} answering STATUS")

    @staticmethod
    def _journal(status: dict[str, Any]) -> dict[str, Any]:
        journal = status.get("journal") or {}
        return {"found_damaged": journal.get("found_damaged"), "damaged": journal.get("damaged"),
                "torn_bytes": journal.get("torn_bytes"), "clean_shutdown": journal.get("clean_shutdown"),
                "recovered_messages": journal.get("recovered_messages")}

    def _op_assert(self, op: Op) -> tuple[str | None, str, dict[str, Any]]:
        if op.arg not in ASSERTIONS:
            raise ValueError(f"unknown assertion {op.arg!r}")
        handler = getattr(self, f"_assert_{op.arg.replace('-', '_')}")
        return handler(op)

    def _assert_found_damage(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        journal = self._journal(self._answering(node, op.seconds or ANSWER_TIMEOUT))
        fields = {**journal, "quarantined": self.cluster.quarantined(node)}
        if journal["found_damaged"] or journal["damaged"]:
            return node, "ok", fields
        return node, f"violated: its start found nothing damaged (torn_bytes {journal['torn_bytes']})", fields

    def _assert_no_damage(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        journal = self._journal(self._answering(node, op.seconds or ANSWER_TIMEOUT))
        fields = {**journal, "quarantined": self.cluster.quarantined(node)}
        if journal["found_damaged"] or journal["damaged"]:
            return node, f"violated: its start found damage: {journal['found_damaged'] or journal['damaged']}", fields
        return node, "ok", fields

    def _assert_damage_cleared(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        """The node holds everything again: STATUS says it lacks nothing, and the damage record is gone."""
        node = self._resolve(op.target)
        record = self.cluster.data_dir(node) / "journal.damaged.json"
        seen: dict[str, Any] = {}

        def cleared() -> bool:
            status = self.cluster.status_of(node)
            if status is None or status.get("journal") is None:
                return False
            seen.update(self._journal(status), state=status.get("state"),
                        not_ready_because=status.get("not_ready_because"))
            return not seen["damaged"] and not record.exists()

        try:
            self.cluster.wait(cleared, self._limit(op.seconds or ANSWER_TIMEOUT), f"{node}'s damage cleared")
        except ClusterError:
            return node, (f"violated: still lacks data in state {seen.get('state')} (damaged {seen.get('damaged')}, "
                          f"record {'present' if record.exists() else 'gone'})"), seen
        return node, "ok", {**seen, "quarantined": self.cluster.quarantined(node)}

    def _assert_not_primary(self, op: Op, only_if_damaged: bool = False) -> tuple[str, str, dict[str, Any]]:
        """Once the node answers, it stays out of `primary` for ``seconds`` (and no other node is primary:
        they are down); it must not have been primary while starting either."""
        node = self._resolve(op.target)
        states: list[str] = []
        primaries: list[str] = []

        def look() -> str | None:
            for other, state in self.cluster.states().items():
                if state == "primary" and other not in primaries:
                    primaries.append(other)
            state = self.cluster.nodes[node].state
            if state is not None and (not states or states[-1] != state):
                states.append(state)
            return state

        self.cluster.wait(lambda: look() is not None, self._limit(ANSWER_TIMEOUT), f"{node} answering")
        status = self.cluster.status_of(node) or {}
        journal = self._journal(status) if status.get("journal") is not None else {}
        deadline = time.monotonic() + self._limit(op.seconds)
        while time.monotonic() < deadline:
            look()
            time.sleep(0.05)
        detail = (self.cluster.nodes[node].status or {}).get("detail")
        fields = {"states": states, "primaries": primaries, "detail": detail, **journal,
                  "not_ready_because": status.get("not_ready_because")}
        damaged = bool(journal.get("found_damaged") or journal.get("damaged"))
        if only_if_damaged and not damaged:
            return node, "ok", {**fields, "note": "its start found no damage: nothing asserted"}
        if primaries:
            return node, f"violated: {','.join(primaries)} primary while {node} " + (
                "lacked data" if damaged else "was started alone"), fields
        return node, "ok", fields

    def _assert_not_primary_if_damaged(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        return self._assert_not_primary(op, only_if_damaged=True)

    def _assert_in_sync(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        try:
            sync, _ = self.cluster.etcd_view()
        except Exception as error:  # noqa: BLE001 - etcd did not answer: no verdict on the precondition
            raise ClusterError(f"etcd's sync set not read: {error}") from None
        fields = {"sync_set": sorted(sync) if sync is not None else None}
        if sync is None or node not in sync:
            return node, f"violated: the schedule's precondition: the sync set {fields['sync_set']} lacks it", fields
        return node, "ok", fields

    def _assert_acking(self, op: Op) -> tuple[str | None, str, dict[str, Any]]:
        """For ``seconds`` the background producers are acknowledged (at least ACKING_SHARE of the offered
        rate), and nothing was refused since the op that bound the target (if any) ran."""
        binding = self.bindings.get(op.target.lstrip("@")) if op.target.startswith("@") else None
        node = binding.node if binding is not None else None
        acked, rejected = self._acked(), self._rejected()
        refusing: set[str] = set()
        deadline = time.monotonic() + self._limit(op.seconds)
        while time.monotonic() < deadline:
            primary = self.cluster.primary()
            status = self.cluster.status_of(primary) if primary is not None else None
            if status and status.get("refusing"):
                refusing.add(str(status["refusing"]))
            time.sleep(0.25)
        got = self._acked() - acked
        wanted = int(self.workload.offered_rate * op.seconds * ACKING_SHARE)
        since = binding.rejected if binding is not None and binding.rejected is not None else rejected
        refused = self._rejected() - since
        fields = {"acked": got, "wanted": wanted, "refused_since": refused, "refused_in_window":
                  self._rejected() - rejected, "primary_refusing": sorted(refusing)}
        problems = []
        if got < wanted:
            problems.append(f"{got} acknowledged in {op.seconds:g} s, fewer than {wanted}")
        if refused:
            problems.append(f"{refused} messages refused since {op.target or 'the assertion began'}"
                            + (f" (the primary: {sorted(refusing)[0]})" if refusing else ""))
        return node, f"violated: {'; '.join(problems)}" if problems else "ok", fields

    # -- partitions ---------------------------------------------------------------------------------------

    def _op_partition(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)  # frozen or down is fine: the network does not care
        if op.arg == PRIMARY_ETCD:
            pairs = [(node, "etcd")]
        elif op.arg == PRIMARY_BACKUPS:
            pairs = [(node, other) for other in self.node_ids if other != node]
        elif op.arg == CLIENTS_PRIMARY:
            pairs = [("clients", node)]
        elif op.arg == PRIMARY_ALL:
            pairs = [(node, other) for other in self.network.hosts if other != node]
        else:
            raise ValueError(f"unknown partition {op.arg!r}")
        self._bind(op, node, self.network.cut(pairs))
        return node, "ok", {"cut": [list(p) for p in pairs]}

    def _op_heal(self, op: Op) -> tuple[str | None, str, dict[str, Any]]:
        binding = self.bindings.get(op.target.lstrip("@"))
        if binding is None or not binding.pairs:
            raise Skip(f"{op.target} cut nothing")
        self.network.heal(binding.pairs)
        healed, binding.pairs = binding.pairs, []
        return binding.node, "ok", {"healed": [list(p) for p in healed]}

    # -- checks and elections ------------------------------------------------------------------------------

    def _op_check(self, op: Op) -> tuple[str | None, str, dict[str, Any]]:
        check = self.check(after=self.last_op)
        return check.get("primary"), check["result"], {}

    def _op_elect_each(self, op: Op) -> tuple[str | None, str, dict[str, Any]]:
        """Promote each node in the given order, waiting until it is primary, with a check after each."""
        elected = []
        for target in op.target.split(","):
            step = Op(PROMOTE, target=target)
            t = time.time()
            node: str | None = None
            try:
                node = self._resolve(target)
                self._healthy(node)
                self.cluster.wait(lambda n=node: self.cluster.settled() and self.cluster.nodes[n].state in
                                  ("backup", "primary"), self._limit(SETTLE_TIMEOUT),
                                  f"{node} a backup of a settled cluster")
                if self.cluster.primary() == node:
                    result, fields = "ok", {"note": "already primary"}
                else:
                    code, output = self.cluster.promote(node)
                    fields = {"exit_code": code}
                    result = "ok" if code == 0 else f"refused: {output.splitlines()[-1] if output else code}"
                if result == "ok":
                    self.cluster.wait(lambda n=node: self.cluster.primary() == n, self._limit(PROMOTE_WAIT),
                                      f"{node} primary")
                    elected.append(node)
            except Skip as why:
                node, result, fields = None, f"skipped: {why}", {}
            except ClusterError as error:
                result, fields = f"timeout: {error}", {}
            self._record(step, t, node, result, phase=ELECT_EACH, **fields)
            self.run_op(Op(CHECK))
        result = "ok" if len(elected) == len(op.target.split(",")) else f"elected {','.join(elected) or 'none'}"
        return None, result, {"elected": elected}

    def check(self, after: str) -> dict[str, Any]:
        """Compare replicas once the cluster has settled, with the load paused; one ``replica_check`` line."""
        t = time.time()
        check: dict[str, Any] = {"after": after}
        try:
            primary = self.cluster.wait(self.cluster.settled, self._limit(SETTLE_TIMEOUT),
                                         "a settled cluster to compare")
        except ClusterError as error:
            check.update(result=f"skipped: {error}", mismatches=None)
            self.checks.append(check)
            self.trace.line(t, REPLICA_CHECK, **check)
            return check
        self.workload.command("pause")
        try:
            check["load_quiet"] = self.workload.quiet(QUIET_TIMEOUT)
            deadline = time.monotonic() + RECHECK
            attempts = 0
            while True:
                attempts += 1
                backups = {n: self.cluster.nodes[n].address for n in self.cluster.backups()}
                try:
                    diffs: list[ReplicaDiff] | None = verify_replicas(self.cluster.nodes[primary].address, backups,
                                                                        self.cluster.admin)
                    error = None
                except BrowseError as failed:
                    diffs, error = None, str(failed)
                mismatches = None if diffs is None else sum(d.mismatches for d in diffs)
                if mismatches == 0 or time.monotonic() >= deadline:
                    break
                time.sleep(0.5)
        finally:
            self.workload.command("resume")
        check.update(primary=primary, backups=sorted(backups), attempts=attempts, mismatches=mismatches,
                     result="ok" if mismatches == 0 else (f"error: {error}" if diffs is None else "MISMATCH"))
        if self.cluster.virtual_ip is not None:  # the settled cluster's primary holds it, no other node does
            holders = self.cluster.virtual_ip_holders()
            check.update(virtual_ip_on=holders, virtual_ip_misplaced=holders != [primary])
        if diffs:
            check.update(missing=sum(len(d.missing) for d in diffs), differing=sum(len(d.differing) for d in diffs),
                         extra=sum(len(d.extra) for d in diffs), diffs=[str(d) for d in diffs])
        self.checks.append(check)
        self.trace.line(t, REPLICA_CHECK, **check)
        return check

    # -- the workload's ops ------------------------------------------------------------------------------

    def _op_producer(self, op: Op) -> tuple[None, str, dict[str, Any]]:
        self.workload.command(f"producer {op.arg} 0")
        return None, "ok", {}

    def _op_pin(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        self._healthy(node)
        self.workload.command(f"pinned {op.arg} {self.cluster.nodes[node].url}")
        self._bind(op, node)
        if not self.workload.wait(lambda: bool(self.workload.client(op.arg).get("attached")),
                                  self._limit(RESOLVE_TIMEOUT)):
            return node, f"timeout: {op.arg} not attached to {node}", {}
        return node, "ok", {}

    def _op_send(self, op: Op) -> tuple[None, str, dict[str, Any]]:
        self.workload.command(f"send {op.arg} {op.count}")
        return None, "ok", {"count": op.count}

    def _op_rate(self, op: Op) -> tuple[None, str, dict[str, Any]]:
        self.workload.command(f"rate {op.arg} {op.count}")
        return None, "ok", {"rate": op.count}

    def _op_await_acked(self, op: Op) -> tuple[str | None, str, dict[str, Any]]:
        def acked() -> int:
            return int(self.workload.client(op.arg).get("acked") or 0)

        ok = self.workload.wait(lambda: acked() >= op.count, self._limit(op.seconds))
        status = self.workload.client(op.arg)
        return None, "ok" if ok else f"timeout: {acked()} of {op.count} acknowledged", {
            "acked": acked(), "url": status.get("url")}

    def _op_await_primary(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        avoid = (self._resolve(op.target),) if op.target else ()
        node = self.cluster.wait(lambda: self.cluster.primary(exclude=avoid), self._limit(op.seconds),
                                 f"a primary other than {','.join(avoid)}")
        self._bind(op, node)
        return node, "ok", {}

    def _op_await_state(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        node = self._resolve(op.target)
        self.cluster.wait(lambda: self.cluster.nodes[node].state == op.arg, self._limit(op.seconds),
                          f"{node} {op.arg}")
        return node, "ok", {}

    # -- the final phase -------------------------------------------------------------------------------------

    def undo_everything(self) -> str | None:
        """Heal, resume and restart whatever is still faulted; wait for the cluster to settle.

        Returns the primary, or None if the cluster did not settle in time.
        """
        if self.network.partitioned:
            t = time.time()
            cut = self.network.partitioned
            self.network.heal_all()
            for binding in self.bindings.values():
                binding.pairs = []
            self.trace.nemesis(t, HEAL, None, "ok", time.time(), healed=[list(p) for p in cut], phase="final")
        for node in self.cluster.nodes.values():
            if node.frozen:
                self.run_op(Op(SIGCONT, target=node.node_id))
            if node.disk_failed:  # killed, repaired and started again
                self.run_op(Op(DISK_REPAIR, target=node.node_id))
            elif node.down:
                self.run_op(Op(RESTART, target=node.node_id))
        try:
            return self.cluster.wait(self.cluster.settled, FINAL_SETTLE, "the cluster to settle after the schedule")
        except ClusterError:
            return None

