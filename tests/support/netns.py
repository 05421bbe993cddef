"""Hosts on one machine as network namespaces (needs root): a WAN pair, and a LAN on a bridge.

``WanPair`` makes ``<prefix>-a`` at 10.77.N.1 and ``<prefix>-b`` at 10.77.N.2,
runs commands inside either (``ip netns exec``), takes the veth link down and
up (a cut WAN), and removes both namespaces on ``close()``; processes started
with ``popen`` are stopped by PID first.

``Lan`` puts N hosts on one Linux bridge in the root namespace: each host a
namespace joined to the bridge by a veth pair, at 10.78.N.10, .11, ...; the
test itself (root namespace) has 10.78.N.1 on the bridge and reaches every
host directly (management, etcd there).  It runs commands in each host,
cuts a host's link (its bridge port down: the cable pulled, the host's own
interface loses carrier) and restores it, lists a host's addresses, and on
``close()`` stops what it started by PID and deletes the namespaces and the
bridge.  Names carry the pid and a counter; the subnet is one no root
namespace address uses (``benchmarks/nemesis/network.py`` picks its 10.78
subnets the same way).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .nodes import REPO


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


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


@dataclass(frozen=True)
class LanHost:
    """One host of a ``Lan``: its namespace, address, and the two ends of its veth pair."""

    name: str
    namespace: str
    address: str
    device: str  # inside the namespace
    port: str  # the bridge's end, in the root namespace

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host (``ip netns exec`` execs it: the PID is argv's)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _subnet_in_use(subnet: int) -> bool:
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    return f" 10.78.{subnet}." in shown


class Lan:
    """Hosts ``names`` on one bridge, and the test on it too (module doc); ``close()`` undoes everything."""

    def __init__(self, names: Sequence[str]) -> None:
        number = next(_lan_counter)
        tag = f"{os.getpid() % 10000:04d}{number % 100:02d}"  # interface names are at most 15 characters
        self.bridge = f"hlb{tag}"
        subnet = 1 + (os.getpid() * 7 + number) % 250
        for _ in range(250):
            if not _subnet_in_use(subnet):
                break
            subnet = 1 + subnet % 250
        else:
            raise RuntimeError("every 10.78.N.0/24 subnet is in use in the root namespace")
        self.prefix = f"10.78.{subnet}"
        self.controller = f"{self.prefix}.1"
        self.hosts: dict[str, LanHost] = {}
        self._procs: list[tuple[subprocess.Popen, IO[bytes] | None]] = []
        self._closed = False
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.controller}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for index, name in enumerate(names):
                host = LanHost(name, f"hl{tag}-{name}", f"{self.prefix}.{10 + index}", f"hl{tag}i{index}",
                               f"hl{tag}o{index}")
                _ip("netns", "add", host.namespace)
                self.hosts[name] = host
                _ip("link", "add", host.port, "type", "veth", "peer", "name", host.device)
                _ip("link", "set", host.device, "netns", host.namespace)
                _ip("link", "set", host.port, "master", self.bridge)
                _ip("link", "set", host.port, "up")
                _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.device)
                _ip("-n", host.namespace, "link", "set", host.device, "up")
                _ip("-n", host.namespace, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name: str) -> LanHost:
        return self.hosts[name]

    def address(self, last: int) -> str:
        """An address of the LAN's subnet, e.g. ``address(100)`` for a virtual IP."""
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
        _ip("link", "set", self.hosts[name].port, "up" if up else "down")

    def addresses(self, name: str) -> list[str]:
        """The IPv4 addresses (``A.B.C.D/P``) on host ``name``'s LAN interface."""
        host = self.hosts[name]
        shown = subprocess.run(["ip", "-n", host.namespace, "-o", "-4", "addr", "show", "dev", host.device],
                               capture_output=True, text=True, timeout=10, check=True).stdout
        return [line.split()[3] for line in shown.splitlines() if " inet " in line]

    def holders(self, address: str) -> list[str]:
        """The hosts whose LAN interface carries ``address`` (no prefix), in host order."""
        return [name for name in self.hosts if any(a.split("/")[0] == address for a in self.addresses(name))]

    def stop_processes(self) -> None:
        """Stop what ``popen`` started, by PID (SIGCONT, SIGTERM, then SIGKILL), in the order started."""
        procs, self._procs = self._procs, []
        for proc, log in procs:
            _stop_process(proc)
            if log is not None:
                log.close()

    def close(self) -> None:
        """Stop what ``popen`` started (by PID), delete the namespaces and the bridge; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.stop_processes()
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "delete", host.namespace], capture_output=True, timeout=10)
            subprocess.run(["ip", "link", "delete", host.port], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, timeout=10)
