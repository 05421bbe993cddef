"""etcd over TLS with authentication, and over several endpoints: the coordinator and real nodes.

No mocks: etcd is the real server (hastandby/testing/etcd.py), started with
https for clients, client-certificate authentication and etcd users (root,
and a ``hastandby`` user whose role may use ``/hastandby/`` only);
certificates are made here (hastandby/testing/certs.py).  Idle tokens live
``TOKEN_TTL`` seconds, so renewing them is exercised throughout.  Endpoint
failover runs against a three-member etcd cluster on loopback: the member a
node talks to is killed or paused while the cluster stays up.

Timings (switch to the next endpoint, lease confirmation age across it,
failover of the nodes) are printed (``pytest -s``) and bounded by assertions.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from hastandby.cli import main as cli
from hastandby.client import Login, ManagementClient, ManagementError
from hastandby.dr.config import EtcdStore, ReplicationConfig
from hastandby.election.coordinator import CoordinatorError, CoordinatorEvent, CoordinatorUnavailable
from hastandby.election.etcd_client import EtcdClient, EtcdError, EtcdSettings, etcdrpc
from hastandby.election.etcd_coordinator import EtcdCoordinator
from hastandby.lifecycle.states import NodeStatus, State
from hastandby.testing import auth
from hastandby.testing.certs import Pki, make_pki
from hastandby.testing.etcd import (
    EtcdCluster,
    EtcdLogin,
    EtcdServer,
    EtcdTls,
    dead_endpoint,
)
from hastandby.testing.nodes import NodeProcess, free_port

pytestmark = pytest.mark.etcd

TTL = 2
MARGIN = 0.5
SAFE_AGE = TTL - MARGIN
TOKEN_TTL = 2  # seconds an idle etcd token lives (etcd's default is 300)
BACKUP = NodeStatus(State.BACKUP)
ADMIN = Login(auth.ADMIN, auth.PASSWORDS[auth.ADMIN])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure(pki: Pki) -> Iterator[tuple[EtcdServer, EtcdLogin]]:
    """One etcd for the module: https, client certificates required, authentication on."""
    with EtcdServer(tls=EtcdTls.from_pki(pki), auth_token_ttl=TOKEN_TTL) as server:
        yield server, server.enable_auth()


@pytest.fixture
def own_secure(pki: Pki) -> Iterator[tuple[EtcdServer, EtcdLogin]]:
    """A secure etcd a test may kill and restart."""
    with EtcdServer(tls=EtcdTls.from_pki(pki), auth_token_ttl=TOKEN_TTL) as server:
        yield server, server.enable_auth()


@pytest.fixture
def etcd_cluster(pki: Pki) -> Iterator[tuple[EtcdCluster, EtcdLogin]]:
    """Three secure members; a test may kill or pause one."""
    with EtcdCluster(3, tls=EtcdTls.from_pki(pki), auth_token_ttl=TOKEN_TTL) as cluster:
        yield cluster, cluster.enable_auth()


@dataclass
class Node:
    id: str
    coordinator: EtcdCoordinator
    events: queue.Queue[CoordinatorEvent]

    def wait_for(self, event: CoordinatorEvent, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                if self.events.get(timeout=remaining) is event:
                    return time.monotonic()
            except queue.Empty:
                break
        raise AssertionError(f"{self.id}: no {event} within {timeout} s")

    def seen(self) -> list[CoordinatorEvent]:
        events = []
        while not self.events.empty():
            events.append(self.events.get_nowait())
        return events


MakeNode = Callable[..., Node]


@pytest.fixture
def make_node() -> Iterator[MakeNode]:
    """Coordinators in a fresh cluster name; all closed afterwards."""
    cluster = f"t{uuid.uuid4().hex[:8]}"
    nodes: list[Node] = []

    def make(settings: EtcdSettings, node_id: str, watch: bool = False, publish: bool = True) -> Node:
        events: queue.Queue[CoordinatorEvent] = queue.Queue()
        coordinator = EtcdCoordinator(settings, cluster, node_id, f"amqp://{node_id}", events.put,
                                      lease_ttl=TTL, lease_margin=MARGIN, request_timeout=0.5)
        node = Node(node_id, coordinator, events)
        nodes.append(node)
        if publish:
            coordinator.publish_status(BACKUP)
        if watch:
            assert coordinator.watch(), "watch not established"
        return node

    make.cluster = cluster  # type: ignore[attr-defined]
    yield make
    for node in nodes:
        node.coordinator.close()


def campaign(node: Node, sync: frozenset[str] | None = None) -> int | None:
    snapshot = node.coordinator.read_snapshot()
    revision = snapshot.sync.revision if snapshot.sync is not None else 0
    return node.coordinator.campaign(sync if sync is not None else frozenset({node.id}), revision)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


def wait_for_refreshes(node: Node, count: int = 2) -> None:
    for _ in range(count):
        before = node.coordinator.last_lease_confirmation()
        wait_until(lambda before=before: node.coordinator.last_lease_confirmation() != before, TTL,
                   "a confirmed keepalive")


# -- settings and options, no etcd needed -------------------------------------------------------------


def test_settings_are_checked_when_built(pki: Pki) -> None:
    settings = EtcdSettings("a:1, http://b ")  # type: ignore[arg-type]  # a string is split at commas
    assert settings.endpoints == ("http://a:1", "http://b:2379")
    assert str(settings) == "http://a:1,http://b:2379"
    assert EtcdSettings.of("http://[::1]:5").endpoints == ("http://[::1]:5",)
    secret = EtcdSettings(("https://a",), ca_file=str(pki.ca), user="u", password="s3cret")
    assert "s3cret" not in repr(secret)
    for bad, why in [
        ({"endpoints": ("https://a",)}, "CA file"),
        ({"endpoints": ("http://a", "https://b"), "ca_file": str(pki.ca)}, "all http"),
        ({"endpoints": ("http://a",), "ca_file": str(pki.ca)}, "need https"),
        ({"endpoints": ("https://a",), "ca_file": str(pki.ca), "cert_file": str(pki.cert("client"))},
         "needs its key"),
        ({"endpoints": ("http://a",), "user": "u"}, "both a user and a password"),
        ({"endpoints": ("ftp://a",)}, "must be http"),
        ({"endpoints": ("http://a/path",)}, "must be http"),
        ({"endpoints": ("http://a", "a:2379")}, "repeat"),
        ({"endpoints": ()}, "at least one"),
    ]:
        with pytest.raises(ValueError, match=why):
            EtcdSettings(**bad)


def test_serve_refuses_incomplete_etcd_options(pki: Pki, tmp_path: Path) -> None:
    """Checked before anything starts: one clear line, a usage error."""
    password = tmp_path / "password"
    password.write_text("x\n")
    runner = CliRunner()
    for arguments, why in [
        (["--etcd", "https://127.0.0.1:1"], "CA file (--etcd-ca-file)"),
        (["--etcd", "http://127.0.0.1:1", "--etcd-user", "u"], "--etcd-user and --etcd-password-file"),
        (["--etcd-ca-file", str(pki.ca)], "need --etcd"),
        (["--etcd", "https://127.0.0.1:1", "--etcd-ca-file", str(pki.ca), "--etcd-key-file", str(pki.key("client"))],
         "a key its certificate"),
        (["--etcd", "http://a,https://b"], "all http"),
    ]:
        result = runner.invoke(cli, ["serve", *arguments])
        assert result.exit_code == 2, (arguments, result.output)
        assert why in result.output, (arguments, result.output)


# -- the coordinator over TLS with authentication ----------------------------------------------------


def test_coordinator_over_tls_with_authentication(secure: tuple[EtcdServer, EtcdLogin], make_node: MakeNode) -> None:
    server, login = secure
    settings = server.settings(login)
    first, second = make_node(settings, "first", watch=True), make_node(settings, "second", watch=True)
    snapshot = first.coordinator.read_snapshot()
    assert [member.node_id for member in snapshot.members] == ["first", "second"]

    second.seen()
    term = campaign(first, frozenset({"first", "second"}))
    assert term is not None
    second.wait_for(CoordinatorEvent.CLUSTER_CHANGED, 2)
    leader = second.coordinator.read_snapshot().leader
    assert leader is not None and (leader.node_id, leader.term) == ("first", term)
    assert first.coordinator.update_sync(term, frozenset({"first"}))
    assert not second.coordinator.update_sync(term + 1, frozenset({"second"}))

    wait_for_refreshes(first)  # keepalives go through TLS with the token
    assert first.coordinator.lease_confirmed_within(SAFE_AGE)

    first.coordinator.set_handover("second", ttl=5)
    assert first.coordinator.resign(term)
    new_term = campaign(second)
    assert new_term is not None and new_term > term
    second.coordinator.clear_handover()
    assert second.coordinator.read_snapshot().handover_target is None

    # The DR configuration store uses the same settings.
    store = EtcdStore(settings, make_node.cluster)  # type: ignore[attr-defined]
    try:
        store.save(ReplicationConfig(queue="orders", source="127.0.0.1:5672"))
        assert [config.queue for config in store.load()] == ["orders"]
        store.remove("orders")
        assert store.load() == []
    finally:
        store.close()


def test_refusals_are_clear_errors(secure: tuple[EtcdServer, EtcdLogin], pki: Pki, make_node: MakeNode) -> None:
    server, login = secure
    url = server.client_url
    tls = {"ca_file": str(pki.ca), "cert_file": str(pki.cert("client")), "key_file": str(pki.key("client"))}
    cases: list[tuple[EtcdSettings, type[CoordinatorError], list[str]]] = [
        (EtcdSettings((url,), **tls, user=login.user, password="wrong"), CoordinatorError,
         ["cannot authenticate to etcd as 'hastandby'", "authentication failed, invalid user ID or password"]),
        (EtcdSettings((url,), **tls, user="nobody", password="x"), CoordinatorError, ["authentication failed"]),
        (EtcdSettings((url,), **{**tls, "ca_file": str(pki.path("rogue-ca.pem"))}, user=login.user,
                      password=login.password), CoordinatorUnavailable, ["TLS failed", "CERTIFICATE_VERIFY_FAILED"]),
        (EtcdSettings((url,), ca_file=str(pki.ca), cert_file=str(pki.cert("rogue")), key_file=str(pki.key("rogue")),
                      user=login.user, password=login.password), CoordinatorUnavailable, ["TLS failed"]),
        (EtcdSettings((url,), **tls), CoordinatorError, ["permission denied"]),  # no user: not allowed
    ]
    for index, (settings, kind, words) in enumerate(cases):
        started = time.monotonic()
        with pytest.raises(CoordinatorError) as raised:
            make_node(settings, f"refused{index}")
        took = time.monotonic() - started
        message = str(raised.value)
        print(f"\n{took * 1000:.0f} ms: {message}")
        assert isinstance(raised.value, kind), message
        assert kind is CoordinatorUnavailable or not isinstance(raised.value, CoordinatorUnavailable), message
        assert url in message and all(word in message for word in words), message
        assert took < 1.5


def test_an_idle_token_expires_and_is_renewed(secure: tuple[EtcdServer, EtcdLogin], make_node: MakeNode) -> None:
    server, login = secure
    settings = server.settings(login)
    node = make_node(settings, "idle")
    store = EtcdStore(settings, make_node.cluster)  # type: ignore[attr-defined]
    raw = EtcdClient(settings, 2)
    try:
        store.save(ReplicationConfig(queue="q", source="127.0.0.1:5672"))
        token = raw.call("authenticate", lambda c, timeout, md: c.auth.Authenticate(
            etcdrpc.AuthenticateRequest(name=login.user, password=login.password), timeout)).token
        time.sleep(TOKEN_TTL + 1.5)
        with pytest.raises(EtcdError) as refused:  # etcd did drop the idle token
            raw.call("read", lambda c, timeout, md: c.kv.Range(
                etcdrpc.RangeRequest(key=b"/hastandby/x"), timeout, metadata=(("token", token),)))
        assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
        assert [config.queue for config in store.load()] == ["q"]  # the store authenticated again
        assert node.coordinator.read_snapshot().member("idle") is not None  # and so did the coordinator
        assert node.coordinator.lease_confirmed_within(SAFE_AGE)
    finally:
        raw.close()
        store.close()


def test_lease_token_and_watch_recover_after_an_etcd_restart(
    own_secure: tuple[EtcdServer, EtcdLogin], make_node: MakeNode
) -> None:
    """A restarted etcd has forgotten every token: calls and the watch authenticate again."""
    server, login = own_secure
    node = make_node(server.settings(login), "n1", watch=True)
    raw = EtcdClient(server.settings(login), 2)
    try:
        token = raw.call("authenticate", lambda c, timeout, md: c.auth.Authenticate(
            etcdrpc.AuthenticateRequest(name=login.user, password=login.password), timeout)).token
        # A write after it, committed (etcd's backend commits every 100 ms): a restarted etcd
        # replays its log from its last committed write on, and would make a later token again.
        node.coordinator.publish_status(BACKUP)
        time.sleep(0.5)
        server.kill()
        time.sleep(TTL + 0.5)
        node.seen()
        server.restart()
        with pytest.raises(EtcdError) as refused:  # tokens are gone
            raw.call("read", lambda c, timeout, md: c.kv.Range(
                etcdrpc.RangeRequest(key=b"/hastandby/x"), timeout, metadata=(("token", token),)))
        assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    finally:
        raw.close()
    node.wait_for(CoordinatorEvent.CLUSTER_CHANGED, 5)  # the watch is back (its token was refused first)
    wait_until(lambda: node.coordinator.lease_confirmed_within(SAFE_AGE), 3, "lease confirmed again")
    node.coordinator.publish_status(NodeStatus(State.CATCHUP))
    node.wait_for(CoordinatorEvent.CLUSTER_CHANGED, 2)
    member = node.coordinator.read_snapshot().member("n1")
    assert member is not None and member.state == "catchup"


# -- several endpoints -----------------------------------------------------------------------------


def test_a_dead_first_endpoint_is_passed_over(secure: tuple[EtcdServer, EtcdLogin], make_node: MakeNode) -> None:
    server, login = secure
    dead = dead_endpoint()
    settings = server.settings(login, [dead, server.client_url])
    started = time.monotonic()
    node = make_node(settings, "n1", watch=True)
    took = time.monotonic() - started
    print(f"\nfirst call through a dead endpoint, then the live one: {took * 1000:.0f} ms")
    assert node.coordinator.etcd_endpoint == server.client_url
    assert took < 1.0
    assert campaign(node) is not None
    wait_for_refreshes(node)
    store = EtcdStore(server.settings(login, [dead, server.client_url]), make_node.cluster)  # type: ignore[attr-defined]
    try:
        assert store.load() == []
    finally:
        store.close()

    every_dead = make_node(server.settings(login, [dead_endpoint(), dead_endpoint()]), "n2", publish=False)
    with pytest.raises(CoordinatorUnavailable, match="and 1 more endpoints"):
        every_dead.coordinator.publish_status(BACKUP)


@pytest.mark.parametrize("outage", ["kill", "pause"])
def test_the_lease_survives_losing_the_endpoint_in_use(
    etcd_cluster: tuple[EtcdCluster, EtcdLogin], make_node: MakeNode, outage: str
) -> None:
    """The member the primary talks to dies (kill) or hangs (pause); the lease stays confirmed within
    the safe age throughout, the watch moves, and etcd still names the primary leader of its term."""
    cluster, login = etcd_cluster
    urls = cluster.client_urls
    leader = cluster.leader()
    followers = [i for i in range(len(urls)) if i != leader]
    order = [urls[i] for i in (*followers, leader)]  # the one to lose first: a follower, so etcd stays up
    primary = make_node(cluster.settings(login, order), "primary", watch=True)
    observer = make_node(cluster.settings(login, [urls[leader]]), "observer")
    term = campaign(primary)
    assert term is not None
    wait_for_refreshes(primary)
    primary.seen()

    ages: list[float] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            confirmed = primary.coordinator.last_lease_confirmation()
            ages.append(time.monotonic() - confirmed if confirmed is not None else float("inf"))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    lost = cluster.members[followers[0]]
    try:
        signalled = time.monotonic()
        getattr(lost, outage)()
        switched = wait_until(lambda: primary.coordinator.etcd_endpoint != order[0], 2 * TTL, "switched")
        time.sleep(3 * TTL)
    finally:
        sampling.set()
        sampler.join()
        if outage == "pause":
            lost.resume()
    worst = max(ages)
    print(f"\n{outage}: switched to the next endpoint {(switched - signalled) * 1000:.0f} ms after the "
          f"signal; oldest lease confirmation seen {worst:.2f} s (safe age {SAFE_AGE} s)")
    assert worst < SAFE_AGE
    assert CoordinatorEvent.LEASE_UNCONFIRMED not in primary.seen()
    assert primary.coordinator.etcd_endpoint == order[1]

    observer.coordinator.publish_status(NodeStatus(State.CATCHUP))
    primary.wait_for(CoordinatorEvent.CLUSTER_CHANGED, 2)  # the watch moved with the switch
    snapshot = primary.coordinator.read_snapshot()
    assert snapshot.leader is not None and (snapshot.leader.node_id, snapshot.leader.term) == ("primary", term)
    assert primary.coordinator.update_sync(term, frozenset({"primary"}))


# -- real nodes ------------------------------------------------------------------------------------


class SecureHa:
    """``size`` real ``hastandby serve`` nodes electing through the secure etcd; stopped by PID."""

    def __init__(self, log_dir: Path, settings: EtcdSettings, login: EtcdLogin, size: int = 3) -> None:
        self.name = f"t{uuid.uuid4().hex[:8]}"
        ports = [free_port() for _ in range(size)]
        brokers = ",".join(f"127.0.0.1:{port}" for port in ports)
        etcd = ["--etcd", str(settings), "--etcd-ca-file", str(settings.ca_file),
                "--etcd-cert-file", str(settings.cert_file), "--etcd-key-file", str(settings.key_file),
                "--etcd-user", login.user, "--etcd-password-file", str(login.password_file)]
        self.nodes = [NodeProcess(log_dir, *etcd, "--cluster", self.name,  # NodeProcess adds the AMQP users
                                  "--node-id", f"n{i}", "--lease-ttl", str(TTL), "--brokers-url", brokers,
                                  port=port, name=f"n{i}")
                      for i, port in enumerate(ports)]

    def start(self) -> SecureHa:
        for node in self.nodes:
            node.start(wait=False)
        for node in self.nodes:
            node.wait_ready()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def status(self, index: int) -> dict[str, Any] | None:
        try:
            with ManagementClient(self.nodes[index].address, timeout=2, login=ADMIN) as client:
                return client.request("STATUS")
        except ManagementError:
            return None

    def states(self, among: list[int]) -> list[tuple[str | None, int | None]]:
        statuses = [self.status(i) for i in among]
        return [(s["state"], s["term"]) if s else (None, None) for s in statuses]

    def wait_settled(self, among: list[int], timeout: float = 20.0) -> tuple[int, int]:
        """Wait until one of ``among`` is primary and the others backups; (its index, its term)."""
        deadline = time.monotonic() + timeout
        states: list[tuple[str | None, int | None]] = []
        while time.monotonic() < deadline:
            states = self.states(among)
            names = [state for state, _ in states]
            if names.count("primary") == 1 and names.count("backup") == len(among) - 1:
                index = names.index("primary")
                term = states[index][1]
                assert term is not None
                return among[index], term
            time.sleep(0.1)
        raise AssertionError(f"not settled after {timeout} s: {states}")


def test_nodes_elect_and_fail_over_through_tls_authentication_and_a_lost_etcd_member(
    etcd_cluster: tuple[EtcdCluster, EtcdLogin], tmp_path: Path
) -> None:
    cluster, login = etcd_cluster
    urls = cluster.client_urls
    leader = cluster.leader()
    followers = [i for i in range(len(urls)) if i != leader]
    settings = cluster.settings(login, [urls[i] for i in (*followers, leader)])
    ha = SecureHa(tmp_path, settings, login)
    try:
        ha.start()
        primary, term = ha.wait_settled([0, 1, 2])
        print(f"\nelected n{primary}, term {term}, through {settings}")
        assert all(ha.status(i)["etcd"] == str(settings) for i in range(3))  # type: ignore[index]

        cluster.members[followers[0]].kill()  # the member every node talks to first
        deadline = time.monotonic() + 3 * TTL
        while time.monotonic() < deadline:  # the primary never steps down (None: a status request timed out)
            assert ha.states([primary])[0] in (("primary", term), (None, None)), ha.nodes[primary].log()
            time.sleep(0.05)
        assert ha.wait_settled([0, 1, 2], timeout=5) == (primary, term)
        assert "etcd endpoint failing; switching" in ha.nodes[primary].log_path.read_text()

        killed_at = time.monotonic()
        ha.nodes[primary].kill()
        survivors = [i for i in range(3) if i != primary]
        successor, new_term = ha.wait_settled(survivors, timeout=TTL + 10)
        print(f"n{successor} primary (term {new_term}) {time.monotonic() - killed_at:.2f} s after kill -9 of "
              f"n{primary}, with one etcd member down")
        assert new_term > term
    finally:
        ha.stop()
