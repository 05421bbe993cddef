"""Durable throughput (issues 14 and 27): hastandby with 0, 1 and 2 backups against RabbitMQ 4.3 quorum queues.

    python -m benchmarks.durable [--count 100000] [--runs 3] [--body-size 100] [--latency-messages 1000]
        [--systems standalone,primary+1,primary+2,primary+2-nondurable,rabbitmq] [--no-strace]
        [--rabbitmq-chroot build/rabbitmq-4.3] [--out results/]

In one invocation, rounds alternating over the systems (so the noise of this
shared machine hits all alike):

``standalone``, ``primary+1``, ``primary+2``
    a fresh hastandby node, or a primary with 1 or 2 caught-up backups
    (started as ``benchmarks.ha_throughput`` does: ``--ha-cluster
    --brokers-url``, PROMOTE, wait for ``backup``), every node with its own
    ``--data-dir`` (so it keeps a journal) and the default ``--journal-sync
    batch``; durable queues (``qpid.replicate=all``).
``primary+2-nondurable``
    the same as ``primary+2`` (data dirs, durable queues), but the messages
    are not durable: nothing is journaled; the comparison for what the journal
    costs.
``rabbitmq``
    RabbitMQ 4.3 (Debian forky's ``rabbitmq-server`` on Erlang/OTP 29) from a
    minimal Debian chroot that ``benchmarks/rabbitmq/setup-chroot.sh`` builds
    in ``build/rabbitmq-4.3`` (``--rabbitmq-chroot`` or ``$RABBITMQ_CHROOT``
    elsewhere; needs root).  Every RabbitMQ process (epmd, the three nodes,
    each ``rabbitmqctl``) runs through ``unshare --mount`` in a private mount
    namespace that binds ``/proc``, ``/dev``, ``/sys`` and the run's work
    directory (at the same path) into the chroot, then ``chroot``: the host
    sees their pids (CPU accounting, strace, stopping by PID) and the paths
    are the same inside and out.  The three nodes start together and form
    a cluster by ``classic_config`` peer discovery.  Per round fresh durable
    quorum queues over the three nodes (declared on the first node with
    ``rabbitmqctl eval``), addressed by the AMQP 1.0 clients as
    ``/queues/NAME`` (AMQP 1.0 is built in, with SASL required: the clients
    log in as ``guest`` with PLAIN); clients connect to the node the queue's
    leader is on.  The cluster is started once per invocation and stopped
    (``rabbitmqctl stop``, then by PID) at the end; its data is in a
    temporary directory that is removed.  RabbitMQ 3.10 (bookworm's, used up
    to issue 14) is no longer supported: its AMQP 1.0 plugin had other
    addresses and no SASL requirement, and keeping both was not worth it.

Figures per system and round, each as msg/s and broker CPU per message
(user+system seconds of every node process of the system over the figure,
divided by ``--count``):

- **send**: the proton C ``send-bench`` sends ``--count`` messages of
  ``--body-size`` bytes with the header's ``durable=true``
  (``HASTANDBY_DURABLE``, see ``cexamples``) into an empty queue; msg/s until
  the last is accepted (by hastandby once every ready backup has it and every
  node's journal has it on disk; by RabbitMQ once a majority of the quorum
  has it on disk).  The queue must then hold ``--count`` messages; for
  hastandby each node's journal must have grown by at least count x body
  bytes (durable) or not at all (non-durable).
- **receive**: ``receive-bench`` drains that full queue (exactly
  ``--count`` messages, accepted and settled); the queue must then be empty.
- **together**: ``receive-bench`` is started on a second empty queue, then
  ``send-bench`` sends ``--count`` messages into it; msg/s until both are done.
- **fsyncs per message**: every node process runs under ``strace -f
  --seccomp-bpf -e trace=fsync,fdatasync`` (only those calls stop the
  process, so it costs little; ``--no-strace`` turns it off), and the calls
  timed within each figure are counted, per node and in all.
- **ack latency**: ``benchmarks.ha_throughput``'s sender (python-qpid-proton,
  one message in flight, send -> ``accepted``), here with durable messages on
  a third fresh queue; p50 and p99 of ``--latency-messages``.

Prints the figures per round, then medians per figure and the ratios:
primary+2 / rabbitmq for send, receive and together (issue 27's goal: at
least 2.0 each; issue 14's was 1.5 on send), every system against rabbitmq
and standalone, and primary+2 durable / non-durable.  JSON in
``results/durable-<UTC>.json`` with the command line, the host, the
uncommitted node changes, every round, the RabbitMQ set-up and version.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from proton import Message
from proton.reactor import Container

from spark_analysis.phases import nearest_rank
from hastandby.testing import auth as _auth
from hastandby.testing import (
    cexamples,
    fmt,
    interrupt_on_sigterm,
    median_or_none,
    output_tail,
    ratio,
    request,
    wait_answering,
    wait_state,
    write_report,
)
from hastandby.testing.processes import LOOPBACK, Service, free_port, python_env
from hastandby.testing.provenance import host_info, uncommitted_changes

from .ha_throughput import LatencySender
from .throughput import DEFAULT_OUT, MIN_RATE, REPO_ROOT

HASTANDBY_SYSTEMS = {"standalone": 0, "primary+1": 1, "primary+2": 2, "primary+2-nondurable": 2}
"""hastandby systems and their number of backups."""
SYSTEMS = (*HASTANDBY_SYSTEMS, "rabbitmq")
NONDURABLE = {"primary+2-nondurable"}
FIGURES = ("send", "receive", "together")
GOAL_SYSTEM, GOAL_REFERENCE, GOAL = "primary+2", "rabbitmq", 2.0
"""Issue 27: with 2 backups at least 2 x RabbitMQ 4.3's three-node quorum queue on send, receive and together."""

READY_TIMEOUT = 60.0
RABBIT_START_TIMEOUT = 180.0
RABBIT_CTL_TIMEOUT = 90.0
RABBIT_CHROOT = Path(os.environ.get("RABBITMQ_CHROOT", str(REPO_ROOT / "build" / "rabbitmq-4.3")))
"""The forky chroot of ``benchmarks/rabbitmq/setup-chroot.sh``."""
RABBIT_SERIES = "4.3"
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
"""Inside the chroot: Debian's rabbitmq-server scripts; /usr/sbin's wrappers would switch to the rabbitmq user."""
CHROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
RABBIT_USER = RABBIT_PASSWORD = "guest"  # RabbitMQ's default user, allowed from loopback only
RABBIT_NODES = 3
RABBIT_ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"
"""No busy-waiting schedulers: three Erlang VMs share two cores with each other and with the other systems."""
_IN_CHROOT = ('set -e; root=$1; work=$2; shift 2; '
              'for fs in proc dev sys; do mount --rbind "/$fs" "$root/$fs"; done; '
              'mount --bind "$work" "$root$work"; '
              'exec chroot "$root" "$@"')
"""Run in a fresh private mount namespace (``unshare --mount``): bind what a node needs, then chroot and exec."""
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


def record_fsyncs(result: dict[str, Any], files: list[Path]) -> None:
    """Per figure: the calls within its window by node (``fsyncs``) and their sum per message; within the latency run."""
    if not files:
        return
    for figure in FIGURES:
        entry = result.get(figure)
        if not entry or "window" not in entry:
            continue
        by_node = [count_fsyncs(f, *entry["window"]) for f in files]
        entry["fsync_calls"] = by_node
        entry["fsyncs"] = [sum(c.values()) for c in by_node]
        entry["fsyncs_per_msg"] = sum(entry["fsyncs"]) / entry["messages"]
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
            wait_answering(node.service, node.port)
        if backups:
            request(ports[0], "PROMOTE")
            for port in ports[1:]:
                wait_state(port, "backup")
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


def rabbit_package_version(root: Path, package: str = "rabbitmq-server") -> str | None:
    """The Debian version of ``package`` in the chroot, read from its dpkg status file (no process started)."""
    try:
        text = (root / "var/lib/dpkg/status").read_text(errors="replace")
    except OSError:
        return None
    for stanza in text.split("\n\n"):
        if re.search(rf"^Package: {re.escape(package)}$", stanza, re.MULTILINE):
            match = re.search(r"^Version: (\S+)$", stanza, re.MULTILINE)
            return match.group(1) if match else None
    return None


def erlang_version(root: Path) -> str | None:
    """The chroot's Erlang/OTP version (``releases/*/OTP_VERSION``)."""
    for path in sorted((root / "usr/lib/erlang/releases").glob("*/OTP_VERSION")):
        return path.read_text().strip()
    return None


def rabbit_unusable(root: Path) -> str | None:
    """None if RabbitMQ 4.3 can run from the chroot ``root`` here, else why not."""
    if not (root / RABBIT_BIN.relative_to("/") / "rabbitmq-server").exists():
        return f"no RabbitMQ in {root}: run benchmarks/rabbitmq/setup-chroot.sh (as root), or leave out rabbitmq"
    version = rabbit_package_version(root)
    if not (version or "").startswith(RABBIT_SERIES + "."):
        return f"{root} has rabbitmq-server {version}, not {RABBIT_SERIES}: run benchmarks/rabbitmq/setup-chroot.sh"
    if os.geteuid() != 0:
        return "RabbitMQ runs in a chroot through unshare --mount: run as root, or leave out rabbitmq"
    return None


@dataclass
class RabbitCluster:
    """Three RabbitMQ nodes from the chroot ``root`` on loopback, each with its own ports, data and logs under
    ``directory`` (bound into the chroot at the same path)."""

    directory: Path
    strace: bool
    root: Path = RABBIT_CHROOT
    nodes: list[RabbitNode] = field(default_factory=list)
    epmd: Service | None = None
    setup_s: float | None = None

    def __post_init__(self) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.home = self.directory / "home"  # HOME: the Erlang cookie of the nodes and of rabbitmqctl
        self.mountpoint = self.root / self.directory.relative_to("/")
        self._made: list[Path] = []  # directories made in the chroot for the mount point, removed at the end
        self.epmd_port = free_port()
        self.nodes = [RabbitNode(f"hsb{i + 1}-{suffix}@localhost", free_port(), free_port())
                      for i in range(RABBIT_NODES)]

    # environment ----------------------------------------------------------------------------------------

    def in_chroot(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the chroot, in a private mount namespace of its own (see ``_IN_CHROOT``)."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_CHROOT, "sh", str(self.root),
                str(self.directory), *argv]

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RABBITMQ_", "ERL_", "PYTHON", "VIRTUAL_ENV"))}
        env.update(HOME=str(self.home), PATH=CHROOT_PATH, ERL_EPMD_PORT=str(self.epmd_port), LANG="C.UTF-8",
                   LC_ALL="C.UTF-8")
        return env

    def node_env(self, node: RabbitNode) -> dict[str, str]:
        short = node.name.split("@")[0]
        base = self.directory / short
        env = self._base_env()
        env.update(
            RABBITMQ_NODENAME=node.name,
            RABBITMQ_NODE_IP_ADDRESS=LOOPBACK,
            RABBITMQ_NODE_PORT=str(node.port),  # AMQP 0-9-1 and 1.0
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
        argv = self.in_chroot([str(RABBIT_BIN / "rabbitmqctl"), "-q", "-n", target.name, *args])
        run = subprocess.run(argv, check=False, env=self.node_env(target), capture_output=True, text=True,
                             timeout=timeout, cwd=self.directory)
        if check and run.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {target.name}: exit {run.returncode}: "
                               f"{(run.stdout + run.stderr).strip()[-800:]}")
        return run.stdout

    # life ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start epmd and the three nodes together; they cluster by classic_config peer discovery."""
        started = time.monotonic()
        self.home.mkdir(parents=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        (self.directory / "rabbitmq-env.conf").write_text("")
        (self.directory / "enabled_plugins").write_text("[].\n")
        (self.directory / "rabbitmq.conf").write_text(
            "log.console = false\nlog.file.level = info\n"
            "cluster_formation.peer_discovery_backend = classic_config\n"
            + "".join(f"cluster_formation.classic_config.nodes.{i + 1} = {n.name}\n"
                      for i, n in enumerate(self.nodes)))
        missing = [p for p in (self.mountpoint, *self.mountpoint.parents) if not p.exists()]
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._made = missing  # deepest first
        # Our own epmd, in the foreground, so that it is ours to stop (a node would start a daemon of its own).
        self.epmd = Service("epmd", self.in_chroot(["epmd", "-port", str(self.epmd_port)]),
                            self.directory / "epmd.log", cwd=self.directory, env=self._base_env())
        _wait_port(self.epmd_port, 30.0, self.epmd)
        for node in self.nodes:
            short = node.name.split("@")[0]
            argv = self.in_chroot([str(RABBIT_BIN / "rabbitmq-server")])
            if self.strace:
                node.strace_out = self.directory / f"{short}.strace"
                argv = strace_prefix(node.strace_out) + argv
            node.service = Service(short, argv, self.directory / f"{short}.out", cwd=self.directory,
                                   env=self.node_env(node))
        deadline = time.monotonic() + RABBIT_START_TIMEOUT
        for node in self.nodes:
            self._await_startup(node, deadline)
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
        for made in self._made:  # the empty mount point in the chroot (mounted only in the nodes' namespaces)
            try:
                made.rmdir()
            except OSError:
                break

    def cpu_seconds(self) -> float:
        return sum(n.service.cpu_seconds() for n in self.nodes if n.service is not None)

    def check_running(self) -> None:
        for node in self.nodes:
            if node.service is None or not node.service.running():
                raise RuntimeError(f"RabbitMQ node {node.name} is not running")

    def node_named(self, name: str) -> RabbitNode:
        """The node called ``name`` (a queue's leader), or RuntimeError."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise RuntimeError(f"no node {name!r} in this cluster ({', '.join(n.name for n in self.nodes)})")

    def versions(self) -> dict[str, Any]:
        """What RabbitMQ runs: the server's own version, the Debian package, Erlang/OTP."""
        server = self.ctl("eval", "rabbit_misc:version().", check=False).strip().strip('"')
        otp = self.ctl("eval", "erlang:system_info(otp_release).", check=False).strip().strip('"')
        return {"version": server or None, "package": rabbit_package_version(self.root),
                "erlang_otp": otp or erlang_version(self.root), "chroot": str(self.root),
                "debian_suite": "forky"}

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


class _DurableLatencySender(LatencySender):
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


def _client_timeout(count: int) -> float:
    return 30.0 + count / MIN_RATE * 2


def _check_sent(run: cexamples.ClientRun, count: int) -> None:
    sent = cexamples.sent_count(run)
    if run.returncode != 0 or sent != count:
        raise RuntimeError(f"send exit {run.returncode}, acknowledged {sent} of {count}: {output_tail(run.stdout)}")


def _check_received(run: cexamples.ClientRun, count: int) -> None:
    received = cexamples.received_count(run)
    if run.returncode != 0 or received != count:
        raise RuntimeError(f"receive exit {run.returncode}, received {received} of {count}: {output_tail(run.stdout)}")


def _send(port: int, address: str, count: int, body_size: int, env: dict[str, str]) -> None:
    """send-bench; RuntimeError unless every message was accepted."""
    _check_sent(cexamples.run_send(LOOPBACK, port, address, count, body_size, _client_timeout(count), env=env), count)


def _receive(port: int, address: str, count: int, env: dict[str, str]) -> None:
    """receive-bench; RuntimeError unless it got, accepted and settled exactly ``count`` messages."""
    _check_received(cexamples.run_receive(LOOPBACK, port, address, count, _client_timeout(count), env=env), count)


def _together(port: int, address: str, count: int, body_size: int, env: dict[str, str]) -> None:
    """receive-bench first (attached and waiting when the first message comes), then send-bench; both must finish."""
    receiver = cexamples.start_receive(LOOPBACK, port, address, count, env=env)
    sender: cexamples.Client | None = None
    try:
        sender = cexamples.start_send(LOOPBACK, port, address, count, body_size, env=env)
        _check_sent(sender.wait(_client_timeout(count)), count)
        _check_received(receiver.wait(_client_timeout(count)), count)
    finally:
        receiver.kill()
        if sender is not None:
            sender.kill()


def measure_figure(count: int, cpu_seconds: Callable[[], float], action: Callable[[], None]) -> dict[str, Any]:
    """Time ``action`` (a figure's clients) and charge the broker CPU it took; a failure is recorded, not raised."""
    cpu_before = cpu_seconds()
    t0, started = time.time(), time.monotonic()
    try:
        action()
    except subprocess.TimeoutExpired as error:
        return {"ok": False, "messages": count, "error": f"client timed out after {error.timeout:.0f} s: "
                                                          f"{output_tail(str(error.output or ''))}"}
    except RuntimeError as error:
        return {"ok": False, "messages": count, "error": str(error)}
    elapsed, t1 = time.monotonic() - started, time.time()
    cpu = cpu_seconds() - cpu_before
    return {"ok": True, "error": None, "messages": count, "msg_per_s": count / elapsed, "elapsed_s": elapsed,
            "cpu_s": cpu, "cpu_us_per_msg": cpu / count * 1e6, "window": [t0, t1]}


def _not_run(count: int, why: str) -> dict[str, Any]:
    return {"ok": False, "messages": count, "error": f"not run: {why}"}


def _fail(figure: dict[str, Any], problem: str) -> None:
    figure["ok"] = False
    figure["error"] = "; ".join(filter(None, [figure.get("error"), problem]))


def _finish(result: dict[str, Any], problems: list[str]) -> None:
    """The round's error: every failed figure's and the other problems; ok only without any."""
    errors = [f"{figure}: {result[figure]['error']}" for figure in FIGURES
              if figure in result and not result[figure]["ok"]]
    errors += [f"{figure}: not measured" for figure in FIGURES if figure not in result]
    errors += problems
    result["error"] = "; ".join(errors) or None
    result["ok"] = not errors


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
    count, body = settings.count, settings.body_size
    tag = f"{system}-r{round_no}-{uuid.uuid4().hex[:6]}"
    queue, together_queue, latency_queue = f"dq-{tag}", f"tq-{tag}", f"lat-{tag}"
    result: dict[str, Any] = {"system": system, "round": round_no, "ok": False, "error": None,
                              "backups": backups, "durable_messages": durable, "queue": queue,
                              "together_queue": together_queue}
    nodes: list[HaNode] = []
    problems: list[str] = []
    try:
        nodes = start_hastandby(backups, work, tag, settings.strace)
        port = nodes[0].port
        for name in (queue, together_queue, latency_queue):
            request(port, "CREATE", "queue", name, {"durable": True, "arguments": {"qpid.replicate": "all"}})
        env = _auth.users().client_environment() | ({"HASTANDBY_DURABLE": "1"} if durable else {})

        def cpu() -> float:
            return sum(n.service.cpu_seconds() for n in nodes)

        def depth(name: str) -> int:
            return next(q["depth"] for q in request(port, "QUERY")["queues"] if q["name"] == name)

        journal_before = [n.journal_bytes() for n in nodes]
        rabbit_cpu_before, span_start = (rabbit.cpu_seconds() if rabbit else 0.0), time.monotonic()
        result["send"] = send = measure_figure(count, cpu, lambda: _send(port, queue, count, body, env))
        growth = [n.journal_bytes() - before for n, before in zip(nodes, journal_before)]
        send.update(journal_growth_bytes=growth, depth=depth(queue))
        if send["ok"]:
            if send["depth"] != count:
                _fail(send, f"queue holds {send['depth']} messages, not {count}")
            for i, grown in enumerate(growth):
                if durable and grown < count * body:
                    _fail(send, f"node{i}'s journal grew by {grown} bytes only: messages not journaled")
                if not durable and grown > 64 * 1024:
                    _fail(send, f"node{i}'s journal grew by {grown} bytes with non-durable messages")
        if send["ok"]:
            result["receive"] = receive = measure_figure(count, cpu, lambda: _receive(port, queue, count, env))
            receive["depth"] = depth(queue)
            if receive["ok"] and receive["depth"] != 0:
                _fail(receive, f"queue still holds {receive['depth']} messages")
        else:
            result["receive"] = _not_run(count, "the send that fills its queue failed")
        result["together"] = together = measure_figure(
            count, cpu, lambda: _together(port, together_queue, count, body, env))
        together["depth"] = depth(together_queue)
        if together["ok"] and together["depth"] != 0:
            _fail(together, f"queue still holds {together['depth']} messages")
        if rabbit is not None:
            # RabbitMQ's nodes run idle meanwhile (started once per invocation): what they take from the cores
            result["rabbitmq_idle_cpu_s"] = rabbit.cpu_seconds() - rabbit_cpu_before
            result["rabbitmq_idle_span_s"] = time.monotonic() - span_start
        result["journal"] = request(port, "STATUS").get("journal")
        t2 = time.time()
        result["ack_latency"] = ack_latency(port, latency_queue, settings.latency_messages, durable, body,
                                            _auth.users().connect_options())
        result["latency_window"] = [t2, time.time()]
    except Exception as error:  # noqa: BLE001 - recorded, the run goes on
        problems.append(f"{type(error).__name__}: {error}")
    finally:
        stop_hastandby(nodes)
    _finish(result, problems)
    record_fsyncs(result, [n.strace_out for n in nodes if n.strace_out is not None])
    if result["ok"]:
        for node in nodes:
            shutil.rmtree(node.data_dir, ignore_errors=True)
            if node.strace_out is not None:
                node.strace_out.unlink(missing_ok=True)
    return result


def measure_rabbit(round_no: int, settings: Settings, rabbit: RabbitCluster) -> dict[str, Any]:
    count, body = settings.count, settings.body_size
    tag = f"r{round_no}-{uuid.uuid4().hex[:6]}"
    queue, together_queue, latency_queue = f"dq-{tag}", f"tq-{tag}", f"lat-{tag}"
    result: dict[str, Any] = {"system": "rabbitmq", "round": round_no, "ok": False, "error": None,
                              "durable_messages": True, "queue": queue, "together_queue": together_queue}
    env = {"HASTANDBY_USER": RABBIT_USER, "HASTANDBY_PASSWORD": RABBIT_PASSWORD, "HASTANDBY_DURABLE": "1"}
    problems: list[str] = []
    try:
        rabbit.check_running()
        for name in (queue, together_queue, latency_queue):
            rabbit.declare_quorum_queue(name)
        leaders: dict[str, RabbitNode] = {}
        for name in (queue, together_queue, latency_queue):
            info = rabbit.queue_info(name)
            members = [m for m in info.get("members", "").strip("[]").split(",") if m.strip()]
            if info.get("type") != "quorum" or info.get("durable") != "true" or len(members) != RABBIT_NODES:
                raise RuntimeError(f"queue {name} is not a durable quorum queue on {RABBIT_NODES} nodes: {info}")
            leaders[name] = rabbit.node_named(info["leader"])
            result.setdefault("queue_info", {})[name] = info

        send_port, together_port = leaders[queue].port, leaders[together_queue].port
        result["send"] = send = measure_figure(
            count, rabbit.cpu_seconds, lambda: _send(send_port, f"/queues/{queue}", count, body, env))
        if send["ok"]:
            after = rabbit.wait_messages(queue, count)
            send["depth"] = int(after["messages"]) if after.get("messages", "").isdigit() else None
            if send["depth"] != count:
                _fail(send, f"queue holds {after.get('messages')} messages, not {count}")
        if send["ok"]:
            result["receive"] = receive = measure_figure(
                count, rabbit.cpu_seconds, lambda: _receive(send_port, f"/queues/{queue}", count, env))
            after = rabbit.wait_messages(queue, 0)
            receive["depth"] = int(after["messages"]) if after.get("messages", "").isdigit() else None
            if receive["ok"] and receive["depth"] != 0:
                _fail(receive, f"queue still holds {after.get('messages')} messages")
        else:
            result["receive"] = _not_run(count, "the send that fills its queue failed")
        result["together"] = together = measure_figure(
            count, rabbit.cpu_seconds,
            lambda: _together(together_port, f"/queues/{together_queue}", count, body, env))
        after = rabbit.wait_messages(together_queue, 0)
        together["depth"] = int(after["messages"]) if after.get("messages", "").isdigit() else None
        if together["ok"] and together["depth"] != 0:
            _fail(together, f"queue still holds {after.get('messages')} messages")
        t2 = time.time()
        result["ack_latency"] = ack_latency(leaders[latency_queue].port, f"/queues/{latency_queue}",
                                            settings.latency_messages, True, body,
                                            {"user": RABBIT_USER, "password": RABBIT_PASSWORD,
                                             "allow_insecure_mechs": True})
        result["latency_window"] = [t2, time.time()]
    except Exception as error:  # noqa: BLE001 - recorded, the run goes on
        problems.append(f"{type(error).__name__}: {error}")
    finally:
        for name in (queue, together_queue, latency_queue):
            try:
                rabbit.delete_queue(name)
            except (subprocess.TimeoutExpired, RuntimeError):
                pass
    _finish(result, problems)
    return result


def rabbit_fsyncs(results: list[dict[str, Any]], rabbit: RabbitCluster) -> None:
    """After the cluster has stopped (strace has written everything): fsyncs within each RabbitMQ round's figures."""
    files = [n.strace_out for n in rabbit.nodes if n.strace_out is not None]
    for result in results:
        if result["system"] == "rabbitmq":
            record_fsyncs(result, files)


def progress(result: dict[str, Any], runs: int) -> None:
    head = f"round {result['round']}/{runs}  {result['system']:<22}"
    for figure in FIGURES:
        entry = result.get(figure)
        if entry and "msg_per_s" in entry:
            fsync = f"  fsyncs/msg {entry['fsyncs_per_msg']:.4f}" if "fsyncs_per_msg" in entry else ""
            bad = "" if entry["ok"] else f"  *** {entry['error']}"
            print(f"{head} {figure:<9}{entry['msg_per_s']:>9,.0f} msg/s  cpu {entry['cpu_us_per_msg']:6.1f} us/msg"
                  f"{fsync}{bad}", flush=True)
    lat = result.get("ack_latency")
    if lat:
        print(f"{head} ack p50/p99 {fmt(lat.get('p50_ms'), '.2f')}/{fmt(lat.get('p99_ms'), '.2f')} ms", flush=True)
    if not result["ok"]:
        print(f"{head} *** FAILED *** {result['error']}", flush=True)


# -- summary -------------------------------------------------------------------------------------------------


def _figure_medians(rounds: list[dict[str, Any]], figure: str) -> dict[str, Any]:
    done = [r[figure] for r in rounds if r.get(figure, {}).get("ok")]
    rates = [f["msg_per_s"] for f in done]
    nodes = max((len(f.get("fsyncs", [])) for f in done), default=0)
    return {
        "msg_per_s": median_or_none(rates),
        "msg_per_s_min": min(rates) if rates else None,
        "msg_per_s_max": max(rates) if rates else None,
        "cpu_us_per_msg": median_or_none([f["cpu_us_per_msg"] for f in done]),
        "fsyncs_per_msg": median_or_none([f["fsyncs_per_msg"] for f in done if "fsyncs_per_msg" in f]),
        "fsyncs_per_msg_by_node": [median_or_none([f["fsyncs"][i] / f["messages"] for f in done
                                                   if len(f.get("fsyncs", [])) > i])
                                   for i in range(nodes)],
        "ok_rounds": len(done),
        "failed_rounds": len(rounds) - len(done),
    }


def summarize(results: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    medians: dict[str, Any] = {}
    for system in systems:
        rounds = [r for r in results if r["system"] == system]
        medians[system] = {figure: _figure_medians(rounds, figure) for figure in FIGURES}
        medians[system].update(
            ack_p50_ms=median_or_none([r["ack_latency"]["p50_ms"] for r in rounds if "ack_latency" in r]),
            ack_p99_ms=median_or_none([r["ack_latency"]["p99_ms"] for r in rounds if "ack_latency" in r]),
            rabbitmq_idle_cpu_per_s=median_or_none([r["rabbitmq_idle_cpu_s"] / r["rabbitmq_idle_span_s"]
                                                    for r in rounds if r.get("rabbitmq_idle_span_s")]),
            ok_rounds=len([r for r in rounds if r["ok"]]),
            failed_rounds=len([r for r in rounds if not r["ok"]]),
        )
    ratios: dict[str, Any] = {}
    for reference in ("rabbitmq", "standalone"):
        if reference in medians:
            ratios[f"/{reference}"] = {
                figure: {s: ratio(medians[s][figure]["msg_per_s"], medians[reference][figure]["msg_per_s"])
                         for s in systems if s != reference}
                for figure in FIGURES}
    if "primary+2" in medians and "primary+2-nondurable" in medians:
        ratios["primary+2 durable/non-durable"] = {
            figure: ratio(medians["primary+2"][figure]["msg_per_s"], medians["primary+2-nondurable"][figure]["msg_per_s"])
            for figure in FIGURES}
    goal: dict[str, Any] = {"figure": f"{GOAL_SYSTEM} / {GOAL_REFERENCE} msg/s on each of {', '.join(FIGURES)}",
                            "at_least": GOAL, "issue": 27}
    if GOAL_SYSTEM in medians and GOAL_REFERENCE in medians:
        goal["figures"] = {}
        for figure in FIGURES:
            mine, reference = medians[GOAL_SYSTEM][figure], medians[GOAL_REFERENCE][figure]
            value = ratio(mine["msg_per_s"], reference["msg_per_s"])
            per_round = []
            for round_no in sorted({r["round"] for r in results}):
                pair = {r["system"]: r[figure] for r in results
                        if r["round"] == round_no and r.get(figure, {}).get("ok")}
                if GOAL_SYSTEM in pair and GOAL_REFERENCE in pair:
                    per_round.append(pair[GOAL_SYSTEM]["msg_per_s"] / pair[GOAL_REFERENCE]["msg_per_s"])
            goal["figures"][figure] = {
                "ratio": value, "per_round": per_round, "met": value is not None and value >= GOAL,
                # below 1: primary+2 (all three nodes) takes less CPU per message than RabbitMQ's three nodes
                "cpu_us_per_msg_ratio": ratio(mine["cpu_us_per_msg"], reference["cpu_us_per_msg"])}
        goal["met"] = all(g["met"] for g in goal["figures"].values())
    return {"medians": medians, "ratios": ratios, "goal": goal}


def print_summary(summary: dict[str, Any], rabbit_label: str | None = None) -> None:
    medians, ratios = summary["medians"], summary["ratios"]
    print("\nmedians over successful rounds: msg/s, broker CPU (all nodes of the system) per message")
    for figure in FIGURES:
        print(f"\n{figure:<22}{'msg/s':>10}{'min-max':>18}{'x rabbitmq':>12}{'cpu us/msg':>12}{'fsyncs/msg':>12}"
              f"  fsyncs/msg by node")
        for system, m in medians.items():
            f = m[figure]
            span = f"{fmt(f['msg_per_s_min'], ',.0f')}-{fmt(f['msg_per_s_max'], ',.0f')}"
            versus = ratios.get("/rabbitmq", {}).get(figure, {}).get(system)
            by_node = " ".join(fmt(v, ".4f") for v in f["fsyncs_per_msg_by_node"])
            failed = f"  [{f['failed_rounds']} FAILED]" if f["failed_rounds"] else ""
            print(f"{system:<22}{fmt(f['msg_per_s'], ',.0f'):>10}{span:>18}"
                  f"{('x' + fmt(versus, '.2f')) if versus else '':>12}{fmt(f['cpu_us_per_msg'], '.1f'):>12}"
                  f"{fmt(f['fsyncs_per_msg'], '.4f'):>12}  {by_node}{failed}")
    print("\nack latency p50/p99 ms: " + ", ".join(
        f"{system} {fmt(m['ack_p50_ms'], '.2f')}/{fmt(m['ack_p99_ms'], '.2f')}" for system, m in medians.items()))
    idle = [m["rabbitmq_idle_cpu_per_s"] for m in medians.values() if m.get("rabbitmq_idle_cpu_per_s") is not None]
    if idle:
        print(f"RabbitMQ's idle nodes during the hastandby rounds: {max(idle):.3f} CPU-seconds per second at most")
    if "primary+2 durable/non-durable" in ratios:
        print("primary+2 durable / non-durable: " + ", ".join(
            f"{figure} x{fmt(v, '.2f')}" for figure, v in ratios["primary+2 durable/non-durable"].items()))
    if "/standalone" in ratios:
        for figure, by_system in ratios["/standalone"].items():
            print(f"against standalone, {figure}: "
                  + ", ".join(f"{s} x{fmt(v, '.2f')}" for s, v in by_system.items()))
    goal = summary["goal"]
    if "figures" in goal:
        against = f"{GOAL_REFERENCE} {rabbit_label}" if rabbit_label else GOAL_REFERENCE
        print(f"\ngoal (issue {goal['issue']}): {GOAL_SYSTEM} / {against} msg/s >= {GOAL} on each figure: "
              f"{'met' if goal['met'] else 'MISSED'}")
        for figure, g in goal["figures"].items():
            rounds = ", ".join(f"x{v:.2f}" for v in g["per_round"])
            print(f"  {figure:<9} x{fmt(g['ratio'], '.2f')} ({'met' if g['met'] else 'MISSED'}; rounds {rounds}); "
                  f"cpu per message x{fmt(g['cpu_us_per_msg_ratio'], '.2f')} of RabbitMQ's")


# -- main --------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.durable", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000,
                        help="durable messages per figure: send, receive, together (default 100000)")
    parser.add_argument("--runs", type=int, default=3, help="rounds per system, alternating (default 3)")
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--latency-messages", type=int, default=1000,
                        help="messages for the ack latency, one in flight (default 1000)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {','.join(SYSTEMS)}")
    parser.add_argument("--no-strace", action="store_true", help="do not count fsyncs (no strace)")
    parser.add_argument("--rabbitmq-chroot", type=Path, default=RABBIT_CHROOT,
                        help="the chroot of benchmarks/rabbitmq/setup-chroot.sh (default $RABBITMQ_CHROOT or "
                             "build/rabbitmq-4.3)")
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
    chroot = args.rabbitmq_chroot.resolve()
    if "rabbitmq" in systems and (why := rabbit_unusable(chroot)):
        parser.error(why)

    command = shlex.join([sys.executable, "-m", "benchmarks.durable", *(sys.argv[1:] if argv is None else argv)])
    started = datetime.now(UTC)
    host_at_start, code_at_start = host_info(), uncommitted_changes()
    for name in ("send-bench", "receive-bench"):
        cexamples.build(name)
    work = Path(tempfile.mkdtemp(prefix="durable-bench-"))
    print(f"durable: {args.count:,} x {args.body_size}-byte durable messages per figure ({', '.join(FIGURES)}), "
          f"{args.runs} rounds of {', '.join(systems)}; fsyncs {'by strace' if settings.strace else 'not counted'}; "
          f"work dir {work}", flush=True)
    undo_sigterm = interrupt_on_sigterm()
    rabbit: RabbitCluster | None = None
    rabbit_label: str | None = None
    results: list[dict[str, Any]] = []
    interrupted = False
    report: dict[str, Any] = {
        "benchmark": "durable", "command": command, "started_utc": started.isoformat(timespec="seconds"),
        "host": host_at_start, "node_code": code_at_start,
        "parameters": {"count": args.count, "runs": args.runs, "body_size": args.body_size,
                       "latency_messages": args.latency_messages, "systems": systems, "strace": settings.strace,
                       "figures": list(FIGURES), "journal_sync": "batch",
                       "clients": "send-bench (HASTANDBY_DURABLE=1), receive-bench",
                       "client_timeout_s": _client_timeout(args.count)},
    }
    try:
        if "rabbitmq" in systems:
            rabbit = RabbitCluster(work / "rabbitmq", settings.strace, chroot)
            rabbit.directory.mkdir()
            print(f"rabbitmq: starting {RABBIT_NODES} nodes from {chroot} ...", flush=True)
            try:
                rabbit.start()
            except (RuntimeError, TimeoutError, OSError, subprocess.TimeoutExpired) as error:
                print(f"*** RabbitMQ did not start: {error}", flush=True)
                raise
            versions = rabbit.versions()
            status = rabbit.ctl("cluster_status", "--formatter", "json")
            report["rabbitmq"] = {
                **versions, "nodes": [{"name": n.name, "amqp_port": n.port} for n in rabbit.nodes],
                "setup_s": rabbit.setup_s, "erl_args": RABBIT_ERL_ARGS,
                "cluster_formation": "classic_config peer discovery, the three nodes started together",
                "run": "unshare --mount (private /proc /dev /sys and work-directory binds) + chroot",
                "queue": "quorum, durable, over the 3 nodes, declared on node 1 with rabbit_amqqueue:declare, "
                         "AMQP 1.0 address /queues/NAME, clients on the leader's node",
                "user": RABBIT_USER, "sasl": "PLAIN", "cluster_status": status.strip()[-2000:]}
            rabbit_label = (f"{versions['version']} (Debian {versions['package']}, Erlang/OTP "
                            f"{versions['erlang_otp']})")
            print(f"rabbitmq {rabbit_label}: {', '.join(n.name for n in rabbit.nodes)} clustered in "
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
        rabbit_fsyncs(results, rabbit)
    summary = summarize(results, systems)
    report.update(duration_s=(datetime.now(UTC) - started).total_seconds(), interrupted=interrupted,
                  summary=summary, rounds=results)
    failed = interrupted or not results or any(not r["ok"] for r in results)
    report["failed"] = failed
    if host_info().get("git_commit") != host_at_start.get("git_commit") or uncommitted_changes() != code_at_start:
        report["node_code_changed_during_run"] = True
        print("WARNING: the node code changed during the run; rounds before and after ran different code", flush=True)
    print_summary(summary, rabbit_label)
    path = write_report(args.out, "durable", started, report)
    print(f"\nresults: {path}")
    if failed:
        print(f"*** SOME ROUNDS FAILED; see above and the logs in {work} ***", flush=True)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
