"""Nemesis schedules: what to do to the cluster, in which order, as plain data.

A schedule is an ordered tuple of :class:`Op`.  The runner executes them one
after another; faults overlap because a fault lasts until its own undo op
(``sigstop`` ... ``sigcont``, ``partition`` ... ``heal``, ``kill9`` or
``kill9-all`` ... ``restart``) and other ops may come in between.  Time passes only in
``sleep`` ops and in the bounded waits of the others.

Ops name nodes by role, resolved when they run (``primary``, ``backup``), by
id (``n2``) or by a label an earlier op bound (``@f1``: the node that op
acted on).  So a schedule is a pure value: :func:`random_schedule` builds
the same one for the same seed (Jepsen's generators are replayable the same
way), and the fixed schedules are reviewed like code.

The rules are built into the generator and enforced again by the runner:
at most one node down (killed or terminated) at a time, and a restarted node
must report ``backup`` before another may go down; at most one node frozen
and at most one partition at a time; at most two faults at once; every
schedule ends with every fault undone.  The one exception is ``kill9-all``:
kill -9 of every node at once (possibly while one is already down), then
all of them started again.  The workload's messages are durable and the
nodes keep a journal (``--data-dir``), so the restarted cluster must elect a
primary from the most recent store by itself and still hold every
acknowledged message.  Nothing else starts while it lasts, nor in the
``REJOIN`` s after its restart; it never overlaps a freeze or a partition.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

NODE_IDS = ("n1", "n2", "n3")

# -- op kinds (also the ``op`` field of the trace's ``nemesis`` events) -----------------------------
SLEEP = "sleep"
KILL9 = "kill9"
KILL9_ALL = "kill9-all"  # kill -9 every node at once (target empty), later `restart @L` starts them all
SIGSTOP = "sigstop"
SIGCONT = "sigcont"
SIGTERM = "sigterm"
RESTART = "restart"
PROMOTE = "promote"
PARTITION = "partition"
HEAL = "heal"
CHECK = "check"  # replica comparison, once the cluster has settled
ELECT_EACH = "elect_each"  # promote each node in turn (target: comma-separated order), a check after each
# workload and waiting ops (the fixed schedules script their clients with these)
PIN = "pin"  # arg: producer name; a producer with one connection to the target node, no reconnect
PRODUCER = "producer"  # arg: producer name; a producer with every node's URL that sends only on `send`
SEND = "send"  # arg: producer name; count new messages
RATE = "rate"  # arg: producer name; from now on count new messages per second
AWAIT_ACKED = "await_acked"  # arg: producer name; until count of its messages were accepted
AWAIT_PRIMARY = "await_primary"  # a primary other than target (a label), bound to label
AWAIT_STATE = "await_state"  # target reports state arg

OP_KINDS = (SLEEP, KILL9, KILL9_ALL, SIGSTOP, SIGCONT, SIGTERM, RESTART, PROMOTE, PARTITION, HEAL, CHECK, ELECT_EACH, PIN,
            PRODUCER, SEND, RATE, AWAIT_ACKED, AWAIT_PRIMARY, AWAIT_STATE)
NODE_FAULTS = (KILL9, KILL9_ALL, SIGSTOP, SIGTERM)
UNDO = {KILL9: RESTART, KILL9_ALL: RESTART, SIGTERM: RESTART, SIGSTOP: SIGCONT, PARTITION: HEAL}

# -- fault kinds a random schedule draws from (``--faults``) -----------------------------------------
PRIMARY_ETCD = "primary-etcd"  # the primary cannot reach etcd (nor etcd it)
PRIMARY_BACKUPS = "primary-backups"  # the primary cannot reach the other nodes
CLIENTS_PRIMARY = "clients-primary"  # the clients cannot reach the primary
PARTITIONS = (PRIMARY_ETCD, PRIMARY_BACKUPS, CLIENTS_PRIMARY)
PRIMARY_ALL = "primary-all"  # the primary cannot reach any host (its link cut); fixed schedules only, so that a
#                              seed's random schedule stays what it was
FAULT_KINDS = (KILL9, KILL9_ALL, SIGSTOP, SIGTERM, PROMOTE, *(f"{PARTITION}-{p}" for p in PARTITIONS))
FAULT_ALIASES = {
    "kill": KILL9, "kill9": KILL9, "all": KILL9_ALL, "kill-all": KILL9_ALL, "stop": SIGSTOP, "sigstop": SIGSTOP,
    "term": SIGTERM, "sigterm": SIGTERM,
    "promote": PROMOTE, "etcd": f"{PARTITION}-{PRIMARY_ETCD}", "backups": f"{PARTITION}-{PRIMARY_BACKUPS}",
    "clients": f"{PARTITION}-{CLIENTS_PRIMARY}", **{kind: kind for kind in FAULT_KINDS},
}

# -- timing of random schedules (lease TTL 2 s) ---------------------------------------------------
WARMUP = 2.0  # s of load before the first fault
FAULT_WINDOW = 24.0  # faults start within this many s of the first one
EPISODES = (3, 5)  # faults per schedule, inclusive
FREEZE = (3.0, 5.0)  # SIGSTOP beyond the lease
DOWN = (1.0, 3.0)  # kill -9 / SIGTERM / kill9-all until the restart
CUT = (3.0, 6.0)  # partition until the heal
ONE_DOWN_FIRST = 1 / 3  # share of kill9-all faults that find one node down already
ONE_DOWN_LEAD = (0.5, 2.0)  # s that node is down before kill9-all
ONE_DOWN_LAG = (0.0, 2.0)  # s after kill9-all's restart that node is restarted
REJOIN = 6.0  # s after a restart counted as still down (catch-up) when placing the next kill
GAP = (0.5, 6.0)  # s between the starts of consecutive faults


@dataclass(frozen=True)
class Op:
    """One step of a schedule; which fields matter depends on ``kind`` (see the constants above)."""

    kind: str
    target: str = ""  # primary | backup | n1 | @label | (elect_each) n2,n1,n3 | (await_primary) @label to avoid
    label: str = ""  # binds the node this op acted on (and, for partition, the partition) to @label
    seconds: float = 0.0  # sleep length, or the bound of a wait
    count: int = 0
    arg: str = ""  # partition kind, producer name, or awaited state

    def __str__(self) -> str:
        parts = [self.kind]
        if self.arg:
            parts.append(self.arg)
        if self.target:
            parts.append(self.target)
        if self.count:
            parts.append(f"x{self.count}")
        if self.seconds:
            parts.append(f"{self.seconds:g}s")
        if self.label:
            parts.append(f"as @{self.label}")
        return " ".join(parts)


@dataclass(frozen=True)
class Schedule:
    """A named, replayable list of ops; ``load`` starts the background producers and consumer first."""

    name: str
    ops: tuple[Op, ...]
    seed: int | None = None
    load: bool = True
    description: str = ""
    faults: tuple[str, ...] = field(default=())  # the fault kinds it injects, for the summary
    virtual_ip: bool = False  # the nodes hold a virtual IP (serve --virtual-ip) and one producer knows only it

    def __str__(self) -> str:
        return f"{self.name}: " + "; ".join(str(op) for op in self.ops if op.kind != SLEEP)


@dataclass(frozen=True)
class _Episode:
    """One fault from its start to its undo, as the generator places it."""

    kind: str  # a FAULT_KINDS entry
    start: float
    end: float
    target: str

    @property
    def exclusive_class(self) -> str:
        """Faults of one class never overlap (see the module docstring)."""
        if self.kind in (KILL9, SIGTERM):
            return "down"
        if self.kind == KILL9_ALL:
            return "all-down"
        if self.kind.startswith(PARTITION):
            return PARTITION
        return self.kind

    @property
    def busy_until(self) -> float:
        """Until when another fault of the same class must wait (a restarted node catches up first)."""
        return self.end + (REJOIN if self.exclusive_class in ("down", "all-down") else 0.0)


def parse_faults(text: str) -> tuple[str, ...]:
    """``kill,stop,etcd`` -> the fault kinds; raises ValueError naming an unknown one."""
    kinds: list[str] = []
    for name in (part.strip().lower() for part in text.split(",") if part.strip()):
        if name not in FAULT_ALIASES:
            raise ValueError(f"unknown fault {name!r}: use {', '.join(sorted(FAULT_ALIASES))}")
        if FAULT_ALIASES[name] not in kinds:
            kinds.append(FAULT_ALIASES[name])
    if not kinds:
        raise ValueError("no fault given")
    return tuple(kinds)


def random_schedule(seed: int, faults: Sequence[str] = FAULT_KINDS,
                    node_ids: Sequence[str] = NODE_IDS) -> Schedule:
    """The schedule for ``seed``: 3-5 overlapping faults, their undos, checks, then every node elected in turn."""
    if not faults:
        raise ValueError("no fault kinds to draw from")
    unknown = set(faults) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}")
    rng = random.Random(seed)
    episodes = _place_episodes(rng, list(faults), list(node_ids))
    ops = _linearize(episodes)
    order = list(node_ids)
    rng.shuffle(order)
    ops.append(Op(ELECT_EACH, target=",".join(order)))
    return Schedule(name=f"seed-{seed}", ops=tuple(ops), seed=seed, load=True,
                    description=f"random schedule from seed {seed}",
                    faults=tuple(dict.fromkeys(e.kind for e in episodes)))


def _place_episodes(rng: random.Random, faults: list[str], node_ids: list[str]) -> list[_Episode]:
    episodes: list[_Episode] = []
    start = WARMUP
    count = rng.randint(*EPISODES)
    while len(episodes) < count:
        kind = rng.choice(faults)
        if kind == KILL9_ALL and len(episodes) + 2 <= count and rng.random() < ONE_DOWN_FIRST:
            pair = _one_down_then_all(rng, start, episodes)
            if pair[0].start > WARMUP + FAULT_WINDOW:
                break
            episodes += pair
            start = round(pair[1].start + rng.uniform(*GAP), 1)
            continue
        length = {KILL9: DOWN, KILL9_ALL: DOWN, SIGTERM: DOWN, SIGSTOP: FREEZE, PROMOTE: (0.0, 0.0)}.get(kind, CUT)
        duration = round(rng.uniform(*length), 1)
        if kind == KILL9_ALL:
            target = ""  # every node
        elif kind == PROMOTE:
            target = rng.choice(node_ids)
        elif kind.startswith(PARTITION):
            target = "primary"
        elif kind == SIGSTOP:
            target = rng.choice(["primary", "primary", "primary", "backup"])
        else:
            target = rng.choice(["primary", "backup"])
        candidate = _Episode(kind, start, start + duration, target)
        candidate = _shift_clear(candidate, episodes)
        if candidate.start > WARMUP + FAULT_WINDOW:
            break
        episodes.append(candidate)
        start = round(candidate.start + rng.uniform(*GAP), 1)
    return episodes


def _one_down_then_all(rng: random.Random, start: float, placed: list[_Episode]) -> list[_Episode]:
    """A node killed (or terminated) first, then ``kill9-all`` while it is down; it is restarted with or
    after the others, so its store is older than theirs when the cluster comes back."""
    down = rng.choice([KILL9, SIGTERM])
    target = rng.choice(["primary", "backup"])
    lead = round(rng.uniform(*ONE_DOWN_LEAD), 1)
    duration = round(rng.uniform(*DOWN), 1)
    lag = round(rng.uniform(*ONE_DOWN_LAG), 1)
    start = _clear_of_everything(start, placed)
    return [_Episode(down, start, round(start + lead + duration + lag, 1), target),
            _Episode(KILL9_ALL, round(start + lead, 1), round(start + lead + duration, 1), "")]


def _clear_of_everything(start: float, placed: list[_Episode]) -> float:
    """The first time from ``start`` on at which no placed fault is active, nor a restarted node rejoining."""
    busy = [(e.start, e.busy_until) for e in placed if e.kind != PROMOTE]
    for _ in range(len(busy) + 1):
        ends = [until for began, until in busy if began <= start < until]
        if not ends:
            break
        start = round(max(ends) + 0.5, 1)
    return start


def _shift_clear(candidate: _Episode, placed: list[_Episode]) -> _Episode:
    """Move ``candidate`` later until it overlaps no fault of its class and at most one other fault.

    Every placed episode starts no later than ``candidate``, so overlapping
    means ending after its start; each move passes at least one end.  A
    ``kill9-all`` also keeps everything else away until its ``busy_until``
    and may start only while no node is frozen and no partition is in place.
    """
    for _ in range(2 * len(placed) + 1):  # each move passes an end or a busy_until: at most two per episode
        limits = [e.busy_until for e in placed
                  if e.exclusive_class == candidate.exclusive_class and candidate.start < e.busy_until]
        # nothing starts while every node is down or the cluster is coming back from it
        limits += [e.busy_until for e in placed if e.kind == KILL9_ALL and candidate.start < e.busy_until]
        if candidate.kind == KILL9_ALL:  # it may find one node down (or rejoining), not frozen or cut off
            limits += [e.end for e in placed if e.kind == SIGSTOP or e.kind.startswith(PARTITION)
                       if candidate.start < e.end]
        running = sorted(e.end for e in placed if e.kind != PROMOTE and candidate.start < e.end)
        if candidate.kind != PROMOTE and len(running) >= 2:
            limits.append(running[0])
        if not limits:
            break
        start = round(max(limits) + 0.5, 1)
        candidate = _Episode(candidate.kind, start, round(start + candidate.end - candidate.start, 1),
                             candidate.target)
    return candidate


def _linearize(episodes: list[_Episode]) -> list[Op]:
    """Turn placed episodes into ops with sleeps between; a check whenever no fault is active."""
    events: list[tuple[float, int, int]] = []  # (time, 0 = undo first at equal times, episode index)
    for index, episode in enumerate(episodes):
        events.append((episode.start, 1, index))
        if episode.kind != PROMOTE:
            events.append((episode.end, 0, index))
    events.sort()
    ops: list[Op] = []
    now = 0.0
    active: set[int] = set()
    for t, is_start, index in events:
        if t > now:
            ops.append(Op(SLEEP, seconds=round(t - now, 1)))
            now = t
        episode = episodes[index]
        label = f"f{index + 1}"
        if is_start:
            ops.append(_start_op(episode, label))
            if episode.kind != PROMOTE:
                active.add(index)
            continue
        kind = PARTITION if episode.kind.startswith(PARTITION) else episode.kind
        ops.append(Op(UNDO[kind], target=f"@{label}"))
        active.discard(index)
        if not active:
            ops.append(Op(CHECK))
    if not ops or ops[-1].kind != CHECK:
        ops.append(Op(CHECK))
    return ops


def _start_op(episode: _Episode, label: str) -> Op:
    if episode.kind.startswith(PARTITION):
        return Op(PARTITION, target=episode.target, label=label, arg=episode.kind[len(PARTITION) + 1:])
    if episode.kind == PROMOTE:
        return Op(PROMOTE, target=episode.target)
    return Op(episode.kind, target=episode.target, label=label)


# -- the fixed schedules ----------------------------------------------------------------------------


REPRO_ROUNDS = 3


def _freeze_with_socket_writes(i: int, cut_etcd: bool) -> list[Op]:
    """One round of the minimal reproduction; labels are numbered by round."""
    ops = [
        Op(PIN, target="primary", label=f"P{i}", arg=f"a{i}"),
        # A trickle, so that the node has input on a's connection after its last idle-timeout tick
        # before the freeze: otherwise it drops the connection on resume, unread (docs/nemesis.md).
        Op(RATE, arg=f"a{i}", count=50),
        Op(AWAIT_ACKED, arg=f"a{i}", count=10, seconds=15),
        Op(SIGSTOP, target=f"@P{i}", label=f"S{i}"),
        Op(SLEEP, seconds=0.4),  # a writes about 20 messages into the frozen node's socket
        Op(RATE, arg=f"a{i}", count=0),
        Op(AWAIT_PRIMARY, target=f"@P{i}", label=f"Q{i}", seconds=15),
        Op(SEND, arg="b", count=20),
        Op(AWAIT_ACKED, arg="b", count=20 * i, seconds=20),
    ]
    if cut_etcd:
        ops += [Op(PARTITION, target=f"@P{i}", label=f"E{i}", arg=PRIMARY_ETCD), Op(SIGCONT, target=f"@S{i}"),
                Op(SLEEP, seconds=2.0), Op(HEAL, target=f"@E{i}")]
    else:
        ops.append(Op(SIGCONT, target=f"@S{i}"))
    return ops + [
        Op(AWAIT_STATE, target=f"@P{i}", arg="backup", seconds=20),
        Op(CHECK),
        Op(PROMOTE, target=f"@P{i}"),
        Op(AWAIT_STATE, target=f"@P{i}", arg="primary", seconds=15),
        Op(CHECK),
    ]


def _frozen_primary_rejoins() -> Schedule:
    ops = [Op(PRODUCER, arg="b")]
    for i in range(1, REPRO_ROUNDS + 1):
        ops += _freeze_with_socket_writes(i, cut_etcd=False)
    return Schedule(
        name="frozen-primary-rejoins", ops=tuple(ops), load=False, faults=(SIGSTOP, PROMOTE),
        description="the minimal reproduction, three rounds: a producer pinned to primary P1 writes about 20 "
                    "messages into its socket while P1 is stopped; 20 more go to the new primary P2 and are "
                    "accepted; P1 resumes, rejoins as a backup and is promoted; the accepted messages must arrive. "
                    "Whether a resumed node reads its socket before it steps down is a race inside the node, "
                    "hence the rounds")


def _frozen_primary_resumes_cut_from_etcd() -> Schedule:
    ops = [Op(PRODUCER, arg="b"), *_freeze_with_socket_writes(1, cut_etcd=True)]
    return Schedule(
        name="frozen-primary-resumes-cut-from-etcd", ops=tuple(ops), load=False,
        faults=(SIGSTOP, f"{PARTITION}-{PRIMARY_ETCD}", PROMOTE),
        description="the minimal reproduction without its race: P1 resumes while cut from etcd for 2 s, so its "
                    "step-down waits for an etcd read that times out, and it reads its socket first")


def _frozen_primary_reelected() -> Schedule:
    ops = (
        Op(SLEEP, seconds=WARMUP),
        Op(SIGSTOP, target="primary", label="F"),
        Op(SLEEP, seconds=4.0),
        Op(SIGCONT, target="@F"),
        Op(AWAIT_STATE, target="@F", arg="backup", seconds=20),
        Op(CHECK),
        Op(PROMOTE, target="@F"),
        Op(AWAIT_STATE, target="@F", arg="primary", seconds=15),
        Op(CHECK),
    )
    return Schedule(
        name="frozen-primary-reelected", ops=ops, faults=(SIGSTOP, PROMOTE),
        description="under load, freeze the primary 4 s (lease 2 s), let another be elected, resume it, then "
                    "elect the formerly frozen node and drain")


def _partitioned_primary_killed() -> Schedule:
    ops = (
        Op(SLEEP, seconds=WARMUP),
        Op(PARTITION, target="primary", label="X", arg=PRIMARY_BACKUPS),
        Op(SLEEP, seconds=4.0),
        Op(KILL9, target="@X", label="K"),
        Op(SLEEP, seconds=2.0),
        Op(HEAL, target="@X"),
        Op(RESTART, target="@K"),
        Op(AWAIT_STATE, target="@K", arg="backup", seconds=25),
        Op(CHECK),
    )
    return Schedule(
        name="partitioned-primary-killed", ops=ops, faults=(f"{PARTITION}-{PRIMARY_BACKUPS}", KILL9),
        description="under load, cut the primary from its backups (not from etcd) for 4 s, then kill -9 it; "
                    "heal, restart it and drain")


def _primary_cut_from_etcd() -> Schedule:
    ops = (
        Op(SLEEP, seconds=WARMUP),
        Op(PARTITION, target="primary", label="X", arg=PRIMARY_ETCD),
        Op(SLEEP, seconds=5.0),
        Op(HEAL, target="@X"),
        Op(AWAIT_STATE, target="@X", arg="backup", seconds=20),
        Op(CHECK),
        Op(PROMOTE, target="@X"),
        Op(AWAIT_STATE, target="@X", arg="primary", seconds=15),
        Op(CHECK),
    )
    return Schedule(
        name="primary-cut-from-etcd", ops=ops, faults=(f"{PARTITION}-{PRIMARY_ETCD}", PROMOTE),
        description="under load, cut the primary from etcd for 5 s; heal, then elect it again and drain")


def _frozen_primary_killed_backup() -> Schedule:
    ops = (
        Op(SLEEP, seconds=WARMUP),
        Op(SIGSTOP, target="primary", label="F"),
        Op(SLEEP, seconds=0.5),
        Op(KILL9, target="backup", label="K"),
        Op(SLEEP, seconds=4.0),
        Op(SIGCONT, target="@F"),
        Op(SLEEP, seconds=1.0),
        Op(RESTART, target="@K"),
        Op(AWAIT_STATE, target="@K", arg="backup", seconds=25),
        Op(AWAIT_STATE, target="@F", arg="backup", seconds=20),
        Op(CHECK),
        Op(ELECT_EACH, target="@F,@K"),
    )
    return Schedule(
        name="frozen-primary-killed-backup", ops=ops, faults=(SIGSTOP, KILL9, PROMOTE),
        description="under load, freeze the primary and kill -9 a backup while it is frozen; the third node "
                    "takes over; resume, restart, then elect the formerly frozen and the killed node in turn")


def _every_node_killed() -> Schedule:
    ops = (
        Op(SLEEP, seconds=WARMUP),
        # a backlog of acknowledged durable messages in every node's journal (p1 is one of three producers)
        Op(AWAIT_ACKED, arg="p1", count=60, seconds=15),
        Op(KILL9_ALL, label="A"),
        Op(SLEEP, seconds=2.0),
        Op(RESTART, target="@A"),
        Op(CHECK),
        Op(ELECT_EACH, target=",".join(NODE_IDS)),
    )
    return Schedule(
        name="every-node-killed", ops=ops, faults=(KILL9_ALL, PROMOTE),
        description="under load (durable messages, journals), kill -9 every node at once; start them all again: "
                    "they must elect a primary from the most recent store by themselves and hold every "
                    "acknowledged message; then elect each node in turn and drain")


def _virtual_ip_through_partitions() -> Schedule:
    ops = (
        Op(SLEEP, seconds=WARMUP),
        Op(PARTITION, target="primary", label="A", arg=PRIMARY_ALL),
        Op(SLEEP, seconds=5.0),
        Op(HEAL, target="@A"),
        Op(AWAIT_STATE, target="@A", arg="backup", seconds=20),
        Op(CHECK),
        Op(PARTITION, target="primary", label="E", arg=PRIMARY_ETCD),
        Op(SLEEP, seconds=5.0),
        Op(HEAL, target="@E"),
        Op(AWAIT_STATE, target="@E", arg="backup", seconds=20),
        Op(CHECK),
        Op(PARTITION, target="primary", label="C", arg=CLIENTS_PRIMARY),
        Op(SLEEP, seconds=3.0),
        Op(HEAL, target="@C"),
        Op(KILL9, target="primary", label="K"),
        Op(SLEEP, seconds=2.0),
        Op(RESTART, target="@K"),
        Op(AWAIT_STATE, target="@K", arg="backup", seconds=25),
        Op(PROMOTE, target="backup"),
        Op(CHECK),
    )
    return Schedule(
        name="virtual-ip-through-partitions", ops=ops, virtual_ip=True,
        faults=(f"{PARTITION}-{PRIMARY_ALL}", f"{PARTITION}-{PRIMARY_ETCD}", f"{PARTITION}-{CLIENTS_PRIMARY}",
                KILL9, PROMOTE),
        description="the nodes hold a virtual IP and one more producer knows only it; under load, cut the "
                    "primary from every host for 5 s (the address must move to the new primary, whose "
                    "announcement resets the producer's stalled connection), then from etcd only for 5 s, then "
                    "the clients from the primary for 3 s (the address's path itself cut: nothing moves), kill -9 "
                    "the primary (its address stays on the dead host until it starts again) and restart it, "
                    "promote a backup (a handover); a check after each, where the address must be on the "
                    "primary alone")


FIXED: dict[str, Schedule] = {s.name: s for s in (
    _frozen_primary_rejoins(), _frozen_primary_reelected(), _partitioned_primary_killed(),
    _primary_cut_from_etcd(), _frozen_primary_killed_backup(), _frozen_primary_resumes_cut_from_etcd(),
    _every_node_killed(), _virtual_ip_through_partitions(),
)}
"""The named, deterministic schedules (``--fixed``), in the order they run."""
