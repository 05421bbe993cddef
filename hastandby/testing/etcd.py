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

Security: ``EtcdServer(tls=EtcdTls(...))`` serves clients over https (with
``client_cert_auth``, only to clients whose certificate its CA signed), and
``enable_auth()`` turns etcd authentication on: a ``root`` user and role, and
a user whose role may read and write ``/hastandby/`` only.  ``EtcdCluster``
runs several members on loopback (peers speak plain http among themselves),
so that one member can die while the cluster stays up.
"""

from __future__ import annotations

import atexit
import importlib
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from hastandby.testing.processes import free_port

if TYPE_CHECKING:
    from hastandby.election.etcd_client import EtcdClient, EtcdSettings
    from hastandby.testing.certs import Pki

#: Environment variable naming the etcd binary, if not ``etcd`` on PATH.
ETCD_BINARY_ENV = "HASTANDBY_ETCD"
_FALLBACK_BINARY = "/usr/bin/etcd"
_START_TIMEOUT = 20.0
_STOP_TIMEOUT = 5.0

_running: set[EtcdServer] = set()

#: The etcd user tests give the nodes; its role may read and write /hastandby/ only.
NODE_USER = "hastandby"


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


def dead_endpoint(scheme: str = "https") -> str:
    """An endpoint nothing listens on (connections are refused)."""
    return f"{scheme}://127.0.0.1:{free_port()}"


@dataclass(frozen=True)
class EtcdTls:
    """etcd's TLS towards clients: its certificate and key, and the CA of its clients' certificates.

    ``client_cert``/``client_key`` are what the test itself (health checks,
    ``enable_auth``) presents; ``client_cert_auth`` makes etcd require one.
    """

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    client_cert_auth: bool = True

    @classmethod
    def from_pki(cls, pki: Pki, client: str = "client", client_cert_auth: bool = True) -> EtcdTls:
        """From ``certs.make_pki``: its server certificate (127.0.0.1, localhost) and a client's."""
        return cls(pki.ca, pki.cert("server"), pki.key("server"), pki.cert(client), pki.key(client), client_cert_auth)

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


@dataclass(frozen=True)
class EtcdLogin:
    """An etcd user and its password, and a file holding the password (for --etcd-password-file)."""

    user: str
    password: str = field(repr=False)
    password_file: Path


class EtcdServer:
    """One single-member etcd server on loopback, owned by the test that made it.

    Use as a context manager (``with EtcdServer() as etcd: ... etcd.client_url``)
    or call ``start()``/``stop()`` yourself; ``stop()`` is safe to call twice.
    ``tls``: serve clients over https.  ``auth_token_ttl``: seconds an idle
    authentication token lives (etcd's default is 300).
    """

    def __init__(self, binary: str | None = None, *, tls: EtcdTls | None = None,
                 auth_token_ttl: int | None = None, name: str = "test", host: str = "127.0.0.1") -> None:
        self.binary = binary or find_etcd_binary()
        self.host = host  # where it listens: another address (a bridge's) lets network namespaces reach it
        self.tls = tls
        self.auth_token_ttl = auth_token_ttl
        self.name = name
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._client_port = 0
        self._peer_port = 0
        self._initial_cluster: str | None = None  # set by EtcdCluster for its members
        self.root: EtcdLogin | None = None  # once enable_auth() ran

    @property
    def client_url(self) -> str:
        """The URL clients use, e.g. ``http://127.0.0.1:23791`` (``https://`` with TLS)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self._client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self._peer_port}"

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
            self._client_port, self._peer_port = free_port(), free_port()
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

    # -- security ------------------------------------------------------------------------------

    def settings(self, login: EtcdLogin | None = None, endpoints: Sequence[str] | None = None) -> EtcdSettings:
        """``EtcdSettings`` for this server (or ``endpoints``): its TLS client files, ``login``'s user."""
        return _settings(endpoints or [self.client_url], self.tls, login)

    def enable_auth(self, user: str = NODE_USER, password: str | None = None) -> EtcdLogin:
        """Turn authentication on; return the login of a new ``user`` who may use /hastandby/ only."""
        self.root, login = _enable_auth([self.client_url], self.tls, self._secrets_dir(), user, password)
        return login

    def admin(self) -> EtcdClient:
        """A client as ``root`` (after ``enable_auth``), or without a user; the caller closes it."""
        return _client([self.client_url], self.tls, self.root)

    def _secrets_dir(self) -> Path:
        assert self._workdir is not None, "etcd is not running"
        return self._workdir

    # -- the process ----------------------------------------------------------------------------

    def _command(self) -> list[str]:
        assert self._workdir is not None
        command = [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self._workdir / "data"),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self._initial_cluster or f"{self.name}={self.peer_url}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", "hastandby-test",
            "--logger", "zap",
            "--log-outputs", "stderr",
            "--log-level", "warn",
        ]
        if self.tls is not None:
            command += ["--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key),
                        "--trusted-ca-file", str(self.tls.ca)]
            if self.tls.client_cert_auth:
                command.append("--client-cert-auth")
        if self.auth_token_ttl is not None:
            command += ["--auth-token-ttl", str(self.auth_token_ttl)]
        return command

    def _launch(self) -> None:
        self._spawn()
        self._wait_answering()

    def _spawn(self) -> None:
        assert self._workdir is not None
        with open(self._workdir / "etcd.log", "ab") as log:
            self._process = subprocess.Popen(
                self._command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    def _wait_answering(self) -> None:
        assert self._process is not None
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
        context = self.tls.ssl_context() if self.tls is not None else None
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1, context=context) as response:
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


class EtcdCluster:
    """``size`` etcd members on loopback forming one cluster; a member may die while the cluster stays up.

    ``members[i]`` is an ``EtcdServer`` (``kill``, ``pause``, ``restart`` ...);
    ``stop()`` stops every member by PID and removes their directories.
    """

    def __init__(self, size: int = 3, binary: str | None = None, *, tls: EtcdTls | None = None,
                 auth_token_ttl: int | None = None) -> None:
        self.tls = tls
        self.members = [EtcdServer(binary, tls=tls, auth_token_ttl=auth_token_ttl, name=f"m{i}")
                        for i in range(size)]
        self.root: EtcdLogin | None = None
        self._secrets: Path | None = None

    @property
    def client_urls(self) -> list[str]:
        return [member.client_url for member in self.members]

    def start(self) -> list[str]:
        """Start every member on fresh ports; return the client URLs."""
        self._secrets = Path(tempfile.mkdtemp(prefix="hastandby-etcd-cluster-"))
        last_error: EtcdUnavailable | None = None
        for _ in range(3):  # another process may grab a "free" port first
            for member in self.members:
                member._workdir = Path(tempfile.mkdtemp(prefix="hastandby-etcd-"))
                member._client_port, member._peer_port = free_port(), free_port()
                _running.add(member)
            initial = ",".join(f"{member.name}={member.peer_url}" for member in self.members)
            try:
                for member in self.members:
                    member._initial_cluster = initial
                    member._spawn()
                for member in self.members:  # a member answers only once the cluster has a leader
                    member._wait_answering()
                return self.client_urls
            except EtcdUnavailable as error:
                last_error = error
                for member in self.members:
                    member.stop()
        self.stop()
        assert last_error is not None
        raise last_error

    def stop(self) -> None:
        for member in self.members:
            member.stop()
        if self._secrets is not None:
            shutil.rmtree(self._secrets, ignore_errors=True)
            self._secrets = None

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def settings(self, login: EtcdLogin | None = None, endpoints: Sequence[str] | None = None) -> EtcdSettings:
        return _settings(endpoints or self.client_urls, self.tls, login)

    def enable_auth(self, user: str = NODE_USER, password: str | None = None) -> EtcdLogin:
        assert self._secrets is not None, "the cluster is not running"
        self.root, login = _enable_auth(self.client_urls, self.tls, self._secrets, user, password)
        for member in self.members:
            member.root = self.root
        return login

    def leader(self) -> int:
        """Index of the member that is raft leader now."""
        from hastandby.election.etcd_client import etcdrpc

        for index, member in enumerate(self.members):
            if member.pid is None:
                continue
            client = member.admin()
            try:
                status = client.call("status", lambda c, timeout, md: etcdrpc.MaintenanceStub(c.channel).Status(
                    etcdrpc.StatusRequest(), timeout, metadata=md))
            finally:
                client.close()
            if status.leader == status.header.member_id:
                return index
        raise AssertionError("no member is leader")


def _settings(endpoints: Sequence[str], tls: EtcdTls | None, login: EtcdLogin | None) -> EtcdSettings:
    from hastandby.election.etcd_client import EtcdSettings

    return EtcdSettings(
        tuple(endpoints),
        ca_file=str(tls.ca) if tls else None,
        cert_file=str(tls.client_cert) if tls else None,
        key_file=str(tls.client_key) if tls else None,
        user=login.user if login else None,
        password=login.password if login else None,
    )


def _client(endpoints: Sequence[str], tls: EtcdTls | None, login: EtcdLogin | None) -> EtcdClient:
    from hastandby.election.etcd_client import EtcdClient

    return EtcdClient(_settings(endpoints, tls, login), 5.0)


def _enable_auth(endpoints: Sequence[str], tls: EtcdTls | None, directory: Path, user: str,
                 password: str | None) -> tuple[EtcdLogin, EtcdLogin]:
    """Add ``root`` (role root) and ``user`` (a role that may read and write /hastandby/), enable auth."""
    from hastandby.election.etcd_client import etcdrpc, increment_last_byte

    auth_pb2 = importlib.import_module("etcd3.etcdrpc.auth_pb2")  # after etcd_client: protobuf's runtime

    def login(name: str, secret: str | None) -> EtcdLogin:
        secret = secret or secrets.token_urlsafe(12)
        path = directory / f"etcd-{name}.password"
        path.write_text(secret + "\n")
        return EtcdLogin(name, secret, path)

    root, node = login("root", None), login(user, password)
    prefix = b"/hastandby/"
    requests: list[tuple[str, Any]] = [
        ("UserAdd", etcdrpc.AuthUserAddRequest(name=root.user, password=root.password)),
        ("RoleAdd", etcdrpc.AuthRoleAddRequest(name="root")),
        ("UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user=root.user, role="root")),
        ("UserAdd", etcdrpc.AuthUserAddRequest(name=node.user, password=node.password)),
        ("RoleAdd", etcdrpc.AuthRoleAddRequest(name=node.user)),
        ("RoleGrantPermission", etcdrpc.AuthRoleGrantPermissionRequest(name=node.user, perm=auth_pb2.Permission(
            permType=auth_pb2.Permission.READWRITE, key=prefix, range_end=increment_last_byte(prefix)))),
        ("UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user=node.user, role=node.user)),
        ("AuthEnable", etcdrpc.AuthEnableRequest()),
    ]
    client = _client(endpoints, tls, None)
    try:
        for method, request in requests:
            client.call(method, lambda c, timeout, md, m=method, r=request: getattr(c.auth, m)(r, timeout))
    finally:
        client.close()
    return root, node


@atexit.register
def _stop_leftovers() -> None:
    """Last resort if a test run is torn down without its finalizers."""
    for server in list(_running):
        server.stop()
