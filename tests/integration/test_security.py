"""The security layer end to end: real nodes, real clients (python-qpid-proton, our own SASL client, rhea).

Every bad input here -- a wrong password, an unknown user, an untrusted or
expired certificate, the wrong protocol on a port, a claim to a role the
principal does not have, an action the ACL denies, a broken ACL file -- must
get a clear error naming what was wrong, while the node keeps serving
everyone else and loses nothing: each test runs a reference producer and
consumer (``Reference``) across the bad input and checks, afterwards, that its
open connection still works and that a fresh consumer gets every message it
sent, in order.

Nodes are started with exactly the security options each test gives (``Node``
below adds none of its own), against a users file of the test's own: the
run's ``admin``, ``peer`` and ``app`` users (``hastandby/testing/auth.py``, so
that management clients, which authenticate as ``admin``, work unchanged),
and certificate-only users named by the test PKI's certificates
(``hastandby/testing/certs.py``).  python-qpid-proton cannot verify a server
certificate by IP address: TLS clients connect to ``localhost``.
"""

from __future__ import annotations

import json
import os
import queue as queue_module
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote

import pytest
from proton import Delivery, Message, SSLDomain, Timeout, symbol
from proton.reactor import Copy, LinkOption
from proton.utils import BlockingConnection, SyncRequestResponse

from hastandby.client import Login, ManagementClient, ManagementError
from hastandby.security.credentials import Credentials
from hastandby.security.sasl import AMQP_HEADER, INIT, SASL_HEADER, SaslClient, encode_frame
from hastandby.testing import auth
from hastandby.testing.certs import Pki, make_pki
from hastandby.testing.nodes import REPO, NodeProcess, free_port
from hastandby.testing.waiting import wait_for

ADMIN, PEER, APP = auth.ADMIN, auth.PEER, auth.APP
PASSWORDS = auth.PASSWORDS
ADMIN_PROPERTY = symbol("qpid.ha-admin")
BACKUP_PROPERTY = symbol("qpid.ha-backup")
REPLICA_PROPERTY = symbol("hastandby.dr-replica")
MODE_PROPERTY = symbol("hastandby.dr-mode")
UNAUTHORIZED = "amqp:unauthorized-access"
RHEA_CLIENT = REPO / "tests" / "rhea" / "client.js"
# Certificate-only users (EXTERNAL): the names are the test certificates' CNs.
CERT_USERS = {"client": [], "certadmin": ["admin"], "server": ["cluster"]}


# -- nodes and their security set-up ------------------------------------------------------------


class Node(NodeProcess):
    """A node started with exactly the ``serve`` options the test gives: no security options implied."""

    peer_address = ""  # HOST:PORT where its HA peers reach it (its TLS listener with --peer-tls)

    def start(self, wait: bool = True) -> "Node":
        command = [sys.executable, "-m", "hastandby", "serve", "--listen", self.address,
                   "--log-format", "json", *self.args]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(command, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()
        return self

    def records(self) -> list[dict[str, Any]]:
        """Every JSON line of the node's log so far."""
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def events(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event") == event]

    def unauthenticated(self) -> list[str]:
        """The reasons the node gave for every connection it refused before AMQP."""
        return [str(r.get("reason")) for r in self.events("connection not authenticated")]

    def wait_event(self, event: str, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((r for r in self.events(event)
                         if all(value in str(r.get(key, "")) for key, value in fields.items())), None)
        return wait_for(found, timeout, f"{self.address} logs {event!r} with {fields}")


@dataclass
class Setup:
    """One test's users file, password files and the (shared) test PKI."""

    directory: Path
    users_file: Path
    pki: Pki
    _peers: int = 0

    def password_file(self, user: str, password: str | None = None) -> Path:
        path = self.directory / f"{user}.password"
        path.write_text((password if password is not None else PASSWORDS[user]) + "\n")
        return path

    def serve(self, anonymous: bool = False, peer_user: str | None = PEER,
              peer_password: str | None = None) -> list[str]:
        """Authentication required (unless ``anonymous``), this test's users, peers as ``peer_user`` (SCRAM)."""
        return self.users(anonymous) + self.peer(peer_user, peer_password)

    def users(self, anonymous: bool = False) -> list[str]:
        return ["--allow-anonymous" if anonymous else "--no-allow-anonymous", "--users-file", str(self.users_file)]

    def peer(self, user: str | None = PEER, password: str | None = None) -> list[str]:
        """How a node authenticates to its peers: ``user`` and a password file (none: no peer user)."""
        if user is None:
            return []
        self._peers += 1  # a file per node: nodes of one test may be given different passwords
        password = PASSWORDS[user] if password is None else password
        password_file = self.password_file(f"{user}-peer-{self._peers}", password)
        return ["--peer-user", user, "--peer-password-file", str(password_file)]

    def tls(self, port: int, require_client_cert: bool = False) -> list[str]:
        """A TLS listener on 127.0.0.1:``port`` with the server certificate; client certificates from the CA."""
        args = ["--listen-tls", f"127.0.0.1:{port}", "--ssl-cert-file", str(self.pki.cert("server")),
                "--ssl-key-file", str(self.pki.key("server")), "--ssl-ca-file", str(self.pki.ca)]
        return args + (["--ssl-require-client-cert"] if require_client_cert else [])


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), clients=("client", "certadmin"))


@pytest.fixture
def setup(tmp_path, pki, monkeypatch) -> Setup:
    # Management clients (and NodeProcess.wait_ready) authenticate as admin, as everywhere in the suite.
    for key, value in auth.client_environment(ADMIN).items():
        monkeypatch.setenv(key, value)
    users = Credentials(tmp_path / "users.json")
    for user, groups in ((ADMIN, ["admin"]), (PEER, ["cluster"]), (APP, [])):
        users.add(user, PASSWORDS[user], groups)
    for user, groups in CERT_USERS.items():
        users.add(user, None, groups)
    users.save()
    return Setup(tmp_path, tmp_path / "users.json", pki)


@pytest.fixture
def start_node(tmp_path) -> Iterator[Callable[..., Node]]:
    """Start nodes with exactly these ``serve`` arguments; every one is stopped by PID at teardown."""
    started: list[Node] = []

    def start(*args: str, wait: bool = True, name: str = "node", port: int | None = None) -> Node:
        node = Node(tmp_path, *args, port=port, name=name)
        started.append(node)
        return node.start(wait=wait)

    yield start
    for node in started:
        node.stop()


# -- clients ------------------------------------------------------------------------------------------


def connect(address: str, user: str | None = APP, password: str | None = None, **kwargs: Any) -> BlockingConnection:
    """A python-qpid-proton connection on the plain port: PLAIN with a user, ANONYMOUS without."""
    if user is None:
        return BlockingConnection(f"amqp://{address}", timeout=10, **kwargs)
    password = PASSWORDS[user] if password is None else password
    return BlockingConnection(f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{address}", timeout=10,
                              allow_insecure_mechs=True, **kwargs)


def tls_domain(pki: Pki, cert: str | None = None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, str(pki.ca))
    if cert is not None:
        domain.set_credentials(str(pki.cert(cert)), str(pki.key(cert)), None)
    return domain


def tls_connect(pki: Pki, port: int, user: str | None = None, password: str | None = None,
                cert: str | None = None, **kwargs: Any) -> BlockingConnection:
    """A TLS connection to ``localhost:port``: PLAIN as ``user``, or EXTERNAL with certificate ``cert``."""
    credentials = ""
    if user is not None:
        credentials = f"{quote(user, safe='')}:{quote(PASSWORDS[user] if password is None else password, safe='')}@"
    return BlockingConnection(f"amqps://{credentials}localhost:{port}", timeout=10,
                              ssl_domain=tls_domain(pki, cert), **kwargs)


def refused(attempt: Callable[[], Any]) -> str:
    """Run ``attempt``, which must fail; return its error's text (proton's includes the peer's condition)."""
    try:
        result = attempt()
    except Exception as error:  # ConnectionException, LinkDetached, ManagementError, ...
        return f"{type(error).__name__}: {error}"
    if isinstance(result, BlockingConnection):
        result.close()
    raise AssertionError(f"expected a refusal, got {result!r}")


def send(connection: BlockingConnection, queue: str, bodies: list[str]) -> None:
    sender = connection.create_sender(queue)
    for body in bodies:
        sender.send(Message(body=body))  # waits for the node's outcome; raises unless accepted
    sender.close()


def receive(connection: BlockingConnection, queue: str, count: int, browse: bool = False,
            timeout: float = 5.0) -> list[Any]:
    receiver = connection.create_receiver(queue, credit=max(count, 1), options=Copy() if browse else None)
    bodies = []
    for _ in range(count):
        try:
            message = receiver.receive(timeout=timeout)
        except Exception:
            break
        bodies.append(message.body)
        receiver.accept()
    receiver.close()
    return bodies


def relay_send(connection: BlockingConnection, address: str, body: str) -> tuple[Any, Any]:
    """Send one message through the anonymous relay (a sender without target); its outcome and condition."""
    sender = connection.create_sender(None)
    try:
        delivery = sender.link.send(Message(address=address, body=body))
        connection.wait(lambda: bool(delivery.remote_state), msg=f"an outcome for a message to {address}")
        return delivery.remote_state, delivery.remote.condition
    finally:
        sender.close()


class LinkProperties(LinkOption):
    def __init__(self, properties: dict[Any, Any]) -> None:
        self.properties = properties

    def apply(self, link: Any) -> None:
        link.properties = self.properties


def management(address: str, user: str | None = ADMIN, password: str | None = None, **login: Any) -> ManagementClient:
    password = (PASSWORDS.get(user) if user else None) if password is None else password
    return ManagementClient(address, timeout=10, login=Login(user, password, **login))


def request(address: str, operation: str, type: str = "", name: str = "", body: dict | None = None,
            user: str | None = ADMIN, **login: Any) -> Any:
    with management(address, user, **login) as client:
        return client.request(operation, type, name, body)


def depth(address: str, queue: str) -> int | None:
    found = [q for q in request(address, "QUERY")["queues"] if q["name"] == queue]
    return found[0]["depth"] if found else None


class Reference:
    """A producer and a consumer that have nothing to do with the bad input around them.

    Its connection lives in a thread of its own, which keeps it busy (heartbeats:
    HA nodes drop a connection idle for 2 s) while the test does other things.
    It sends a few messages before the test's bad input; ``check`` then sends
    more on the same, still open connection and drains the queue with a new
    connection: every message, in order, none twice.
    """

    def __init__(self, connect: Callable[[], BlockingConnection], queue: str = "reference") -> None:
        self.connect, self.queue = connect, queue
        self.sent: list[str] = []
        self._commands: queue_module.Queue[int | None] = queue_module.Queue()
        self._results: queue_module.Queue[BaseException | None] = queue_module.Queue()
        self._thread = threading.Thread(target=self._run, name=f"reference-{queue}", daemon=True)
        self._thread.start()
        self._outcome(self._results.get(timeout=30))  # connected
        self.send(5)

    def _run(self) -> None:
        try:
            connection = self.connect()
            sender = connection.create_sender(self.queue)
        except BaseException as error:  # reported to the test by the constructor
            self._results.put(error)
            return
        self._results.put(None)
        try:
            while True:
                try:
                    count = self._commands.get(timeout=0.1)
                except queue_module.Empty:
                    try:  # process events (heartbeats) for a moment
                        connection.wait(lambda: False, timeout=0.05)
                    except Timeout:
                        pass
                    except BaseException as error:
                        self._results.put(error)
                        return
                    continue
                if count is None:
                    break
                try:
                    for _ in range(count):
                        body = f"{self.queue}-{len(self.sent)}"
                        sender.send(Message(body=body))  # waits until the node accepts it
                        self.sent.append(body)
                    self._results.put(None)
                except BaseException as error:
                    self._results.put(error)
                    return
        finally:
            connection.close()

    @staticmethod
    def _outcome(result: BaseException | None) -> None:
        if result is not None:
            raise AssertionError(f"the reference client failed: {type(result).__name__}: {result}") from result

    def send(self, count: int) -> None:
        """Send ``count`` more on the reference connection (which must still be open)."""
        if not self._results.empty():
            self._outcome(self._results.get())
        self._commands.put(count)
        self._outcome(self._results.get(timeout=30))

    def check(self) -> None:
        self.send(5)
        self._commands.put(None)
        self._thread.join(10)
        consumer = self.connect()
        try:
            # One more than was sent: the queue already holds them all, so an extra one would come with
            # them, and a second without it is enough.
            got = receive(consumer, self.queue, len(self.sent) + 1, timeout=1.0)
        finally:
            consumer.close()
        assert got == self.sent, f"reference queue {self.queue!r}: sent {self.sent}, got {got}"


def sasl_handshake(port: int, client: SaslClient, host: str = "127.0.0.1") -> tuple[bytes, bool]:
    """Drive our own SASL client over a plain socket.

    Returns what the node answered to the AMQP header once SASL is done (b''
    if it failed) and whether the node closed the connection (after a failed
    outcome it must; a client that found no mechanism to offer just leaves).
    """
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(client.take_output())
        rest = b""
        while not client.done and client.failed is None:
            data = sock.recv(65536)
            if not data:
                return b"", True
            rest = client.receive(data)
            output = client.take_output()
            if output:
                sock.sendall(output)
        if client.failed is not None:
            return b"", client.mechanism != "" and _closes(sock)
        sock.sendall(AMQP_HEADER)
        while len(rest) < 8:
            data = sock.recv(64)
            if not data:
                return rest, True
            rest += data
        return rest[:8], False


def raw_exchange(port: int, data: bytes, expect: int = 1 << 20) -> tuple[bytes, bool]:
    """Send ``data`` on a plain socket; what the node sends back (up to ``expect`` bytes), and whether it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        received = b""
        while len(received) < expect:
            try:
                chunk = sock.recv(4096)
            except socket.timeout:
                return received, False
            if not chunk:
                return received, True
            received += chunk
        return received, False


def _closes(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except OSError:
        return False
    return True


def hastandby(*args: str, user: str | None = ADMIN, password_file: Path | None = None, input: str | None = None,
              timeout: float = 60.0) -> subprocess.CompletedProcess:
    """The ``hastandby`` command, authenticating as ``user`` (HASTANDBY_* environment or --password-file)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HASTANDBY_")}
    if user is not None and password_file is None:
        environment.update(auth.client_environment(user))
    command = [sys.executable, "-m", "hastandby"]
    if password_file is not None:
        command += ["--user", str(user), "--password-file", str(password_file)]
    return subprocess.run([*command, *args], cwd=REPO, capture_output=True, text=True, input=input or "",
                          timeout=timeout, env=environment)


# -- HA clusters of this file's nodes --------------------------------------------------------------------


def start_cluster(start_node: Callable[..., Node], size: int, common: list[str],
                  per_node: list[list[str]] | None = None, tls: bool = False) -> list[Node]:
    """``size`` nodes with --ha-cluster and one --brokers-url (their TLS addresses when ``tls``)."""
    ports = [free_port() for _ in range(size)]
    tls_ports = [free_port() for _ in range(size)]
    brokers = ",".join(f"127.0.0.1:{p}" for p in (tls_ports if tls else ports))
    nodes = []
    for index in range(size):
        own = list(per_node[index]) if per_node else []
        tls_args = ["--listen-tls", f"127.0.0.1:{tls_ports[index]}"] if tls else []
        nodes.append(start_node("--ha-cluster", "--brokers-url", brokers, *tls_args, *common, *own,
                                port=ports[index], name=f"ha{index}", wait=False))
        nodes[-1].peer_address = f"127.0.0.1:{(tls_ports if tls else ports)[index]}"
    for node in nodes:
        node.wait_ready()
    return nodes


def state(node: Node) -> str | None:
    try:
        return request(node.address, "STATUS")["state"]
    except ManagementError:
        return None


def wait_state(node: Node, expected: str, timeout: float = 20.0) -> None:
    wait_for(lambda: state(node) == expected, timeout, f"{node.address} is {expected} (log:\n{node.log()})")


def promote(node: Node) -> None:
    request(node.address, "PROMOTE")
    wait_state(node, "primary")


# -- authentication ------------------------------------------------------------------------------------------


def test_wrong_password_or_unknown_user_is_refused_clearly_and_everyone_else_is_served(setup, start_node):
    node = start_node(*setup.serve())
    reference = Reference(lambda: connect(node.address))

    # PLAIN, from python-qpid-proton.
    for user, password in ((APP, "not-the-password"), ("nobody", "whatever")):
        error = refused(lambda: connect(node.address, user, password))
        assert UNAUTHORIZED in error and "Authentication failed" in error, error
    # SCRAM-SHA-256, from our own client: the node answers with a failed outcome and closes.
    for user, password in ((APP, "not-the-password"), ("nobody", "whatever")):
        client = SaslClient(user, password, hostname="localhost")
        answer, closed = sasl_handshake(node.port, client)
        assert client.mechanism == "SCRAM-SHA-256" and client.failed == "authentication failed", client.failed
        assert answer == b"" and closed
    # The right password over SCRAM: the node proves it knows the secret too, then speaks AMQP.
    client = SaslClient(APP, PASSWORDS[APP], hostname="localhost")
    answer, closed = sasl_handshake(node.port, client)
    assert client.done and client.mechanism == "SCRAM-SHA-256" and client.failed is None
    assert answer == AMQP_HEADER and not closed

    reasons = node.unauthenticated()
    assert reasons.count("SASL: wrong password for user 'app'") == 2, reasons
    assert reasons.count("SASL: unknown user 'nobody'") == 2, reasons
    assert state(node) == "standalone"
    reference.check()


def test_tls_untrusted_and_expired_certificates_external_and_the_wrong_port(setup, start_node, pki):
    tls_port = free_port()
    node = start_node(*setup.serve(), *setup.tls(tls_port))
    plain_reference = Reference(lambda: connect(node.address))
    tls_reference = Reference(lambda: tls_connect(pki, tls_port, APP), "reference-tls")

    error = refused(lambda: tls_connect(pki, tls_port, cert="rogue"))
    assert "unknown ca" in error, error
    error = refused(lambda: tls_connect(pki, tls_port, cert="expired"))
    assert "certificate expired" in error, error

    # EXTERNAL: the certificate's CN is the user, with no password, and that user's groups apply.
    external = tls_connect(pki, tls_port, cert="client")
    try:
        send(external, "external", ["e0", "e1", "e2"])
        assert receive(external, "external", 3) == ["e0", "e1", "e2"]
    finally:
        external.close()
    certificate = {"ca_file": str(pki.ca), "tls": True}
    listed = request(f"amqps://localhost:{tls_port}", "USER-LIST", user=None, cert_file=str(pki.cert("certadmin")),
                     key_file=str(pki.key("certadmin")), **certificate)
    assert {"user": "certadmin", "groups": ["admin"], "password": False} in listed["users"]
    error = refused(lambda: request(f"amqps://localhost:{tls_port}", "USER-LIST", user=None,
                                    cert_file=str(pki.cert("client")), key_file=str(pki.key("client")), **certificate))
    assert "user 'client' may not admin 'user-list'" in error, error

    # A plain client on the TLS port, a TLS client on the plain port.
    error = refused(lambda: BlockingConnection(f"amqp://app:{PASSWORDS[APP]}@127.0.0.1:{tls_port}", timeout=10,
                                               allow_insecure_mechs=True))
    assert "amqp:connection:framing-error" in error, error
    error = refused(lambda: tls_connect(pki, node.port, APP))
    assert "SSL" in error, error

    reasons = node.unauthenticated()
    assert "TLS: certificate not accepted: unable to get local issuer certificate" in reasons, reasons
    assert "TLS: certificate not accepted: certificate has expired" in reasons, reasons
    assert any(r.startswith("TLS: not a TLS client") and "a plain AMQP client on the TLS port?" in r
               for r in reasons), reasons
    assert "SASL: a TLS client on a port without TLS" in reasons, reasons
    plain_reference.check()
    tls_reference.check()


def test_a_required_client_certificate(setup, start_node, pki):
    tls_port = free_port()
    node = start_node(*setup.serve(), *setup.tls(tls_port, require_client_cert=True))
    reference = Reference(lambda: tls_connect(pki, tls_port, cert="client"))
    error = refused(lambda: tls_connect(pki, tls_port, APP))
    assert "SSL" in error, error
    node.wait_event("connection not authenticated", reason="TLS")
    with closing(tls_connect(pki, tls_port, APP, cert="client")) as both:  # a certificate and a password
        send(both, "both", ["b0"])
    reference.check()


def test_anonymous_is_refused_when_not_allowed(setup, start_node):
    node = start_node(*setup.serve(anonymous=False))
    reference = Reference(lambda: connect(node.address))

    error = refused(lambda: connect(node.address, user=None))
    assert UNAUTHORIZED in error, error
    client = SaslClient(hostname="localhost")  # no credentials: it would take ANONYMOUS if offered
    assert sasl_handshake(node.port, client)[0] == b""
    assert client.failed == "no usable mechanism among those offered: SCRAM-SHA-256, PLAIN", client.failed
    # Asking for ANONYMOUS anyway, and skipping SASL altogether.
    answer, closed = raw_exchange(node.port, SASL_HEADER + encode_frame(INIT, [symbol("ANONYMOUS"), b"", None]))
    assert answer.startswith(SASL_HEADER) and closed
    answer, closed = raw_exchange(node.port, AMQP_HEADER)
    assert answer == SASL_HEADER and closed

    reasons = node.unauthenticated()
    assert any("mechanism 'ANONYMOUS' is not offered" in r for r in reasons), reasons
    assert "SASL: the client skipped SASL, and anonymous access is not allowed" in reasons, reasons
    reference.check()


def test_anonymous_has_every_right_when_allowed(setup, start_node):
    node = start_node(*setup.serve(anonymous=True))
    reference = Reference(lambda: connect(node.address, user=None))
    anonymous = connect(node.address, user=None)
    try:
        send(anonymous, "anon", ["a0", "a1"])
        assert receive(anonymous, "anon", 1, browse=True) == ["a0"]
        assert receive(anonymous, "anon", 2) == ["a0", "a1"]
    finally:
        anonymous.close()
    # Without SASL at all: the node answers the AMQP header with its own.
    answer, _ = raw_exchange(node.port, AMQP_HEADER, expect=8)
    assert answer == AMQP_HEADER, answer
    # Every management right, admin operations included.
    request(node.address, "CREATE", "exchange", "anon.x", {"exchange-type": "fanout"}, user=None)
    request(node.address, "CREATE", "queue", "anon.q", user=None)
    request(node.address, "BIND", body={"exchange": "anon.x", "queue": "anon.q"}, user=None)
    request(node.address, "PURGE", "queue", "anon.q", user=None)
    request(node.address, "USER-ADD", body={"user": "made-by-anonymous", "password": "pw-1", "groups": []}, user=None)
    assert "made-by-anonymous" in [u["user"] for u in request(node.address, "USER-LIST", user=None)["users"]]
    request(node.address, "USER-DEL", body={"user": "made-by-anonymous"}, user=None)
    request(node.address, "DELETE", "queue", "anon.q", user=None)
    # Anonymous access does not switch authentication off: a wrong password is still wrong.
    error = refused(lambda: connect(node.address, APP, "not-the-password"))
    assert UNAUTHORIZED in error, error
    assert node.events("denied") == []
    reference.check()


# -- roles ---------------------------------------------------------------------------------------------------


def test_roles_in_an_ha_cluster_are_granted_by_groups_not_by_properties(setup, start_node):
    primary, backup = start_cluster(start_node, 2, [*setup.serve(), "--client-refusal", "forced"])
    promote(primary)
    wait_state(backup, "backup")
    reference = Reference(lambda: connect(primary.address))

    # An ordinary user claiming admin on a backup is refused like any client.
    for properties in ({ADMIN_PROPERTY: True}, None):
        error = refused(lambda: connect(backup.address, APP, properties=properties))
        assert "amqp:connection:forced" in error and "not the primary" in error, error
    assert request(backup.address, "STATUS")["state"] == "backup"  # an admin is let in
    # Admin operations from an ordinary user (on the primary: a backup does not let it in at all).
    for operation, body in (("PROMOTE", {}), ("USER-ADD", {"user": "mallory", "password": "pw", "groups": ["admin"]})):
        with management(primary.address, APP) as client:
            with pytest.raises(ManagementError) as denied:
                client.request(operation, body=body)
        assert denied.value.status == 403
        assert f"user 'app' may not admin '{operation.lower()}'" in str(denied.value), str(denied.value)
    assert "mallory" not in [u["user"] for u in request(primary.address, "USER-LIST")["users"]]
    # A principal outside group cluster claiming to be an HA backup: its connection is refused ...
    impostor = {BACKUP_PROPERTY: {"node_id": "impostor", "url": "127.0.0.1:1"}}
    for node in (primary, backup):
        error = refused(lambda: connect(node.address, APP, properties=impostor))
        assert UNAUTHORIZED in error and "user 'app' is not in group 'cluster'" in error, error
    # ... and one claiming to be a DR replica gets its link refused.
    replica = connect(primary.address, APP, properties={REPLICA_PROPERTY: {"node_id": "impostor", "url": "x:1"}})
    try:
        error = refused(lambda: replica.create_receiver("reference", options=LinkProperties({MODE_PROPERTY: "full"})))
    finally:
        replica.close()
    assert UNAUTHORIZED in error and "user 'app' is not in group 'cluster': it may not act as a DR replica" in error

    denied = [(r["user"], r["action"], r["object"]) for r in primary.events("denied")]
    assert ("app", "admin", "promote") in denied and ("app", "admin", "user-add") in denied, denied
    assert ("app", "act as a backup", primary.address) in denied, denied
    # Nothing was disturbed: the backup is still ready and has the reference messages.
    reference.send(5)
    assert state(primary) == "primary" and state(backup) == "backup"
    wait_for(lambda: depth(backup.address, "reference") == len(reference.sent), 10, "backup has the reference")
    reference.check()


def test_management_denials_carry_amqp_unauthorized_access(setup, start_node):
    """The management response of a denied request names the AMQP condition, as a refused link does."""
    (node,) = start_cluster(start_node, 1, setup.serve())
    promote(node)
    connection = connect(node.address, APP)
    try:
        rpc = SyncRequestResponse(connection, "$management")
        replies = {}
        for operation, body in (("PROMOTE", {}), ("USER-ADD", {"user": "mallory", "password": "pw"})):
            reply = rpc.call(Message(properties={"operation": operation, "type": "", "name": ""}, body=body))
            replies[operation] = dict(reply.properties or {})
    finally:
        connection.close()
    for operation, properties in replies.items():
        assert properties.get("statusCode") == 403, properties
        assert f"user 'app' may not admin '{operation.lower()}'" in str(properties.get("statusDescription"))
    app_password = setup.password_file(APP)
    cli = hastandby("promote", "-b", node.address, user=APP, password_file=app_password)
    assert cli.returncode == 1 and "user 'app' may not admin 'promote'" in cli.stderr, cli.stderr
    assert state(node) == "primary"
    for operation, properties in replies.items():
        assert any(UNAUTHORIZED in str(value) for value in properties.values()), (operation, properties)


# -- ACL -----------------------------------------------------------------------------------------------------

ACL = """\
# who may do what, in the order it is decided
allow  @admin  all
deny   app     consume              audit
allow  app     browse,publish       audit
allow  app     publish,consume      orders.*,reference
allow  app     create,delete,purge  tmp.*
allow  app     bind                 ex.tmp,tmp.*
deny   all     all
"""


def acl_node(setup: Setup, start_node: Callable[..., Node], text: str = ACL) -> tuple[Node, Path]:
    acl_file = setup.directory / "acl"
    acl_file.write_text(text)
    node = start_node(*setup.serve(), "--acl-file", str(acl_file))
    for queue in ("orders.a", "audit", "secret", "reference", "tmp.keep"):
        request(node.address, "CREATE", "queue", queue)
    request(node.address, "CREATE", "exchange", "ex.tmp", {"exchange-type": "fanout"})
    return node, acl_file


def app_request(node: Node, operation: str, type: str = "", name: str = "", body: dict | None = None) -> Any:
    return request(node.address, operation, type, name, body, user=APP)


def test_acl_allows_what_it_says_and_denies_the_rest_by_name(setup, start_node):
    node, _ = acl_node(setup, start_node)
    reference = Reference(lambda: connect(node.address))
    app = connect(node.address)
    try:
        # Allowed.
        send(app, "orders.a", ["o0", "o1"])
        assert receive(app, "orders.a", 1) == ["o0"]
        send(app, "audit", ["a0"])
        assert receive(app, "audit", 1, browse=True) == ["a0"]
        app_request(node, "CREATE", "queue", "tmp.new")
        app_request(node, "BIND", body={"exchange": "ex.tmp", "queue": "tmp.keep"})
        app_request(node, "PURGE", "queue", "tmp.keep")
        app_request(node, "DELETE", "queue", "tmp.new")
        # Denied, each naming user, action and object.
        attempts: list[tuple[str, str, Callable[[], Any]]] = [
            ("consume", "audit", lambda: app.create_receiver("audit")),
            ("publish", "secret", lambda: app.create_sender("secret")),
            ("browse", "secret", lambda: app.create_receiver("secret", options=Copy())),
            ("create", "orders.new", lambda: app.create_sender("orders.new")),
            ("create", "orders.other", lambda: app_request(node, "CREATE", "queue", "orders.other")),
            ("delete", "orders.a", lambda: app_request(node, "DELETE", "queue", "orders.a")),
            ("purge", "orders.a", lambda: app_request(node, "PURGE", "queue", "orders.a")),
            ("bind", "orders.a", lambda: app_request(node, "BIND", body={"exchange": "ex.tmp", "queue": "orders.a"})),
            ("admin", "user-list", lambda: app_request(node, "USER-LIST")),
        ]
        for action, obj, attempt in attempts:
            error = refused(attempt)
            assert f"user 'app' may not {action} '{obj}'" in error, (action, obj, error)
            if "ManagementError" not in error:  # links: the condition itself
                assert UNAUTHORIZED in error, error
        # The anonymous relay checks each message's own address.
        outcome, condition = relay_send(app, "secret", "s0")
        assert outcome == Delivery.REJECTED and condition is not None, (outcome, condition)
        assert condition.name == UNAUTHORIZED and "user 'app' may not publish 'secret'" in condition.description
        assert relay_send(app, "orders.a", "o2") == (Delivery.ACCEPTED, None)
        assert receive(app, "orders.a", 2) == ["o1", "o2"]
    finally:
        app.close()
    # The admin group may do all of it.
    admin = connect(node.address, ADMIN)
    try:
        assert receive(admin, "audit", 1) == ["a0"]
        assert receive(admin, "secret", 1, timeout=0.5) == []
    finally:
        admin.close()

    denied = {(r["user"], r["action"], r["object"]) for r in node.events("denied")}
    for action, obj, _ in attempts:
        assert ("app", action, obj) in denied, (action, obj, denied)
    assert ("app", "publish", "secret") in denied
    assert all("line" in r["reason"] for r in node.events("denied")), node.events("denied")
    assert depth(node.address, "secret") == 0 and depth(node.address, "orders.a") == 0
    reference.check()


def test_acl_reload_keeps_the_rules_on_a_mistake_and_applies_a_fixed_file(setup, start_node):
    node, acl_file = acl_node(setup, start_node)
    reference = Reference(lambda: connect(node.address))

    def may_consume_audit() -> bool:
        connection = connect(node.address)
        try:
            connection.create_receiver("audit").close()
            return True
        except Exception:
            return False
        finally:
            connection.close()

    assert not may_consume_audit()
    broken = ACL.replace("allow  app     bind", "allow  app     frobnicate")
    acl_file.write_text(broken)
    result = hastandby("acl", "reload", "-b", node.address)
    assert result.returncode == 1, result
    assert "ACL not reloaded, the rules stay as they were" in result.stderr, result.stderr
    assert f"{acl_file} line 7: unknown action 'frobnicate'" in result.stderr, result.stderr
    # The old rules are in force: app still publishes orders, still may not consume audit.
    with closing(connect(node.address)) as app:
        send(app, "orders.a", ["kept"])
    assert not may_consume_audit()
    # An ordinary user may not reload at all.
    result = hastandby("acl", "reload", "-b", node.address, user=APP, password_file=setup.password_file(APP))
    assert result.returncode == 1 and "user 'app' may not admin 'acl-reload'" in result.stderr, result.stderr

    # SIGHUP with the broken file: logged, rules kept.
    node.signal(signal.SIGHUP)
    record = node.wait_event("ACL not reloaded, the rules stay as they were")
    assert "line 7" in record["reason"] and "frobnicate" in record["reason"], record
    assert not may_consume_audit()

    # SIGHUP with a fixed file that lets app consume audit and no longer publish orders.
    acl_file.write_text(ACL.replace("deny   app     consume              audit",
                                    "allow  app     consume              audit\n"
                                    "deny   app     publish              orders.*"))
    node.signal(signal.SIGHUP)
    node.wait_event("ACL loaded", file=str(acl_file))
    assert may_consume_audit()
    with closing(connect(node.address)) as app:
        error = refused(lambda: app.create_sender("orders.a"))
    assert UNAUTHORIZED in error and "user 'app' may not publish 'orders.a'" in error, error
    # And the command reloads a good file too.
    acl_file.write_text(ACL)
    result = hastandby("acl", "reload", "-b", node.address)
    assert result.returncode == 0 and f"ACL reloaded from {acl_file}" in result.stdout, result
    assert not may_consume_audit()
    assert depth(node.address, "orders.a") == 1
    reference.check()


@pytest.mark.parametrize("text, problem", [
    (ACL.replace("deny   all     all", "deny   all     all   x  y"), "line 8: expected 'allow|deny WHO ACTIONS"),
    (ACL.replace("allow  app     create", "permit app     create"), "line 6: 'permit' is neither allow nor deny"),
    (None, "cannot read"),
], ids=["too-many-words", "neither-allow-nor-deny", "missing-file"])
def test_serve_refuses_to_start_with_a_broken_acl_file(setup, text, problem):
    acl_file = setup.directory / "acl"
    if text is not None:
        acl_file.write_text(text)
    port = free_port()
    result = subprocess.run([sys.executable, "-m", "hastandby", "serve", "--listen", f"127.0.0.1:{port}",
                             *setup.serve(), "--acl-file", str(acl_file)],
                            cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, result
    assert f"Error: {acl_file}" in result.stderr and problem in result.stderr, result.stderr
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


# -- users ---------------------------------------------------------------------------------------------------


def assert_no_clear_passwords(users_file: Path, passwords: list[str]) -> None:
    text = users_file.read_text()
    for password in passwords:
        assert password not in text, f"{users_file} holds a password in clear"
    assert oct(users_file.stat().st_mode & 0o777) == "0o600"
    for user, entry in json.loads(text)["users"].items():
        assert set(entry) <= {"groups", "scram-sha-256"}, (user, entry)
        if "scram-sha-256" in entry:
            assert set(entry["scram-sha-256"]) == {"salt", "iterations", "stored_key", "server_key"}, entry


def may_log_in(node: Node, user: str, password: str) -> bool:
    """Both ways: PLAIN from python-qpid-proton and SCRAM-SHA-256 from our own client must agree."""
    try:
        connect(node.address, user, password).close()
        plain = True
    except Exception:
        plain = False
    scram = SaslClient(user, password, hostname="localhost")
    sasl_handshake(node.port, scram)
    assert plain == scram.done, f"PLAIN and SCRAM disagree about {user}"
    return plain


def test_user_commands_offline_edit_the_users_file(setup, start_node):
    users_file = setup.directory / "offline-users.json"
    target = ["--users-file", str(users_file)]
    bob_first, bob_second, carol = "bob-first-Secret", "bob-second-Secret", "carol-Secret"

    def user(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return hastandby("user", *args, *target, user=None, input=input)

    added = user("add", ADMIN, "--group", "admin", "--new-password-file", str(setup.password_file(ADMIN)))
    assert added.returncode == 0, added.stderr
    added = user("add", "bob", "--group", "ops", "--group", "audit", "--new-password-file",
                 str(setup.password_file("bob", bob_first)))
    assert added.returncode == 0 and "bob  groups: audit, ops" in added.stdout, added
    assert user("add", "carol", input=carol + "\n").returncode == 0  # the password on standard input
    added = user("add", "certy", "--no-password")
    assert added.returncode == 0 and "certy  groups: -  (certificate only)" in added.stdout, added
    again = user("add", "bob", "--new-password-file", str(setup.password_file("bob", bob_first)))
    assert again.returncode == 1 and "user 'bob' exists already" in again.stderr, again
    assert user("passwd", "bob", input=bob_second + "\n").returncode == 0
    assert user("del", "carol").returncode == 0
    gone = user("del", "carol")
    assert gone.returncode == 1 and "no such user: 'carol'" in gone.stderr, gone
    listed = user("list")
    assert listed.returncode == 0, listed
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [ADMIN, "bob", "certy"], listed.stdout
    both = hastandby("user", "list", *target, "-b", "127.0.0.1:1", user=None)
    assert both.returncode == 2 and "--users-file FILE (offline) or -b NODE" in both.stderr, both
    assert_no_clear_passwords(users_file, [bob_first, bob_second, carol, PASSWORDS[ADMIN]])

    # A node started on that file knows what the commands made of it.
    node = start_node("--no-allow-anonymous", "--users-file", str(users_file))
    reference = Reference(lambda: connect(node.address, "bob", bob_second))
    assert may_log_in(node, "bob", bob_second)
    assert not may_log_in(node, "bob", bob_first)
    assert not may_log_in(node, "carol", carol)
    assert "SASL: unknown user 'carol'" in node.unauthenticated()
    reference.check()


def test_user_commands_on_a_running_node_are_for_admins_and_apply_at_once(setup, start_node):
    node = start_node(*setup.serve())
    reference = Reference(lambda: connect(node.address))
    broker = ["-b", node.address]
    first, second, eve = "dave-first-Secret", "dave-second-Secret", "eve-Secret"

    added = hastandby("user", "add", "dave", "--group", "ops", *broker,
                      "--new-password-file", str(setup.password_file("dave", first)))
    assert added.returncode == 0 and "dave  groups: ops" in added.stdout, added
    assert may_log_in(node, "dave", first)
    assert "dave" in json.loads(setup.users_file.read_text())["users"]
    changed = hastandby("user", "passwd", "dave", *broker, input=second + "\n")
    assert changed.returncode == 0, changed
    assert may_log_in(node, "dave", second) and not may_log_in(node, "dave", first)
    listed = hastandby("user", "list", *broker)
    assert listed.returncode == 0 and "dave  groups: ops" in listed.stdout, listed
    assert_no_clear_passwords(setup.users_file, [first, second])

    # Not for an ordinary user: refused, and nothing changes.
    app_password = setup.password_file(APP)
    for args in (("add", "eve", "--new-password-file", str(setup.password_file("eve", eve))), ("del", "dave")):
        result = hastandby("user", *args, *broker, user=APP, password_file=app_password)
        assert result.returncode == 1 and f"user 'app' may not admin 'user-{args[0]}'" in result.stderr, result
    assert not may_log_in(node, "eve", eve) and may_log_in(node, "dave", second)

    deleted = hastandby("user", "del", "dave", *broker)
    assert deleted.returncode == 0 and "dave" not in deleted.stdout, deleted
    assert not may_log_in(node, "dave", second)
    assert "SASL: unknown user 'dave'" in node.unauthenticated()
    assert "dave" not in json.loads(setup.users_file.read_text())["users"]
    assert_no_clear_passwords(setup.users_file, [first, second, eve])
    reference.check()


# -- HA clusters whose peers authenticate ---------------------------------------------------------------------


def replicates(primary: Node, backups: list[Node], queue: str, count: int) -> None:
    """``count`` messages sent to the primary reach every backup (depth, and the bodies an admin browses)."""
    request(primary.address, "CREATE", "queue", queue)
    bodies = [f"{queue}-{i}" for i in range(count)]
    with closing(connect(primary.address)) as app:
        send(app, queue, bodies)
    for backup in backups:
        wait_for(lambda: depth(backup.address, queue) == count, 15, f"{backup.address} has {count} on {queue}")
        with closing(connect(backup.address, ADMIN, properties={ADMIN_PROPERTY: True})) as admin:
            assert receive(admin, queue, count, browse=True) == bodies


def test_ha_backups_authenticate_with_scram_as_the_peer_user(setup, start_node):
    nodes = start_cluster(start_node, 3, setup.serve(peer_user=PEER))
    promote(nodes[0])
    for backup in nodes[1:]:
        wait_state(backup, "backup")
    replicates(nodes[0], nodes[1:], "orders", 20)
    for node in nodes:
        assert node.unauthenticated() == [] and node.events("denied") == [], node.log()


@pytest.mark.parametrize("mechanism", ["EXTERNAL", "SCRAM-SHA-256"])
def test_ha_peers_over_tls(setup, start_node, pki, mechanism):
    """Peers connect to each other's TLS listeners; EXTERNAL with the node's certificate (CN server), or SCRAM."""
    tls_options = ["--ssl-cert-file", str(pki.cert("server")), "--ssl-key-file", str(pki.key("server")),
                   "--ssl-ca-file", str(pki.ca), "--peer-tls"]
    common = setup.serve(peer_user=None if mechanism == "EXTERNAL" else PEER) + tls_options
    nodes = start_cluster(start_node, 2, common, tls=True)
    promote(nodes[0])
    wait_state(nodes[1], "backup")
    assert request(nodes[1].address, "STATUS")["primary"].startswith("amqps://127.0.0.1:")
    replicates(nodes[0], nodes[1:], "orders", 10)
    for node in nodes:
        # Every peer authenticated (TLS refusals of the promotion check's own connections are the subject of
        # test_a_connecting_node_is_not_promoted_while_a_peer_is_past_connecting).
        assert [r for r in node.unauthenticated() if not r.startswith("TLS:")] == [], node.log()
        assert node.events("denied") == [], node.log()


@pytest.mark.parametrize("peer_tls", [False, True], ids=["plain", "peer-tls"])
def test_a_connecting_node_is_not_promoted_while_a_peer_is_past_connecting(setup, start_node, pki, peer_tls):
    """Before promoting a connecting node, it asks its peers' state as the peer user (over TLS with --peer-tls).

    A third node whose brokers URL names only the backup and itself stays
    connecting (a backup does not serve backups); promoting it would make a
    second primary, so the node must refuse, naming the backup.
    """
    tls_options = ["--ssl-cert-file", str(pki.cert("server")), "--ssl-key-file", str(pki.key("server")),
                   "--ssl-ca-file", str(pki.ca), "--peer-tls"] if peer_tls else []
    common = setup.serve() + tls_options
    primary, backup = start_cluster(start_node, 2, common, tls=peer_tls)
    promote(primary)
    wait_state(backup, "backup")
    port, tls_port = free_port(), free_port()
    own = f"127.0.0.1:{tls_port if peer_tls else port}"
    tls_listener = ["--listen-tls", f"127.0.0.1:{tls_port}"] if peer_tls else []
    third = start_node("--ha-cluster", "--brokers-url", f"{backup.peer_address},{own}", *tls_listener, *common,
                       port=port, name="ha2")
    assert state(third) == "connecting"
    error = refused(lambda: request(third.address, "PROMOTE"))
    assert f"{backup.peer_address} is backup: promote a backup, not a connecting node" in error, error
    assert state(third) == "connecting" and state(primary) == "primary"


def test_ha_backups_with_a_wrong_peer_password_or_user_never_become_ready(setup, start_node):
    nodes = start_cluster(start_node, 3, setup.users(), per_node=[
        setup.peer(),
        setup.peer(password="not-the-peer-password"),
        setup.peer(APP),  # the right password of a user outside group cluster
    ])
    primary, wrong_password, wrong_user = nodes
    promote(primary)
    reference = Reference(lambda: connect(primary.address))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # the primary serves clients all along
        assert state(wrong_password) not in ("catchup", "backup")
        assert state(wrong_user) not in ("catchup", "backup")
        reference.send(1)
        time.sleep(0.2)
    # Why, on both sides.
    assert "SASL: wrong password for user 'peer'" in primary.unauthenticated(), primary.log()
    assert any("authentication failed" in r for r in wrong_password.unauthenticated()), wrong_password.log()
    denied = [(r["user"], r["action"]) for r in primary.events("denied")]
    assert ("app", "act as a backup") in denied, denied
    wrong_user_log = wrong_user.log_path.read_text()
    assert "user 'app' is not in group 'cluster'" in wrong_user_log, wrong_user.log()
    assert state(primary) == "primary"
    reference.check()


# -- rhea ------------------------------------------------------------------------------------------------------


def rhea(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    node_binary = shutil.which("node")
    assert node_binary, "Node.js is needed for the rhea tests (scripts/setup installs it)"
    assert (RHEA_CLIENT.parent / "node_modules" / "rhea").is_dir(), "rhea is not installed: run scripts/setup"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HASTANDBY_")}
    environment.update(env or {})
    result = subprocess.run([node_binary, str(RHEA_CLIENT), "--timeout", "20", *args], capture_output=True,
                            text=True, timeout=40, env=environment)
    lines = result.stdout.strip().splitlines()
    assert lines, f"rhea printed nothing (exit {result.returncode}): {result.stderr}"
    return result.returncode, json.loads(lines[-1])


def test_rhea_with_a_password_over_plain_and_tls_and_a_wrong_one(setup, start_node, pki):
    tls_port = free_port()
    node = start_node(*setup.serve(), *setup.tls(tls_port))
    reference = Reference(lambda: connect(node.address))
    plain, tls = f"amqp://127.0.0.1:{node.port}", f"amqps://localhost:{tls_port}"

    code, result = rhea("--url", plain, "--user", APP, "--password", PASSWORDS[APP], "--queue", "rhea.plain",
                        "--send", "10", "--receive", "10")
    assert code == 0 and result["accepted"] == 10, result
    assert result["bodies"] == [f"rhea-{i}" for i in range(10)], result
    # Over TLS, credentials from the environment.
    code, result = rhea("--url", tls, "--ca", str(pki.ca), "--queue", "rhea.tls", "--send", "10", "--receive", "10",
                        env=auth.client_environment(APP))
    assert code == 0 and result["received"] == 10, result
    # EXTERNAL with a client certificate.
    code, result = rhea("--url", tls, "--ca", str(pki.ca), "--cert", str(pki.cert("client")),
                        "--key", str(pki.key("client")), "--queue", "rhea.tls", "--send", "1", "--receive", "1")
    assert code == 0 and result["bodies"] == ["rhea-0"], result

    for url, extra in ((plain, []), (tls, ["--ca", str(pki.ca)])):
        code, result = rhea("--url", url, *extra, "--user", APP, "--password", "not-the-password", "--queue",
                            "rhea.plain", "--send", "1")
        assert code == 1 and UNAUTHORIZED in result["error"] and result["sent"] == 0, result
    code, result = rhea("--url", plain, "--queue", "rhea.plain", "--send", "1")  # anonymous
    assert code == 1 and UNAUTHORIZED in result["error"], result
    code, result = rhea("--url", tls, "--ca", str(pki.path("rogue-ca.pem")), "--user", APP,
                        "--password", PASSWORDS[APP], "--queue", "rhea.plain", "--send", "1")
    assert code == 1 and "certificate" in result["error"], result  # rhea does not trust the node's certificate

    assert node.unauthenticated().count("SASL: wrong password for user 'app'") == 2, node.unauthenticated()
    assert depth(node.address, "rhea.plain") == 0 and depth(node.address, "rhea.tls") == 0
    reference.check()
