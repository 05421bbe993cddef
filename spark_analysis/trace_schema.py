"""Names, units and the Spark schema of the failover trace format (version 1).

The failover benchmark writes these traces and ``spark_analysis`` reads them;
both import the names from here so that a renamed field cannot drift apart on
the two sides.  ``docs/failover-traces.md`` is the prose description of every
event, field and unit.  The nemesis (``tests/nemesis``) writes the same
format with more events; the ones the dashboards read (``nemesis``,
``replica_check``, ``checker`` and a few ``round_start`` fields) are named
here too, in the section "Nemesis traces".

This module must stay importable without pyspark (the benchmark does not
depend on it), which is why the Spark ``StructType`` is built lazily by
:func:`spark_schema`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql.types import StructType

SCHEMA_VERSION = 1
"""Value of ``schema`` in ``round_start``; bumped on incompatible changes."""

TRACE_SUFFIX = ".jsonl"
"""Trace files are named ``*.jsonl``: one JSON object per line, UTF-8."""

ACK_BUCKET_MS = 100
"""Width of one acknowledgement bucket (``acks`` event), in milliseconds."""

# --- fields present on every line -------------------------------------------
ROUND = "round"  # string: round id, unique across all traces of a run set
T = "t"  # float: unix epoch seconds (time.time()), microsecond precision
EVENT = "event"  # string: one of the EVENTS below
SRC = "src"  # optional string: who wrote the line ("harness", "producer", node id)

# --- event names --------------------------------------------------------------
ROUND_START = "round_start"
FAULT_INJECTED = "fault_injected"
LEADER_KEY_GONE = "leader_key_gone"
ELECTION_WON = "election_won"
PROMOTED = "promoted"
CLIENT_RECONNECTED = "client_reconnected"
FIRST_ACCEPTED_AFTER_FAULT = "first_accepted_after_fault"
BACKUP_REATTACHED = "backup_reattached"
BACKUP_CAUGHT_UP = "backup_caught_up"
ACKS = "acks"
TALLY = "tally"
ROUND_END = "round_end"

# the nemesis's events (section "Nemesis traces" below)
NEMESIS = "nemesis"  # one op of a schedule
REPLICA_CHECK = "replica_check"  # one comparison of the backups' queues with the primary's
CHECKER = "checker"  # the total-queue checker's verdict, once per nemesis round

EVENTS = (
    ROUND_START,
    FAULT_INJECTED,
    LEADER_KEY_GONE,
    ELECTION_WON,
    PROMOTED,
    CLIENT_RECONNECTED,
    FIRST_ACCEPTED_AFTER_FAULT,
    BACKUP_REATTACHED,
    BACKUP_CAUGHT_UP,
    ACKS,
    TALLY,
    ROUND_END,
    NEMESIS,
    REPLICA_CHECK,
    CHECKER,
)
"""The events the analysis reads; any other event is ignored."""

# --- event-specific fields ----------------------------------------------------
# round_start
SCHEMA = "schema"  # int: SCHEMA_VERSION
RUN = "run"  # optional string: id of the benchmark invocation
FAULT = "fault"  # string: one of FAULTS
LEASE_TTL_S = "lease_ttl_s"  # float: etcd leader-lease TTL, seconds
NODES = "nodes"  # int: broker nodes in the cluster
NODE_IDS = "node_ids"  # array of strings: ids of all broker nodes
PRIMARY = "primary"  # string: node id of the primary before the fault
LOAD_MSG_S = "load_msg_s"  # float: offered producer load, messages per second
# fault_injected, election_won, promoted, backup_*, client_* , first_accepted_*
NODE = "node"  # string: node id the event is about
PID = "pid"  # optional int: OS process id the fault was sent to
TERM = "term"  # int (election_won): election term / etcd lease revision
CLIENT = "client"  # string: "producer" or "consumer"
# acks
K = "k"  # int: index of the first bucket in N, counted from round_start's t
N = "n"  # array of ints: acknowledgements in buckets k, k+1, ...
# tally
SENT = "sent"
ACKNOWLEDGED = "acknowledged"
RECEIVED = "received"
LOST_ACKNOWLEDGED = "lost_acknowledged"
DUPLICATED = "duplicated"
TALLY_FIELDS = (SENT, ACKNOWLEDGED, RECEIVED, LOST_ACKNOWLEDGED, DUPLICATED)

FAULT_KILL9 = "kill9"
FAULT_SIGSTOP = "sigstop"
FAULT_SIGTERM = "sigterm"
FAULTS = (FAULT_KILL9, FAULT_SIGSTOP, FAULT_SIGTERM)
FAULT_KILL9_BROKER = "kill9-broker"
"""A failover-benchmark ``fault``: kill -9 of the broker process only, under ``serve --supervise``."""
FAULT_CUT = "cut"
"""A failover-benchmark ``fault`` on a LAN of network namespaces: the primary's link cut for a while."""
FAULT_KILL9_ALL = "kill9-all"
"""A nemesis op (not a failover-benchmark ``fault``): kill -9 of every node at once."""

PRODUCER = "producer"
CONSUMER = "consumer"

# --- Nemesis traces (tests/nemesis; docs/failover-traces.md, "Nemesis traces") --------
FAULT_NEMESIS = "nemesis"
"""``round_start``'s ``fault`` of a nemesis round (one schedule of overlapping faults)."""
ROUND_FAULTS = FAULTS + (FAULT_KILL9_BROKER, FAULT_CUT, FAULT_NEMESIS)
"""Every ``fault`` a ``round_start`` may name."""
# round_start of a nemesis round (all optional)
SCHEDULE = "schedule"  # string: the schedule's name ("seed-4711", "frozen-primary-rejoins")
SEED = "seed"  # int or null: the random schedule's seed (null: a fixed schedule)
SCHEDULE_FAULTS = "faults"  # array of strings: the fault kinds the schedule uses
# nemesis (one op); fault_injected of a nemesis round also carries OP
OP = "op"  # string: the op's kind, one of NEMESIS_*_OPS or a scripted-client op
RESULT = "result"  # string: "ok", "refused: ...", "skipped: ...", "timeout: ...", "failed: ...",
#   "MISMATCH" (a check); replica_check: "ok", "MISMATCH", "error: ...", "skipped: ..."
ARG = "arg"  # optional string: the op's argument as written; a partition's kind ("primary-etcd")
# replica_check
AFTER = "after"  # string: the op the check follows, or "final"
MISMATCHES = "mismatches"  # int or null: missing + different ids over all backups and queues
# checker (ACKNOWLEDGED, RECEIVED and DUPLICATED are the tally's names; DUPLICATED counts ids here)
VALID = "valid"  # bool: nothing lost and nothing unexpected
ATTEMPTED = "attempted"  # int: distinct message ids the producers tried to send
LOST = "lost"  # int: acknowledged, never received
UNEXPECTED = "unexpected"  # int: received, never attempted
DUPLICATES = "duplicates"  # optional int: extra copies received
RECOVERED = "recovered"  # int: received though never acknowledged (the producer was in doubt)
REPLICA_MISMATCHES = "replica_mismatches"  # int: MISMATCHES summed over the replica checks
REPLICA_CHECKS = "replica_checks"  # optional int: replica checks run
DRAIN_COMPLETE = "drain_complete"  # bool: the queue was drained (false: no verdict)
LOST_IDS = "lost_ids"  # optional array of strings: the first lost ids
UNEXPECTED_IDS = "unexpected_ids"  # optional array of strings: the first unexpected ids
CHECKER_FIELDS = (VALID, ATTEMPTED, ACKNOWLEDGED, RECEIVED, LOST, UNEXPECTED, DUPLICATED,
                  RECOVERED, REPLICA_MISMATCHES, DRAIN_COMPLETE)
"""The fields a ``checker`` line must have."""
CHECKER_OPTIONAL_FIELDS = (DUPLICATES, REPLICA_CHECKS, LOST_IDS, UNEXPECTED_IDS)

# op kinds, by what they do to the cluster ("role")
OP_PARTITION = "partition"  # its ARG names the partition: its fault type is "partition-<arg>"
NEMESIS_FAULT_OPS = (FAULT_KILL9, FAULT_KILL9_ALL, FAULT_SIGSTOP, FAULT_SIGTERM, "promote", OP_PARTITION,
                     "disk-fail", "rot")  # a node's file system turned read-only; bit rot in a down node's journal
NEMESIS_RECOVERY_OPS = ("sigcont", "restart", "heal", "disk-repair")
NEMESIS_CHECK_OPS = ("check", "elect_each", "assert")
ROLE_FAULT, ROLE_RECOVERY, ROLE_CHECK, ROLE_SCRIPT = "fault", "recovery", "check", "script"
ROLES = (ROLE_FAULT, ROLE_RECOVERY, ROLE_CHECK, ROLE_SCRIPT)
"""Every other op (the scripted clients' pin, producer, rate, send and the waits) is a script op."""

# an op's outcome, from its RESULT
RESULT_OK = "ok"
RESULT_MISMATCH = "MISMATCH"
RESULT_PREFIXES = ("refused", "skipped", "timeout", "failed")
OUTCOMES = (RESULT_OK, *RESULT_PREFIXES, RESULT_MISMATCH, "other")

# a nemesis round's verdict (the nemesis's own table says the same)
VERDICT_OK = "ok"
VERDICT_INVALID = "INVALID"  # lost or unexpected messages
VERDICT_MISMATCH = "MISMATCH"  # a ready backup's copy differed from the primary's
VERDICT_NO_VERDICT = "NO VERDICT"  # the queue was not drained: the checker cannot judge
VERDICTS = (VERDICT_OK, VERDICT_INVALID, VERDICT_MISMATCH, VERDICT_NO_VERDICT)


def fault_type(op: str, arg: str | None = None) -> str:
    """The fault type of a ``nemesis`` op: its kind, a partition's with its kind appended."""
    return f"{op}-{arg}" if op == OP_PARTITION and arg else op


def op_role(op: str) -> str:
    """``ROLE_FAULT``, ``ROLE_RECOVERY``, ``ROLE_CHECK`` or ``ROLE_SCRIPT``."""
    for ops, role in ((NEMESIS_FAULT_OPS, ROLE_FAULT), (NEMESIS_RECOVERY_OPS, ROLE_RECOVERY),
                      (NEMESIS_CHECK_OPS, ROLE_CHECK)):
        if op in ops:
            return role
    return ROLE_SCRIPT


def outcome(result: str | None) -> str:
    """The outcome (one of ``OUTCOMES``) of an op's ``result``."""
    if result in (RESULT_OK, RESULT_MISMATCH):
        return result
    return next((p for p in RESULT_PREFIXES if (result or "").startswith(p)), "other")


def verdict(valid: bool, drain_complete: bool, replica_mismatches: int) -> str:
    """A nemesis round's verdict from its ``checker`` line."""
    if not drain_complete:
        return VERDICT_NO_VERDICT
    if not valid:
        return VERDICT_INVALID
    return VERDICT_MISMATCH if replica_mismatches else VERDICT_OK


REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    ROUND_START: (SCHEMA, FAULT, LEASE_TTL_S, NODES, LOAD_MSG_S),
    FAULT_INJECTED: (NODE,),
    ELECTION_WON: (NODE,),
    PROMOTED: (NODE,),
    CLIENT_RECONNECTED: (CLIENT,),
    BACKUP_REATTACHED: (NODE,),
    BACKUP_CAUGHT_UP: (NODE,),
    ACKS: (K, N),
    TALLY: TALLY_FIELDS,
    NEMESIS: (OP, RESULT),
    REPLICA_CHECK: (RESULT,),
    CHECKER: CHECKER_FIELDS,
}
"""Fields (besides round/t/event) without which a line of that event is malformed."""


NEMESIS_FIELD_EVENTS = (ROUND_START, NEMESIS, REPLICA_CHECK, CHECKER)
"""The events whose lines are read for the nemesis's fields (:func:`nemesis_spark_schema`);
on any other event those fields are unknown fields, ignored."""


def spark_schema(with_nemesis: bool = True) -> StructType:
    """The explicit Spark schema of one trace line (the union of all events).

    Fields that an event does not carry are simply null for that line.
    ``with_nemesis=False``: without the fields of :func:`nemesis_spark_schema`.
    """
    from pyspark.sql.types import (
        ArrayType,
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    fields = [
        (ROUND, StringType()),
        (T, DoubleType()),
        (EVENT, StringType()),
        (SRC, StringType()),
        (SCHEMA, IntegerType()),
        (RUN, StringType()),
        (FAULT, StringType()),
        (LEASE_TTL_S, DoubleType()),
        (NODES, IntegerType()),
        (NODE_IDS, ArrayType(StringType())),
        (PRIMARY, StringType()),
        (LOAD_MSG_S, DoubleType()),
        (NODE, StringType()),
        (PID, LongType()),
        (TERM, LongType()),
        (CLIENT, StringType()),
        (K, LongType()),
        (N, ArrayType(LongType())),
    ] + [(name, LongType()) for name in TALLY_FIELDS]
    core = [StructField(name, kind, nullable=True) for name, kind in fields]
    return StructType(core + (nemesis_spark_schema().fields if with_nemesis else []))


def nemesis_spark_schema() -> StructType:
    """The fields of the nemesis's lines that the analysis reads, on the events
    ``NEMESIS_FIELD_EVENTS`` (the other fields of the union are in :func:`spark_schema`)."""
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    fields = [
        (SCHEDULE, StringType()),
        (SEED, LongType()),
        (SCHEDULE_FAULTS, ArrayType(StringType())),
        (OP, StringType()),
        (RESULT, StringType()),
        (ARG, StringType()),
        (AFTER, StringType()),
        (MISMATCHES, LongType()),
        (VALID, BooleanType()),
        (ATTEMPTED, LongType()),
        (LOST, LongType()),
        (UNEXPECTED, LongType()),
        (DUPLICATES, LongType()),
        (RECOVERED, LongType()),
        (REPLICA_MISMATCHES, LongType()),
        (REPLICA_CHECKS, LongType()),
        (DRAIN_COMPLETE, BooleanType()),
        (LOST_IDS, ArrayType(StringType())),
        (UNEXPECTED_IDS, ArrayType(StringType())),
    ]
    return StructType([StructField(name, kind, nullable=True) for name, kind in fields])
