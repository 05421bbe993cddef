"""Process helpers of tests and benchmarks: free ports, measured broker processes.

Benchmarks start brokers (the C example broker, hastandby nodes) as child
processes, measure their CPU and memory with psutil, and must always stop them
by PID, also when a run fails; :class:`Service` bundles that.  The tests'
``hastandby serve`` process with a management readiness check is
``nodes.NodeProcess``; bounded polling is in ``waiting``.  A client process
driven by command lines that reports JSON lines is a :class:`JsonLinesProcess`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psutil
from proton import ProtonException
from proton.utils import BlockingConnection

from hastandby.testing.paths import repo

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port that was free a moment ago (bind to port 0, then release).

    The kernel may hand the same port to two binds in a row once the first is
    released, so a cluster asking for three ports could get one twice; ports
    already returned to this process are skipped.  Another process may still
    take a port before the caller binds; callers that start a server on it
    should treat a failed start as worth one retry.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            break
    _handed_out[port] = None
    if len(_handed_out) > _HANDED_OUT_KEPT:
        del _handed_out[next(iter(_handed_out))]  # the oldest: a long session cannot exhaust the range
    return port


_HANDED_OUT_KEPT = 4096
_handed_out: dict[int, None] = {}  # ports free_port returned lately, oldest first


class Service:
    """A long-running process we started (a broker node), with CPU/RSS accounting.

    Its output goes to ``log_path`` (a pipe nobody reads could fill and block
    the process). It runs in its own session so a Ctrl-C at the terminal
    reaches only the benchmark, whose cleanup then stops it by PID.
    Use as a context manager, or call :meth:`stop` in a ``finally``.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.popen.pid
        self.process = psutil.Process(self.pid)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def running(self) -> bool:
        """True while the process has not exited."""
        return self.popen.poll() is None

    def _tree(self) -> list[psutil.Process]:
        """The process and its live descendants (a node may spawn helpers)."""
        try:
            return [self.process, *self.process.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        """User+system CPU seconds used so far by the process and its descendants."""
        total = 0.0
        for proc in self._tree():
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        try:
            reaped = self.process.cpu_times()
            total += reaped.children_user + reaped.children_system
        except psutil.NoSuchProcess:
            pass
        return total

    def rss_bytes(self) -> int:
        """Resident set size of the process and its descendants."""
        total = 0
        for proc in self._tree():
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def wait_ready(self, host: str, port: int, timeout: float = 30.0,
                   connect_options: dict[str, Any] | None = None) -> None:
        """Wait until ``port`` accepts TCP connections and an AMQP connection opens.

        ``connect_options``: python-qpid-proton connect arguments (the user and
        password a hastandby node requires, ``auth.users().connect_options()``).
        Raises RuntimeError if the process exits first, TimeoutError after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                raise RuntimeError(
                    f"{self.name} exited with {self.popen.returncode} before it was ready; "
                    f"{self.log_path} ends: {self.log_tail()}"
                )
            if _amqp_opens(host, port, max(0.5, min(5.0, deadline - time.monotonic())), connect_options or {}):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready on {host}:{port} after {timeout} s")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the process (a crash, for failover benchmarks); does not wait."""
        if self.running():
            self.popen.kill()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process, SIGKILL it after ``timeout``; then any descendants left.

        Returns its exit code (negative: killed by that signal).
        """
        children = self._tree()[1:]
        if self.running():
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=timeout)
        return self.popen.returncode

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the process's output on one line, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])


def _amqp_opens(host: str, port: int, timeout: float, connect_options: dict[str, Any]) -> bool:
    """True if a TCP connection is accepted and an AMQP connection opens on it."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError:
        return False
    try:
        connection = BlockingConnection(f"amqp://{host}:{port}", timeout=timeout, **connect_options)
    except ProtonException:  # ConnectionException, Timeout, ...
        return False
    connection.close()
    return True


def python_env() -> dict[str, str]:
    """Environment for child Python processes: unbuffered output, so logs are current."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


class JsonLinesProcess:
    """A child process that takes commands as lines on its stdin and reports JSON objects, a line each, on
    its stdout, read on a thread (``on_line``); its stderr goes to ``log_path``.  It runs in a session of its
    own, and ``kill`` stops it by PID (the failover benchmark's clients, the nemesis workload)."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str], name: str) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(argv, cwd=repo(), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=log, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=name, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict):
                self.on_line(line)

    def on_line(self, line: dict[str, Any]) -> None:
        """One JSON object the process printed, on the reader thread."""

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def write_line(self, text: str) -> None:
        """Send one command line; OSError (or ValueError) once the process's stdin is closed."""
        assert self.popen.stdin is not None
        self.popen.stdin.write((text + "\n").encode())
        self.popen.stdin.flush()

    def end_input(self) -> None:
        """Close the process's stdin: end of commands."""
        try:
            assert self.popen.stdin is not None
            self.popen.stdin.close()
        except OSError:
            pass

    def wait_or_kill(self, timeout: float) -> bool:
        """Wait ``timeout`` s for the process to exit, SIGKILL it if it does not; True if it exited by itself.
        Then the rest of what it printed is read (5 s at most) and its pipes are closed."""
        exited = True
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            exited = False
            self.popen.kill()
            self.popen.wait(5)
        self._reader.join(5)
        for stream in (self.popen.stdin, self.popen.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        return exited

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""
