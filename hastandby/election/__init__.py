"""The election: which node is primary, decided through etcd (or a fake of it in tests).

``cluster.py`` the etcd key layout and one snapshot of it; ``decide.py`` the
pure decision over a snapshot; ``coordinator.py`` the interface and the lease
bookkeeping both implementations share; ``etcd_client.py`` and
``etcd_coordinator.py`` the only code that talks to etcd; ``loop.py`` the
election thread that turns snapshots into the state table's events.  See
docs/lifecycle.md.
"""
