"""Hot standby: a broker node as a member of a cluster whose primary serves clients and backups copy it.

The file names are the architecture (after Qpid's ``src/qpid/ha/``):
``node.py`` the HA node, which runs the state table's actions; ``roles.py``
the role it plays; ``primary.py`` a primary serving its backups (a
``ReplicatingSubscription`` and ``QueueGuard`` per queue and backup);
``backup.py`` a backup following its primary (one ``replicator.py``
``QueueReplicator`` per queue); ``protocol.py`` what only hot standby says on
the wire; ``config_*.py`` the replication of queues, exchanges and bindings,
``access_replica.py`` of users and the ACL; ``admission.py`` which clients a
node takes in its state; ``cluster_management.py`` the cluster's management
operations.  The election that assigns the role is ``election/``; the pure
state table ``lifecycle/``.  docs/architecture.md shows the flows.
"""
