"""A Jepsen-style generative fault suite ("nemesis") for the hot-standby cluster.

``python -m tests.nemesis --schedules N [--seed S] [--faults ...] [--fixed all] [--out DIR]``
(or ``hastandby bench nemesis ...``) runs schedules of overlapping faults
against etcd and three real nodes in network namespaces, under a workload of
ordinary proton clients, and checks what came out (``docs/nemesis.md``).

| module | holds |
|---|---|
| ``schedule`` | ops and schedules as data: the seeded generator and the fixed schedules (pure) |
| ``hastandby.testing.checker`` | the total-queue checker and the replica diff (pure) |
| ``hastandby.testing.netns`` | ``Network``: namespaces on a bridge; partitions as neighbour entries |
| ``hastandby.testing.netns_cluster`` | etcd and the nodes in their namespaces; signals, restarts, promote, status; the nodes' disks (bit rot, a file system failed and repaired) |
| ``hastandby.testing.netns_workload`` | the clients process (``hastandby.testing.numbered_client``) in its namespace; the history read back; the final drain |
| ``replicas`` | browsing the replicas and comparing them |
| ``executor`` | runs ops (and assertions) against the cluster |
| ``runner`` | one schedule from start to verdict |
| ``trace`` | the schedule's failover-format trace |
| ``command`` | the command line, the table and the summary JSON |
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """The command line (imported lazily: the pure modules must not pull in the harness)."""
    from .command import main as run

    return run(argv)
