"""What security costs (issue 12): TLS against plain, replication over TLS, connection set-up per mechanism.

    python -m benchmarks.security [--parts tls,ha,setup] [--count 100000] [--runs 3]
        [--latency-messages 2000] [--connections 200] [--out results/]

Three parts, each alternating what it compares round by round (A B, B A, ...)
so that noise from the shared machine hits both alike; ratios are taken
within this one invocation:

``tls``
    Throughput over TLS against plain.  Per round one fresh standalone node
    with a plain listener and a TLS listener (``--listen-tls``, a certificate
    made for the run by ``hastandby/testing/certs.py``); the proton C clients of
    ``benchmarks.throughput`` (``send-bench``/``receive-bench``, 100-byte
    messages, PLAIN as ``app``) against the plain port and against the TLS
    port (``cexamples``' TLS patch: trusting the run's CA, verifying the
    certificate and the name ``localhost``).  Figures ``send``, ``receive``,
    ``concurrent`` as in ``benchmarks.throughput``: msg/s and the node's CPU
    (user+system) per message.  Goal: TLS >= 0.7 of plain.
``ha``
    Hot standby with TLS on the replication link.  Per round and
    configuration a fresh primary and one backup, both with plain and TLS
    listeners and the same certificate: ``plain-peers`` (``--brokers-url``
    lists the plain ports) and ``tls-peers`` (``--peer-tls``, the URL lists
    the TLS ports; the backup's STATUS must name an ``amqps://`` primary).
    Clients use the primary's plain port in both, so only the replication
    link differs.  The ``send`` figure of ``benchmarks.ha_throughput`` (the
    primary accepts a message only once the backup has it) with the CPU per
    message of both nodes, and its producer acknowledgement latency (one
    message in flight, p50/p99).  Goal: send over TLS >= 0.6 of plain.
``setup``
    Connection set-up time: ``--connections`` sequential connections per
    case and round, each connecting, authenticating and opening an AMQP
    connection (timed until the node's open arrives), then closing (until
    the node's close arrives).  Cases: ANONYMOUS (against a second node with
    ``--allow-anonymous``), PLAIN, SCRAM-SHA-256, TLS + PLAIN and TLS +
    SCRAM-SHA-256, each with the clients that can do it:
    ``blocking`` (python-qpid-proton's ``BlockingConnection``, a new one per
    connection; it has no SCRAM), ``container`` (python-qpid-proton, one
    ``Container`` opening the connections one after the other) and ``raw``
    (our own: a blocking socket, Python's ``ssl`` for TLS,
    ``hastandby.security.sasl.SaslClient``, then the AMQP header and an open
    frame from a bare ``proton.Transport``), so that mechanisms compare on
    one client and clients on one mechanism.  ``blocking`` is dominated by
    the client itself: each ``BlockingConnection`` makes a ``Container``,
    which makes two SSL domains that load the system CA store (about 100 ms
    each here, against the C example broker as well).  p50/p99/max ms to
    the open, p50 of the whole cycle, and the node's CPU per connection.

Nodes require authentication as in production (``hastandby/testing/auth.py``).  PLAIN makes
the node derive PBKDF2-SHA-256 of 4096 rounds per connection (to check the
password against the salted secret); SCRAM-SHA-256 leaves that to the
client.  Prints a table
per part and writes ``results/security-<UTC>.json`` (command line,
host, the working tree's uncommitted node changes, every round's figures,
medians, ratios, goals).  Exit code 1 if any figure failed.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import socket
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from proton import (
    Connection,
    Endpoint,
    ProtonException,
    SSLDomain,
    Transport,
)
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from hastandby.client import ManagementError
from hastandby.security.credentials import Credentials
from hastandby.security.pipe import ClientPipe, PipeError
from hastandby.security.sasl import SaslClient
from hastandby.security.tls import TlsLayer
from hastandby.testing import auth as _auth
from hastandby.testing import (
    cexamples,
    fmt,
    interrupt_on_sigterm,
    median_or_none,
    ratio,
    request,
    wait_answering,
    wait_state,
    write_report,
)
from hastandby.testing.certs import SERVER_NAME, SUBJECT, Certificates, make_certificates
from hastandby.testing.clients import PlainSaslClient
from hastandby.testing.processes import Service, free_port, python_env
from hastandby.testing.provenance import host_info, uncommitted_changes
from spark_analysis.phases import nearest_rank

from .ha_throughput import ack_latency
from .throughput import (
    DEFAULT_OUT,
    FIGURES,
    LOOPBACK,
    PHASES,
    REPO_ROOT,
    Run,
    Settings,
    measure_phase,
    print_run,
)

PARTS = ("tls", "ha", "setup")
TRANSPORTS = ("plain", "tls")
HA_CONFIGS = ("plain-peers", "tls-peers")
GOALS = {"tls": 0.7, "ha": 0.6}
"""Least ratio (TLS / plain msg/s) that meets issue 12's speed goals."""
READY_TIMEOUT = 60.0
CONNECT_TIMEOUT = 10.0


# -- shared with benchmarks.overload ---------------------------------------------------------------


class RawConnectionError(Exception):
    """A raw connection failed: TLS, SASL, the node closed it, or no answer in time."""


class RawConnection:
    """An AMQP connection made by hand, as our own nodes make theirs (``hastandby.security.pipe``).

    A blocking socket; TLS (Python's ``ssl`` with memory BIOs) when given a
    context; the SASL handshake by ``sasl`` (a ``SaslClient``); then the AMQP
    header and an open frame from a bare ``proton.Transport`` (no SASL layer of
    its own, no idle timeout asked for, so the node expects no heartbeats from
    us when its own heartbeat is off).  The constructor returns once the
    node's open has arrived; a node that answers with open and close (a limit
    reached) raises ``RawConnectionError`` with its condition.
    """

    def __init__(self, host: str, port: int, sasl: SaslClient, tls: ssl.SSLContext | None = None,
                 server_name: str = SERVER_NAME, timeout: float = CONNECT_TIMEOUT, container: str = "bench") -> None:
        self.deadline = time.monotonic() + timeout
        self.sasl = sasl
        self.sock = socket.create_connection((host, port), timeout=timeout)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            layer = TlsLayer(tls, server_side=False, server_hostname=server_name) if tls is not None else None
            self.pipe = ClientPipe(sasl, layer)
            self.transport = Transport()  # client mode; no SASL: our pipe did it
            self.connection = Connection()
            self.connection.container = container
            self.connection.hostname = server_name
            self.transport.bind(self.connection)
            self.connection.open()
            self._write(self.pipe.take_output())
            self._wait(lambda: bool(self.connection.state & (Endpoint.REMOTE_ACTIVE | Endpoint.REMOTE_CLOSED)))
            self._check_refused()
        except BaseException:
            self.sock.close()
            raise

    def _write(self, data: bytes) -> None:
        if data:
            self.sock.sendall(data)

    def _pump(self) -> None:
        """Send what the engine has (only once TLS and SASL are done)."""
        if not self.pipe.done:
            return
        pending = self.transport.pending()
        if pending > 0:
            out = self.transport.peek(pending)
            self.transport.pop(len(out))
            try:
                self._write(self.pipe.send(out))
            except PipeError as error:
                raise RawConnectionError(str(error)) from None

    def _feed(self, data: bytes) -> None:
        try:
            rest = self.pipe.receive(data)
            self._write(self.pipe.take_output())
        except PipeError as error:
            raise RawConnectionError(str(error)) from None
        if self.pipe.done:
            if rest:
                self.transport.push(rest)
            self._pump()

    def _wait(self, done: Callable[[], bool]) -> None:
        while not done():
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise RawConnectionError(f"no answer within the timeout (SASL {self.sasl.mechanism or '-'})")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                reason = self.sasl.failed or (f"SASL ({self.sasl.mechanism}) not finished" if not self.pipe.done
                                              else "closed by the node")
                raise RawConnectionError(f"connection closed: {reason}")
            self._feed(data)

    def _check_refused(self) -> None:
        if self.connection.state & Endpoint.REMOTE_CLOSED:
            condition = self.connection.remote_condition
            raise RawConnectionError(f"{condition.name}: {condition.description}" if condition
                                     else "closed by the node at open")

    def linger(self, seconds: float) -> None:
        """Read for ``seconds`` more: a node that opens and then closes (a limit) raises RawConnectionError."""
        self.deadline = time.monotonic() + seconds
        try:
            self._wait(lambda: bool(self.connection.state & Endpoint.REMOTE_CLOSED))
        except RawConnectionError as error:
            if "no answer within" not in str(error):
                raise
        self._check_refused()

    def close(self, wait: float = CONNECT_TIMEOUT) -> None:
        """Send close and wait (at most ``wait`` s) for the node's; the socket is closed in any case."""
        try:
            if wait > 0:
                self.connection.close()
                self._pump()
                self.deadline = time.monotonic() + wait
                self._wait(lambda: bool(self.connection.state & Endpoint.REMOTE_CLOSED))
        finally:
            self.sock.close()


# -- part tls: throughput over TLS against plain ---------------------------------------------------


def node_argv(port: int, tls_port: int, certs: Certificates, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hastandby", "serve", "--listen", f"{LOOPBACK}:{port}",
            "--listen-tls", f"{LOOPBACK}:{tls_port}", "--log-format", "json",
            *_auth.users().serve_arguments(), *certs.serve_arguments(), *extra]


def tls_client_environment(certs: Certificates) -> dict[str, str]:
    """The C clients' env for the TLS port: PLAIN as app, trusting the run's CA, verifying the name localhost."""
    return {**_auth.users().client_environment(), "HASTANDBY_SSL_CA_FILE": str(certs.ca),
            "HASTANDBY_SSL_PEER_NAME": SERVER_NAME}


def tls_round(round_no: int, settings: Settings, certs: Certificates, logs: Path) -> list[Run]:
    """One fresh node; every figure on the plain port and on the TLS port, in this round's order."""
    order = TRANSPORTS if round_no % 2 else TRANSPORTS[::-1]
    port, tls_port = free_port(), free_port()
    runs = {(t, f): Run(round_no, t, f, "", settings.count) for t in order for f in FIGURES}
    try:
        service = Service("node", node_argv(port, tls_port, certs), logs / f"tls-round{round_no}.log",
                          cwd=REPO_ROOT, env=python_env())
    except OSError as error:
        for run in runs.values():
            run.error = f"node did not start: {error}"
        return list(runs.values())
    try:
        service.wait_ready(LOOPBACK, port, READY_TIMEOUT, _auth.users().connect_options())
        for transport in order:
            tag = uuid.uuid4().hex[:8]
            queues = {"send": f"q-{tag}", "receive": f"q-{tag}", "concurrent": f"c-{tag}"}
            target_port = tls_port if transport == "tls" else port
            env = tls_client_environment(certs) if transport == "tls" else _auth.users().client_environment()
            for figure in FIGURES:
                run = runs[(transport, figure)]
                run.queue = queues[figure]
                if figure == "receive" and not runs[(transport, "send")].ok:
                    run.error = "not run: the send figure that fills its queue failed"
                else:
                    measure_phase(run, service, partial(PHASES[figure], settings, target_port, run.queue, env))
                print_run(run, settings.runs)
    except (RuntimeError, TimeoutError) as error:
        for run in runs.values():
            if not run.ok and run.error is None:
                run.error = f"node: {error}"
    finally:
        service.stop()
    return list(runs.values())


def summarize_tls(runs: list[Run]) -> dict[str, Any]:
    medians: dict[str, Any] = {}
    for transport in TRANSPORTS:
        medians[transport] = {}
        for figure in FIGURES:
            mine = [r for r in runs if r.target == transport and r.figure == figure]
            ok = [r for r in mine if r.ok]
            rates = [r.msg_per_s for r in ok if r.msg_per_s is not None]
            medians[transport][figure] = {
                "msg_per_s": median_or_none(rates),
                "msg_per_s_min": min(rates) if rates else None,
                "msg_per_s_max": max(rates) if rates else None,
                "cpu_us_per_msg": median_or_none([r.cpu_us_per_msg for r in ok if r.cpu_us_per_msg is not None]),
                "ok_runs": len(ok), "failed_runs": len(mine) - len(ok),
            }
    ratios = {figure: {key: ratio(medians["tls"][figure][key], medians["plain"][figure][key])
                       for key in ("msg_per_s", "cpu_us_per_msg")} for figure in FIGURES}
    goal = GOALS["tls"]
    return {"medians": medians, "ratios_tls_to_plain": ratios, "goal_min_ratio": goal,
            "goal_met": {f: (ratios[f]["msg_per_s"] is not None and ratios[f]["msg_per_s"] >= goal) for f in FIGURES}}


def print_tls(summary: dict[str, Any]) -> None:
    print("\nthroughput over TLS against plain: median msg/s (node cpu us/msg)")
    print(f"{'figure':<12}{'plain':>24}{'tls':>24}{'tls/plain':>28}   goal >= {summary['goal_min_ratio']}")
    for figure in FIGURES:
        cells = []
        for transport in TRANSPORTS:
            m = summary["medians"][transport][figure]
            failed = f" [{m['failed_runs']} FAILED]" if m["failed_runs"] else ""
            cells.append(f"{fmt(m['msg_per_s'], ',.0f')} ({fmt(m['cpu_us_per_msg'], '.1f')}){failed}".rjust(24))
        r = summary["ratios_tls_to_plain"][figure]
        cells.append(f"x{fmt(r['msg_per_s'], '.2f')} (cpu x{fmt(r['cpu_us_per_msg'], '.2f')})".rjust(28))
        verdict = "met" if summary["goal_met"][figure] else "MISSED"
        print(f"{figure:<12}{''.join(cells)}   {verdict}")


# -- part ha: replication links over TLS against plain ---------------------------------------------


def certificate_user() -> None:
    """Make the node certificate's subject a certificate-only user of group ``cluster`` in the run's users file.

    Needed for ``--peer-tls`` with a peer password: promoting a connecting
    node first asks the other members' state with python-qpid-proton, which
    presents the node's certificate and then authenticates with EXTERNAL
    (proton prefers it to PLAIN), as the certificate's subject rather than
    as ``--peer-user``; a subject that is no user makes PROMOTE fail with
    "cannot tell what HOST:PORT is".  The replication links themselves (our
    ``SaslClient``) use SCRAM-SHA-256 as ``peer`` either way.
    """
    store = Credentials.load(_auth.users().users_file)
    if SUBJECT not in store:
        store.add(SUBJECT, None, ["cluster"])
        store.save()


def start_pair(config: str, certs: Certificates, logs: Path, tag: str) -> list[Service]:
    """A primary and one caught-up backup; with ``tls-peers`` they replicate over their TLS listeners."""
    ports = [free_port() for _ in range(2)]
    tls_ports = [free_port() for _ in range(2)]
    peer_tls = config == "tls-peers"
    brokers = ",".join(f"{LOOPBACK}:{p}" for p in (tls_ports if peer_tls else ports))
    services: list[Service] = []
    try:
        for index in range(2):
            argv = node_argv(ports[index], tls_ports[index], certs, "--ha-cluster", "--brokers-url", brokers,
                             *(["--peer-tls"] if peer_tls else []))
            service = Service(f"node{index}", argv, logs / f"{tag}-node{index}.log", cwd=REPO_ROOT, env=python_env())
            service.port = ports[index]  # type: ignore[attr-defined]
            services.append(service)
        for service in services:
            wait_answering(service, service.port)  # type: ignore[attr-defined]
        request(ports[0], "PROMOTE")
        wait_state(ports[1], "backup")
    except BaseException:
        for service in services:
            service.stop()
        raise
    return services


def ha_round(config: str, round_no: int, settings: Settings, latency_messages: int, certs: Certificates,
             logs: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    result: dict[str, Any] = {"config": config, "round": round_no, "ok": False, "error": None}
    run = Run(round_no, config, "send", f"q-{tag}", settings.count)
    try:
        services = start_pair(config, certs, logs, f"{config}-r{round_no}")
    except (RuntimeError, TimeoutError, OSError) as error:
        result["error"] = f"nodes did not start: {error}"
        print(f"round {round_no}/{settings.runs}  {config:<11} *** FAILED *** {result['error']}", flush=True)
        return result
    primary, backup = services
    port = primary.port  # type: ignore[attr-defined]
    try:
        result["backup_primary_url"] = request(backup.port, "STATUS").get("primary")  # type: ignore[attr-defined]
        if str(result["backup_primary_url"]).startswith("amqps://") != (config == "tls-peers"):
            raise RuntimeError(f"{config}: the backup names its primary {result['backup_primary_url']!r}")
        for name in (run.queue, f"lat-{tag}"):
            request(port, "CREATE", "queue", name, {"arguments": {"qpid.replicate": "all"}})
        backup_cpu = backup.cpu_seconds()
        measure_phase(run, primary, partial(PHASES["send"], settings, port, run.queue, _auth.users().client_environment()))
        if run.ok:
            result["backup_cpu_us_per_msg"] = (backup.cpu_seconds() - backup_cpu) / run.messages * 1e6
        print_run(run, settings.runs)
        result["ack_latency"] = ack_latency(port, f"lat-{tag}", latency_messages)
        lat = result["ack_latency"]
        print(f"round {round_no}/{settings.runs}  {config:<11} ack latency p50 {lat['p50_ms']:.2f} ms "
              f"p99 {lat['p99_ms']:.2f} ms; backup cpu {fmt(result.get('backup_cpu_us_per_msg'), '.1f')} us/msg",
              flush=True)
        result["ok"] = run.ok
        result["error"] = run.error
    except (ManagementError, ProtonException, RuntimeError, TimeoutError, OSError) as error:
        result["error"] = f"{type(error).__name__}: {error}"
        print(f"round {round_no}/{settings.runs}  {config:<11} *** FAILED *** {result['error']}", flush=True)
    finally:
        for service in services:
            service.stop()
    result["send"] = asdict(run)
    return result


def summarize_ha(results: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for config in HA_CONFIGS:
        mine = [r for r in results if r["config"] == config]
        ok = [r for r in mine if r["ok"]]
        summary[config] = {
            "send_msg_per_s": median_or_none([r["send"]["msg_per_s"] for r in ok]),
            "primary_cpu_us_per_msg": median_or_none([r["send"]["cpu_us_per_msg"] for r in ok]),
            "backup_cpu_us_per_msg": median_or_none([r["backup_cpu_us_per_msg"] for r in ok
                                                     if "backup_cpu_us_per_msg" in r]),
            "ack_p50_ms": median_or_none([r["ack_latency"]["p50_ms"] for r in ok if "ack_latency" in r]),
            "ack_p99_ms": median_or_none([r["ack_latency"]["p99_ms"] for r in ok if "ack_latency" in r]),
            "ok_rounds": len(ok), "failed_rounds": len(mine) - len(ok),
        }
    plain, tls = summary["plain-peers"], summary["tls-peers"]
    send_ratio = ratio(tls["send_msg_per_s"], plain["send_msg_per_s"])
    summary["ratios_tls_to_plain"] = {key: ratio(tls[key], plain[key]) for key in
                                      ("send_msg_per_s", "primary_cpu_us_per_msg", "backup_cpu_us_per_msg",
                                       "ack_p50_ms", "ack_p99_ms")}
    summary["goal_min_ratio"] = GOALS["ha"]
    summary["goal_met"] = send_ratio is not None and send_ratio >= GOALS["ha"]
    return summary


def print_ha(summary: dict[str, Any]) -> None:
    print("\nhot standby, primary + 1 backup: replication over TLS against plain (medians)")
    print(f"{'config':<13}{'send msg/s':>12}{'primary us/msg':>16}{'backup us/msg':>15}{'ack p50/p99 ms':>17}")
    for config in HA_CONFIGS:
        row = summary[config]
        failed = f" [{row['failed_rounds']} FAILED]" if row["failed_rounds"] else ""
        print(f"{config:<13}{fmt(row['send_msg_per_s'], ',.0f'):>12}{fmt(row['primary_cpu_us_per_msg'], '.1f'):>16}"
              f"{fmt(row['backup_cpu_us_per_msg'], '.1f'):>15}"
              f"{fmt(row['ack_p50_ms'], '.2f') + '/' + fmt(row['ack_p99_ms'], '.2f'):>17}{failed}")
    r = summary["ratios_tls_to_plain"]
    verdict = "met" if summary["goal_met"] else "MISSED"
    print(f"{'tls/plain':<13}{'x' + fmt(r['send_msg_per_s'], '.2f'):>12}{'x' + fmt(r['primary_cpu_us_per_msg'], '.2f'):>16}"
          f"{'x' + fmt(r['backup_cpu_us_per_msg'], '.2f'):>15}"
          f"{'x' + fmt(r['ack_p50_ms'], '.2f') + '/x' + fmt(r['ack_p99_ms'], '.2f'):>17}"
          f"   send goal >= {summary['goal_min_ratio']}: {verdict}")


# -- part setup: connection set-up time per mechanism ----------------------------------------------


@dataclass(frozen=True)
class Case:
    """One way of connecting: mechanism, client, TLS or not, and which node (anonymous allowed or not)."""

    name: str
    client: str  # "blocking", "container" or "raw"
    mechanism: str  # ANONYMOUS, PLAIN, SCRAM-SHA-256
    tls: bool = False
    anonymous_node: bool = False


CASES = (
    Case("anonymous/blocking", "blocking", "ANONYMOUS", anonymous_node=True),
    Case("anonymous/container", "container", "ANONYMOUS", anonymous_node=True),
    Case("anonymous/raw", "raw", "ANONYMOUS", anonymous_node=True),
    Case("plain/blocking", "blocking", "PLAIN"),
    Case("plain/container", "container", "PLAIN"),
    Case("plain/raw", "raw", "PLAIN"),
    Case("scram/raw", "raw", "SCRAM-SHA-256"),
    Case("tls+plain/blocking", "blocking", "PLAIN", tls=True),
    Case("tls+plain/container", "container", "PLAIN", tls=True),
    Case("tls+plain/raw", "raw", "PLAIN", tls=True),
    Case("tls+scram/raw", "raw", "SCRAM-SHA-256", tls=True),
)
CLIENTS = {
    "blocking": "python-qpid-proton BlockingConnection, a new one per connection (its Container makes two "
                "SSL domains, each loading the system CA store, before it connects)",
    "container": "python-qpid-proton, one Container opening the connections one after the other",
    "raw": "a blocking socket, TLS by Python's ssl, SASL by hastandby.security.sasl.SaslClient, "
           "AMQP header and open by a bare proton.Transport",
}


class _Sequential(MessagingHandler):
    """One Container: connect, wait for the node's open, close, wait for its close; ``count`` times."""

    def __init__(self, url: str, count: int, options: dict[str, Any], timeout: float) -> None:
        super().__init__(prefetch=0)
        self.url, self.count, self.options, self.timeout = url, count, options, timeout
        self.open_ms: list[float] = []
        self.cycle_ms: list[float] = []
        self.error: str | None = None
        self._started = self._opened = 0.0
        self._deadline: Any = None

    def on_start(self, event: Any) -> None:
        self._deadline = event.container.schedule(self.timeout, self)
        self._next(event.container)

    def _next(self, container: Any) -> None:
        self._started = time.perf_counter()
        container.connect(self.url, reconnect=False, **self.options)

    def on_connection_opened(self, event: Any) -> None:
        self._opened = time.perf_counter()
        event.connection.close()

    def on_connection_closed(self, event: Any) -> None:
        self.open_ms.append((self._opened - self._started) * 1e3)
        self.cycle_ms.append((time.perf_counter() - self._started) * 1e3)
        if len(self.cycle_ms) < self.count:
            self._next(event.container)
        else:
            self._deadline.cancel()

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        self._fail(event, f"{condition.name}: {condition.description}" if condition else "transport error")

    def on_connection_error(self, event: Any) -> None:
        condition = event.connection.remote_condition
        self._fail(event, f"{condition.name}: {condition.description}" if condition else "connection error")

    def on_timer_task(self, event: Any) -> None:
        self._fail(event, f"not done within {self.timeout:.0f} s")

    def _fail(self, event: Any, reason: str) -> None:
        if self.error is None:
            self.error = f"connection {len(self.cycle_ms) + 1}: {reason}"
        self._deadline.cancel()
        event.container.stop()


class SetupNodes:
    """The two nodes of the set-up part: ``secure`` (authentication required) and ``anonymous`` (allowed)."""

    def __init__(self, certs: Certificates, logs: Path) -> None:
        self.certs = certs
        self.services: dict[bool, Service] = {}
        self.ports: dict[bool, tuple[int, int]] = {}
        try:
            for anonymous in (False, True):
                port, tls_port = free_port(), free_port()
                argv = node_argv(port, tls_port, certs)
                if anonymous:  # the last of --no-allow-anonymous / --allow-anonymous counts
                    argv.append("--allow-anonymous")
                label = "anonymous" if anonymous else "secure"
                self.services[anonymous] = Service(f"setup-{label}", argv, logs / f"setup-{label}.log",
                                                   cwd=REPO_ROOT, env=python_env())
                self.ports[anonymous] = (port, tls_port)
            for anonymous, service in self.services.items():
                service.wait_ready(LOOPBACK, self.ports[anonymous][0], READY_TIMEOUT, _auth.users().connect_options())
        except BaseException:
            self.stop()
            raise
        self.tls_context = ssl.create_default_context(cafile=str(certs.ca))
        self.ssl_domain = SSLDomain(SSLDomain.MODE_CLIENT)
        self.ssl_domain.set_trusted_ca_db(str(certs.ca))
        self.ssl_domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)

    def stop(self) -> None:
        for service in self.services.values():
            service.stop()

    def run(self, case: Case, count: int) -> tuple[list[float], list[float]]:
        """``count`` sequential connections of ``case``: ms to the node's open, and of the whole cycle.

        Raises RawConnectionError, ProtonException or OSError on the first that fails.
        """
        port, tls_port = self.ports[case.anonymous_node]
        if case.client == "raw":
            return self._raw(case, LOOPBACK, tls_port if case.tls else port, count)
        if case.tls:
            url, options = f"amqps://{SERVER_NAME}:{tls_port}", {"ssl_domain": self.ssl_domain}
        else:
            url, options = f"amqp://{LOOPBACK}:{port}", {"allow_insecure_mechs": True}
        if case.mechanism == "PLAIN":
            options.update(user=_auth.APP, password=_auth.users().passwords[_auth.APP])
        if case.client == "container":
            handler = _Sequential(url, count, options, timeout=CONNECT_TIMEOUT + count * CONNECT_TIMEOUT / 10)
            Container(handler).run()
            if handler.error:
                raise RawConnectionError(handler.error)
            return handler.open_ms, handler.cycle_ms
        open_ms, cycle_ms = [], []
        for _ in range(count):
            started = time.perf_counter()
            connection = BlockingConnection(url, timeout=CONNECT_TIMEOUT, **options)
            opened = time.perf_counter()
            connection.close()
            open_ms.append((opened - started) * 1e3)
            cycle_ms.append((time.perf_counter() - started) * 1e3)
        return open_ms, cycle_ms

    def _raw(self, case: Case, host: str, port: int, count: int) -> tuple[list[float], list[float]]:
        password = _auth.users().passwords[_auth.APP]
        open_ms, cycle_ms = [], []
        for _ in range(count):
            if case.mechanism == "ANONYMOUS":
                sasl = SaslClient(hostname=SERVER_NAME)
            elif case.mechanism == "PLAIN":
                sasl = PlainSaslClient(_auth.APP, password, hostname=SERVER_NAME)
            else:
                sasl = SaslClient(_auth.APP, password, hostname=SERVER_NAME)
            started = time.perf_counter()
            connection = RawConnection(host, port, sasl, self.tls_context if case.tls else None)
            opened = time.perf_counter()
            if sasl.mechanism != case.mechanism:
                connection.close(0)
                raise RawConnectionError(f"authenticated with {sasl.mechanism}, not {case.mechanism}")
            connection.close()
            open_ms.append((opened - started) * 1e3)
            cycle_ms.append((time.perf_counter() - started) * 1e3)
        return open_ms, cycle_ms


def setup_round(nodes: SetupNodes, round_no: int, rounds: int, count: int) -> list[dict[str, Any]]:
    order = CASES if round_no % 2 else CASES[::-1]
    results = []
    for case in order:
        service = nodes.services[case.anonymous_node]
        result: dict[str, Any] = {"case": case.name, "round": round_no, "connections": count, "ok": False,
                                  "error": None, "open_ms": [], "cycle_ms": []}
        cpu_before = service.cpu_seconds()
        try:
            result["open_ms"], result["cycle_ms"] = nodes.run(case, count)
            result["ok"] = True
            result["node_cpu_ms_per_connection"] = (service.cpu_seconds() - cpu_before) / count * 1e3
        except (RawConnectionError, ProtonException, OSError) as error:
            result["error"] = f"{type(error).__name__}: {error}"
        head = f"round {round_no}/{rounds}  setup {case.name:<20}"
        if result["ok"]:
            ordered = sorted(result["open_ms"])
            print(f"{head} open p50 {nearest_rank(ordered, 50):7.2f} ms  p99 {nearest_rank(ordered, 99):7.2f} ms  "
                  f"node cpu {result['node_cpu_ms_per_connection']:.2f} ms/connection", flush=True)
        else:
            print(f"{head} *** FAILED *** {result['error']}", flush=True)
        results.append(result)
    return results


def summarize_setup(results: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for case in CASES:
        mine = [r for r in results if r["case"] == case.name]
        ok = [r for r in mine if r["ok"]]
        opens = sorted(ms for r in ok for ms in r["open_ms"])
        cycles = sorted(ms for r in ok for ms in r["cycle_ms"])
        summary[case.name] = {
            "client": case.client, "mechanism": case.mechanism, "tls": case.tls,
            "node": "anonymous allowed" if case.anonymous_node else "authentication required",
            "connections": len(opens),
            "open_p50_ms": nearest_rank(opens, 50),
            "open_p99_ms": nearest_rank(opens, 99),
            "open_max_ms": opens[-1] if opens else None,
            "cycle_p50_ms": nearest_rank(cycles, 50),
            "node_cpu_ms_per_connection": median_or_none([r["node_cpu_ms_per_connection"] for r in ok]),
            "ok_rounds": len(ok), "failed_rounds": len(mine) - len(ok),
        }
    return summary


def print_setup(summary: dict[str, Any]) -> None:
    print("\nconnection set-up, sequential: connect + authenticate + AMQP open (ms), and the whole cycle with close")
    print(f"{'case':<22}{'n':>7}{'open p50':>10}{'p99':>9}{'max':>9}{'cycle p50':>11}{'node cpu ms':>13}")
    for name, row in summary.items():
        failed = f" [{row['failed_rounds']} FAILED]" if row["failed_rounds"] else ""
        print(f"{name:<22}{row['connections']:>7}{fmt(row['open_p50_ms'], '.2f'):>10}{fmt(row['open_p99_ms'], '.2f'):>9}"
              f"{fmt(row['open_max_ms'], '.2f'):>9}{fmt(row['cycle_p50_ms'], '.2f'):>11}"
              f"{fmt(row['node_cpu_ms_per_connection'], '.2f'):>13}{failed}")


# -- main -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.security", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)} (default all)")
    parser.add_argument("--count", type=int, default=100_000, help="messages per throughput figure (default 100000)")
    parser.add_argument("--runs", type=int, default=3, help="rounds of each part, alternating (default 3)")
    parser.add_argument("--latency-messages", type=int, default=2000,
                        help="messages of the ack latency figure, one in flight (default 2000)")
    parser.add_argument("--connections", type=int, default=200,
                        help="sequential connections per set-up case and round (default 200)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown or not args.parts:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    if min(args.count, args.runs, args.latency_messages, args.connections) < 1:
        parser.error("--count, --runs, --latency-messages and --connections must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join([sys.executable, "-m", "benchmarks.security", *(sys.argv[1:] if argv is None else argv)])
    settings = Settings(count=args.count, runs=args.runs, body_size=100, out=args.out, skip_rss=True,
                        rss_messages=1, targets=[])
    for name in ("send-bench", "receive-bench"):
        cexamples.build(name)  # compile before any clock runs
    started = datetime.now(UTC)
    host_at_start, code_at_start = host_info(), uncommitted_changes()
    logs = Path(tempfile.mkdtemp(prefix="security-logs-"))
    certs = make_certificates(logs / "pki")
    certificate_user()
    print(f"security: parts {', '.join(args.parts)}; {args.runs} rounds; {args.count:,} x 100-byte messages; "
          f"{args.connections} connections per set-up case and round; node logs in {logs}", flush=True)
    tls_runs: list[Run] = []
    ha_results: list[dict[str, Any]] = []
    setup_results: list[dict[str, Any]] = []
    interrupted = False
    undo = interrupt_on_sigterm()
    try:
        if "tls" in args.parts:
            for round_no in range(1, args.runs + 1):
                tls_runs.extend(tls_round(round_no, settings, certs, logs))
        if "ha" in args.parts:
            for round_no in range(1, args.runs + 1):
                for config in (HA_CONFIGS if round_no % 2 else HA_CONFIGS[::-1]):
                    ha_results.append(ha_round(config, round_no, settings, args.latency_messages, certs, logs))
        if "setup" in args.parts:
            nodes = SetupNodes(certs, logs)
            try:
                for round_no in range(1, args.runs + 1):
                    setup_results.extend(setup_round(nodes, round_no, args.runs, args.connections))
            finally:
                nodes.stop()
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: every process started was stopped; summarising what finished", flush=True)
    finally:
        undo()
    report: dict[str, Any] = {
        "benchmark": "security",
        "command": command,
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(UTC) - started).total_seconds(), 1),
        "interrupted": interrupted,
        "host": host_at_start,
        "node_code": code_at_start,
        "parameters": {"parts": args.parts, "count": args.count, "runs": args.runs, "body_size": 100,
                       "latency_messages": args.latency_messages, "connections": args.connections,
                       "client_timeout_s": settings.client_timeout, "goals": GOALS,
                       "clients": ["send-bench", "receive-bench"], "setup_clients": CLIENTS,
                       "tls_server_name": SERVER_NAME},
    }
    failed = interrupted
    if tls_runs:
        report["tls"] = {"summary": summarize_tls(tls_runs), "runs": [asdict(r) for r in tls_runs]}
        print_tls(report["tls"]["summary"])
        failed |= any(not r.ok for r in tls_runs)
    if ha_results:
        report["ha"] = {"summary": summarize_ha(ha_results), "rounds": ha_results}
        print_ha(report["ha"]["summary"])
        failed |= any(not r["ok"] for r in ha_results)
    if setup_results:
        report["setup"] = {"summary": summarize_setup(setup_results), "rounds": setup_results}
        print_setup(report["setup"]["summary"])
        failed |= any(not r["ok"] for r in setup_results)
    report["failed"] = failed
    if host_info().get("git_commit") != host_at_start.get("git_commit") or uncommitted_changes() != code_at_start:
        report["node_code_changed_during_run"] = True
        print("WARNING: the node code changed during the run; rounds before and after ran different code", flush=True)
    path = write_report(args.out, "security", started, report)
    print(f"\nresults: {path}")
    if failed:
        print(f"*** SOME FIGURES FAILED; see above and the node logs in {logs} ***", flush=True)
        return 1
    shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
