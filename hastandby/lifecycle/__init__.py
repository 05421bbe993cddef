"""The node's role in an HA cluster, and the election that assigns it.

``states`` is the pure state table (connecting -> catchup -> backup ->
primary, plus standalone); ``cluster`` the etcd key layout and snapshot;
``decide`` the pure per-cycle decision; ``coordinator`` the only code that
talks to etcd.  See docs/lifecycle.md.
"""
