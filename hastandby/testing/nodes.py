"""Real ``hastandby serve`` processes on loopback ports, stopped by PID.

Every node requires authentication and knows the test run's users
(``auth.serve_arguments()``, given before the test's own arguments, so a test
may override them, e.g. with ``--allow-anonymous``).  ``url`` is the ``app``
user's URL for python-qpid-proton clients; management requests authenticate as
``admin`` (the environment conftest exports).  ``read_node_log`` reads back
any node's ``--log-format json`` log, these nodes' or those the benchmarks
and the nemesis suite start elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from hastandby.client import ManagementClient, ManagementError

from hastandby.testing import auth
from hastandby.testing.paths import repo
from hastandby.testing.processes import free_port

REPO = repo()  # the checkout's root: the nodes' cwd, and where tests find scripts/ and docs/


class NodeProcess:
    """One node process; ``stop()`` (SIGTERM, then SIGKILL) always runs in fixtures."""

    def __init__(self, log_dir: Path, *args: str, port: int | None = None, name: str = "node") -> None:
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = auth.url(self.address)  # amqp://app:PASSWORD@127.0.0.1:PORT
        self.args = list(args)
        self.log_path = Path(log_dir) / f"{name}-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> "NodeProcess":
        command = [sys.executable, "-m", "hastandby", "serve", "--listen", self.address,
                   "--log-format", "json", *auth.serve_arguments(), *self.args]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(command, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with ManagementClient(self.address, timeout=2) as client:
                    client.request("PING")
                return
            except ManagementError:
                time.sleep(0.1)
        raise TimeoutError(f"node {self.address} not ready after {timeout}s:\n{self.log()}")

    def request(self, operation: str, type: str = "", name: str = "", body: dict | None = None):
        with ManagementClient(self.address, timeout=10) as client:
            return client.request(operation, type, name, body)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def terminate(self) -> None:
        """Ask the node to stop (SIGCONT, for a frozen one, then SIGTERM) without waiting for it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, SIGKILL if needed; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def stop_together(nodes: Iterable[NodeProcess]) -> None:
    """Stop every node, all asked at once, so that their shutdown grace periods overlap."""
    nodes = list(nodes)
    for node in nodes:
        node.terminate()
    for node in nodes:
        node.stop()


def read_node_log(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a node's log (``--log-format json``) with ``_t`` = epoch seconds."""
    lines: list[dict[str, Any]] = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return lines
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and "event" in line and "timestamp" in line:
            try:
                line["_t"] = datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
            lines.append(line)
    return lines
