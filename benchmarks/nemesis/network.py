"""A private network of namespaces on one bridge, and partitions in it (needs root and ``ip``).

Every host of the test (each broker node, etcd, the clients) runs in a
network namespace of its own, joined to one Linux bridge by a veth pair;
the controller (this process) stays in the root namespace with an address on
the bridge, so it can reach every host for management and status whatever
the partitions.  Addresses are ``10.78.N.0/24`` (``tests/support/netns.py``
uses ``10.77``), N derived from the pid and moved on if the root namespace
already has an address in that subnet.

A partition between hosts A and B is a permanent neighbour (ARP) entry in
A's namespace that gives B's address a MAC no host has, and the same for A
in B's: frames still leave, the bridge floods them, and every interface
drops them.  So, as in a real partition, packets vanish silently: established
TCP connections stall until a heartbeat gives up (after the heal TCP
retransmits what was queued), and a new ``connect()`` hangs in SYN_SENT.
The heal deletes the entries; the next packet resolves the real MAC.  (A
``blackhole`` or ``unreachable`` route would make ``connect()`` fail at once
with EINVAL or EHOSTUNREACH, and python-qpid-proton 0.40 raises a connect
error that is not EINPROGRESS out of its reactor, ending the client: a
test artefact, not a partition.)  This kernel has no netem, and no
nftables/iptables are installed; neighbour entries need nothing but ``ip``.

Names carry the pid and a per-process counter so that runs never collide;
``close()`` deletes the namespaces (which takes their veth ends along) and
the bridge, and is also registered with ``atexit``.
"""

from __future__ import annotations

import atexit
import itertools
import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

_IP_TIMEOUT = 10.0
NOWHERE = "02:de:ad:00:00:01"  # a locally administered MAC no host on the bridge has
_counter = itertools.count()
_open: set["Network"] = set()


class NetworkError(RuntimeError):
    """An ``ip`` command failed; the message has its output."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (bounded); raise NetworkError with its stderr if ``check`` and it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


@dataclass(frozen=True)
class Host:
    """One namespace on the bridge."""

    name: str  # e.g. "n1", "etcd", "clients"
    namespace: str
    address: str
    device: str  # its end of the veth pair, inside the namespace

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec`` execs: the PID is argv's)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _subnet_in_use(subnet: int) -> bool:
    shown = ip("-o", "-4", "addr", "show", check=False).stdout
    return f" 10.78.{subnet}." in shown


class Network:
    """A bridge, the controller's address on it, and one namespace per host name given."""

    def __init__(self, host_names: Iterable[str]) -> None:
        number = next(_counter)
        tag = f"{os.getpid() % 100000:05d}{number % 100:02d}"  # interface names are at most 15 chars
        self.bridge = f"nmb{tag}"
        subnet = 1 + (os.getpid() + number) % 250
        for _ in range(250):
            if not _subnet_in_use(subnet):
                break
            subnet = 1 + subnet % 250
        else:
            raise NetworkError("every 10.78.N.0/24 subnet is in use in the root namespace")
        self.prefix = f"10.78.{subnet}"
        self.controller_address = f"{self.prefix}.1"
        self.hosts: dict[str, Host] = {}
        self._veths: list[str] = []
        self._cuts: dict[tuple[str, str], int] = {}  # (host, peer) -> partitions that need the cut
        self._closed = False
        _open.add(self)
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.controller_address}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for index, name in enumerate(host_names):
                self._add_host(name, f"nemesis-{tag}-{name}", f"{self.prefix}.{10 + index}", f"nmv{tag}{index}")
        except BaseException:
            self.close()
            raise

    def _add_host(self, name: str, namespace: str, address: str, veth: str) -> None:
        ip("netns", "add", namespace)
        inner = f"{veth}i"
        self.hosts[name] = Host(name, namespace, address, inner)
        ip("link", "add", veth, "type", "veth", "peer", "name", inner)
        self._veths.append(veth)
        ip("link", "set", inner, "netns", namespace)
        ip("link", "set", veth, "master", self.bridge)
        ip("link", "set", veth, "up")
        ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inner)
        ip("-n", namespace, "link", "set", inner, "up")
        ip("-n", namespace, "link", "set", "lo", "up")

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def address(self, last: int) -> str:
        """An address of the network's subnet that no host has, e.g. ``address(100)`` for a virtual IP."""
        return f"{self.prefix}.{last}"

    def holders(self, address: str) -> list[str]:
        """The hosts whose interface carries ``address`` (a virtual IP), in host order."""
        found = []
        for host in self.hosts.values():
            shown = ip("-n", host.namespace, "-o", "-4", "addr", "show", "dev", host.device, check=False).stdout
            if any(line.split()[3].split("/")[0] == address for line in shown.splitlines() if " inet " in line):
                found.append(host.name)
        return found

    # -- partitions ----------------------------------------------------------------------------------

    def cut(self, pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Drop all traffic between each pair of host names, both ways; returns the pairs for ``heal``.

        Cuts are counted per direction, so two partitions that share a pair
        keep it cut until both are healed.
        """
        done: list[tuple[str, str]] = []
        try:
            for a, b in pairs:
                for here, there in ((a, b), (b, a)):
                    self._cut_one(here, there, add=True)
                done.append((a, b))
        except NetworkError:
            self.heal(done)
            raise
        return done

    def heal(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Undo a ``cut`` of these pairs."""
        for a, b in pairs:
            for here, there in ((a, b), (b, a)):
                self._cut_one(here, there, add=False)

    def heal_all(self) -> None:
        """Remove every partition still in place."""
        for here, there in list(self._cuts):
            self._cuts[(here, there)] = 1
            self._cut_one(here, there, add=False)

    @property
    def partitioned(self) -> list[tuple[str, str]]:
        """The (host, unreachable peer) directions cut now."""
        return sorted(self._cuts)

    def _cut_one(self, here: str, there: str, add: bool) -> None:
        """Point (or stop pointing) ``here``'s neighbour entry for ``there`` at a MAC nobody has."""
        key = (here, there)
        count = self._cuts.get(key, 0)
        host, peer = self.hosts[here], self.hosts[there]
        if add:
            if count == 0:
                ip("-n", host.namespace, "neigh", "replace", peer.address, "lladdr", NOWHERE, "nud", "permanent",
                   "dev", host.device)
            self._cuts[key] = count + 1
        elif count:
            if count == 1:  # the next packet asks ARP again and finds the real address
                ip("-n", host.namespace, "neigh", "del", peer.address, "dev", host.device, check=False)
                del self._cuts[key]
            else:
                self._cuts[key] = count - 1

    # -- cleanup ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Delete the namespaces (their veth ends go with them) and the bridge; safe to call twice.

        Stop the processes inside first: a namespace with processes left in
        it lives on, unnamed, until they exit.
        """
        if self._closed:
            return
        self._closed = True
        for host in self.hosts.values():
            ip("netns", "delete", host.namespace, check=False)
        for veth in self._veths:  # gone with their peers already, unless a namespace add failed halfway
            ip("link", "delete", veth, check=False)
        ip("link", "delete", self.bridge, check=False)
        _open.discard(self)


@atexit.register
def _close_leftovers() -> None:
    """Last resort if a run ends without its ``finally``."""
    for network in list(_open):
        network.close()
