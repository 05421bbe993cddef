"""Where a cluster's members are: this node's URL, the brokers URL, and etcd's leader and member keys.

``ClusterAddresses`` answers two questions for ``HaNode``: where a backup looks
for the primary (etcd's leader if known, else every other member of the
brokers URL), and every member's client address, which the primary's Open
frame names (``admission.ClientAdmission.failover_list``) and STATUS shows.
Pure: it reads only what it is given.
"""

from __future__ import annotations

from collections.abc import Iterable

from hastandby.broker.transport.address import Address, split_hostport
from hastandby.election.cluster import ClusterSnapshot, Leader
from hastandby.node import NodeConfig


class ClusterAddresses:
    """``url``: HOST:PORT this node is known by (``--public-url``, else where peers reach it); ``brokers``: the
    brokers URL's members (none: etcd's)."""

    def __init__(self, node_id: str, config: NodeConfig, public_url: str | None, brokers: Iterable[str]) -> None:
        host, port = split_hostport(public_url or config.peer_address)
        self.node_id = node_id
        self.url = f"{host}:{port}"
        self.brokers: list[Address] = [split_hostport(b) for b in brokers]
        listeners = [a for a in (config.listen, config.listen_tls) if a]
        self._own = {split_hostport(self.url), *(split_hostport(a) for a in listeners)}

    def others(self, leader: Leader | None) -> list[Address]:
        """Where to look for the primary: etcd's ``leader`` if known, else the brokers URL."""
        if leader is not None and leader.node_id != self.node_id:
            return [split_hostport(leader.url)]
        return [address for address in self.brokers if address not in self._own]

    def members(self, snapshot: ClusterSnapshot | None) -> list[str]:
        """Every member's HOST:PORT: the brokers URL, or etcd's member keys (``snapshot``) without one."""
        if self.brokers:
            return [f"{h}:{p}" for h, p in self.brokers]
        members = snapshot.members if snapshot is not None else ()
        return sorted({m.url for m in members} | {self.url})
