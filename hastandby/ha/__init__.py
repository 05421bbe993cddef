"""Hot standby: a broker node as a member of a cluster whose primary serves clients and backups copy it.

The file names are the architecture (after Qpid's ``src/qpid/ha/``):
``node.py`` the HA node, which fires the state table's events and runs its
actions; ``roles.py`` what the two roles both answer; ``primary.py`` the
primary's role, which is its replication (a ``ReplicatingSubscription`` and
``QueueGuard`` per queue and backup); ``backup.py`` the backup's role, which
is its replication (one ``replicator.py`` ``QueueReplicator`` per queue);
``membership.py`` what a backup hears of its primary, as the table's events;
``protocol.py`` what only hot standby says on the wire; ``config_*.py`` the
replication of queues, exchanges and bindings, ``access_replica.py`` of users
and the ACL; ``admission.py`` the broker's hooks (which clients a node takes
in its state); ``cluster_management.py`` the cluster's management
operations; ``journal.py`` the node's journal in a cluster; ``observers.py``
who is told of role changes; ``addresses.py`` where the members are.  The
election that assigns the role is ``election/`` (its ``sync_request.py`` the
``--min-sync`` round trip); the pure state table ``lifecycle/``.
docs/architecture.md shows the flows.
"""
