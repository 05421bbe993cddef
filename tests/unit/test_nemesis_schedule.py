"""Nemesis schedules: replayable from a seed, and within the rules that keep the verdict meaningful."""

from __future__ import annotations

import pytest

from tests.nemesis import schedule as s


def _simulate(ops: tuple[s.Op, ...]) -> list[tuple[float, str, str]]:
    """(time, kind, label) of every fault start and undo, from the sleeps between them."""
    now, events = 0.0, []
    for op in ops:
        if op.kind == s.SLEEP:
            now += op.seconds
        elif op.kind in (*s.NODE_FAULTS, s.PARTITION):
            events.append((now, "start", op.label))
        elif op.kind in (s.RESTART, s.SIGCONT, s.HEAL):
            events.append((now, "undo", op.target.lstrip("@")))
    return events


def test_same_seed_same_schedule():
    assert s.random_schedule(7) == s.random_schedule(7)
    assert s.random_schedule(7) != s.random_schedule(8)


@pytest.mark.parametrize("seed", range(300))
def test_random_schedules_keep_the_rules(seed):
    schedule = s.random_schedule(seed)
    ops = schedule.ops
    kinds = {op.label: op.kind for op in ops if op.label}
    # every fault is undone, exactly once, after it started
    started = {op.label for op in ops if op.kind in (*s.NODE_FAULTS, s.PARTITION)}
    undone = [op.target.lstrip("@") for op in ops if op.kind in (s.RESTART, s.SIGCONT, s.HEAL)]
    assert sorted(undone) == sorted(started)
    for op in ops:
        if op.kind in (s.RESTART, s.SIGCONT, s.HEAL):
            assert s.UNDO[kinds[op.target.lstrip("@")]] == op.kind
    # overlaps: at most two faults at once, one per class, and a node down only after the last one rejoined;
    # kill9-all may find one node down (or rejoining), nothing else; nothing starts until its nodes rejoined
    active: dict[str, str] = {}
    last_restart = last_all_restart = -100.0
    for t, what, label in _simulate(ops):
        kind = kinds[label]
        if what == "undo":
            del active[label]
            if kind in (s.KILL9, s.SIGTERM):
                last_restart = t
            if kind == s.KILL9_ALL:
                last_all_restart = t
            continue
        assert len(active) < 2, (seed, schedule)
        assert s.KILL9_ALL not in active.values() and t >= last_all_restart + s.REJOIN, (seed, schedule)
        if kind == s.KILL9_ALL:
            assert set(active.values()) <= {s.KILL9, s.SIGTERM}, (seed, schedule)
        cls = "down" if kind in (s.KILL9, s.SIGTERM) else kind
        assert cls not in {"down" if k in (s.KILL9, s.SIGTERM) else k for k in active.values()}, (seed, schedule)
        if cls == "down":
            assert t >= last_restart + s.REJOIN, (seed, schedule)
        active[label] = kind
    assert not active
    # ends with a check and every node elected in turn
    assert ops[-1].kind == s.ELECT_EACH and sorted(ops[-1].target.split(",")) == list(s.NODE_IDS)
    assert ops[-2].kind == s.CHECK
    assert s.EPISODES[0] <= len(started) + sum(op.kind == s.PROMOTE for op in ops) <= s.EPISODES[1]


def test_random_schedules_are_bounded_in_time():
    for seed in range(300):
        sleeps = sum(op.seconds for op in s.random_schedule(seed).ops if op.kind == s.SLEEP)
        assert sleeps <= s.WARMUP + s.FAULT_WINDOW + max(s.CUT[1], s.FREEZE[1], s.DOWN[1]) + 1


def test_a_freeze_outlasts_the_lease():
    for seed in range(100):
        ops = s.random_schedule(seed).ops
        for t, what, label in _simulate(ops):
            if what == "start" and any(op.label == label and op.kind == s.SIGSTOP for op in ops):
                end = next(u for u, w, other in _simulate(ops) if w == "undo" and other == label)
                assert end - t >= s.FREEZE[0] > 2


def test_every_fault_kind_turns_up():
    seen = {kind for seed in range(100) for kind in s.random_schedule(seed).faults}
    assert seen == set(s.FAULT_KINDS)


def test_restricted_fault_kinds():
    for seed in range(50):
        schedule = s.random_schedule(seed, faults=(s.SIGSTOP,))
        assert set(schedule.faults) == {s.SIGSTOP}
        assert {op.kind for op in schedule.ops} <= {s.SLEEP, s.SIGSTOP, s.SIGCONT, s.CHECK, s.ELECT_EACH}


def test_parse_faults():
    assert s.parse_faults("kill, stop,etcd") == (s.KILL9, s.SIGSTOP, "partition-primary-etcd")
    assert s.parse_faults("kill,kill9") == (s.KILL9,)
    assert s.parse_faults("kill9-all,all") == (s.KILL9_ALL,)
    with pytest.raises(ValueError, match="unknown fault 'fire'"):
        s.parse_faults("kill,fire")
    with pytest.raises(ValueError):
        s.parse_faults(" , ")


def test_unknown_kinds_are_refused():
    with pytest.raises(ValueError):
        s.random_schedule(1, faults=("meteor",))


def test_fixed_schedules_bind_labels_before_using_them():
    assert list(s.FIXED) == ["frozen-primary-rejoins", "frozen-primary-reelected", "partitioned-primary-killed",
                             "primary-cut-from-etcd", "frozen-primary-killed-backup",
                             "frozen-primary-resumes-cut-from-etcd", "every-node-killed",
                             "virtual-ip-through-partitions", "damaged-sync-member-first", "backup-disk-read-only",
                             "clean-stop-rot", "damaged-tail-sync-member-first"]
    for schedule in s.FIXED.values():
        bound: set[str] = set()
        for op in schedule.ops:
            for target in op.target.split(","):
                if target.startswith("@"):
                    assert target[1:] in bound, (schedule.name, op)
            if op.label:
                bound.add(op.label)
        assert schedule.ops[-1].kind in (s.CHECK, s.ELECT_EACH)


def test_the_minimal_reproduction_runs_without_background_load():
    repro = s.FIXED["frozen-primary-rejoins"]
    assert not repro.load
    sends = [(op.kind, op.arg, op.count) for op in repro.ops if op.kind in (s.SEND, s.RATE)]
    assert sends == [(s.RATE, "a1", 50), (s.RATE, "a1", 0), (s.SEND, "b", 20),
                     (s.RATE, "a2", 50), (s.RATE, "a2", 0), (s.SEND, "b", 20),
                     (s.RATE, "a3", 50), (s.RATE, "a3", 0), (s.SEND, "b", 20)]
    kinds = [op.kind for op in repro.ops]
    stop = kinds.index(s.SIGSTOP)
    assert stop < kinds.index(s.RATE, stop) < kinds.index(s.SIGCONT)  # the trickle stops while frozen
    assert kinds.count(s.SIGSTOP) == kinds.count(s.PROMOTE) == s.REPRO_ROUNDS


def test_kill9_all_sometimes_finds_a_node_down():
    """Down before it; restarted alone while the others are still dead, or with or after them."""
    found = after = 0
    for seed in range(200):
        ops = s.random_schedule(seed).ops
        kinds = {op.label: op.kind for op in ops if op.label}
        events = _simulate(ops)
        for t, what, label in events:
            if what != "start" or kinds[label] != s.KILL9_ALL:
                continue
            all_back = next(u for u, w, other in events if w == "undo" and other == label)
            down = [other for u, w, other in events if w == "start" and u < t and kinds[other] in (s.KILL9, s.SIGTERM)
                    and next(v for v, x, o in events if x == "undo" and o == other) >= t]
            if down:
                found += 1
                (other,) = down
                after += next(v for v, x, o in events if x == "undo" and o == other) >= all_back
    assert found >= 20 and after >= 10


def test_every_node_killed_restarts_them_all_and_elects_each():
    ops = [op for op in s.FIXED["every-node-killed"].ops if op.kind != s.SLEEP]
    assert [op.kind for op in ops] == [s.AWAIT_ACKED, s.KILL9_ALL, s.RESTART, s.CHECK, s.ELECT_EACH]
    assert ops[2].target == f"@{ops[1].label}" and sorted(ops[4].target.split(",")) == list(s.NODE_IDS)


def test_the_virtual_ip_schedule_partitions_through_the_address():
    """The primary cut from every host, from etcd, its clients cut from it; then killed, and a handover."""
    schedule = s.FIXED["virtual-ip-through-partitions"]
    assert schedule.virtual_ip and schedule.load
    assert [op.arg for op in schedule.ops if op.kind == s.PARTITION] == [s.PRIMARY_ALL, s.PRIMARY_ETCD,
                                                                          s.CLIENTS_PRIMARY]
    assert all(op.target == "primary" for op in schedule.ops if op.kind in (s.PARTITION, s.KILL9))
    assert all(f"{s.PARTITION}-{s.PRIMARY_ALL}" not in s.random_schedule(seed).faults for seed in range(100))


def test_the_race_free_reproduction_resumes_the_node_cut_from_etcd():
    kinds = [op.kind for op in s.FIXED["frozen-primary-resumes-cut-from-etcd"].ops]
    assert kinds.index(s.PARTITION) < kinds.index(s.SIGCONT) < kinds.index(s.HEAL) < kinds.index(s.PROMOTE)


def test_ops_describe_themselves():
    assert str(s.Op(s.PARTITION, target="primary", label="f1", arg=s.PRIMARY_ETCD)) == \
        "partition primary-etcd primary as @f1"
    assert str(s.Op(s.SLEEP, seconds=1.5)) == "sleep 1.5s"
    assert "sleep" not in str(s.random_schedule(3))


def test_every_op_kind_has_a_handler():
    from tests.nemesis.executor import Executor

    assert all(hasattr(Executor, f"_op_{kind.replace('-', '_')}") for kind in s.OP_KINDS if kind != s.SLEEP)
    for schedule in [*s.FIXED.values(), *(s.random_schedule(seed) for seed in range(50))]:
        assert {op.kind for op in schedule.ops} <= set(s.OP_KINDS)
