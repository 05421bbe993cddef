"""Hosts on one machine as network namespaces (needs root and ``ip``): a WAN pair, and a LAN on a bridge.

``WanPair`` makes ``<prefix>-a`` at 10.77.N.1 and ``<prefix>-b`` at 10.77.N.2,
runs commands inside either (``ip netns exec``), takes the veth link down and
up (a cut WAN), and removes both namespaces on ``close()``; processes started
with ``popen`` are stopped by PID first.

``Lan`` puts N hosts on one Linux bridge in the root namespace: each host a
namespace joined to the bridge by a veth pair, at 10.78.N.10, .11, ...; the
controller (the test or harness itself, in the root namespace) has 10.78.N.1
on the bridge and reaches every host directly (management, etcd there),
whatever the partitions.  It runs commands in each host, cuts a host's link
(``set_link``: its bridge port down, the cable pulled, the host's own
interface loses carrier) and restores it, partitions pairs of hosts
(``cut``/``heal``, below), lists a host's addresses, and on ``close()`` stops
what it started by PID and deletes the namespaces and the bridge (also at
exit, as a last resort).  Names carry the pid and a per-process counter, so
runs never collide; N is derived from them and moved on if the root
namespace already has an address in that subnet.  ``Network`` is the same
LAN with the nemesis suite's names (``nemesis-<pid>...``, which its test
looks for to check nothing is left behind).

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
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hastandby.testing.nodes import REPO

_IP_TIMEOUT = 10.0
NOWHERE = "02:de:ad:00:00:01"  # a locally administered MAC no host on the bridge has


class NetworkError(RuntimeError):
    """An ``ip`` command failed; the message has its output."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (bounded); raise NetworkError with its stderr if ``check`` and it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _ip(*args: str) -> None:
    ip(*args)


class WanPair:
    """Namespaces ``a`` and ``b`` with one veth link between them."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        subnet = 1 + os.getpid() % 250
        self.ns = {"a": f"hs{tag}-a", "b": f"hs{tag}-b"}
        self.ip = {"a": f"10.77.{subnet}.1", "b": f"10.77.{subnet}.2"}
        self.dev = {"a": f"hs{tag}a", "b": f"hs{tag}b"}
        self._procs: list[tuple[subprocess.Popen, IO[bytes]]] = []
        for side in "ab":
            _ip("netns", "add", self.ns[side])
        try:
            _ip("link", "add", self.dev["a"], "type", "veth", "peer", "name", self.dev["b"])
            for side in "ab":
                _ip("link", "set", self.dev[side], "netns", self.ns[side])
                _ip("-n", self.ns[side], "addr", "add", f"{self.ip[side]}/24", "dev", self.dev[side])
                _ip("-n", self.ns[side], "link", "set", "lo", "up")
                _ip("-n", self.ns[side], "link", "set", self.dev[side], "up")
        except Exception:
            self.close()
            raise

    def command(self, side: str, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[side], *args]

    def run(self, side: str, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(side, *args), cwd=REPO, capture_output=True, text=True, timeout=timeout)

    def python(self, side: str, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return self.run(side, sys.executable, *args, timeout=timeout)

    def popen(self, side: str, log_path: Path, *args: str) -> subprocess.Popen:
        """Start ``python ARGS`` inside ``side`` (``ip netns exec`` execs it: same PID)."""
        log = open(log_path, "ab")
        proc = subprocess.Popen(self.command(side, sys.executable, *args), cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT)
        self._procs.append((proc, log))
        return proc

    def set_link(self, up: bool) -> None:
        """Take the WAN link down (a cut) or bring it back."""
        _ip("-n", self.ns["a"], "link", "set", self.dev["a"], "up" if up else "down")

    def close(self) -> None:
        for proc, log in self._procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            log.close()
        for side in "ab":
            subprocess.run(["ip", "netns", "delete", self.ns[side]], check=False, capture_output=True, timeout=10)


def _stop_process(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGCONT (a frozen process cannot act on SIGTERM), SIGTERM, then SIGKILL; by PID."""
    if proc.poll() is not None:
        return
    for signum in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


_lan_counter = itertools.count()
_open: set[Lan] = set()


@dataclass(frozen=True)
class LanHost:
    """One host of a ``Lan``: its namespace, address, and the two ends of its veth pair."""

    name: str  # e.g. "n1", "etcd", "clients"
    namespace: str
    address: str
    device: str  # inside the namespace
    port: str  # the bridge's end, in the root namespace

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host (``ip netns exec`` execs it: the PID is argv's)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


Host = LanHost


def _subnet_in_use(subnet: int) -> bool:
    shown = ip("-o", "-4", "addr", "show", check=False).stdout
    return f" 10.78.{subnet}." in shown


class Lan:
    """Hosts ``names`` on one bridge, and the controller on it too (module doc); ``close()`` undoes everything."""

    def __init__(self, names: Iterable[str]) -> None:
        number = next(_lan_counter)
        tag = self._tag(number)  # interface names are at most 15 characters
        self.bridge = self._bridge_name(tag)
        subnet = 1 + (os.getpid() * 7 + number) % 250
        for _ in range(250):
            if not _subnet_in_use(subnet):
                break
            subnet = 1 + subnet % 250
        else:
            raise NetworkError("every 10.78.N.0/24 subnet is in use in the root namespace")
        self.prefix = f"10.78.{subnet}"
        self.controller = f"{self.prefix}.1"
        self.hosts: dict[str, LanHost] = {}
        self._procs: list[tuple[subprocess.Popen, IO[bytes] | None]] = []
        self._cuts: dict[tuple[str, str], int] = {}  # (host, peer) -> partitions that need the cut
        self._closed = False
        _open.add(self)
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.controller}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for index, name in enumerate(names):
                host = self._host(tag, index, name, f"{self.prefix}.{10 + index}")
                ip("netns", "add", host.namespace)
                self.hosts[name] = host
                ip("link", "add", host.port, "type", "veth", "peer", "name", host.device)
                ip("link", "set", host.device, "netns", host.namespace)
                ip("link", "set", host.port, "master", self.bridge)
                ip("link", "set", host.port, "up")
                ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.device)
                ip("-n", host.namespace, "link", "set", host.device, "up")
                ip("-n", host.namespace, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    # -- names (``Network`` has the nemesis's) ------------------------------------------------------

    @staticmethod
    def _tag(number: int) -> str:
        return f"{os.getpid() % 10000:04d}{number % 100:02d}"

    @staticmethod
    def _bridge_name(tag: str) -> str:
        return f"hlb{tag}"

    @staticmethod
    def _host(tag: str, index: int, name: str, address: str) -> LanHost:
        return LanHost(name, f"hl{tag}-{name}", address, f"hl{tag}i{index}", f"hl{tag}o{index}")

    # -- hosts and processes -----------------------------------------------------------------------

    def __getitem__(self, name: str) -> LanHost:
        return self.hosts[name]

    def address(self, last: int) -> str:
        """An address of the LAN's subnet that no host has, e.g. ``address(100)`` for a virtual IP."""
        return f"{self.prefix}.{last}"

    def run(self, name: str, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run(self.hosts[name].command(*argv), cwd=REPO, capture_output=True, text=True,
                              timeout=timeout)

    def popen(self, name: str, argv: Sequence[str], log_path: Path | None = None,
              env: Mapping[str, str] | None = None, **options: object) -> subprocess.Popen:
        """Start ``argv`` inside host ``name``; stopped by PID on ``close()``.

        Its stderr, and its stdout unless ``stdout=`` says otherwise (e.g.
        ``subprocess.PIPE``), go to ``log_path``; ``options`` go to Popen.
        """
        log = open(log_path, "ab") if log_path is not None else None
        stdout = options.pop("stdout", log if log is not None else subprocess.DEVNULL)
        proc = subprocess.Popen(self.hosts[name].command(*argv), cwd=REPO, stdout=stdout, stderr=log,
                                env=dict(env) if env is not None else None, **options)  # type: ignore[call-overload]
        self._procs.append((proc, log))
        return proc

    def python(self, name: str, args: Sequence[str], log_path: Path | None = None, **options: object) -> subprocess.Popen:
        return self.popen(name, [sys.executable, *args], log_path, **options)

    def set_link(self, name: str, up: bool) -> None:
        """Cut host ``name`` off the LAN (its bridge port down) or plug it back in."""
        ip("link", "set", self.hosts[name].port, "up" if up else "down")

    def addresses(self, name: str) -> list[str]:
        """The IPv4 addresses (``A.B.C.D/P``) on host ``name``'s LAN interface."""
        host = self.hosts[name]
        shown = ip("-n", host.namespace, "-o", "-4", "addr", "show", "dev", host.device).stdout
        return [line.split()[3] for line in shown.splitlines() if " inet " in line]

    def holders(self, address: str) -> list[str]:
        """The hosts whose LAN interface carries ``address`` (no prefix; a virtual IP), in host order."""
        return [name for name in self.hosts if any(a.split("/")[0] == address for a in self.addresses(name))]

    # -- partitions (module doc) -------------------------------------------------------------------

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

    # -- cleanup -----------------------------------------------------------------------------------

    def stop_processes(self) -> None:
        """Stop what ``popen`` started, by PID (SIGCONT, SIGTERM, then SIGKILL), in the order started."""
        procs, self._procs = self._procs, []
        for proc, log in procs:
            _stop_process(proc)
            if log is not None:
                log.close()

    def close(self) -> None:
        """Stop what ``popen`` started (by PID), delete the namespaces and the bridge; safe to call twice.

        Whoever started processes inside by other means stops them first: a
        namespace with processes left in it lives on, unnamed, until they exit.
        """
        if self._closed:
            return
        self._closed = True
        self.stop_processes()
        for host in self.hosts.values():
            ip("netns", "delete", host.namespace, check=False)
            ip("link", "delete", host.port, check=False)  # gone with its peer already, unless an add failed halfway
        ip("link", "delete", self.bridge, check=False)
        _open.discard(self)


class Network(Lan):
    """A ``Lan`` named as the nemesis suite's (``nemesis-<pid><n>-<host>``, bridge ``nmb...``)."""

    @staticmethod
    def _tag(number: int) -> str:
        return f"{os.getpid() % 100000:05d}{number % 100:02d}"

    @staticmethod
    def _bridge_name(tag: str) -> str:
        return f"nmb{tag}"

    @staticmethod
    def _host(tag: str, index: int, name: str, address: str) -> LanHost:
        return LanHost(name, f"nemesis-{tag}-{name}", address, f"nmv{tag}{index}i", f"nmv{tag}{index}")


@atexit.register
def _close_leftovers() -> None:
    """Last resort if a run ends without its ``finally``."""
    for lan in list(_open):
        lan.close()
