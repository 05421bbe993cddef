"""Where a failover round runs and how its clients find the primary: loopback, or a LAN of network namespaces.

Why a LAN: on loopback a dead node's port refuses at once and nothing can be
cut, so the failover benchmark there measures kill -9, SIGSTOP and SIGTERM
as a URL-list client meets them.  A network cut, and a virtual IP that
follows the primary (``serve --virtual-ip``, docs/lifecycle.md section 14),
only exist on a network: the nodes here are hosts (namespaces) on one Linux
bridge (``hastandby.testing.netns.Lan``), the clients a host of their own, etcd
and the harness on the bridge's own address, so the harness still reaches
every node while one is cut off.

A round is a :class:`Case`: a fault and the way its clients are told where
the cluster is (``via``):

- ``loopback``: every node on 127.0.0.1, the clients given every node's URL
  (the benchmark as it always was);
- ``urls``: nodes on the LAN, the clients given the three node addresses,
  with the numbered client's bounded connect per address;
- ``virtual-ip``: nodes on the LAN with ``--virtual-ip``, the clients given
  ``amqp://VIP:5672`` only.

On the LAN every node runs under ``serve --supervise``, as a node holding a
virtual IP should (its supervisor removes the address when the node dies),
so ``kill`` there is kill -9 of supervisor and node (a host crash, the
address left behind), ``kill9-broker`` and ``stop`` act on the node under
the supervisor, and ``cut`` takes the primary's bridge port down (the cable
pulled: the host loses everything, etcd included) for a bounded time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from hastandby.testing.etcd import EtcdServer
from hastandby.testing.netns import Lan
from spark_analysis import trace_schema as ts

VIA_LOOPBACK = "loopback"
VIA_URLS = "urls"
VIA_VIRTUAL_IP = "virtual-ip"
VIAS = (VIA_LOOPBACK, VIA_URLS, VIA_VIRTUAL_IP)
NODE_PORT = 5672  # every node a host of its own, so the same port everywhere
VIRTUAL_IP_HOST = 100  # the virtual IP is 10.78.N.100/24 on the LAN's subnet
CLIENTS = "clients"  # the clients' host


@dataclass(frozen=True)
class Case:
    """One kind of round: a fault, and how the clients reach the cluster."""

    fault: str
    via: str = VIA_LOOPBACK

    @property
    def name(self) -> str:
        """The summary's key: the fault alone on loopback (as before the LAN existed), else ``fault/via``."""
        return self.fault if self.via == VIA_LOOPBACK else f"{self.fault}/{self.via}"

    @property
    def on_lan(self) -> bool:
        return self.via != VIA_LOOPBACK

    @property
    def supervised(self) -> bool:
        """Nodes under ``serve --supervise``: every LAN round, and kill -9 of the broker on loopback."""
        return self.on_lan or self.fault == ts.FAULT_KILL9_BROKER


class FailoverLan:
    """The LAN of one benchmark run: a host per node and one for the clients; ``close()`` deletes it all.

    Each round brings its own etcd (on the bridge) and nodes; ``reset()``
    leaves the LAN as it was made for the next round: every link up, and the
    virtual IP on no host (a node killed with its supervisor leaves it on its
    interface, docs/lifecycle.md section 14).
    """

    def __init__(self, node_ids: list[str]) -> None:
        self.node_ids = node_ids
        self.lan = Lan([*node_ids, CLIENTS])

    @property
    def virtual_ip(self) -> str:
        return self.lan.address(VIRTUAL_IP_HOST)

    @property
    def virtual_ip_url(self) -> str:
        return f"amqp://{self.virtual_ip}:{NODE_PORT}"

    def host(self, node_id: str) -> str:
        """The address of a node's host."""
        return self.lan[node_id].address

    def address(self, node_id: str) -> str:
        """HOST:PORT of a node, as peers and the harness know it."""
        return f"{self.host(node_id)}:{NODE_PORT}"

    def etcd(self) -> EtcdServer:
        """A round's etcd, listening on the bridge's address: every host reaches it unless cut off."""
        return EtcdServer(name="failover", host=self.lan.controller)

    def serve_argv(self, node_id: str, options: list[str], via: str) -> list[str]:
        """``hastandby serve OPTIONS`` run in the node's host, listening on every address (the virtual IP's too)."""
        host = self.lan[node_id]
        argv = [sys.executable, "-m", "hastandby", "serve", "--listen", f"0.0.0.0:{NODE_PORT}",
                "--public-url", self.address(node_id),
                "--brokers-url", ",".join(self.address(n) for n in self.node_ids), *options]
        if via == VIA_VIRTUAL_IP:
            argv += ["--virtual-ip", f"{self.virtual_ip}/24", "--virtual-ip-interface", host.device]
        return host.command(*argv)

    def client_urls(self, via: str) -> list[str]:
        if via == VIA_VIRTUAL_IP:
            return [self.virtual_ip_url]
        return [f"amqp://{self.address(n)}" for n in self.node_ids]

    def client_command(self) -> list[str]:
        """The prefix that runs a client process in the clients' host."""
        return self.lan[CLIENTS].command()

    def set_link(self, node_id: str, up: bool) -> None:
        """Cut a node's host off the LAN (its bridge port down), or plug it back in."""
        self.lan.set_link(node_id, up)

    def holders(self) -> list[str]:
        """The hosts whose interface carries the virtual IP now."""
        return self.lan.holders(self.virtual_ip)

    def reset(self) -> None:
        """Every link up and the virtual IP removed everywhere (call with the round's nodes stopped)."""
        for node_id in self.node_ids:
            self.lan.set_link(node_id, True)
            host = self.lan[node_id]
            self.lan.run(node_id, "ip", "address", "del", f"{self.virtual_ip}/24", "dev", host.device, timeout=10)

    def close(self) -> None:
        self.lan.close()
