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

Run as ``python -m spark_analysis.synthetic --rounds N --out DIR``.
"""

from __future__ import annotations

import argparse
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
        if self.fault not in ts.FAULTS:
            raise ValueError(f"fault must be one of {ts.FAULTS}, not {self.fault!r}")
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
            ts.RECEIVED: acknowledged - self.lost_acknowledged + self.duplicated,
            ts.LOST_ACKNOWLEDGED: self.lost_acknowledged,
            ts.DUPLICATED: self.duplicated,
        }

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
                },
            ),
            (200_000, ts.ELECTION_WON, {ts.NODE: self.primary, ts.TERM: 1}),
            (250_000, ts.PROMOTED, {ts.NODE: self.primary}),
            (2_500_000, ts.CLIENT_RECONNECTED, {ts.CLIENT: ts.CONSUMER, ts.NODE: self.primary}),
            (m[ts.FAULT_INJECTED], ts.FAULT_INJECTED, {ts.NODE: self.primary, ts.PID: 4242}),
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
    args = parser.parse_args(argv)
    paths = write_traces(
        generate_rounds(args.rounds, seed=args.seed, lossy_every=args.lossy_every), args.out
    )
    print(f"wrote {len(paths)} traces to {args.out}")


if __name__ == "__main__":
    main()
