"""A real, throw-away etcd server for integration tests.

Election tests are only worth something against the real thing: lease expiry,
the minimum TTL etcd imposes, transactions and watches all behave in ways a
mock would get wrong.  ``EtcdServer`` starts one single-member etcd on free
loopback ports in a fresh temporary directory, waits until it answers, and
stops it by PID (SIGTERM, then SIGKILL) and removes the directory, even when
the test fails.  It can also pause, kill and restart the server, which is how
tests make etcd unreachable.

A missing etcd binary raises ``EtcdUnavailable`` with a message saying how to
get one: integration tests must fail, not skip, on a machine without etcd.

etcd keeps its default timing (100 ms heartbeat, 1000 ms election timeout):
the minimum lease TTL it enforces (about 1.5 x election timeout, so 2 s) is
part of what the tests measure, and the defaults are what users run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

#: Environment variable naming the etcd binary, if not ``etcd`` on PATH.
ETCD_BINARY_ENV = "HASTANDBY_ETCD"
_FALLBACK_BINARY = "/usr/bin/etcd"
_START_TIMEOUT = 20.0
_STOP_TIMEOUT = 5.0

_running: set[EtcdServer] = set()


class EtcdUnavailable(RuntimeError):
    """etcd could not be found or started; the message says why."""


def find_etcd_binary() -> str:
    """The etcd binary to run: $HASTANDBY_ETCD, else ``etcd`` on PATH, else /usr/bin/etcd."""
    explicit = os.environ.get(ETCD_BINARY_ENV)
    candidate = explicit or shutil.which("etcd") or _FALLBACK_BINARY
    if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
        looked_at = f"${ETCD_BINARY_ENV}={explicit}" if explicit else f"PATH and {_FALLBACK_BINARY}"
        raise EtcdUnavailable(
            f"no etcd binary (looked at {looked_at}): install one (Debian: apt-get install "
            f"etcd-server) or point ${ETCD_BINARY_ENV} at an etcd 3.4+ binary; "
            "the etcd integration tests need a real server"
        )
    return candidate


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EtcdServer:
    """One single-member etcd server on loopback, owned by the test that made it.

    Use as a context manager (``with EtcdServer() as etcd: ... etcd.client_url``)
    or call ``start()``/``stop()`` yourself; ``stop()`` is safe to call twice.
    """

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or find_etcd_binary()
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._client_port = 0
        self._peer_port = 0

    @property
    def client_url(self) -> str:
        """The URL clients use, e.g. ``http://127.0.0.1:23791``."""
        return f"http://127.0.0.1:{self._client_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def log_path(self) -> Path | None:
        return self._workdir / "etcd.log" if self._workdir else None

    def start(self) -> str:
        """Start on fresh free ports in a fresh directory; return the client URL."""
        if self._process is not None:
            raise RuntimeError("etcd already running")
        self._workdir = Path(tempfile.mkdtemp(prefix="hastandby-etcd-"))
        _running.add(self)
        last_error: EtcdUnavailable | None = None
        for _ in range(3):  # another process may grab a "free" port first
            self._client_port, self._peer_port = _free_port(), _free_port()
            try:
                self._launch()
                return self.client_url
            except EtcdUnavailable as error:
                last_error = error
                self._terminate()
                shutil.rmtree(self._workdir / "data", ignore_errors=True)
        self.stop()
        assert last_error is not None
        raise last_error

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; remove the directory."""
        self._terminate()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        _running.discard(self)

    def kill(self) -> None:
        """SIGKILL the server (a crash); its data stays for ``restart()``."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self) -> None:
        """Start again on the same ports and data after ``kill()``."""
        if self._process is not None:
            raise RuntimeError("etcd still running; kill() it first")
        self._launch()

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a hung etcd)."""
        assert self._process is not None, "etcd is not running"
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause()``."""
        assert self._process is not None, "etcd is not running"
        os.kill(self._process.pid, signal.SIGCONT)

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _command(self) -> list[str]:
        assert self._workdir is not None
        peer_url = f"http://127.0.0.1:{self._peer_port}"
        return [
            self.binary,
            "--name", "test",
            "--data-dir", str(self._workdir / "data"),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"test={peer_url}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", "hastandby-test",
            "--logger", "zap",
            "--log-outputs", "stderr",
            "--log-level", "warn",
        ]

    def _launch(self) -> None:
        assert self._workdir is not None
        with open(self._workdir / "etcd.log", "ab") as log:
            self._process = subprocess.Popen(
                self._command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EtcdUnavailable(
                    f"etcd exited with status {self._process.returncode} at start:\n{self._log_tail()}"
                )
            if self._answers():
                return
            time.sleep(0.05)
        raise EtcdUnavailable(f"etcd did not answer within {_START_TIMEOUT:.0f} s:\n{self._log_tail()}")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1) as response:
                return b'"true"' in response.read()
        except (urllib.error.URLError, OSError):
            return False

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.kill(process.pid, signal.SIGCONT)  # a paused etcd cannot act on SIGTERM
            except ProcessLookupError:
                pass
            process.terminate()
            try:
                process.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _log_tail(self, lines: int = 20) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@atexit.register
def _stop_leftovers() -> None:
    """Last resort if a test run is torn down without its finalizers."""
    for server in list(_running):
        server.stop()
