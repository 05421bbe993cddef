"""Durable producer throughput (issue 14): hastandby with 0, 1 and 2 backups against RabbitMQ 3.10 quorum queues.

    python -m benchmarks.durable [--count 100000] [--runs 3] [--body-size 100] [--latency-messages 1000]
        [--systems standalone,primary+1,primary+2,primary+2-nondurable,rabbitmq] [--no-strace]
        [--out results/]

In one invocation, rounds alternating over the systems (so the noise of this
shared machine hits all alike):

``standalone``, ``primary+1``, ``primary+2``
    a fresh hastandby node, or a primary with 1 or 2 caught-up backups
    (started as ``benchmarks.ha_throughput`` does: ``--ha-cluster
    --brokers-url``, PROMOTE, wait for ``backup``), every node with its own
    ``--data-dir`` (so it keeps a journal) and the default ``--journal-sync
    batch``; a durable queue (``qpid.replicate=all``).
``primary+2-nondurable``
    the same as ``primary+2`` (data dirs, durable queue), but the messages
    are not durable: nothing is journaled; the comparison for what the journal
    costs.
``rabbitmq``
    RabbitMQ 3.10 (Debian's ``rabbitmq-server``), three nodes on this machine
    clustered with ``rabbitmqctl join_cluster``, the ``rabbitmq_amqp1_0``
    plugin; per round a fresh durable quorum queue over the three nodes
    (declared on the first node with ``rabbitmqctl eval``), addressed by the
    AMQP 1.0 clients as ``/amq/queue/NAME``; clients connect to the node the
    queue's leader is on.  The cluster is started once per invocation and
    stopped (``rabbitmqctl stop``, then by PID) at the end; its data is in a
    temporary directory that is removed.

Figures per system and round:

- **send**: the proton C ``send-bench`` sends ``--count`` messages of
  ``--body-size`` bytes with the header's ``durable=true``
  (``HASTANDBY_DURABLE``, see ``cexamples``) into the empty queue; msg/s
  until the last is accepted (by hastandby once every ready backup has it and
  every node's journal has it on disk; by RabbitMQ once a majority of the
  quorum has it on disk).  Node CPU (every node of the system) per message.
  The queue must then hold ``--count`` messages; for hastandby each node's
  journal must have grown by at least count x body bytes (durable) or not at
  all (non-durable).
- **fsyncs per message**: every node process runs under ``strace -f
  --seccomp-bpf -e trace=fsync,fdatasync`` (only those calls stop the
  process, so it costs little; ``--no-strace`` turns it off), and the calls
  timed within the send are counted, per node and in all.  The nodes keep no
  fsync counter of their own: STATUS's ``journal`` part has the sync mode
  and whether writes work, not counts.
- **ack latency**: ``benchmarks.ha_throughput``'s sender (python-qpid-proton,
  one message in flight, send -> ``accepted``), here with durable messages on
  a second fresh queue; p50 and p99 of ``--latency-messages``.

Prints the figures per round, then medians and the ratios: primary+2 /
rabbitmq (issue 14's goal: at least 1.5), every system against rabbitmq and
standalone, and primary+2 durable / non-durable.  JSON in
``results/durable-<UTC>.json`` with the command line, the host,
the uncommitted node changes, every round, the RabbitMQ set-up.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from proton import Message
from proton.reactor import Container

from spark_analysis.phases import nearest_rank
from hastandby.testing import auth as _auth
from hastandby.testing import cexamples
from hastandby.testing.processes import LOOPBACK, Service, free_port, python_env
from hastandby.testing.provenance import host_info, uncommitted_changes

from .ha_throughput import _LatencySender, _request, _wait_answering, _wait_state
from .security import (
    fmt,
    interrupt_on_sigterm,
    median_or_none,
    ratio,
    write_report,
)
from .throughput import DEFAULT_OUT, MIN_RATE, REPO_ROOT

HASTANDBY_SYSTEMS = {"standalone": 0, "primary+1": 1, "primary+2": 2, "primary+2-nondurable": 2}
"""hastandby systems and their number of backups."""
SYSTEMS = (*HASTANDBY_SYSTEMS, "rabbitmq")
NONDURABLE = {"primary+2-nondurable"}
GOAL_SYSTEM, GOAL_REFERENCE, GOAL = "primary+2", "rabbitmq", 1.5
"""Issue 14: durable producer throughput with 2 backups at least 1.5 x RabbitMQ's three-node quorum queue."""

READY_TIMEOUT = 60.0
RABBIT_START_TIMEOUT = 120.0
RABBIT_CTL_TIMEOUT = 90.0
RABBIT_BIN = Path(os.environ.get("RABBITMQ_BIN_DIR", "/usr/lib/rabbitmq/bin"))
"""Debian's rabbitmq-server scripts; /usr/sbin's wrappers would switch to the rabbitmq user and its HOME."""
RABBIT_USER = RABBIT_PASSWORD = "guest"  # RabbitMQ's default user, allowed from loopback only
RABBIT_NODES = 3
RABBIT_ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"
"""No busy-waiting schedulers: three Erlang VMs share two cores with each other and with the other systems."""
FSYNC_CALLS = ("fsync", "fdatasync")
_STRACE_LINE = re.compile(r"^\d+\s+(\d+\.\d+)\s+(fsync|fdatasync)\(")


# -- strace: fsync counts --------------------------------------------------------------------------


def strace_prefix(output: Path) -> list[str]:
    """Run a command under strace, stopping it only at fsync/fdatasync (seccomp-bpf), timestamps to ``output``."""
    return ["strace", "-f", "--seccomp-bpf", "-qq", "-ttt", "-e", f"trace={','.join(FSYNC_CALLS)}", "-o", str(output)]


def strace_works() -> str | None:
    """None if ``strace --seccomp-bpf`` runs here, else why not."""
    try:
        run = subprocess.run([*strace_prefix(Path(os.devnull)), "true"], check=False, capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    return None if run.returncode == 0 else (run.stderr.strip() or f"exit {run.returncode}")


def count_fsyncs(output: Path, start: float, end: float) -> dict[str, int]:
    """fsync and fdatasync calls begun between ``start`` and ``end`` (``time.time()``) in a strace output file."""
    counts = dict.fromkeys(FSYNC_CALLS, 0)
    try:
        with open(output, errors="replace") as lines:
            for line in lines:
                match = _STRACE_LINE.match(line)
                if match and start <= float(match.group(1)) <= end:
                    counts[match.group(2)] += 1
    except FileNotFoundError:
        pass
    return counts


def record_fsyncs(result: dict[str, Any], files: list[Path], count: int) -> None:
    """Per node: calls within the send (``fsyncs``, their sum per message) and within the latency run."""
    if not files or "window" not in result:
        return
    by_node = [count_fsyncs(f, *result["window"]) for f in files]
    result["fsync_calls"] = by_node
    result["fsyncs"] = [sum(c.values()) for c in by_node]
    result["fsyncs_per_msg"] = sum(result["fsyncs"]) / count
    if "latency_window" in result:
        result["latency_fsyncs"] = [sum(count_fsyncs(f, *result["latency_window"]).values()) for f in files]


def _stop_traced(service: Service, traced: bool, timeout: float = 15.0) -> None:
    """Stop a node: under strace, SIGTERM the node itself first (strace then ends and writes its file)."""
    if traced and service.running():
        try:
            children = service.process.children()
        except psutil.NoSuchProcess:
            children = []
        for child in children:
            try:
                child.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        try:
            service.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    service.stop()


# -- hastandby -------------------------------------------------------------------------------------------


@dataclass
class HaNode:
    service: Service
    port: int
    data_dir: Path
    strace_out: Path | None

    def journal_bytes(self) -> int:
        try:
            return (self.data_dir / "journal").stat().st_size
        except FileNotFoundError:
            return 0


def start_hastandby(backups: int, work: Path, tag: str, strace: bool) -> list[HaNode]:
    """A standalone node, or a primary plus ``backups`` caught-up backups, each with its own ``--data-dir``.

    The steps of ``ha_throughput.start_nodes`` (whose argv has no data dir).
    """
    ports = [free_port() for _ in range(backups + 1)]
    base = [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", *_auth.users().serve_arguments()]
    brokers = ",".join(f"{LOOPBACK}:{p}" for p in ports)
    nodes: list[HaNode] = []
    try:
        for i, port in enumerate(ports):
            data_dir = work / f"{tag}-node{i}-data"
            argv = base + ["--listen", f"{LOOPBACK}:{port}", "--data-dir", str(data_dir)]
            if backups:
                argv += ["--ha-cluster", "--brokers-url", brokers]
            strace_out = work / f"{tag}-node{i}.strace" if strace else None
            if strace_out is not None:
                argv = strace_prefix(strace_out) + argv
            service = Service(f"{tag}-node{i}", argv, work / f"{tag}-node{i}.log", cwd=REPO_ROOT, env=python_env())
            nodes.append(HaNode(service, port, data_dir, strace_out))
        for node in nodes:
            _wait_answering(node.service, node.port)
        if backups:
            _request(ports[0], "PROMOTE")
            for port in ports[1:]:
                _wait_state(port, "backup")
    except BaseException:
        stop_hastandby(nodes)
        raise
    return nodes


def stop_hastandby(nodes: list[HaNode]) -> None:
    for node in nodes:
        _stop_traced(node.service, node.strace_out is not None)


# -- RabbitMQ ---------------------------------------------------------------------------------------------


@dataclass
class RabbitNode:
    name: str
    port: int
    dist_port: int
    service: Service | None = None
    strace_out: Path | None = None


@dataclass
class RabbitCluster:
    """Three RabbitMQ nodes on loopback, each with its own ports, data and logs under ``directory``."""

    directory: Path
    strace: bool
    nodes: list[RabbitNode] = field(default_factory=list)
    epmd: Service | None = None
    setup_s: float | None = None

    def __post_init__(self) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.home = self.directory / "home"  # HOME: the Erlang cookie of the nodes and of rabbitmqctl
        self.epmd_port = free_port()
        self.nodes = [RabbitNode(f"hsb{i + 1}-{suffix}@localhost", free_port(), free_port())
                      for i in range(RABBIT_NODES)]

    # environment ----------------------------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(HOME=str(self.home), ERL_EPMD_PORT=str(self.epmd_port), LANG="C.UTF-8", LC_ALL="C.UTF-8")
        return env

    def node_env(self, node: RabbitNode) -> dict[str, str]:
        short = node.name.split("@")[0]
        base = self.directory / short
        env = self._base_env()
        env.update(
            RABBITMQ_NODENAME=node.name,
            RABBITMQ_NODE_IP_ADDRESS=LOOPBACK,
            RABBITMQ_NODE_PORT=str(node.port),  # AMQP 0-9-1 and, with the plugin, AMQP 1.0
            RABBITMQ_DIST_PORT=str(node.dist_port),
            RABBITMQ_CONF_ENV_FILE=str(self.directory / "rabbitmq-env.conf"),  # empty: not /etc/rabbitmq's
            RABBITMQ_CONFIG_FILE=str(self.directory / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.directory / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.directory / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_LOGS=str(base / "log" / f"{short}.log"),
            RABBITMQ_PID_FILE=str(base / f"{short}.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=RABBIT_ERL_ARGS,
        )
        return env

    def ctl(self, *args: str, node: RabbitNode | None = None, timeout: float = RABBIT_CTL_TIMEOUT,
            check: bool = True) -> str:
        """``rabbitmqctl -n NODE ARGS`` (first node by default); its output, or RuntimeError if it fails."""
        target = node or self.nodes[0]
        argv = [str(RABBIT_BIN / "rabbitmqctl"), "-q", "-n", target.name, *args]
        run = subprocess.run(argv, check=False, env=self.node_env(target), capture_output=True, text=True,
                             timeout=timeout, cwd=self.directory)
        if check and run.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {target.name}: exit {run.returncode}: "
                               f"{(run.stdout + run.stderr).strip()[-800:]}")
        return run.stdout

    # life ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start epmd and the three nodes, enable the AMQP 1.0 plugin, cluster nodes 2 and 3 with node 1."""
        started = time.monotonic()
        self.home.mkdir(parents=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        (self.directory / "rabbitmq-env.conf").write_text("")
        (self.directory / "rabbitmq.conf").write_text("log.console = false\nlog.file.level = info\n")
        plugins = subprocess.run([str(RABBIT_BIN / "rabbitmq-plugins"), "enable", "--offline", "rabbitmq_amqp1_0"],
                                 check=False, env=self.node_env(self.nodes[0]), capture_output=True, text=True, timeout=120,
                                 cwd=self.directory)
        if plugins.returncode != 0:
            raise RuntimeError(f"rabbitmq-plugins enable rabbitmq_amqp1_0: {(plugins.stdout + plugins.stderr)[-800:]}")
        # Our own epmd, in the foreground, so that it is ours to stop (a node would start a daemon of its own).
        self.epmd = Service("epmd", ["epmd", "-port", str(self.epmd_port)], self.directory / "epmd.log",
                            cwd=self.directory, env=self._base_env())
        _wait_port(self.epmd_port, 10.0, self.epmd)
        for node in self.nodes:
            short = node.name.split("@")[0]
            argv = [str(RABBIT_BIN / "rabbitmq-server")]
            if self.strace:
                node.strace_out = self.directory / f"{short}.strace"
                argv = strace_prefix(node.strace_out) + argv
            node.service = Service(short, argv, self.directory / f"{short}.out", cwd=self.directory,
                                   env=self.node_env(node))
        for node in self.nodes:
            self._await_startup(node, time.monotonic() + RABBIT_START_TIMEOUT)
        for node in self.nodes[1:]:
            self.ctl("stop_app", node=node)
            self.ctl("join_cluster", self.nodes[0].name, node=node)
            self.ctl("start_app", node=node)
        self.ctl("await_online_nodes", str(RABBIT_NODES), "--timeout", "60", timeout=90)
        self.setup_s = time.monotonic() - started

    def _await_startup(self, node: RabbitNode, deadline: float) -> None:
        """``await_startup`` fails at once while the node has not registered with epmd yet: try until ``deadline``."""
        assert node.service is not None
        while True:
            if not node.service.running():
                raise RuntimeError(f"RabbitMQ node {node.name} exited: {node.service.log_tail()}")
            left = deadline - time.monotonic()
            try:
                self.ctl("await_startup", "--timeout", str(max(1, int(left))), node=node, timeout=max(5.0, left) + 30)
                return
            except RuntimeError:
                if left <= 0:
                    raise
                time.sleep(1.0)

    def stop(self) -> None:
        """``rabbitmqctl stop`` each node, then by PID whatever still runs; epmd last; then remove the data."""
        for node in reversed(self.nodes):
            if node.service is None:
                continue
            if node.service.running():
                try:
                    self.ctl("stop", node=node, timeout=60, check=False)
                except subprocess.TimeoutExpired:
                    pass
                try:
                    node.service.popen.wait(30)
                except subprocess.TimeoutExpired:
                    pass
            _stop_traced(node.service, node.strace_out is not None)
        if self.epmd is not None:
            self.epmd.stop()
        for node in self.nodes:  # logs stay (the work directory goes after a run without failures)
            shutil.rmtree(self.directory / node.name.split("@")[0] / "mnesia", ignore_errors=True)

    def cpu_seconds(self) -> float:
        return sum(n.service.cpu_seconds() for n in self.nodes if n.service is not None)

    def check_running(self) -> None:
        for node in self.nodes:
            if node.service is None or not node.service.running():
                raise RuntimeError(f"RabbitMQ node {node.name} is not running")

    # queues ---------------------------------------------------------------------------------------------

    def declare_quorum_queue(self, name: str) -> None:
        """A durable quorum queue over every cluster node, declared on node 1 (where its leader then is)."""
        _check_name(name)
        out = self.ctl("eval", (
            f'{{new, _}} = rabbit_amqqueue:declare(rabbit_misc:r(<<"/">>, queue, <<"{name}">>), true, false, '
            f'[{{<<"x-queue-type">>, longstr, <<"quorum">>}}], none, <<"benchmark">>), ok.'))
        if out.strip() != "ok":
            raise RuntimeError(f"declaring quorum queue {name}: {out.strip()}")

    def queue_info(self, name: str) -> dict[str, str]:
        """``list_queues`` columns for ``name`` (type, durable, messages, leader, members)."""
        _check_name(name)
        columns = ("name", "type", "durable", "messages", "leader", "members")
        for line in self.ctl("list_queues", "--no-table-headers", *columns).splitlines():
            cells = line.split("\t")
            if cells and cells[0] == name:
                return dict(zip(columns, cells))
        return {}

    def wait_messages(self, name: str, count: int, timeout: float = 30.0) -> dict[str, str]:
        """Poll until the queue reports ``count`` messages (a quorum queue's count may lag the confirms)."""
        deadline = time.monotonic() + timeout
        info = self.queue_info(name)
        while info.get("messages") != str(count) and time.monotonic() < deadline:
            time.sleep(1.0)
            info = self.queue_info(name)
        return info

    def delete_queue(self, name: str) -> None:
        self.ctl("delete_queue", name, check=False)


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"queue name {name!r} would need quoting")


def _wait_port(port: int, timeout: float, service: Service) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.running():
            raise RuntimeError(f"{service.name} exited: {service.log_tail()}")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{service.name} not listening on {port}")


# -- clients ---------------------------------------------------------------------------------------------------


class _DurableLatencySender(_LatencySender):
    """``ha_throughput``'s one-in-flight sender, with durable messages of ``body_size`` bytes.

    Its time limit is cancelled once every message is accepted: a timer left
    scheduled keeps ``Container.run()`` going until it fires.
    """

    def __init__(self, url: str, address: str, count: int, durable: bool, body_size: int,
                 connect_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, address, count, connect_options, timeout)
        self.durable, self.body = durable, b"x" * body_size
        self._timer: Any = None

    def on_start(self, event: Any) -> None:
        self._timer = event.container.schedule(self.timeout, self)
        connection = event.container.connect(self.url, reconnect=False, **self.connect_options)
        event.container.create_sender(connection, self.address)

    def on_sendable(self, event: Any) -> None:
        if self._sent_at == 0.0 and len(self.latencies) < self.count:
            self._sent_at = time.perf_counter()
            event.sender.send(Message(body=self.body, durable=self.durable))

    def on_accepted(self, event: Any) -> None:
        super().on_accepted(event)
        if len(self.latencies) >= self.count and self._timer is not None:
            self._timer.cancel()


def ack_latency(port: int, address: str, count: int, durable: bool, body_size: int,
                connect_options: dict[str, Any]) -> dict[str, float]:
    """p50/p99/max ms from send to ``accepted``, one durable message in flight (as ``ha_throughput``)."""
    timeout = 30.0 + count * 0.1
    sender = _DurableLatencySender(f"amqp://{LOOPBACK}:{port}", address, count, durable, body_size,
                                   connect_options, timeout)
    Container(sender).run()
    if len(sender.latencies) < count:
        raise RuntimeError(f"only {len(sender.latencies)} of {count} latency messages were accepted"
                           + (f" within {timeout:.0f} s" if sender.timed_out else ""))
    return {"p50_ms": nearest_rank(sender.latencies, 50) * 1e3, "p99_ms": nearest_rank(sender.latencies, 99) * 1e3,
            "max_ms": max(sender.latencies) * 1e3}


def _send(port: int, address: str, count: int, body_size: int, env: dict[str, str]) -> float:
    """send-bench; elapsed seconds, or RuntimeError unless every message was accepted."""
    started = time.monotonic()
    run = cexamples.run_send(LOOPBACK, port, address, count, body_size, 30.0 + count / MIN_RATE * 2, env=env)
    elapsed = time.monotonic() - started
    sent = cexamples.sent_count(run)
    if run.returncode != 0 or sent != count:
        tail = " | ".join(run.stdout.strip().splitlines()[-5:])
        raise RuntimeError(f"send exit {run.returncode}, acknowledged {sent} of {count}: {tail}")
    return elapsed


# -- one round of one system ------------------------------------------------------------------------------------


@dataclass
class Settings:
    count: int
    runs: int
    body_size: int
    latency_messages: int
    strace: bool


def measure_hastandby(system: str, round_no: int, settings: Settings, work: Path,
                      rabbit: RabbitCluster | None) -> dict[str, Any]:
    backups, durable = HASTANDBY_SYSTEMS[system], system not in NONDURABLE
    tag = f"{system}-r{round_no}-{uuid.uuid4().hex[:6]}"
    result: dict[str, Any] = {"system": system, "round": round_no, "ok": False, "error": None,
                              "backups": backups, "durable_messages": durable}
    nodes: list[HaNode] = []
    try:
        nodes = start_hastandby(backups, work, tag, settings.strace)
        port = nodes[0].port
        queue, latency_queue = f"dq-{tag}", f"lat-{tag}"
        for name in (queue, latency_queue):
            _request(port, "CREATE", "queue", name, {"durable": True, "arguments": {"qpid.replicate": "all"}})
        env = _auth.users().client_environment() | ({"HASTANDBY_DURABLE": "1"} if durable else {})
        journal_before = [n.journal_bytes() for n in nodes]
        cpu_before = [n.service.cpu_seconds() for n in nodes]
        rabbit_cpu_before = rabbit.cpu_seconds() if rabbit else None
        t0 = time.time()
        elapsed = _send(port, queue, settings.count, settings.body_size, env)
        t1 = time.time()
        cpu = sum(n.service.cpu_seconds() - before for n, before in zip(nodes, cpu_before))
        if rabbit is not None and rabbit_cpu_before is not None:
            # RabbitMQ's nodes run idle meanwhile (started once per invocation): what they take from the cores
            result["rabbitmq_idle_cpu_s"] = rabbit.cpu_seconds() - rabbit_cpu_before
        growth = [n.journal_bytes() - before for n, before in zip(nodes, journal_before)]
        depth = next(q["depth"] for q in _request(port, "QUERY")["queues"] if q["name"] == queue)
        result.update(msg_per_s=settings.count / elapsed, elapsed_s=elapsed, cpu_us_per_msg=cpu / settings.count * 1e6,
                      journal_growth_bytes=growth, depth=depth, window=[t0, t1])
        problems = []
        if depth != settings.count:
            problems.append(f"queue holds {depth} messages, not {settings.count}")
        for i, grown in enumerate(growth):
            if durable and grown < settings.count * settings.body_size:
                problems.append(f"node{i}'s journal grew by {grown} bytes only: messages not journaled")
            if not durable and grown > 64 * 1024:
                problems.append(f"node{i}'s journal grew by {grown} bytes with non-durable messages")
        result["journal"] = _request(port, "STATUS").get("journal")
        t2 = time.time()
        result["ack_latency"] = ack_latency(port, latency_queue, settings.latency_messages, durable,
                                            settings.body_size, _auth.users().connect_options())
        t3 = time.time()
        result["latency_window"] = [t2, t3]
        if problems:
            result["error"] = "; ".join(problems)
        else:
            result["ok"] = True
    except Exception as error:  # noqa: BLE001 - recorded, the run goes on
        result["error"] = f"{type(error).__name__}: {error}"
    finally:
        stop_hastandby(nodes)
    record_fsyncs(result, [n.strace_out for n in nodes if n.strace_out is not None], settings.count)
    if result["ok"]:
        for node in nodes:
            shutil.rmtree(node.data_dir, ignore_errors=True)
            if node.strace_out is not None:
                node.strace_out.unlink(missing_ok=True)
    return result


def measure_rabbit(round_no: int, settings: Settings, rabbit: RabbitCluster) -> dict[str, Any]:
    tag = f"r{round_no}-{uuid.uuid4().hex[:6]}"
    queue, latency_queue = f"dq-{tag}", f"lat-{tag}"
    result: dict[str, Any] = {"system": "rabbitmq", "round": round_no, "ok": False, "error": None,
                              "durable_messages": True, "queue": queue}
    leader = rabbit.nodes[0]
    env = {"HASTANDBY_USER": RABBIT_USER, "HASTANDBY_PASSWORD": RABBIT_PASSWORD, "HASTANDBY_DURABLE": "1"}
    try:
        rabbit.check_running()
        for name in (queue, latency_queue):
            rabbit.declare_quorum_queue(name)
        result["queue_info"] = info = rabbit.queue_info(queue)
        if info.get("type") != "quorum" or info.get("durable") != "true":
            raise RuntimeError(f"queue {queue} is not a durable quorum queue: {info}")
        cpu_before = rabbit.cpu_seconds()
        t0 = time.time()
        elapsed = _send(leader.port, f"/amq/queue/{queue}", settings.count, settings.body_size, env)
        t1 = time.time()
        cpu = rabbit.cpu_seconds() - cpu_before
        result.update(msg_per_s=settings.count / elapsed, elapsed_s=elapsed,
                      cpu_us_per_msg=cpu / settings.count * 1e6, window=[t0, t1])
        after = rabbit.wait_messages(queue, settings.count)
        result["depth"] = int(after["messages"]) if after.get("messages", "").isdigit() else None
        t2 = time.time()
        result["ack_latency"] = ack_latency(leader.port, f"/amq/queue/{latency_queue}", settings.latency_messages,
                                            True, settings.body_size,
                                            {"user": RABBIT_USER, "password": RABBIT_PASSWORD,
                                             "allow_insecure_mechs": True})
        result["latency_window"] = [t2, time.time()]
        if result["depth"] != settings.count:
            result["error"] = f"queue holds {after.get('messages')} messages, not {settings.count}"
        else:
            result["ok"] = True
    except Exception as error:  # noqa: BLE001 - recorded, the run goes on
        result["error"] = f"{type(error).__name__}: {error}"
    finally:
        for name in (queue, latency_queue):
            try:
                rabbit.delete_queue(name)
            except (subprocess.TimeoutExpired, RuntimeError):
                pass
    return result


def rabbit_fsyncs(results: list[dict[str, Any]], rabbit: RabbitCluster, count: int) -> None:
    """After the cluster has stopped (strace has written everything): fsyncs within each RabbitMQ round's send."""
    files = [n.strace_out for n in rabbit.nodes if n.strace_out is not None]
    for result in results:
        if result["system"] == "rabbitmq":
            record_fsyncs(result, files, count)


def progress(result: dict[str, Any], runs: int) -> None:
    head = f"round {result['round']}/{runs}  {result['system']:<22}"
    if "msg_per_s" in result:
        lat = result.get("ack_latency") or {}
        fsync = f"  fsyncs/msg {result['fsyncs_per_msg']:.4f}" if "fsyncs_per_msg" in result else ""
        print(f"{head} {result['msg_per_s']:>9,.0f} msg/s  cpu {result['cpu_us_per_msg']:6.1f} us/msg{fsync}"
              f"  ack p50/p99 {fmt(lat.get('p50_ms'), '.2f')}/{fmt(lat.get('p99_ms'), '.2f')} ms", flush=True)
    if not result["ok"]:
        print(f"{head} *** FAILED *** {result['error']}", flush=True)


# -- summary -------------------------------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    medians: dict[str, Any] = {}
    for system in systems:
        mine = [r for r in results if r["system"] == system and r["ok"]]
        rates = [r["msg_per_s"] for r in mine]
        nodes = max((len(r.get("fsyncs", [])) for r in mine), default=0)
        medians[system] = {
            "msg_per_s": median_or_none(rates),
            "msg_per_s_min": min(rates) if rates else None,
            "msg_per_s_max": max(rates) if rates else None,
            "cpu_us_per_msg": median_or_none([r["cpu_us_per_msg"] for r in mine]),
            "fsyncs_per_msg": median_or_none([r["fsyncs_per_msg"] for r in mine if "fsyncs_per_msg" in r]),
            "fsyncs_per_msg_by_node": [median_or_none([r["fsyncs"][i] / r["depth"] for r in mine
                                                       if len(r.get("fsyncs", [])) > i and r.get("depth")])
                                       for i in range(nodes)],
            "ack_p50_ms": median_or_none([r["ack_latency"]["p50_ms"] for r in mine if "ack_latency" in r]),
            "ack_p99_ms": median_or_none([r["ack_latency"]["p99_ms"] for r in mine if "ack_latency" in r]),
            "rabbitmq_idle_cpu_per_s": median_or_none([r["rabbitmq_idle_cpu_s"] / r["elapsed_s"] for r in mine
                                                       if "rabbitmq_idle_cpu_s" in r]),
            "ok_rounds": len(mine),
            "failed_rounds": len([r for r in results if r["system"] == system]) - len(mine),
        }
    ratios: dict[str, Any] = {}
    for reference in ("rabbitmq", "standalone"):
        if reference in medians:
            ratios[f"/{reference}"] = {s: ratio(medians[s]["msg_per_s"], medians[reference]["msg_per_s"])
                                       for s in systems if s != reference}
    if "primary+2" in medians and "primary+2-nondurable" in medians:
        ratios["primary+2 durable/non-durable"] = ratio(medians["primary+2"]["msg_per_s"],
                                                        medians["primary+2-nondurable"]["msg_per_s"])
    goal: dict[str, Any] = {"figure": f"{GOAL_SYSTEM} / {GOAL_REFERENCE} durable send msg/s", "at_least": GOAL}
    if GOAL_SYSTEM in medians and GOAL_REFERENCE in medians:
        value = ratio(medians[GOAL_SYSTEM]["msg_per_s"], medians[GOAL_REFERENCE]["msg_per_s"])
        per_round = []
        for round_no in sorted({r["round"] for r in results}):
            mine = {r["system"]: r for r in results if r["round"] == round_no and r["ok"]}
            if GOAL_SYSTEM in mine and GOAL_REFERENCE in mine:
                per_round.append(mine[GOAL_SYSTEM]["msg_per_s"] / mine[GOAL_REFERENCE]["msg_per_s"])
        goal.update(ratio=value, per_round=per_round, met=value is not None and value >= GOAL)
    return {"medians": medians, "ratios": ratios, "goal": goal}


def print_summary(summary: dict[str, Any]) -> None:
    medians, ratios = summary["medians"], summary["ratios"]
    print("\nmedians over successful rounds")
    print(f"{'system':<22}{'msg/s':>10}{'min-max':>18}{'x rabbitmq':>12}{'cpu us/msg':>12}{'fsyncs/msg':>12}"
          f"{'ack p50/p99 ms':>16}  fsyncs/msg by node")
    for system, m in medians.items():
        span = f"{fmt(m['msg_per_s_min'], ',.0f')}-{fmt(m['msg_per_s_max'], ',.0f')}"
        versus = ratios.get("/rabbitmq", {}).get(system)
        by_node = " ".join(fmt(v, ".4f") for v in m["fsyncs_per_msg_by_node"])
        failed = f"  [{m['failed_rounds']} FAILED]" if m["failed_rounds"] else ""
        print(f"{system:<22}{fmt(m['msg_per_s'], ',.0f'):>10}{span:>18}"
              f"{('x' + fmt(versus, '.2f')) if versus else '':>12}{fmt(m['cpu_us_per_msg'], '.1f'):>12}"
              f"{fmt(m['fsyncs_per_msg'], '.4f'):>12}"
              f"{fmt(m['ack_p50_ms'], '.2f') + '/' + fmt(m['ack_p99_ms'], '.2f'):>16}  {by_node}{failed}")
    idle = [m["rabbitmq_idle_cpu_per_s"] for m in medians.values() if m.get("rabbitmq_idle_cpu_per_s") is not None]
    if idle:
        print(f"RabbitMQ's idle nodes during the hastandby sends: {max(idle):.3f} CPU-seconds per second at most")
    if "primary+2 durable/non-durable" in ratios:
        print(f"primary+2 durable / non-durable: x{fmt(ratios['primary+2 durable/non-durable'], '.2f')}")
    if "/standalone" in ratios:
        print("against standalone: " + ", ".join(f"{s} x{fmt(v, '.2f')}" for s, v in ratios["/standalone"].items()))
    goal = summary["goal"]
    if "ratio" in goal:
        verdict = "met" if goal["met"] else "MISSED"
        rounds = ", ".join(f"x{v:.2f}" for v in goal["per_round"])
        print(f"goal: {goal['figure']} x{fmt(goal['ratio'], '.2f')} (>= {GOAL}: {verdict}; rounds {rounds})")


# -- main --------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.durable", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="durable messages per send (default 100000)")
    parser.add_argument("--runs", type=int, default=3, help="rounds per system, alternating (default 3)")
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--latency-messages", type=int, default=1000,
                        help="messages for the ack latency, one in flight (default 1000)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {','.join(SYSTEMS)}")
    parser.add_argument("--no-strace", action="store_true", help="do not count fsyncs (no strace)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    if args.count < 1 or args.runs < 1 or args.latency_messages < 1 or args.body_size < 1:
        parser.error("--count, --runs, --latency-messages and --body-size must be positive")
    settings = Settings(args.count, args.runs, args.body_size, args.latency_messages, not args.no_strace)
    if settings.strace and (why := strace_works()):
        parser.error(f"strace --seccomp-bpf does not work here ({why}); use --no-strace")
    if "rabbitmq" in systems and not (RABBIT_BIN / "rabbitmq-server").exists():
        parser.error(f"no {RABBIT_BIN / 'rabbitmq-server'}: apt-get install rabbitmq-server (or leave out rabbitmq)")

    command = shlex.join([sys.executable, "-m", "benchmarks.durable", *(sys.argv[1:] if argv is None else argv)])
    started = datetime.now(UTC)
    host_at_start, code_at_start = host_info(), uncommitted_changes()
    for name in ("send-bench",):
        cexamples.build(name)
    work = Path(tempfile.mkdtemp(prefix="durable-bench-"))
    print(f"durable: {args.count:,} x {args.body_size}-byte durable messages, {args.runs} rounds of "
          f"{', '.join(systems)}; fsyncs {'by strace' if settings.strace else 'not counted'}; work dir {work}",
          flush=True)
    undo_sigterm = interrupt_on_sigterm()
    rabbit: RabbitCluster | None = None
    results: list[dict[str, Any]] = []
    interrupted = False
    report: dict[str, Any] = {
        "benchmark": "durable", "command": command, "started_utc": started.isoformat(timespec="seconds"),
        "host": host_at_start, "node_code": code_at_start,
        "parameters": {"count": args.count, "runs": args.runs, "body_size": args.body_size,
                       "latency_messages": args.latency_messages, "systems": systems, "strace": settings.strace,
                       "journal_sync": "batch", "client": "send-bench (HASTANDBY_DURABLE=1)"},
    }
    try:
        if "rabbitmq" in systems:
            rabbit = RabbitCluster(work / "rabbitmq", settings.strace)
            rabbit.directory.mkdir()
            print(f"rabbitmq: starting {RABBIT_NODES} nodes ...", flush=True)
            try:
                rabbit.start()
            except (RuntimeError, TimeoutError, OSError, subprocess.TimeoutExpired) as error:
                print(f"*** RabbitMQ did not start: {error}", flush=True)
                raise
            version = rabbit.ctl("eval", 'rabbit_misc:version().').strip().strip('"')
            status = rabbit.ctl("cluster_status", "--formatter", "json")
            report["rabbitmq"] = {
                "version": version, "nodes": [{"name": n.name, "amqp_port": n.port} for n in rabbit.nodes],
                "setup_s": rabbit.setup_s, "erl_args": RABBIT_ERL_ARGS, "plugin": "rabbitmq_amqp1_0",
                "queue": "quorum, durable, declared on node 1 with rabbit_amqqueue:declare, address /amq/queue/NAME",
                "user": RABBIT_USER, "cluster_status": status.strip()[-2000:]}
            print(f"rabbitmq {version}: {', '.join(n.name for n in rabbit.nodes)} clustered in "
                  f"{rabbit.setup_s:.1f} s", flush=True)
        for round_no in range(1, args.runs + 1):
            for system in systems:
                if system == "rabbitmq":
                    assert rabbit is not None
                    result = measure_rabbit(round_no, settings, rabbit)
                else:
                    result = measure_hastandby(system, round_no, settings, work, rabbit)
                results.append(result)
                progress(result, args.runs)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: stopping", flush=True)
    finally:
        if rabbit is not None:
            rabbit.stop()
        undo_sigterm()
    if rabbit is not None:
        rabbit_fsyncs(results, rabbit, args.count)
    summary = summarize(results, systems)
    report.update(duration_s=(datetime.now(UTC) - started).total_seconds(), interrupted=interrupted,
                  summary=summary, rounds=results)
    failed = interrupted or not results or any(not r["ok"] for r in results)
    report["failed"] = failed
    if host_info().get("git_commit") != host_at_start.get("git_commit") or uncommitted_changes() != code_at_start:
        report["node_code_changed_during_run"] = True
        print("WARNING: the node code changed during the run; rounds before and after ran different code", flush=True)
    print_summary(summary)
    path = write_report(args.out, "durable", started, report)
    print(f"\nresults: {path}")
    if failed:
        print(f"*** SOME ROUNDS FAILED; see above and the logs in {work} ***", flush=True)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
