"""Names, units and the Spark schema of the failover trace format (version 1).

The failover benchmark writes these traces and ``spark_analysis`` reads them;
both import the names from here so that a renamed field cannot drift apart on
the two sides.  ``docs/failover-traces.md`` is the prose description of every
event, field and unit.

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
)

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

PRODUCER = "producer"
CONSUMER = "consumer"

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
}
"""Fields (besides round/t/event) without which a line of that event is malformed."""


def spark_schema() -> StructType:
    """The explicit Spark schema of one trace line (the union of all events).

    Fields that an event does not carry are simply null for that line.
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
    return StructType([StructField(name, kind, nullable=True) for name, kind in fields])
