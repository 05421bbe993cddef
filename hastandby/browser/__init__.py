"""Replicating browsers: the per-queue message replication between primary and backups.

The primary serves each backup from ``primary.py`` (one
``subscription.ReplicatingSubscription`` per queue, sending batches through
``batching.BatchingLink``, and a ``guard.QueueGuard`` holding producers'
acknowledgements until the backup has their messages); a backup follows its
primary from ``backup.py`` (one ``replicator.QueueReplicator`` per queue).
``protocol.py`` is what they say to each other.  docs/architecture.md shows
the flows.
"""
