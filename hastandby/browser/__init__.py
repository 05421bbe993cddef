"""Replicating browsers: the per-queue message replication between primary and backups.

Holds the pure building blocks so far: ``idset.IdSet`` (sets of replication
ids as ranges, for catch-up and batched dequeues) and ``guard.QueueGuard``
(holds a producer's acknowledgement until a backup has the message).  The
primary-side replicating subscription and the backup-side replicator build on
them.
"""
