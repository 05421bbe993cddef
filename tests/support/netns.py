"""Two network namespaces joined by a veth pair: two hosts on one machine (needs root).

``WanPair`` makes ``<prefix>-a`` at 10.77.N.1 and ``<prefix>-b`` at 10.77.N.2,
runs commands inside either (``ip netns exec``), takes the veth link down and
up (a cut WAN), and removes both namespaces on ``close()``; processes started
with ``popen`` are stopped by PID first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
