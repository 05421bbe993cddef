"""Synthetic failover traces whose every figure is known in advance.

Why: the dashboard job must compute phase durations, throughput dips and
percentiles *exactly*; tests (and the 10,000-round speed check) need traces
for which the right answer is known without running a cluster.  Each
:class:`SyntheticRound` draws its phase durations in whole microseconds,
writes a trace in the documented format (``docs/failover-traces.md``) and
states, through :meth:`SyntheticRound.expected`, the per-round summary the
job must produce.

The shape of a synthetic round (times from ``round_start``):

* 0.2 s: the cluster forms: ``election_won``/``promoted`` for the first
  primary, every backup ``backup_reattached``/``backup_caught_up``;
* 1.0 s: the producer starts and gets ``load_msg_s / 10`` acknowledgements
  in every 100 ms bucket; at 2.5 s the consumer has a transient reconnect
  (these pre-fault events must be ignored by the job);
* 4.0 s + a random part of a bucket: the fault; then the five sequential
  phases back to back (detection, election, promotion, client reconnect,
  first accepted send) and, in parallel from the promotion, backup re-attach
  and catch-up;
* acknowledgements: the fault's bucket holds the share of the steady count
  sent before the fault, then zeros, then the first accepted send's bucket
  holds at most half the steady count, and every later bucket the full
  steady count again.  So the steady rate is exactly the steady count, the
  dip minimum is 0 and the rate is back to steady at the start of the bucket
  after the first accepted send;
* the producer stops 0.5 s before ``round_end``; ``tally`` comes last but one.

A *nemesis* round (:func:`make_nemesis_round`, fault ``nemesis``) has the
same shape and timing, plus what the nemesis writes
(``docs/failover-traces.md``, "Nemesis traces"): the schedule in
``round_start``, a :class:`NemesisScript` of ops from the fault on (150 ms
apart: the first fault, its undo, a second fault that may be refused or
skipped, its undo, a check, ``elect_each`` and its promotion), a
``replica_check`` per check plus a final one, a ``node_state`` line (an
event the analysis ignores) and a ``checker`` line just before ``tally``,
whose verdict is chosen: ``ok``, ``INVALID`` (messages lost, maybe
unexpected), ``MISMATCH`` (a check found different replicas) or
``NO VERDICT`` (not drained, an op failed).

Run as ``python -m spark_analysis.synthetic --rounds N --out DIR [--nemesis M]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from spark_analysis import phases as ph
from spark_analysis import trace_schema as ts

BUCKET_US = ts.ACK_BUCKET_MS * 1000
EPOCH_BASE_S = 1_700_000_000
"""Unix time of the first synthetic round; rounds start one minute apart."""
PRODUCER_START_US = 1_000_000
FAULT_AT_US = 4_000_000
MIN_UNAVAILABILITY_US = 2 * BUCKET_US
"""Keeps at least one empty bucket between the fault and the first accepted send."""


@dataclass(frozen=True)
class RoundConfig:
    """The dimensions a round is aggregated by."""

    fault: str
    lease_ttl_s: float
    nodes: int
    load_msg_s: int

    def __post_init__(self) -> None:
        if self.fault not in ts.ROUND_FAULTS:
            raise ValueError(f"fault must be one of {ts.ROUND_FAULTS}, not {self.fault!r}")
        if self.nodes < 2:
            raise ValueError("a failover needs at least 2 nodes")
        if self.load_msg_s <= 0 or (self.load_msg_s * ts.ACK_BUCKET_MS) % 1000:
            raise ValueError("load_msg_s must give a whole number of acks per bucket")


DEFAULT_CONFIGS = tuple(
    RoundConfig(fault, ttl, nodes, load)
    for fault in ts.FAULTS
    for ttl in (1.0, 3.0)
    for nodes in (2, 3)
    for load in (200, 1000)
)


NEMESIS_CONFIG = RoundConfig(ts.FAULT_NEMESIS, 2.0, 3, 80)
"""What the nemesis runs: lease TTL 2 s, three nodes (the load is a whole count per bucket)."""
NEMESIS_OP_GAP_US = 150_000
"""Time between two ops of a synthetic nemesis round, from its first fault on."""
NEMESIS_VERDICT_CYCLE = (
    ts.VERDICT_OK, ts.VERDICT_OK, ts.VERDICT_INVALID, ts.VERDICT_OK, ts.VERDICT_OK,
    ts.VERDICT_MISMATCH, ts.VERDICT_OK, ts.VERDICT_OK, ts.VERDICT_NO_VERDICT,
)
"""Verdicts of :func:`generate_nemesis_rounds` in turn: one round in three fails."""
UNDO = {ts.FAULT_KILL9: "restart", ts.FAULT_KILL9_ALL: "restart", ts.FAULT_SIGTERM: "restart",
        ts.FAULT_SIGSTOP: "sigcont", ts.OP_PARTITION: "heal"}
PARTITION_KINDS = ("primary-etcd", "primary-backups", "clients-primary")


@dataclass(frozen=True)
class NemesisOp:
    """One ``nemesis`` line: ``offset_us`` after the round's fault."""

    offset_us: int
    op: str
    node: str | None
    result: str
    arg: str | None = None

    @property
    def fault_type(self) -> str:
        return ts.fault_type(self.op, self.arg)


@dataclass(frozen=True)
class NemesisScript:
    """What a synthetic nemesis round does and what its checker finds."""

    schedule: str
    seed: int | None
    ops: tuple[NemesisOp, ...]
    check_mismatches: tuple[int, ...]
    """Mismatches of each replica check, in order; the last one is the final check."""
    lost: int
    unexpected: int
    duplicated: int
    """Ids received more than once."""
    duplicates: int
    """Extra copies received (the tally's ``duplicated``)."""
    recovered: int
    drain_complete: bool

    @property
    def faults(self) -> list[str]:
        """The schedule's fault kinds, as ``round_start`` lists them."""
        return list(dict.fromkeys(o.fault_type for o in self.ops
                                  if ts.op_role(o.op) == ts.ROLE_FAULT))

    @property
    def valid(self) -> bool:
        return not self.lost and not self.unexpected

    @property
    def replica_mismatches(self) -> int:
        return sum(self.check_mismatches)

    @property
    def verdict(self) -> str:
        return ts.verdict(self.valid, self.drain_complete, self.replica_mismatches)

    @property
    def lost_ids(self) -> list[str]:
        return [f"p1-{100 + i:06d}" for i in range(min(self.lost, 20))]

    @property
    def unexpected_ids(self) -> list[str]:
        return [f"p9-{i:06d}" for i in range(min(self.unexpected, 20))]


@dataclass(frozen=True)
class SyntheticRound:
    """One round: its configuration and the durations (whole µs) it was built from."""

    round_id: str
    config: RoundConfig
    start_us: int
    fault_offset_us: int
    detection_us: int
    election_us: int
    promotion_us: int
    reconnect_us: int
    first_send_us: int
    reattach_us: int
    catch_up_us: int
    first_client: str
    new_primary: str
    lost_acknowledged: int
    duplicated: int
    nemesis: NemesisScript | None = None
    """Set for a nemesis round (``config.fault`` is ``nemesis``)."""

    @property
    def node_ids(self) -> list[str]:
        return [f"n{i + 1}" for i in range(self.config.nodes)]

    @property
    def primary(self) -> str:
        return self.node_ids[0]

    @property
    def unavailability_us(self) -> int:
        return (
            self.detection_us
            + self.election_us
            + self.promotion_us
            + self.reconnect_us
            + self.first_send_us
        )

    @property
    def steady_acks(self) -> int:
        return self.config.load_msg_s * ts.ACK_BUCKET_MS // 1000

    @property
    def back_to_steady_us(self) -> int:
        first_accepted = self.fault_offset_us + self.unavailability_us
        return (first_accepted // BUCKET_US + 1) * BUCKET_US - self.fault_offset_us

    def bucket_counts(self) -> dict[int, int]:
        """Acknowledgements per bucket index, as the producer would report them."""
        steady = self.steady_acks
        fault_bucket, fault_part = divmod(self.fault_offset_us, BUCKET_US)
        accepted_bucket, accepted_part = divmod(
            self.fault_offset_us + self.unavailability_us, BUCKET_US
        )
        stop_bucket, stop_part = divmod(self._producer_stop_us(), BUCKET_US)
        counts = {}
        for k in range(PRODUCER_START_US // BUCKET_US, stop_bucket + 1):
            if k < fault_bucket or k > accepted_bucket:
                counts[k] = steady
            elif k == fault_bucket:
                counts[k] = steady * fault_part // BUCKET_US
            elif k == accepted_bucket:
                counts[k] = steady * (BUCKET_US - accepted_part) // BUCKET_US // 2
            else:
                counts[k] = 0
        counts[stop_bucket] = steady * stop_part // BUCKET_US
        return counts

    def expected(self) -> dict[str, object]:
        """The summary row the dashboard job must compute for this round."""
        acknowledged = sum(self.bucket_counts().values())
        durations = {
            ph.DETECTION.column: self.detection_us,
            ph.ELECTION.column: self.election_us,
            ph.PROMOTION.column: self.promotion_us,
            ph.RECONNECT.column: self.reconnect_us,
            ph.FIRST_SEND.column: self.first_send_us,
            ph.UNAVAILABILITY.column: self.unavailability_us,
            ph.REATTACH.column: self.reattach_us,
            ph.CATCH_UP.column: self.catch_up_us,
            ph.BACK_TO_STEADY_MS: self.back_to_steady_us,
        }
        return {
            ts.ROUND: self.round_id,
            ts.FAULT: self.config.fault,
            ts.LEASE_TTL_S: self.config.lease_ttl_s,
            ts.NODES: self.config.nodes,
            ts.LOAD_MSG_S: float(self.config.load_msg_s),
            ts.PRIMARY: self.primary,
            "new_primary": self.new_primary,
            **{column: us / 1000 for column, us in durations.items()},
            "steady_acks_per_100ms": float(self.steady_acks),
            "dip_min_acks_per_100ms": 0,
            ts.SENT: acknowledged + 3,  # 3 sends in flight at the fault, never acknowledged
            ts.ACKNOWLEDGED: acknowledged,
            ts.RECEIVED: acknowledged - self.lost_acknowledged + self.duplicated
            + (self.nemesis.recovered + self.nemesis.unexpected if self.nemesis else 0),
            ts.LOST_ACKNOWLEDGED: self.lost_acknowledged,
            ts.DUPLICATED: self.duplicated,
        }

    def expected_nemesis(self) -> dict[str, object]:
        """The nemesis-table row (``nemesis.NEMESIS_COLUMNS`` but ``file``) the job must produce."""
        script = self.nemesis
        assert script is not None, "not a nemesis round"
        tally = self.expected()
        by_outcome = [ts.outcome(o.result) for o in script.ops]
        return {
            ts.ROUND: self.round_id,
            ts.RUN: "synthetic",
            ts.SCHEDULE: script.schedule,
            ts.SEED: script.seed,
            "verdict": script.verdict,
            "failing": script.verdict != ts.VERDICT_OK,
            ts.VALID: script.valid,
            ts.DRAIN_COMPLETE: script.drain_complete,
            ts.ATTEMPTED: tally[ts.SENT],
            ts.ACKNOWLEDGED: tally[ts.ACKNOWLEDGED],
            ts.RECEIVED: tally[ts.RECEIVED],
            ts.LOST: script.lost,
            ts.UNEXPECTED: script.unexpected,
            ts.DUPLICATED: script.duplicated,
            ts.DUPLICATES: script.duplicates,
            ts.RECOVERED: script.recovered,
            ts.REPLICA_MISMATCHES: script.replica_mismatches,
            ts.REPLICA_CHECKS: len(script.check_mismatches),
            "mismatched_checks": sum(1 for m in script.check_mismatches if m),
            "ops": len(script.ops),
            **{f"ops_{o.lower()}": by_outcome.count(o) for o in ts.OUTCOMES if o != ts.RESULT_OK},
            "faults": ", ".join(script.faults),
            ts.LOST_IDS: " ".join(script.lost_ids),
            ts.UNEXPECTED_IDS: " ".join(script.unexpected_ids),
        }

    def _nemesis_events(self) -> list[tuple[int, str, dict[str, object]]]:
        script = self.nemesis
        assert script is not None
        fault = self._milestones_us()[ts.FAULT_INJECTED]
        end = self._end_us()
        out: list[tuple[int, str, dict[str, object]]] = []
        checks = iter(script.check_mismatches)
        for o in script.ops:
            t = fault + o.offset_us
            out.append((t, ts.NEMESIS, {ts.OP: o.op, ts.NODE: o.node, ts.RESULT: o.result,
                                        "t_end": None, "target": o.node, "label": None,
                                        ts.ARG: o.arg}))
            if o.op == "check":
                mismatches = next(checks)
                out.append((t + 1_000, ts.REPLICA_CHECK, {
                    ts.AFTER: "synthetic op", ts.RESULT: o.result, ts.PRIMARY: self.new_primary,
                    "backups": [n for n in self.node_ids if n != self.new_primary],
                    ts.MISMATCHES: mismatches,
                    "diffs": [f"nemesis on n1: missing {mismatches}"] if mismatches else [],
                }))
        final = next(checks)
        out.append((end - 200_000, ts.REPLICA_CHECK, {
            ts.AFTER: "final", ts.RESULT: ts.RESULT_MISMATCH if final else ts.RESULT_OK,
            ts.PRIMARY: self.new_primary, ts.MISMATCHES: final,
        }))
        out.append((fault + 5_000, "node_state", {ts.NODE: self.primary, "state": None,
                                                   "detail": None, ts.TERM: None}))
        tally = self.expected()
        out.append((end - 150_000, ts.CHECKER, {
            ts.VALID: script.valid, ts.ATTEMPTED: tally[ts.SENT],
            ts.ACKNOWLEDGED: tally[ts.ACKNOWLEDGED], ts.RECEIVED: tally[ts.RECEIVED],
            ts.LOST: script.lost, ts.UNEXPECTED: script.unexpected,
            ts.DUPLICATED: script.duplicated, ts.DUPLICATES: script.duplicates,
            ts.RECOVERED: script.recovered, ts.REPLICA_MISMATCHES: script.replica_mismatches,
            ts.REPLICA_CHECKS: len(script.check_mismatches),
            ts.DRAIN_COMPLETE: script.drain_complete, ts.LOST_IDS: script.lost_ids,
            ts.UNEXPECTED_IDS: script.unexpected_ids,
        }))
        return out

    def _milestones_us(self) -> dict[str, int]:
        fault = self.fault_offset_us
        gone = fault + self.detection_us
        won = gone + self.election_us
        promoted = won + self.promotion_us
        reconnected = promoted + self.reconnect_us
        return {
            ts.FAULT_INJECTED: fault,
            ts.LEADER_KEY_GONE: gone,
            ts.ELECTION_WON: won,
            ts.PROMOTED: promoted,
            ts.CLIENT_RECONNECTED: reconnected,
            ts.FIRST_ACCEPTED_AFTER_FAULT: reconnected + self.first_send_us,
            ts.BACKUP_REATTACHED: promoted + self.reattach_us,
            ts.BACKUP_CAUGHT_UP: promoted + self.reattach_us + self.catch_up_us,
        }

    def _end_us(self) -> int:
        m = self._milestones_us()
        settled = max(
            m[ts.FIRST_ACCEPTED_AFTER_FAULT] + 1_500_000, m[ts.BACKUP_CAUGHT_UP] + 500_000
        )
        return (settled + 1_000_000) // BUCKET_US * BUCKET_US + 37_000

    def _producer_stop_us(self) -> int:
        return self._end_us() - 500_000

    def events(self) -> list[tuple[int, str, dict[str, object]]]:
        """(µs from round start, event, extra fields) for every line, in time order."""
        cfg = self.config
        m = self._milestones_us()
        backups = self.node_ids[1:]
        survivors = [n for n in backups if n != self.new_primary] or [self.primary]
        other_client = ts.CONSUMER if self.first_client == ts.PRODUCER else ts.PRODUCER
        out: list[tuple[int, str, dict[str, object]]] = [
            (
                0,
                ts.ROUND_START,
                {
                    ts.SCHEMA: ts.SCHEMA_VERSION,
                    ts.RUN: "synthetic",
                    ts.FAULT: cfg.fault,
                    ts.LEASE_TTL_S: cfg.lease_ttl_s,
                    ts.NODES: cfg.nodes,
                    ts.NODE_IDS: self.node_ids,
                    ts.PRIMARY: self.primary,
                    ts.LOAD_MSG_S: cfg.load_msg_s,
                    **({ts.SCHEDULE: self.nemesis.schedule, ts.SEED: self.nemesis.seed,
                        ts.SCHEDULE_FAULTS: self.nemesis.faults,
                        "ops": [f"{o.op} {o.arg or o.node or ''}".strip()
                                for o in self.nemesis.ops]}
                       if self.nemesis else {}),
                },
            ),
            (200_000, ts.ELECTION_WON, {ts.NODE: self.primary, ts.TERM: 1}),
            (250_000, ts.PROMOTED, {ts.NODE: self.primary}),
            (2_500_000, ts.CLIENT_RECONNECTED, {ts.CLIENT: ts.CONSUMER, ts.NODE: self.primary}),
            (m[ts.FAULT_INJECTED], ts.FAULT_INJECTED, {
                ts.NODE: self.primary, ts.PID: 4242,
                **({ts.OP: self.nemesis.ops[0].op} if self.nemesis else {}),
            }),
            (m[ts.LEADER_KEY_GONE], ts.LEADER_KEY_GONE, {}),
            (m[ts.ELECTION_WON], ts.ELECTION_WON, {ts.NODE: self.new_primary, ts.TERM: 2}),
            (m[ts.PROMOTED], ts.PROMOTED, {ts.NODE: self.new_primary}),
            (
                m[ts.CLIENT_RECONNECTED],
                ts.CLIENT_RECONNECTED,
                {ts.CLIENT: self.first_client, ts.NODE: self.new_primary},
            ),
            (
                m[ts.CLIENT_RECONNECTED] + 7_000,
                ts.CLIENT_RECONNECTED,
                {ts.CLIENT: other_client, ts.NODE: self.new_primary},
            ),
            (
                m[ts.FIRST_ACCEPTED_AFTER_FAULT],
                ts.FIRST_ACCEPTED_AFTER_FAULT,
                {ts.CLIENT: ts.PRODUCER, ts.NODE: self.new_primary},
            ),
        ]
        for j, node in enumerate(backups):
            out.append((300_000 + j * 10_000, ts.BACKUP_REATTACHED, {ts.NODE: node}))
            out.append((350_000 + j * 10_000, ts.BACKUP_CAUGHT_UP, {ts.NODE: node}))
        for j, node in enumerate(survivors):
            later = j * 50_000
            out.append((m[ts.BACKUP_REATTACHED] + later, ts.BACKUP_REATTACHED, {ts.NODE: node}))
            out.append((m[ts.BACKUP_CAUGHT_UP] + 2 * later, ts.BACKUP_CAUGHT_UP, {ts.NODE: node}))
        counts = self.bucket_counts()
        ks = sorted(counts)
        for i in range(0, len(ks), 10):
            chunk = ks[i : i + 10]
            flushed = min((chunk[-1] + 1) * BUCKET_US, self._producer_stop_us())
            out.append((flushed, ts.ACKS, {ts.K: chunk[0], ts.N: [counts[k] for k in chunk]}))
        if self.nemesis:
            out += self._nemesis_events()
        tally = self.expected()
        end = self._end_us()
        out.append((end - 100_000, ts.TALLY, {f: tally[f] for f in ts.TALLY_FIELDS}))
        out.append((end, ts.ROUND_END, {}))
        out.sort(key=lambda e: e[0])
        return out

    def trace_lines(self) -> list[str]:
        """The JSON lines of this round's trace (without newlines)."""
        return [
            format_line(self.round_id, self.start_us + offset, event, fields)
            for offset, event, fields in self.events()
        ]


def format_line(round_id: str, t_us: int, event: str, fields: dict[str, object]) -> str:
    """One trace line, ``t`` written from integer µs so no float rounding creeps in."""
    seconds, micros = divmod(t_us, 1_000_000)
    extra = "".join(f",{json.dumps(k)}:{json.dumps(v)}" for k, v in fields.items())
    return f'{{"round":{json.dumps(round_id)},"t":{seconds}.{micros:06d},"event":"{event}"{extra}}}'


def make_round(index: int, config: RoundConfig, *, seed: int = 0, lossy: bool = False,
               prefix: str = "syn") -> SyntheticRound:
    """Draw round ``index``'s durations; the same (seed, index) always gives the same round."""
    rng = random.Random(f"{seed}:{index}")
    ttl_us = round(config.lease_ttl_s * 1_000_000)
    if config.fault == ts.FAULT_SIGTERM:
        detection = rng.randint(2_000, 40_000)  # graceful: the lease is revoked at once
    else:
        detection = rng.randint(2 * ttl_us // 3, ttl_us)  # keep-alives run every ttl/3
    election = rng.randint(2_000, 40_000)
    promotion = rng.randint(100_000, 300_000)
    if config.fault == ts.FAULT_SIGSTOP:
        reconnect = rng.randint(100_000, 2_000_000)  # a stopped peer keeps its sockets open
    else:
        reconnect = rng.randint(100_000, 250_000)  # reconnect backoff is 0.1 s
    first_send = rng.randint(1_000, 15_000)
    assert detection + election + promotion + reconnect + first_send >= MIN_UNAVAILABILITY_US
    backups = [f"n{i + 1}" for i in range(1, config.nodes)]
    return SyntheticRound(
        round_id=f"{prefix}-{index:06d}",
        config=config,
        start_us=(EPOCH_BASE_S + 60 * index) * 1_000_000 + rng.randint(0, 999_999),
        fault_offset_us=FAULT_AT_US + rng.randint(0, BUCKET_US - 1),
        detection_us=detection,
        election_us=election,
        promotion_us=promotion,
        reconnect_us=reconnect,
        first_send_us=first_send,
        reattach_us=rng.randint(50_000, 800_000),
        catch_up_us=rng.randint(5_000, 400_000),
        first_client=rng.choice((ts.PRODUCER, ts.CONSUMER)),
        new_primary=rng.choice(backups),
        lost_acknowledged=rng.randint(1, 3) if lossy else 0,
        duplicated=rng.choice((0, 0, 0, 1, 2)),
    )


def generate_rounds(count: int, *, seed: int = 0, configs: Sequence[RoundConfig] = DEFAULT_CONFIGS,
                    lossy_every: int = 0, prefix: str = "syn") -> list[SyntheticRound]:
    """``count`` rounds cycling through ``configs``; every ``lossy_every``-th loses messages."""
    return [
        make_round(
            i,
            configs[i % len(configs)],
            seed=seed,
            lossy=bool(lossy_every) and (i + 1) % lossy_every == 0,
            prefix=prefix,
        )
        for i in range(count)
    ]


def _fault_op(kind: str, node: str, offset_us: int, result: str = ts.RESULT_OK) -> NemesisOp:
    if kind.startswith(f"{ts.OP_PARTITION}-"):
        return NemesisOp(offset_us, ts.OP_PARTITION, node, result, kind.split("-", 1)[1])
    return NemesisOp(offset_us, kind, node, result)


def make_nemesis_round(index: int, verdict: str = ts.VERDICT_OK, *, seed: int = 0,
                       prefix: str = "nem") -> SyntheticRound:
    """A nemesis round whose checker gives ``verdict``; the same arguments give the same round."""
    if verdict not in ts.VERDICTS:
        raise ValueError(f"verdict must be one of {ts.VERDICTS}, not {verdict!r}")
    rng = random.Random(f"nemesis:{seed}:{index}")
    base = make_round(index, NEMESIS_CONFIG, seed=seed, prefix=prefix)
    kinds = [ts.FAULT_KILL9, ts.FAULT_KILL9_ALL, ts.FAULT_SIGSTOP, ts.FAULT_SIGTERM,
             *(f"{ts.OP_PARTITION}-{p}" for p in PARTITION_KINDS)]
    first = rng.choice(kinds)
    second = rng.choice([k for k in kinds if k != first] + ["promote"])
    primary, other = base.primary, base.new_primary
    ops = [_fault_op(first, primary, 0)]
    ops.append(NemesisOp(0, UNDO[ops[0].op], primary, ts.RESULT_OK))
    if second == "promote":
        result = rng.choice([ts.RESULT_OK, "refused: n3 is not a caught-up backup"])
    else:
        result = rng.choice([ts.RESULT_OK, ts.RESULT_OK, "skipped: n1 still down or rejoining"])
    ops.append(_fault_op(second, other, 0, result))
    if result == ts.RESULT_OK and ops[-1].op in UNDO:
        ops.append(NemesisOp(0, UNDO[ops[-1].op], other, ts.RESULT_OK))
    if rng.random() < 0.4:
        ops.append(NemesisOp(0, "await_state", primary, "timeout: n1 is connecting, not backup",
                             "backup"))
    mismatch = verdict == ts.VERDICT_MISMATCH
    ops.append(NemesisOp(0, "check", other, ts.RESULT_MISMATCH if mismatch else ts.RESULT_OK))
    if verdict == ts.VERDICT_NO_VERDICT:
        ops.append(NemesisOp(0, "await_state", other, "failed: n2 exited with code 1", "backup"))
    ops.append(NemesisOp(0, "elect_each", None, ts.RESULT_OK))
    ops.append(NemesisOp(0, "promote", primary, ts.RESULT_OK))
    ops = [dataclasses.replace(o, offset_us=i * NEMESIS_OP_GAP_US) for i, o in enumerate(ops)]
    duplicated = rng.choice((0, 0, 1, 2))
    random_schedule = index % 2 == 0
    script = NemesisScript(
        schedule=f"seed-{1000 + index}" if random_schedule else f"fixed-{index}",
        seed=1000 + index if random_schedule else None,
        ops=tuple(ops),
        check_mismatches=(rng.randint(1, 300) if mismatch else 0, 0),
        lost=rng.randint(1, 40) if verdict == ts.VERDICT_INVALID
        else rng.randint(0, 30) if verdict == ts.VERDICT_NO_VERDICT else 0,
        unexpected=rng.choice((0, 2)) if verdict == ts.VERDICT_INVALID else 0,
        duplicated=duplicated,
        duplicates=duplicated + rng.choice((0, 1)) if duplicated else 0,
        recovered=rng.randint(0, 3),
        drain_complete=verdict != ts.VERDICT_NO_VERDICT,
    )
    return dataclasses.replace(base, nemesis=script, lost_acknowledged=script.lost,
                               duplicated=script.duplicates)


def generate_nemesis_rounds(count: int, *, seed: int = 0,
                            verdicts: Sequence[str] = NEMESIS_VERDICT_CYCLE,
                            prefix: str = "nem") -> list[SyntheticRound]:
    """``count`` nemesis rounds whose verdicts cycle through ``verdicts``."""
    return [make_nemesis_round(i, verdicts[i % len(verdicts)], seed=seed, prefix=prefix)
            for i in range(count)]


def write_traces(rounds: Iterable[SyntheticRound], out_dir: Path) -> list[Path]:
    """Write one ``<round>.jsonl`` trace per round into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in rounds:
        path = out_dir / f"{r.round_id}{ts.TRACE_SUFFIX}"
        path.write_text("\n".join(r.trace_lines()) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, required=True, help="number of rounds")
    parser.add_argument("--out", type=Path, required=True, help="directory for the traces")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lossy-every", type=int, default=0, metavar="N",
        help="every N-th round loses acknowledged messages (0: none)",
    )
    parser.add_argument(
        "--nemesis", type=int, default=0, metavar="M",
        help="also M nemesis rounds (one in three failing the checker in turn)",
    )
    args = parser.parse_args(argv)
    paths = write_traces(
        generate_rounds(args.rounds, seed=args.seed, lossy_every=args.lossy_every)
        + generate_nemesis_rounds(args.nemesis, seed=args.seed), args.out
    )
    print(f"wrote {len(paths)} traces to {args.out}")


if __name__ == "__main__":
    main()
