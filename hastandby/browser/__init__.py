"""Hot-standby replication of queues: a primary serving its backups, a backup following its primary.

The primary serves each backup from ``primary.py`` (one
``replication.subscription.ReplicatingSubscription`` per queue, and a
``replication.guard.QueueGuard`` holding producers' acknowledgements until
the backup has their messages); a backup follows its primary from
``backup.py`` (one ``replicator.QueueReplicator`` per queue).  ``protocol.py``
is what only hot standby says (hello, members, status); the batches and id
sets are the shared ``replication/codec.py``.  docs/architecture.md shows
the flows.
"""
