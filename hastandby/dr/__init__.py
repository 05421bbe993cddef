"""Per-queue replication to a disaster-recovery site (``hastandby replicate``).

A *replica* node pulls one queue from a *source* node (or the primary of a
source HA cluster) over an ordinary AMQP 1.0 connection, in one of two modes:

- ``full``: the replica mirrors the source queue, enqueues and dequeues, with
  the hot-standby replicating browser (catch-up by id set after any outage);
- ``enqueue``: every message enqueued on the source after replication started
  is also enqueued on the replica exactly once; the source keeps what the
  replica has not acknowledged in a *tap* queue, bounded by ``--max-backlog``.

``protocol`` names the wire properties, ``config`` holds what is configured
and where it is kept, ``source`` serves replicas, ``replica`` pulls from a
source, and ``service`` plugs both into a node (management, status, roles).
"""
