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

Disk faults (``docs/nemesis.md``, "Disk faults"): ``rot`` flips bytes of a
node's journal (or of its checkpoint) while the node is down, before its
restart; ``disk-fail`` ... ``disk-repair`` fails a node's file system (the
kernel turns it read-only) and later kills the node, repairs the file system
and starts the node again, which needs the nodes on disks of their own
(``Schedule.disks``).  ``assert`` ops state what must hold (a damaged node is
not elected, a failed backup does not stop the acknowledgements, ...); one
that does not hold fails the schedule.  Random schedules draw disk faults
only when asked (``--faults rot,ro``): the default kinds, and so every seed's
schedule of them, are what they were.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

NODE_IDS = ("n1", "n2", "n3")

# -- op kinds (also the ``op`` field of the trace's ``nemesis`` events) -----------------------------
SLEEP = "sleep"
KILL9 = "kill9"
KILL9_ALL = "kill9-all"  # kill -9 every node at once (target empty), later `restart @L` starts them all
SIGSTOP = "sigstop"
SIGCONT = "sigcont"
SIGTERM = "sigterm"
RESTART = "restart"
PROMOTE = "promote"  # arg "force": `promote --force` (start a restarted cluster from target, accepting a loss)
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
# disk faults
ROT = "rot"  # arg: a ROT_POSITIONS entry; target: a node that is down (of a kill9-all @L: @L or @L:primary is the
#              node that was primary, @L:backup one that was a backup)
DISK_FAIL = "disk-fail"  # the target's file system turns read-only (needs Schedule.disks)
DISK_REPAIR = "disk-repair"  # kill -9 the target, repair its file system, start it again
ASSERT = "assert"  # arg: an ASSERTIONS entry about target, bounded by seconds; one that does not hold fails the schedule

ROT_POSITIONS = ("middle", "tail", "header", "checkpoint")  # journal at half its size, 6 bytes before its end,
#                                                              at byte 12 (its first record); its checkpoint file
ASSERTIONS = (
    "found-damage",  # the target's start found its journal damaged (STATUS journal.found_damaged or .damaged)
    "no-damage",  # ... found nothing damaged
    "damage-cleared",  # the target no longer lacks data (journal.damaged null, no journal.damaged.json)
    "not-primary",  # once the target answers, it is not primary for `seconds` (no node is)
    "not-primary-if-damaged",  # the same, if its start found damage (else: noted, nothing asserted)
    "in-sync",  # etcd's sync set names the target (a precondition of a schedule)
    "acking",  # the background producers have `seconds` of acknowledgements (a quarter of the offered rate at
    #            least) and none refused since the op that bound target (a failed backup costs no message)
)
RESTART_EXCEPT = "except "  # restart's arg "except @L": a kill9-all's restart leaves that node down

OP_KINDS = (SLEEP, KILL9, KILL9_ALL, SIGSTOP, SIGCONT, SIGTERM, RESTART, PROMOTE, PARTITION, HEAL, CHECK, ELECT_EACH, PIN,
            PRODUCER, SEND, RATE, AWAIT_ACKED, AWAIT_PRIMARY, AWAIT_STATE, ROT, DISK_FAIL, DISK_REPAIR, ASSERT)
NODE_FAULTS = (KILL9, KILL9_ALL, SIGSTOP, SIGTERM, DISK_FAIL)
UNDO = {KILL9: RESTART, KILL9_ALL: RESTART, SIGTERM: RESTART, SIGSTOP: SIGCONT, PARTITION: HEAL, DISK_FAIL: DISK_REPAIR}

# -- fault kinds a random schedule draws from (``--faults``) -----------------------------------------
PRIMARY_ETCD = "primary-etcd"  # the primary cannot reach etcd (nor etcd it)
PRIMARY_BACKUPS = "primary-backups"  # the primary cannot reach the other nodes
CLIENTS_PRIMARY = "clients-primary"  # the clients cannot reach the primary
PARTITIONS = (PRIMARY_ETCD, PRIMARY_BACKUPS, CLIENTS_PRIMARY)
PRIMARY_ALL = "primary-all"  # the primary cannot reach any host (its link cut); fixed schedules only, so that a
#                              seed's random schedule stays what it was
FAULT_KINDS = (KILL9, KILL9_ALL, SIGSTOP, SIGTERM, PROMOTE, *(f"{PARTITION}-{p}" for p in PARTITIONS))
# Disk faults are drawn only when named: FAULT_KINDS is the default, and a seed's schedule of it stays what it was.
ROT_KIND = "rot"  # a node down (kill -9, SIGTERM, or every node) with bit rot in its files before its restart
READ_ONLY = "disk-read-only"  # a backup's file system fails; later the node is killed, the disk repaired, restarted
DISK_FAULT_KINDS = (ROT_KIND, READ_ONLY)
KNOWN_FAULT_KINDS = (*FAULT_KINDS, *DISK_FAULT_KINDS)
FAULT_ALIASES = {
    "kill": KILL9, "kill9": KILL9, "all": KILL9_ALL, "kill-all": KILL9_ALL, "stop": SIGSTOP, "sigstop": SIGSTOP,
    "term": SIGTERM, "sigterm": SIGTERM,
    "promote": PROMOTE, "etcd": f"{PARTITION}-{PRIMARY_ETCD}", "backups": f"{PARTITION}-{PRIMARY_BACKUPS}",
    "clients": f"{PARTITION}-{CLIENTS_PRIMARY}", "bitrot": ROT_KIND, "ro": READ_ONLY, "read-only": READ_ONLY,
    **{kind: kind for kind in KNOWN_FAULT_KINDS},
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
ROT_VARIANTS = (KILL9, SIGTERM, KILL9_ALL)  # how a rot's node goes down
ROT_ORDERS = ("damaged-first", "together", "damaged-last")  # a kill9-all rot's restarts: the damaged node alone
#                                                             first, all at once, or after the others
ROT_HOLD = (3.0, 5.0)  # s between the first and the second restart of a kill9-all rot (not together)
READ_ONLY_TIME = (3.0, 6.0)  # s a backup's file system is read-only until the repair


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
    disks: bool = False  # every node's data dir on an ext4 file system of its own (disk-fail, disk-repair)

    def __str__(self) -> str:
        return f"{self.name}: " + "; ".join(str(op) for op in self.ops if op.kind != SLEEP)


@dataclass(frozen=True)
class _Episode:
    """One fault from its start to its undo, as the generator places it."""

    kind: str  # a KNOWN_FAULT_KINDS entry
    start: float
    end: float
    target: str
    variant: str = ""  # a rot's: how its node goes down (ROT_VARIANTS)
    position: str = ""  # a rot's: ROT_POSITIONS
    order: str = ""  # a kill9-all rot's: ROT_ORDERS
    hold: float = 0.0  # a kill9-all rot's: s between its first and its second restart (after `end`)

    @property
    def takes_all(self) -> bool:
        """Every node goes down (kill9-all, or a rot that starts with one)."""
        return self.kind == KILL9_ALL or (self.kind == ROT_KIND and self.variant == KILL9_ALL)

    @property
    def exclusive_class(self) -> str:
        """Faults of one class never overlap (see the module docstring); a failed disk is as good as down."""
        if self.takes_all:
            return "all-down"
        if self.kind in (KILL9, SIGTERM, ROT_KIND, READ_ONLY):
            return "down"
        if self.kind.startswith(PARTITION):
            return PARTITION
        return self.kind

    @property
    def busy_until(self) -> float:
        """Until when another fault of the same class must wait (a restarted node catches up first)."""
        return self.end + self.hold + (REJOIN if self.exclusive_class in ("down", "all-down") else 0.0)


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
    unknown = set(faults) - set(KNOWN_FAULT_KINDS)
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
                    faults=tuple(dict.fromkeys(e.kind for e in episodes)),
                    disks=any(e.kind == READ_ONLY for e in episodes))


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
        if kind in DISK_FAULT_KINDS:  # draws of their own: the other kinds draw as they always did
            candidate = _disk_episode(rng, kind, start)
            candidate = _shift_clear(candidate, episodes)
            if candidate.start > WARMUP + FAULT_WINDOW:
                break
            episodes.append(candidate)
            start = round(candidate.start + rng.uniform(*GAP), 1)
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


def _disk_episode(rng: random.Random, kind: str, start: float) -> _Episode:
    """A rot (a node down, or every node, with bit rot in its files before its restart) or a backup's
    read-only disk (failed, later repaired)."""
    if kind == READ_ONLY:
        return _Episode(kind, start, round(start + rng.uniform(*READ_ONLY_TIME), 1), "backup")
    variant = rng.choice(ROT_VARIANTS)
    position = rng.choice(ROT_POSITIONS)
    duration = round(rng.uniform(*DOWN), 1)
    target = rng.choice(["primary", "backup"])  # with kill9-all: which of the killed nodes rots
    order, hold = "", 0.0
    if variant == KILL9_ALL:
        order = rng.choice(ROT_ORDERS)
        hold = round(rng.uniform(*ROT_HOLD), 1) if order != "together" else 0.0
    return _Episode(kind, start, round(start + duration, 1), target, variant, position, order, hold)


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
        limits += [e.busy_until for e in placed if e.takes_all and candidate.start < e.busy_until]
        if candidate.takes_all:  # it may find one node down (or rejoining), not frozen, cut off or failing a disk
            limits += [e.end for e in placed if e.kind in (SIGSTOP, READ_ONLY) or e.kind.startswith(PARTITION)
                       if candidate.start < e.end]
        running = sorted(e.end for e in placed if e.kind != PROMOTE and candidate.start < e.end)
        if candidate.kind != PROMOTE and len(running) >= 2:
            limits.append(running[0])
        if not limits:
            break
        start = round(max(limits) + 0.5, 1)
        candidate = replace(candidate, start=start, end=round(start + candidate.end - candidate.start, 1))
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
            ops += _start_ops(episode, label)
            if episode.kind != PROMOTE:
                active.add(index)
            continue
        ops += _undo_ops(episode, label)
        active.discard(index)
        if not active:
            ops.append(Op(CHECK))
    if not ops or ops[-1].kind != CHECK:
        ops.append(Op(CHECK))
    return ops


def _start_ops(episode: _Episode, label: str) -> list[Op]:
    if episode.kind.startswith(PARTITION):
        return [Op(PARTITION, target=episode.target, label=label, arg=episode.kind[len(PARTITION) + 1:])]
    if episode.kind == PROMOTE:
        return [Op(PROMOTE, target=episode.target)]
    if episode.kind == READ_ONLY:
        return [Op(DISK_FAIL, target=episode.target, label=label)]
    if episode.kind == ROT_KIND:
        if episode.variant == KILL9_ALL:  # the rot goes to the node that was primary, or to one that was a backup
            return [Op(KILL9_ALL, label=label),
                    Op(ROT, target=f"@{label}:{episode.target}", label=f"{label}r", arg=episode.position)]
        return [Op(episode.variant, target=episode.target, label=label),
                Op(ROT, target=f"@{label}", arg=episode.position)]
    return [Op(episode.kind, target=episode.target, label=label)]


def _undo_ops(episode: _Episode, label: str) -> list[Op]:
    if episode.kind == ROT_KIND and episode.variant == KILL9_ALL and episode.order != "together":
        damaged = f"@{label}r"
        if episode.order == "damaged-first":  # alone, with every other node down: it must not start the cluster
            return [Op(RESTART, target=damaged),
                    Op(ASSERT, target=damaged, arg="not-primary-if-damaged", seconds=episode.hold),
                    Op(RESTART, target=f"@{label}")]
        return [Op(RESTART, target=f"@{label}", arg=RESTART_EXCEPT + damaged), Op(SLEEP, seconds=episode.hold),
                Op(RESTART, target=damaged)]
    kind = PARTITION if episode.kind.startswith(PARTITION) else episode.kind
    kind = {READ_ONLY: DISK_FAIL, ROT_KIND: KILL9}.get(kind, kind)
    return [Op(UNDO[kind], target=f"@{label}")]


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


def _damaged_sync_member_first() -> Schedule:
    ops = (
        Op(SLEEP, seconds=WARMUP),
        Op(AWAIT_ACKED, arg="p1", count=60, seconds=15),  # a backlog of durable messages in every journal
        Op(KILL9_ALL, label="A"),
        Op(ROT, target="@A", label="D", arg="middle"),
        Op(ASSERT, target="@D", arg="in-sync"),  # the sync set names it: without the damage it may start the cluster
        Op(RESTART, target="@D"),
        Op(ASSERT, target="@D", arg="found-damage", seconds=20),
        Op(ASSERT, target="@D", arg="not-primary", seconds=5),  # alone, every other node down
        Op(RESTART, target="@A"),  # the others (the damaged node is running already)
        Op(AWAIT_STATE, target="@D", arg="backup", seconds=30),
        Op(ASSERT, target="@D", arg="damage-cleared", seconds=10),
        Op(CHECK),
        Op(ELECT_EACH, target=",".join(NODE_IDS)),
    )
    return Schedule(
        name="damaged-sync-member-first", ops=ops, faults=(KILL9_ALL, ROT_KIND, PROMOTE),
        description="under load (durable messages, journals), kill -9 every node; flip 3 bytes in the middle of "
                    "the journal of the node that was primary (a sync set member); start it first and alone: its "
                    "start must find the damage and it must not become primary while the others are down (it "
                    "lacks data they hold); start the others: one of them starts the cluster, the damaged node "
                    "catches up and no longer lacks data; check; elect each node in turn, the damaged one "
                    "included, and drain")


def _damaged_tail_sync_member_first() -> Schedule:
    ops = (
        Op(PRODUCER, arg="b"),
        Op(RATE, arg="b", count=20),  # a trickle, no consumer: the last journal record is an acknowledged enqueue
        Op(AWAIT_ACKED, arg="b", count=40, seconds=15),
        Op(KILL9_ALL, label="A"),
        Op(ROT, target="@A", label="D", arg="tail"),  # its last record, fsynced, within the checkpoint's lag
        Op(ASSERT, target="@D", arg="in-sync"),
        Op(RESTART, target="@D"),
        # All of the last record's bytes are there: not a torn write.  (Before the reader told a whole damaged
        # record from one a crash cut short, it was cut as torn, and the node started the cluster alone: the
        # others dropped their copy of the message, 4 runs of 4.)
        Op(ASSERT, target="@D", arg="found-damage", seconds=20),
        Op(ASSERT, target="@D", arg="not-primary", seconds=5),
        Op(RESTART, target="@A"),
        Op(AWAIT_STATE, target="@D", arg="backup", seconds=30),
        Op(ASSERT, target="@D", arg="damage-cleared", seconds=10),
        Op(CHECK),
        Op(ELECT_EACH, target=",".join(NODE_IDS)),
    )
    return Schedule(
        name="damaged-tail-sync-member-first", ops=ops, load=False, faults=(KILL9_ALL, ROT_KIND, PROMOTE),
        description="a producer sends 20 durable messages a second, no consumer; kill -9 every node; flip 3 bytes "
                    "6 bytes before the end of the former primary's journal (its last record: an acknowledged "
                    "message, fsynced less than a second ago, beyond the bytes its checkpoint names yet); start it "
                    "first and alone: its start must find the damage (the record is whole: a crash does not leave "
                    "it so) and it must not become primary; start the others; it catches up; check; elect each node "
                    "in turn and drain.  Every acknowledged message must come back: a node that cut its damaged "
                    "last record as a torn write and started the cluster alone made the others drop their copy")


def _backup_disk_read_only() -> Schedule:
    ops = (
        Op(SLEEP, seconds=WARMUP),
        Op(AWAIT_ACKED, arg="p1", count=30, seconds=15),
        Op(DISK_FAIL, target="backup", label="F"),
        Op(SLEEP, seconds=1.0),
        Op(ASSERT, target="@F", arg="acking", seconds=5),  # 3 nodes, min_sync 2: the primary goes on without it
        Op(SLEEP, seconds=1.0),
        Op(DISK_REPAIR, target="@F"),
        Op(AWAIT_STATE, target="@F", arg="backup", seconds=30),
        Op(CHECK),
        Op(ELECT_EACH, target=",".join(NODE_IDS)),
    )
    return Schedule(
        name="backup-disk-read-only", ops=ops, disks=True, faults=(READ_ONLY, PROMOTE),
        description="every node's data dir on an ext4 file system of its own; under load, the kernel fails a "
                    "backup's file system (read-only, every write EROFS): the backup leaves its primary, which "
                    "goes on acknowledging with the other backup (min_sync 2) and refuses nothing; 7 s later "
                    "kill -9 the backup, repair its file system (umount, e2fsck, mount) and start it: it catches "
                    "up; check; elect each node in turn and drain")


def _clean_stop_rot() -> Schedule:
    ops = (
        Op(SLEEP, seconds=WARMUP),
        Op(AWAIT_ACKED, arg="p1", count=30, seconds=15),
        Op(SIGTERM, target="primary", label="T"),
        Op(ROT, target="@T", arg="tail"),  # its last record: below the bytes its checkpoint says are on disk
        Op(RESTART, target="@T"),
        Op(ASSERT, target="@T", arg="found-damage", seconds=20),
        Op(AWAIT_STATE, target="@T", arg="backup", seconds=30),
        Op(ASSERT, target="@T", arg="damage-cleared", seconds=10),
        Op(CHECK),
        Op(SIGTERM, target="backup", label="U"),
        Op(ROT, target="@U", arg="checkpoint"),  # the checkpoint is ignored; the journal ends with its CLOSE
        Op(RESTART, target="@U"),
        Op(ASSERT, target="@U", arg="no-damage", seconds=20),
        Op(AWAIT_STATE, target="@U", arg="backup", seconds=30),
        Op(CHECK),
        Op(ELECT_EACH, target=",".join(NODE_IDS)),
    )
    return Schedule(
        name="clean-stop-rot", ops=ops, faults=(SIGTERM, ROT_KIND, PROMOTE),
        description="under load, SIGTERM the primary (a clean stop: its checkpoint says every byte is on disk), "
                    "flip 3 bytes 6 bytes before the end of its journal (its last record), start it: the start must "
                    "call that damage, not a torn tail, and the node catches up and no longer lacks data; then "
                    "SIGTERM a backup, flip 3 bytes of its checkpoint file, start it: the checkpoint is ignored, "
                    "nothing is damaged; check after each; elect each node in turn and drain")


FIXED: dict[str, Schedule] = {s.name: s for s in (
    _frozen_primary_rejoins(), _frozen_primary_reelected(), _partitioned_primary_killed(),
    _primary_cut_from_etcd(), _frozen_primary_killed_backup(), _frozen_primary_resumes_cut_from_etcd(),
    _every_node_killed(), _virtual_ip_through_partitions(), _damaged_sync_member_first(), _backup_disk_read_only(),
    _clean_stop_rot(), _damaged_tail_sync_member_first(),
)}
"""The named, deterministic schedules (``--fixed``), in the order they run."""


def _damaged_node_forced_first() -> Schedule:
    ops = (
        Op(PRODUCER, arg="b"),
        Op(SEND, arg="b", count=300),
        Op(AWAIT_ACKED, arg="b", count=300, seconds=30),  # no consumer: all 300 are in every journal
        Op(KILL9_ALL, label="A"),
        Op(ROT, target="@A", label="D", arg="middle"),
        Op(RESTART, target="@D"),
        Op(ASSERT, target="@D", arg="found-damage", seconds=20),
        Op(PROMOTE, target="@D", arg="force"),  # the operator accepts the loss: it starts the cluster alone
        Op(AWAIT_STATE, target="@D", arg="primary", seconds=20),
        Op(RESTART, target="@A"),
        Op(CHECK),
    )
    return Schedule(
        name="damaged-node-forced-first", ops=ops, load=False, faults=(KILL9_ALL, ROT_KIND, PROMOTE),
        description="a NEGATIVE CONTROL, which must fail: 300 durable messages acknowledged and not consumed; kill "
                    "-9 every node, flip 3 bytes in the middle of the former primary's journal, start it alone and "
                    "`promote --force` it (an operator accepting the loss) before the others come back: they "
                    "follow it and drop the copies it lost, and the total-queue checker must count those "
                    "acknowledged messages as lost (the schedule is INVALID).  If it passes, the harness cannot "
                    "see a damaged node elected")


CANARIES: dict[str, Schedule] = {s.name: s for s in (_damaged_node_forced_first(),)}
"""Schedules that must FAIL (negative controls of the harness): run by name with ``--fixed``, never by ``all``."""
