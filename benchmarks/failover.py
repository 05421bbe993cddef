"""Failover of a hot-standby cluster under load: kill -9, SIGSTOP, SIGTERM and a cut link of the primary.

    python -m benchmarks.failover [--rounds 20] [--faults kill,stop,term,kill9-broker] [--lease-ttl 2]
        [--nodes 3] [--rate 200] [--out DIR]
    python -m benchmarks.failover --via virtual-ip --faults kill,cut,stop,urls:cut [--cut-for 6] ...

Each round, on loopback with free ports: a fresh etcd (temporary data
directory) and N ``hastandby serve --etcd`` nodes with a cluster name of
their own; once one node is primary and the others are backups, an
``all``-replicated queue, a consumer and a producer (``numbered_client``, the
numbered failover client of the tests and the nemesis suite too:
python-qpid-proton, URL list of every node, fixed 0.1 s reconnect delay, one
numbered message every 1/rate s, each client a process of its own).  After a steady period the primary gets the
fault: ``kill`` (SIGKILL), ``stop`` (SIGSTOP for 2 x TTL, then SIGCONT),
``term`` (SIGTERM, a graceful stop) or ``kill9-broker`` (the nodes run under
``serve --supervise``; SIGKILL of the primary's broker process only, so its
supervisor revokes the lease at once and starts it again as a backup).

``--via urls`` or ``--via virtual-ip`` (needs root) runs the nodes as hosts
of a LAN of network namespaces instead, under ``serve --supervise``, the
clients on a host of their own given the node addresses or only the virtual
IP the primary holds (``failover_lan.py``), and adds the fault ``cut`` (the
primary's link down for ``--cut-for`` s); a fault written ``VIA:FAULT``
(``urls:cut``) runs that way whatever ``--via`` says, so one run puts the
virtual IP and the URL list side by side.  The round waits (bounded) for a new
primary, for the producer's first acknowledgement from it and for every other
surviving node to be a backup of it again, runs steady again, stops the
producer, lets the consumer drain and stops every process by PID.

Every round writes one trace in the format of ``docs/failover-traces.md``
(names from ``spark_analysis.trace_schema``) into ``--out`` (default
``results/failover-traces-<UTC>/``); the run writes a summary
JSON to ``results/failover-<UTC>.json`` and prints a table per
fault.  ``docs/failover-benchmark.md`` says how each event is observed.
Nodes require authentication (``hastandby/testing/auth.py``): backups authenticate
to the primary as ``peer``, the client processes as ``app`` with PLAIN (their
credentials come in the environment, so the URLs in traces carry none), the
harness's STATUS polls and requests as ``admin``.
Exit code 1 if a round failed, lost an acknowledged message, or (SIGSTOP) the
resumed old primary acknowledged anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hastandby.client import ManagementClient
from hastandby.election.cluster import ClusterKeys
from hastandby.settings import LEASE_TTL, MIN_LEASE_TTL  # etcd raises shorter TTLs to that
from hastandby.testing import auth as _auth
from hastandby.testing.etcd import EtcdServer
from hastandby.testing.nodes import read_node_log
from hastandby.testing.numbered_client import HEARTBEAT, RECONNECT_DELAY
from hastandby.testing.processes import LOOPBACK, JsonLinesProcess, Service, free_port, python_env
from hastandby.testing.provenance import host_info, uncommitted_changes
from hastandby.testing.status_poller import StatusPoller
from hastandby.testing.waiting import wait_until
from spark_analysis import phases as ph
from spark_analysis import trace_schema as ts
from spark_analysis.phases import nearest_rank

from .failover_lan import NODE_PORT, VIA_LOOPBACK, VIA_VIRTUAL_IP, VIAS, Case, FailoverLan
from .throughput import DEFAULT_OUT, REPO_ROOT

FAULT_ALIASES = {
    "kill": ts.FAULT_KILL9, "kill9": ts.FAULT_KILL9,
    "stop": ts.FAULT_SIGSTOP, "sigstop": ts.FAULT_SIGSTOP,
    "term": ts.FAULT_SIGTERM, "sigterm": ts.FAULT_SIGTERM,
    "kill9-broker": ts.FAULT_KILL9_BROKER,
    "cut": ts.FAULT_CUT,
}
SIGNALS = {ts.FAULT_KILL9: signal.SIGKILL, ts.FAULT_SIGSTOP: signal.SIGSTOP, ts.FAULT_SIGTERM: signal.SIGTERM,
           ts.FAULT_KILL9_BROKER: signal.SIGKILL}
QUEUE = "failover"
PROBE_QUEUE = "failover-probe"  # the SIGSTOP fencing probe's queue
PROBE_RATE = 50.0
CLIENT_TICK = 0.005  # s between the producer's send-schedule checks (``numbered_client --tick``)
HARNESS = "harness"
VIRTUAL_IP_ANNOUNCED = "virtual_ip_announced"  # extra trace events: a node's log line -> the event
VIRTUAL_IP_REMOVED = "virtual_ip_removed"
VIRTUAL_IP_EVENTS = {"virtual IP announced": VIRTUAL_IP_ANNOUNCED, "virtual IP removed": VIRTUAL_IP_REMOVED}

START_TIMEOUT = 60.0  # etcd up, nodes settled into one primary + backups
FIRST_ACK_TIMEOUT = 15.0
DRAIN_TIMEOUT = 15.0  # producer in-flight settled; consumer has every acknowledged number
QUIET = 0.5  # the consumer is done once nothing arrived for this long (after it has everything acked)
WAIT_STEP = 0.01

# Goals at lease TTL 2 s (the brief; docs/failover-benchmark.md).
GOALS = {
    ts.FAULT_KILL9: {"unavailability_p50_s": 2.5, "unavailability_max_s": 4.0},
    ts.FAULT_SIGTERM: {"unavailability_p50_s": 0.5},
    ts.FAULT_SIGSTOP: {},
    ts.FAULT_KILL9_BROKER: {"unavailability_p50_s": 0.5, "unavailability_max_s": 1.0},  # issue 16
    ts.FAULT_CUT: {"unavailability_max_s": 4.0},  # issue 24, through the virtual IP; a URL list is held to it too
}
GOAL_TTL = 2.0
CAMPAIGN_WINDOW = 0.5  # s: how far before the watch's report a node's campaign decision may bound a deletion
PORT_RETRIES = 2  # a round whose node lost its "free" port before the fault is started again
CUT_FOR = 6.0  # s a cut link stays down: past the lease and past what a client's bounded connects take


class ChildProcess(JsonLinesProcess):
    """A client or the etcd watch as a child process (``python -m MODULE ARGV``); stopped by PID.

    ``status`` is the latest status line (with ``keep`` every line is kept in
    ``lines``); ``send`` writes a command line; ``finish`` loads what it
    recorded.
    """

    def __init__(self, name: str, module: str, argv: list[str], workdir: Path, keep: bool = False,
                 prefix: list[str] | None = None) -> None:
        """``prefix``: what runs the process elsewhere (``ip netns exec HOST``, a LAN round's clients)."""
        self.name = name
        self.out = workdir / f"{name}.json"
        self.keep = keep
        self.status: dict[str, Any] = {}
        self.lines: list[dict[str, Any]] = []
        self.record: dict[str, Any] | None = None
        self.finished = False
        super().__init__([*(prefix or []), sys.executable, "-m", module, *argv], workdir / f"{name}.log",
                         {**python_env(), **_auth.users().client_environment()}, f"failover-read-{name}")

    def on_line(self, line: dict[str, Any]) -> None:
        self.status = self.status_of(line)
        if self.keep:
            self.lines.append(line)

    def status_of(self, line: dict[str, Any]) -> dict[str, Any]:
        return line

    def send(self, command: str) -> None:
        try:
            self.write_line(command)
        except (OSError, ValueError):
            pass

    def finish(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """Ask it to stop (end of input), wait, SIGKILL it if it does not; load what it recorded."""
        if self.finished:
            return self.record
        self.finished = True
        self.end_input()
        self.wait_or_kill(timeout)
        try:
            self.record = self.record_of(json.loads(self.out.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            self.record = None
        return self.record

    def record_of(self, loaded: Any) -> dict[str, Any]:
        return loaded


class ClientProcess(ChildProcess):
    """One numbered failover client in a process of its own (``python -m hastandby.testing.numbered_client``).

    ``command`` starts it (``producer NAME RATE``, ``consumer NAME 0``,
    ``pinned NAME URL RATE``; NAME is ``name``); its status and record are
    the ones under ``name``.
    """

    def __init__(self, name: str, command: str, urls: list[str], workdir: Path, *options: str,
                 prefix: list[str] | None = None) -> None:
        super().__init__(name, "hastandby.testing.numbered_client",
                         ["--urls", ",".join(urls), "--out", str(workdir / f"{name}.json"), *options], workdir,
                         prefix=prefix)
        self.send(command)

    def status_of(self, line: dict[str, Any]) -> dict[str, Any]:
        return (line.get("status") or {}).get(self.name) or self.status

    def record_of(self, loaded: Any) -> dict[str, Any]:
        return loaded[self.name]


# -- nodes ---------------------------------------------------------------------------------------


@dataclass
class NodeProc:
    node_id: str
    port: int
    service: Service
    poller: StatusPoller | None = None
    host: str = LOOPBACK

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"amqp://{self.address}"


def _only_child(pid: int) -> int:
    """The one child process of ``pid`` (a supervisor's broker), from /proc."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listing:
            children += [int(child) for child in listing.read().split()]
    if len(children) != 1:
        raise RuntimeError(f"process {pid} has {len(children)} children, not one broker")
    return children[0]


def _stop_node(node: NodeProc) -> None:
    if node.service.running():
        try:
            os.kill(node.service.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        except ProcessLookupError:
            pass
    node.service.stop(timeout=5)


_TERM = re.compile(r"term (\d+)")


# -- one round -----------------------------------------------------------------------------------


@dataclass
class Settings:
    rounds: int
    cases: list[Case]
    lease_ttl: int
    nodes: int
    rate: float
    out: Path
    results: Path
    steady: float = 2.5
    steady_after: float = 2.0
    heartbeat: float = HEARTBEAT
    reconnect_delay: float = RECONNECT_DELAY
    recovery_timeout: float = 30.0
    keep_logs: bool = False
    cut_for: float = CUT_FOR


def node_ids(settings: Settings) -> list[str]:
    return [f"n{i}" for i in range(1, settings.nodes + 1)]


class RoundRunner:
    """Runs one round; ``run()`` always stops what it started and returns the round's summary.

    ``lan``: the run's LAN of namespaces, for a case that runs there.
    """

    def __init__(self, settings: Settings, run_id: str, case: Case, index: int, logs: Path,
                 lan: FailoverLan | None = None) -> None:
        if case.on_lan and lan is None:
            raise ValueError(f"{case.name} runs on a LAN of namespaces; none given")
        self.s = settings
        self.run_id = run_id
        self.case = case
        self.fault = case.fault
        self.lan = lan if case.on_lan else None
        self.index = index
        self.round_id = f"{run_id}-{case.name.replace('/', '-')}-r{index:03d}"
        self.cluster = self.round_id  # a cluster name of its own in every round
        self.logs = logs / self.round_id
        self.logs.mkdir(parents=True, exist_ok=True)
        self.node_ids = node_ids(settings)
        self.etcd = self.lan.etcd() if self.lan is not None else EtcdServer(name="failover")
        self.fault_pids: list[int] = []  # what the fault acted on: the process(es) signalled
        self.links_at_fault = 0  # the producer's links attached before the fault
        self.virtual_ip_holders: list[str] | None = None  # hosts with the virtual IP once recovered
        self.watch: ChildProcess | None = None
        self.nodes: list[NodeProc] = []
        self.producer: ClientProcess | None = None
        self.consumer: ClientProcess | None = None
        self.probe: ClientProcess | None = None
        self.t_start = 0.0
        self.t_fault: float | None = None
        self.t_resume: float | None = None
        self.resume_due: float | None = None
        self.primary: NodeProc | None = None
        self.new_primary: NodeProc | None = None
        self.t_teardown: float | None = None  # nodes' events from here on are the harness stopping them
        self.notes: list[str] = []

    # -- the round ---------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.t_start = time.time()
        error: str | None = None
        try:
            self._form()
            self._load()
            self._inject()
            self._recover()
            self._finish_load()
        except Exception as exc:  # noqa: BLE001 - the round fails, the run goes on
            error = f"{type(exc).__name__}: {exc}"
        finally:  # also on KeyboardInterrupt: every process we started is stopped by PID
            self._teardown()
        return self._report(error)

    def _form(self) -> None:
        url = self.etcd.start()
        self.watch = ChildProcess("watch", "benchmarks.leader_watch",
                                  ["--etcd", url, "--key", ClusterKeys(self.cluster).leader], self.logs, keep=True)
        watch = self.watch
        if not wait_until(lambda: any(line.get("kind") == "created" for line in watch.lines) or not watch.running,
                          20.0, WAIT_STEP) or not watch.running:
            raise RuntimeError(f"etcd watch did not start: {watch.log_tail()}")
        for node_id in self.node_ids:
            options = ["--etcd", url, "--cluster", self.cluster, "--node-id", node_id,
                       "--lease-ttl", str(self.s.lease_ttl), "--log-format", "json", *_auth.users().serve_arguments(),
                       *(["--supervise"] if self.case.supervised else [])]
            if self.lan is not None:
                port, host = NODE_PORT, self.lan.host(node_id)
                argv = self.lan.serve_argv(node_id, options, self.case.via)
            else:
                port, host = free_port(), LOOPBACK
                argv = [sys.executable, "-m", "hastandby", "serve", "--listen", f"{LOOPBACK}:{port}", *options]
            service = Service(node_id, argv, self.logs / f"{node_id}.log", cwd=REPO_ROOT, env=python_env())
            self.nodes.append(NodeProc(node_id, port, service, host=host))
        for node in self.nodes:
            node.poller = StatusPoller(node.node_id, node.address, _auth.users().login()).start()

        def settled() -> bool:
            for node in self.nodes:
                if not node.service.running():
                    raise RuntimeError(f"{node.node_id} exited: {node.service.log_tail()}")
            primaries = [n for n in self.nodes if n.poller.state() == "primary"]
            return len(primaries) == 1 and all(
                n.poller.follows(primaries[0].address) for n in self.nodes if n is not primaries[0]) and (
                self.case.via != VIA_VIRTUAL_IP or self.lan.holders() == [primaries[0].node_id])

        if not wait_until(settled, START_TIMEOUT, WAIT_STEP):
            raise RuntimeError(f"cluster did not settle: {self._states()}")
        self.primary = next(n for n in self.nodes if n.poller.state() == "primary")
        queues = [QUEUE, PROBE_QUEUE] if self.fault == ts.FAULT_SIGSTOP else [QUEUE]
        before = {n.node_id: int((n.poller.latest or {}).get("queues") or 0) for n in self.nodes}
        with ManagementClient(self.primary.address, timeout=10, login=_auth.users().login()) as client:
            for queue in queues:
                client.request("CREATE", "queue", queue, {"arguments": {"qpid.replicate": "all"}})
        if not wait_until(lambda: all(int((n.poller.latest or {}).get("queues") or 0) >= before[n.node_id] + len(queues)
                                      for n in self.nodes), 10.0, WAIT_STEP):
            raise RuntimeError(f"queues {queues} did not reach every backup: {self._states()}")

    def _states(self) -> str:
        return ", ".join(f"{n.node_id}={n.poller.latest if n.poller else None}" for n in self.nodes)

    def _load(self) -> None:
        urls = self.lan.client_urls(self.case.via) if self.lan is not None else [n.url for n in self.nodes]
        prefix = self.lan.client_command() if self.lan is not None else None
        common = ["--queue", QUEUE, "--heartbeat", str(self.s.heartbeat), "--reconnect-delay",
                  str(self.s.reconnect_delay), "--tick", str(CLIENT_TICK)]
        self.consumer = ClientProcess(ts.CONSUMER, f"consumer {ts.CONSUMER} 0", urls, self.logs, *common,
                                      prefix=prefix)
        self.producer = ClientProcess(ts.PRODUCER, f"producer {ts.PRODUCER} {self.s.rate:g}", urls, self.logs,
                                      *common, prefix=prefix)
        if self.fault == ts.FAULT_SIGSTOP:  # one connection to the node itself, no reconnect, no idle timeout
            self.probe = ClientProcess("probe", f"pinned probe {self.primary.url} {PROBE_RATE:g}",
                                       [self.primary.url], self.logs, "--queue", PROBE_QUEUE, "--tick",
                                       str(CLIENT_TICK), prefix=prefix)
        for client in filter(None, (self.producer, self.probe)):
            if not wait_until(lambda: client.status.get("first_ack_t") is not None or not client.running,
                              FIRST_ACK_TIMEOUT, WAIT_STEP) or client.status.get("first_ack_t") is None:
                raise RuntimeError(f"{client.name} got no acknowledgement: {client.status} {client.log_tail()}")
        producer = self.producer
        first = float(producer.status["first_ack_t"])
        time.sleep(max(0.0, first + self.s.steady - time.time()))
        if not self.primary.service.running() or self.primary.poller.state() != "primary":
            raise RuntimeError(f"the primary changed before the fault: {self._states()}")

    def _inject(self) -> None:
        """The fault on the primary.  Under a supervisor, kill -9 takes supervisor and node (a host crash: the
        supervisor first, so that it sees nothing), SIGTERM goes to the supervisor (it passes it on), and
        SIGKILL of the broker or SIGSTOP to the node under it."""
        self.links_at_fault = int(self.producer.status.get("links") or 0)
        if self.fault == ts.FAULT_CUT:
            self.lan.set_link(self.primary.node_id, False)
        else:
            supervisor = self.primary.service.pid
            node = _only_child(supervisor) if self.case.supervised else supervisor
            if self.fault == ts.FAULT_KILL9:
                self.fault_pids = list(dict.fromkeys((supervisor, node)))
            else:
                self.fault_pids = [supervisor if self.fault == ts.FAULT_SIGTERM else node]
            for pid in self.fault_pids:
                os.kill(pid, SIGNALS[self.fault])
        self.t_fault = time.time()
        if self.fault == ts.FAULT_SIGSTOP:  # frozen for 2 x TTL (etcd grants at least MIN_LEASE_TTL)
            self.resume_due = time.monotonic() + 2 * max(self.s.lease_ttl, MIN_LEASE_TTL)
        elif self.fault == ts.FAULT_CUT:
            self.resume_due = time.monotonic() + self.s.cut_for

    def _tick(self) -> None:
        """Runs in every wait after the fault: undo a freeze or a cut when due."""
        if self.resume_due is not None and self.t_resume is None and time.monotonic() >= self.resume_due:
            self._undo_fault()

    def _undo_fault(self) -> None:
        """SIGCONT the frozen node, or plug the cut one back in."""
        if self.fault == ts.FAULT_CUT:
            self.lan.set_link(self.primary.node_id, True)
        else:
            os.kill(self.fault_pids[0], signal.SIGCONT)
        self.t_resume = time.time()

    def _new_primary(self) -> NodeProc | None:
        return next((n for n in self.nodes if n is not self.primary and n.poller.state() == "primary"), None)

    def _acked_by_new(self) -> bool:
        """The producer's latest acknowledgement came after the fault from another node than the faulted one
        (through the virtual IP, whose URL names no node: on a link attached since the fault)."""
        last = self.producer.status.get("last_ack")
        if not last or last[0] < self.t_fault:
            return False
        if self.case.via == VIA_VIRTUAL_IP:
            return int(self.producer.status.get("links") or 0) > self.links_at_fault
        return last[1] != self.primary.url

    def _recover(self) -> None:
        def recovered() -> bool:
            new = self._new_primary()
            if new is None or not self._acked_by_new():
                return False
            self.new_primary = new
            others = [n for n in self.nodes if n is not self.primary and n is not new]
            if not all(n.poller.follows(new.address) for n in others):
                return False
            if self.resume_due is not None:  # the resumed (or reconnected) old primary must rejoin as a backup
                return self.t_resume is not None and self.primary.poller.follows(new.address)
            return True

        if not wait_until(recovered, self.s.recovery_timeout, WAIT_STEP, self._tick):
            self.new_primary = self.new_primary or self._new_primary()
            raise RuntimeError(f"no recovery within {self.s.recovery_timeout:g} s: new primary "
                               f"{self.new_primary and self.new_primary.node_id}, producer acked by it: "
                               f"{self._acked_by_new()}, states {self._states()}")
        if self.case.via == VIA_VIRTUAL_IP:
            self.virtual_ip_holders = self.lan.holders()
        wait_until(lambda: False, self.s.steady_after, WAIT_STEP, self._tick)

    def _finish_load(self) -> None:
        producer, consumer = self.producer, self.consumer
        producer.send(f"rate {producer.name} 0")  # no new numbers; in-doubt ones are still sent
        if not wait_until(lambda: producer.status.get("in_flight") == 0, DRAIN_TIMEOUT, WAIT_STEP, self._tick):
            self.notes.append(f"producer still had {producer.status.get('in_flight')} unsettled sends at the end")
        record = producer.finish()
        if record is None:
            raise RuntimeError(f"producer left no record: {producer.log_tail()}")
        expected = self.logs / "acknowledged.json"
        expected.write_text(json.dumps(sorted({number for _, number, _ in record["acks"]})))
        consumer.send(f"expect {consumer.name} {expected}")
        if not wait_until(lambda: consumer.status.get("missing") == 0, DRAIN_TIMEOUT, WAIT_STEP, self._tick):
            self.notes.append(f"consumer still missed {consumer.status.get('missing')} acknowledged numbers")
        last = [consumer.status.get("received"), time.monotonic()]

        def quiet() -> bool:
            if consumer.status.get("received") != last[0]:
                last[:] = [consumer.status.get("received"), time.monotonic()]
            return time.monotonic() - last[1] >= QUIET

        wait_until(quiet, 5.0, WAIT_STEP)
        consumer.finish()

    def _teardown(self) -> None:
        if self.resume_due is not None and self.t_resume is None:  # the round ended during a freeze or a cut
            try:
                self._undo_fault()
            except (OSError, subprocess.SubprocessError) as error:
                self.notes.append(f"could not undo the {self.fault}: {error}")
        for child in (self.producer, self.consumer, self.probe):
            if child is not None:
                child.finish(timeout=5)
        if self.watch is not None:
            self.watch.finish(timeout=5)
        self.t_teardown = time.time()
        primaries = [n for n in self.nodes if n.poller is not None and n.poller.state() == "primary"]
        for node in self.nodes:
            if node.poller is not None:
                node.poller.stop()
        for node in sorted(self.nodes, key=lambda n: n in primaries):  # backups first: no elections
            _stop_node(node)
        log = self.etcd.log_path
        if log is not None and log.exists():  # its directory goes when it stops
            shutil.copyfile(log, self.logs / "etcd.log")
        self.etcd.stop()
        if self.lan is not None:
            self.lan.reset()

    # -- the trace ---------------------------------------------------------------------------

    def _to_faulted(self, link: dict[str, Any]) -> bool:
        """Whether a client's link went to the faulted node: by its URL, or, through the virtual IP (one URL
        for every node), by its time: attached before the fault.  (A link attached after it is taken to be the
        new primary's: the old one is dead, frozen, cut off or a backup by then, and a resumed one is fenced.)"""
        if self.case.via == VIA_VIRTUAL_IP:
            return self.t_fault is None or link["t"] < self.t_fault
        return link["url"] == self.primary.url

    def _node_of(self, link: dict[str, Any]) -> str:
        """The node a client's link went to (see ``_to_faulted`` for the virtual IP)."""
        if self.case.via == VIA_VIRTUAL_IP:
            faulted = self.primary is not None and self._to_faulted(link)
            node = self.primary if faulted else self.new_primary
            return node.node_id if node is not None else link["url"]
        address = link["url"].split("://", 1)[-1].split("/", 1)[0]
        return next((n.node_id for n in self.nodes if n.address == address), link["url"])

    def _line(self, t: float, event: str, src: str = HARNESS, **fields: Any) -> dict[str, Any]:
        return {ts.ROUND: self.round_id, ts.T: round(t, 6), ts.EVENT: event, ts.SRC: src, **fields}

    def _report(self, error: str | None) -> dict[str, Any]:
        """Build the trace (if the fault happened) and the round's summary."""
        lines: list[dict[str, Any]] = []
        logs = {n.node_id: read_node_log(n.service.log_path) for n in self.nodes}
        granted = sorted({int(line["ttl"]) for entries in logs.values() for line in entries
                          if line["event"] == "lease granted" and "ttl" in line})
        primary = self.primary.node_id if self.primary else None
        start = self._line(self.t_start, ts.ROUND_START, **{
            ts.SCHEMA: ts.SCHEMA_VERSION, ts.RUN: self.run_id, ts.FAULT: self.fault,
            ts.LEASE_TTL_S: float(granted[-1] if granted else self.s.lease_ttl),
            ts.NODES: self.s.nodes, ts.NODE_IDS: self.node_ids, ts.LOAD_MSG_S: float(self.s.rate),
            "lease_ttl_requested_s": float(self.s.lease_ttl), "client_heartbeat_s": self.s.heartbeat,
            "reconnect_delay_s": self.s.reconnect_delay, "queue": QUEUE, "cluster": self.cluster,
            "via": self.case.via, **({"virtual_ip": self.lan.virtual_ip} if self.case.via == VIA_VIRTUAL_IP else {}),
            **({"cut_for_s": self.s.cut_for} if self.fault == ts.FAULT_CUT else {}),
        })
        if primary:
            start[ts.PRIMARY] = primary
        lines.append(start)

        # What the nodes logged about the election (upper bounds for the etcd events, see below).
        won_logged = {(node, int(line["term"])): line["_t"] for node, entries in logs.items() for line in entries
                      if line["event"] == "won election" and "term" in line}
        campaigns = sorted(line["_t"] for entries in logs.values() for line in entries
                           if line["event"] == "election decision" and line.get("decision") == "Campaign")

        # etcd: the leader key's deletions and creations, as the watch process saw them arrive.
        watch_lines = self.watch.lines if self.watch else []
        last_put = 0.0
        for item in watch_lines:
            t, kind = float(item.get("t", 0)), item.get("kind")
            if self.t_teardown is not None and t >= self.t_teardown:
                break
            if kind == "delete":
                # A node campaigns only after it read that the key is gone, so a campaign decision
                # shortly before the watch's report bounds the deletion too.  (Nodes that lose an
                # election also log Campaign, just after the winner's put: hence the window.)
                campaign = next((c for c in campaigns if max(last_put, t - CAMPAIGN_WINDOW) < c < t), None)
                extra: dict[str, Any] = {"revision": item.get("revision"), "t_watch": round(t, 6)}
                if campaign is not None and campaign < t:
                    extra["t_first_campaign"] = round(campaign, 6)
                lines.append(self._line(min(t, campaign if campaign is not None else t), ts.LEADER_KEY_GONE,
                                        observed="etcd watch (earliest of watch and a node's campaign decision)",
                                        **extra))
            elif kind == "put" and item.get("version") == 1:
                last_put = t
                node, term = str(item.get("node")), int(item.get("revision", 0))
                logged = won_logged.get((node, term))
                extra = {"t_watch": round(t, 6)}
                if logged is not None:
                    extra["t_node_log"] = round(logged, 6)
                lines.append(self._line(min(t, logged if logged is not None else t), ts.ELECTION_WON,
                                        **{ts.NODE: node, ts.TERM: term},
                                        observed="etcd watch and the winner's log (earliest)", **extra))
            elif kind == "error":
                self.notes.append(f"etcd watch: {item.get('error')}")

        # The nodes' own logs: becoming primary; the primary's view of its backups.
        node_problems: list[str] = []
        for node in self.nodes:
            node_id, poller = node.node_id, node.poller
            for line in logs[node_id]:
                t, name = line["_t"], line["event"]
                if self.t_teardown is not None and t >= self.t_teardown:
                    break
                if name == "state change":
                    before, now = str(line.get("previous", "")), str(line.get("now", ""))
                    if now.startswith("primary") and not before.startswith("primary"):
                        term = _TERM.search(now)
                        seen = poller.first_primary_after(t) if poller else None
                        extra = {"observed": f"{node_id} log: state change", "trigger": line.get("trigger")}
                        if term:
                            extra[ts.TERM] = int(term.group(1))
                        if seen is not None:
                            extra["t_status"] = round(seen.t, 6)
                        lines.append(self._line(t, ts.PROMOTED, node_id, **{ts.NODE: node_id}, **extra))
                    elif before.startswith("primary") and not now.startswith("primary"):
                        lines.append(self._line(t, "stepped_down", node_id, **{ts.NODE: node_id},
                                                trigger=line.get("trigger"), now=now))
                elif name == "backup connected" and line.get("backup"):
                    lines.append(self._line(t, ts.BACKUP_REATTACHED, node_id, **{ts.NODE: str(line["backup"])},
                                            to=node_id, observed=f"{node_id} log: backup connected"))
                elif name == "backup ready" and line.get("backup"):
                    lines.append(self._line(t, ts.BACKUP_CAUGHT_UP, node_id, **{ts.NODE: str(line["backup"])},
                                            to=node_id, observed=f"{node_id} log: backup ready"))
                elif name in VIRTUAL_IP_EVENTS:
                    lines.append(self._line(t, VIRTUAL_IP_EVENTS[name], node_id, **{ts.NODE: node_id},
                                            observed=f"{node_id} log: {name}"))
                if line.get("level") in ("error", "critical") or name in ("illegal transition", "replication halted"):
                    details = {k: v for k, v in line.items() if k not in ("event", "timestamp", "_t", "level")}
                    node_problems.append(f"{node_id} {line['timestamp']}: {name} {json.dumps(details)}")

        if self.t_fault is not None:
            how = ({"link": "down"} if self.fault == ts.FAULT_CUT else
                   {ts.PID: self.fault_pids[0], "pids": self.fault_pids, "signal": SIGNALS[self.fault].name})
            lines.append(self._line(self.t_fault, ts.FAULT_INJECTED, **{ts.NODE: primary}, **how))
        if self.t_resume is not None:
            how = {"link": "up"} if self.fault == ts.FAULT_CUT else {"signal": "SIGCONT"}
            lines.append(self._line(self.t_resume, "fault_resumed", **{ts.NODE: primary}, **how))

        producer = self.producer.record if self.producer else None
        consumer = self.consumer.record if self.consumer else None
        for record in (producer, consumer):
            if record is None:
                continue
            for link in record["links"][1:]:
                lines.append(self._line(link["t"], ts.CLIENT_RECONNECTED, record["role"], **{
                    ts.CLIENT: record["role"], ts.NODE: self._node_of(link)}, link=link["no"]))
        first_after: list[Any] | None = None
        if producer is not None and self.t_fault is not None:
            links = producer["links"]
            first_after = next((ack for ack in producer["acks"]
                                if ack[0] >= self.t_fault and not self._to_faulted(links[ack[2]])), None)
            if first_after is not None:
                t, number, no = first_after
                lines.append(self._line(t, ts.FIRST_ACCEPTED_AFTER_FAULT, ts.PRODUCER, **{
                    ts.CLIENT: ts.PRODUCER, ts.NODE: self._node_of(links[no])}, number=number,
                    observed="harness, from the producer's acknowledgements"))
            lines.extend(self._ack_lines(producer))

        tally, fencing = self._tally(producer, consumer)
        if self.t_fault is not None and tally is not None:
            lines.append(self._line(time.time(), ts.TALLY, **tally))
        lines.append(self._line(time.time(), ts.ROUND_END))

        wrote = None
        if self.t_fault is not None:  # a round without a fault has nothing to analyse
            middle = sorted(lines[1:-1], key=lambda line: line[ts.T])
            self.s.out.mkdir(parents=True, exist_ok=True)
            wrote = self.s.out / f"{self.round_id}{ts.TRACE_SUFFIX}"
            with open(wrote, "w", encoding="utf-8") as out:
                for line in [lines[0], *middle, lines[-1]]:
                    out.write(json.dumps(line, separators=(",", ":")) + "\n")
        return self._summary(error, lines, tally, fencing, node_problems, producer, wrote)

    def _ack_lines(self, producer: dict[str, Any]) -> list[dict[str, Any]]:
        """``acks`` lines: the producer's acceptances per 100 ms bucket (bucket 0 starts at round_start),
        every bucket from its start to its end, empty ones included, ten buckets a line."""
        def bucket(t: float) -> int:
            return int((t - self.t_start) * 1000 // ts.ACK_BUCKET_MS)

        counts: dict[int, int] = {}
        for t, _, _ in producer["acks"]:
            counts[bucket(t)] = counts.get(bucket(t), 0) + 1
        first, last = bucket(producer["started"]), bucket(producer["finished"] or time.time())
        lines = []
        for k in range(first, last + 1, 10):
            n = [counts.get(i, 0) for i in range(k, min(k + 10, last + 1))]
            lines.append(self._line(self.t_start + (k + len(n)) * ts.ACK_BUCKET_MS / 1000, ts.ACKS, ts.PRODUCER,
                                    **{ts.K: k, ts.N: n}))
        return lines

    def _tally(self, producer: dict[str, Any] | None,
               consumer: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        if producer is None or consumer is None:
            return None, {}
        acked = {number for _, number, _ in producer["acks"]}
        received = [number for _, number, _ in consumer["received"]]
        seen = set(received)
        lost = sorted(acked - seen)
        tally = {
            ts.SENT: producer["issued"],
            ts.ACKNOWLEDGED: len(acked),
            ts.RECEIVED: len(received),
            ts.LOST_ACKNOWLEDGED: len(lost),
            ts.DUPLICATED: len(received) - len(seen),
            "transfers": producer["transfers"],
            "resent": producer["resent"],
            "rejected": len(producer["rejected"]),
            "released": producer["released"],
            "unsettled_at_end": producer["in_flight"],
            "received_not_acknowledged": len(seen - acked),
            "empty_messages_received": len(consumer["empty"]),
            "undecodable_messages_received": len(consumer["undecodable"]),
            "lost_numbers": lost[:20],
        }
        fencing: dict[str, Any] = {}
        if self.t_fault is not None and self.primary is not None:
            links = producer["links"]
            from_faulted = [t for t, _, no in producer["acks"] if t >= self.t_fault and self._to_faulted(links[no])]
            fencing["acks_from_faulted_after_fault"] = len(from_faulted)
            if from_faulted:
                fencing["last_ack_from_faulted_after_fault_s"] = round(max(from_faulted) - self.t_fault, 6)
            if self.fault == ts.FAULT_SIGSTOP:
                after = [t for t in from_faulted if self.t_resume is not None and t >= self.t_resume]
                fencing["acks_from_resumed_old_primary"] = len(after) if self.t_resume is not None else None
                fencing["producer_links_to_old_primary_after_fault"] = sum(
                    1 for link in links if link["t"] >= self.t_fault and self._to_faulted(link))
                probe = self.probe.record if self.probe else None
                if probe is not None:  # pinned to the old primary, still connected when it resumed
                    acks = [t for t, _, _ in probe["acks"]]
                    resumed = self.t_resume
                    fencing["probe_acks_after_resume"] = (sum(1 for t in acks if t >= resumed)
                                                          if resumed is not None else None)
                    fencing["probe_acks_during_pause"] = sum(
                        1 for t in acks if t >= self.t_fault and (resumed is None or t < resumed))
                    fencing["probe_sent"] = probe["issued"]
                    fencing["probe_unsettled_at_end"] = probe["in_flight"]
                    fencing["probe_connected_at_resume"] = resumed is not None and not any(
                        self.t_fault <= n["t"] < resumed for n in probe["notes"]
                        if n["kind"] in ("disconnected", "refused", "transport_error"))
                    fencing["probe_disconnected_after_resume_s"] = next(
                        (round(n["t"] - resumed, 6) for n in probe["notes"]
                         if resumed is not None and n["t"] >= resumed and n["kind"] in ("disconnected", "refused")),
                        None)
            tally.update(fencing)
        return tally, fencing

    def _summary(self, error: str | None, lines: list[dict[str, Any]], tally: dict[str, Any] | None,
                 fencing: dict[str, Any], node_problems: list[str], producer: dict[str, Any] | None,
                 wrote: Path | None) -> dict[str, Any]:
        t_fault = None if self.t_fault is None else round(self.t_fault, 6)

        def first(event: str, **match: Any) -> dict[str, Any] | None:
            if t_fault is None:
                return None
            candidates = [line for line in lines if line[ts.EVENT] == event and line[ts.T] >= t_fault
                          and all(line.get(k) == v for k, v in match.items())]
            return min(candidates, key=lambda line: line[ts.T], default=None)

        def rel(line: dict[str, Any] | None) -> float | None:
            return None if line is None or t_fault is None else round(line[ts.T] - t_fault, 6)

        milestones = {
            "leader_key_gone": rel(first(ts.LEADER_KEY_GONE)),
            "election_won": rel(first(ts.ELECTION_WON)),
            "promoted": rel(first(ts.PROMOTED)),
            "client_reconnected": rel(first(ts.CLIENT_RECONNECTED)),
            "producer_reconnected": rel(first(ts.CLIENT_RECONNECTED, client=ts.PRODUCER)),
            "consumer_reconnected": rel(first(ts.CLIENT_RECONNECTED, client=ts.CONSUMER)),
            "first_accepted_after_fault": rel(first(ts.FIRST_ACCEPTED_AFTER_FAULT)),
            "backup_reattached": rel(first(ts.BACKUP_REATTACHED)),
            "backup_caught_up": rel(first(ts.BACKUP_CAUGHT_UP)),
            "resumed": None if self.t_resume is None or t_fault is None else round(self.t_resume - t_fault, 6),
        }
        misplaced = None
        if self.case.via == VIA_VIRTUAL_IP:
            new_id = self.new_primary.node_id if self.new_primary else None
            old_id = self.primary.node_id if self.primary else None
            milestones["virtual_ip_announced"] = rel(first(VIRTUAL_IP_ANNOUNCED, node=new_id))
            milestones["virtual_ip_released_by_faulted"] = rel(first(VIRTUAL_IP_REMOVED, node=old_id))
            misplaced = self._virtual_ip_misplaced()
            if misplaced:
                self.notes.append(misplaced)
        backups = {}
        for node in self.nodes:
            if node is self.new_primary:
                continue
            reattached = first(ts.BACKUP_REATTACHED, node=node.node_id)
            caught_up = first(ts.BACKUP_CAUGHT_UP, node=node.node_id)
            if reattached or caught_up:
                backups[node.node_id] = {"reattached": rel(reattached), "caught_up": rel(caught_up)}
        # Every surviving backup caught up with the new primary: until then a recovering primary
        # holds each new message for them (released early only if a consumer takes it first).
        survivors = [n.node_id for n in self.nodes if n is not self.primary and n is not self.new_primary]
        promoted_line = first(ts.PROMOTED, node=self.new_primary.node_id) if self.new_primary else None
        ready = []
        for node_id in survivors:
            line = None
            if promoted_line is not None:
                caught = [x for x in lines if x[ts.EVENT] == ts.BACKUP_CAUGHT_UP and x.get(ts.NODE) == node_id
                          and x.get("to") == self.new_primary.node_id and x[ts.T] >= promoted_line[ts.T]]
                line = min(caught, key=lambda x: x[ts.T], default=None)
            ready.append(rel(line))
        milestones["surviving_backups_ready"] = (max(ready) if ready and None not in ready else None)
        phases = ph.durations(milestones)
        gap = None
        if producer is not None and t_fault is not None and producer["acks"]:
            times = [t for t, _, _ in producer["acks"]]
            before = [t for t in times if t < t_fault]
            after = [t for t in times if t >= t_fault]
            if before and after:
                sequence = [before[-1]] + after
                gap = round(max(b - a for a, b in zip(sequence, sequence[1:])), 6)
        ok = error is None and tally is not None and tally[ts.LOST_ACKNOWLEDGED] == 0 and not misplaced and not (
            self.fault == ts.FAULT_SIGSTOP and (fencing.get("acks_from_resumed_old_primary")
                                                or fencing.get("probe_acks_after_resume")))
        return {
            "round": self.round_id,
            "fault": self.fault,
            "via": self.case.via,
            "case": self.case.name,
            "index": self.index,
            "ok": ok,
            "faulted": self.t_fault is not None,
            "error": error,
            "notes": self.notes,
            "primary": self.primary.node_id if self.primary else None,
            "new_primary": self.new_primary.node_id if self.new_primary else None,
            "unavailability_s": milestones["first_accepted_after_fault"],
            "largest_ack_gap_s": gap,
            "milestones_s": milestones,
            "phases_s": phases,
            "backups_s": backups,
            "tally": tally,
            "fencing": fencing,
            "node_problems": node_problems[:20],
            "client_errors": [e for c in (self.producer, self.consumer) if c and c.record for e in c.record["errors"]][:5],
            "virtual_ip_holders": self.virtual_ip_holders,
            "virtual_ip_misplaced": misplaced,
            "trace": str(wrote) if wrote else None,
            "logs": str(self.logs),
        }

    def _virtual_ip_misplaced(self) -> str | None:
        """What is wrong with where the virtual IP was once the round recovered, if anything: it must be on the
        new primary only, and on the faulted host too after kill -9 of supervisor and node (nothing there can
        remove it: docs/lifecycle.md section 14)."""
        if self.virtual_ip_holders is None or self.new_primary is None:
            return None
        expected = {self.new_primary.node_id}
        if self.fault == ts.FAULT_KILL9:
            expected.add(self.primary.node_id)
        if set(self.virtual_ip_holders) == expected:
            return None
        return f"virtual IP on {self.virtual_ip_holders or 'no host'} once recovered, expected on {sorted(expected)}"


# -- reporting -----------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def progress(result: dict[str, Any], total: int) -> None:
    head = f"{result['case']:<8} round {result['index']:>2}/{total}"
    if result["error"] and result["unavailability_s"] is None:
        print(f"{head}  *** FAILED *** {result['error']}", flush=True)
        return
    p = result["phases_s"]
    tally = result["tally"] or {}
    fencing = result["fencing"]
    extra = ""
    if result["fault"] == ts.FAULT_SIGSTOP:
        extra = (f"  acks by the resumed old primary: producer {fencing.get('acks_from_resumed_old_primary')},"
                 f" probe {fencing.get('probe_acks_after_resume')}"
                 f" (probe connected at resume: {fencing.get('probe_connected_at_resume')})")
    milestones = result["milestones_s"]
    if result["via"] == VIA_VIRTUAL_IP:
        extra += (f"  virtual IP announced by the new primary {_fmt(milestones['virtual_ip_announced'], ' s')},"
                  f" removed by the old one {_fmt(milestones['virtual_ip_released_by_faulted'], ' s')}")
    if milestones["resumed"] is not None:
        extra += f"  {'reconnected' if result['fault'] == ts.FAULT_CUT else 'resumed'} {milestones['resumed']:.2f} s"
    print(f"{head}  {result['primary']}->{result['new_primary']}  unavailable {_fmt(result['unavailability_s'], ' s')}"
          f" (detect {_fmt(p['detection'])} elect {_fmt(p['election'], digits=3)} promote {_fmt(p['promotion'], digits=3)}"
          f" reconnect {_fmt(p['reconnect'])} first-send {_fmt(p['first_send'])}; backup reattach {_fmt(p['reattach'])})"
          f"  acked {tally.get(ts.ACKNOWLEDGED, '-')} lost {tally.get(ts.LOST_ACKNOWLEDGED, '-')}"
          f" dup {tally.get(ts.DUPLICATED, '-')}{extra}"
          + ("" if result["ok"] else f"  *** {result['error'] or 'NOT OK'} ***"), flush=True)
    for problem in result["node_problems"][:3]:
        print(f"    node problem: {problem[:300]}", flush=True)
    for note in result["notes"]:
        print(f"    note: {note}", flush=True)


def _p50(values: list[float | None]) -> float | None:
    return nearest_rank([v for v in values if v is not None], 50)


def summarize(results: list[dict[str, Any]], settings: Settings) -> dict[str, Any]:
    """One row per case (``Case.name``: the fault alone on loopback)."""
    summary: dict[str, Any] = {}
    for case in settings.cases:
        fault = case.fault
        mine = [r for r in results if r["case"] == case.name]
        unavail = [r["unavailability_s"] for r in mine if r["unavailability_s"] is not None]
        tallies = [r["tally"] for r in mine if r["tally"]]
        row: dict[str, Any] = {
            "fault": fault,
            "via": case.via,
            "rounds": len(mine),
            "failed": sum(1 for r in mine if r["error"]),
            "failed_before_fault": sum(1 for r in mine if not r.get("faulted", r.get("trace") is not None)),
            "faulted": sum(1 for r in mine if r.get("faulted", r.get("trace") is not None)),
            "recovered": len(unavail),
            "unavailability_s": {"p50": nearest_rank(unavail, 50), "p90": nearest_rank(unavail, 90),
                                 "max": max(unavail, default=None), "min": min(unavail, default=None)},
            "surviving_backups_ready_s": {
                "p50": nearest_rank([r["milestones_s"]["surviving_backups_ready"] for r in mine
                                     if r["milestones_s"]["surviving_backups_ready"] is not None], 50),
                "max": max((r["milestones_s"]["surviving_backups_ready"] for r in mine
                            if r["milestones_s"]["surviving_backups_ready"] is not None), default=None)},
            "largest_ack_gap_s_p50": nearest_rank([r["largest_ack_gap_s"] for r in mine
                                                   if r["largest_ack_gap_s"] is not None], 50),
            "phases_s_p50": {name: nearest_rank([r["phases_s"][name] for r in mine if r["phases_s"][name] is not None], 50)
                             for name in map(ph.phase_name, ph.PHASES)},
            "lost_acknowledged": sum(t[ts.LOST_ACKNOWLEDGED] for t in tallies),
            "rounds_losing_acknowledged": sum(1 for t in tallies if t[ts.LOST_ACKNOWLEDGED]),
            "duplicated_total": sum(t[ts.DUPLICATED] for t in tallies),
            "duplicated_p50": nearest_rank([t[ts.DUPLICATED] for t in tallies], 50),
            "acknowledged_total": sum(t[ts.ACKNOWLEDGED] for t in tallies),
        }
        if fault == ts.FAULT_SIGSTOP:
            row["probe_connected_at_resume_rounds"] = sum(1 for r in mine if r["fencing"].get("probe_connected_at_resume"))
            row["acks_from_resumed_old_primary"] = sum((r["fencing"].get("acks_from_resumed_old_primary") or 0)
                                                       + (r["fencing"].get("probe_acks_after_resume") or 0)
                                                       for r in mine)
        if fault in (ts.FAULT_SIGSTOP, ts.FAULT_CUT):  # the undo let the clients through, not the failover
            row["recovered_after_undo"] = sum(1 for r in mine if r["unavailability_s"] is not None
                                              and r["milestones_s"]["resumed"] is not None
                                              and r["unavailability_s"] >= r["milestones_s"]["resumed"])
        if case.via == VIA_VIRTUAL_IP:
            row["virtual_ip_announced_s_p50"] = _p50([r["milestones_s"]["virtual_ip_announced"] for r in mine])
            row["virtual_ip_released_by_faulted_s_p50"] = _p50([r["milestones_s"]["virtual_ip_released_by_faulted"]
                                                                for r in mine])
            row["virtual_ip_misplaced_rounds"] = sum(1 for r in mine if r["virtual_ip_misplaced"])
        row["goals"] = _goals(fault, row, settings)
        summary[case.name] = row
    return summary


def _goals(fault: str, row: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Goal checks (stated for lease TTL 2 s): {name: {"goal", "measured", "met"}}."""
    goals: dict[str, Any] = {}
    u = row["unavailability_s"]
    wanted = GOALS.get(fault, {})
    if "unavailability_p50_s" in wanted:
        goals["unavailability_p50_s"] = {"goal": wanted["unavailability_p50_s"], "measured": u["p50"],
                                         "met": u["p50"] is not None and u["p50"] <= wanted["unavailability_p50_s"]}
    if "unavailability_max_s" in wanted:
        complete = row["recovered"] == row["faulted"]  # every faulted round recovered
        goals["unavailability_max_s"] = {"goal": wanted["unavailability_max_s"], "measured": u["max"],
                                         "met": complete and u["max"] is not None and u["max"] <= wanted["unavailability_max_s"]}
    goals["lost_acknowledged"] = {"goal": 0, "measured": row["lost_acknowledged"], "met": row["lost_acknowledged"] == 0}
    if fault == ts.FAULT_SIGSTOP:
        goals["acks_from_resumed_old_primary"] = {"goal": 0, "measured": row["acks_from_resumed_old_primary"],
                                                  "met": row["acks_from_resumed_old_primary"] == 0}
    if float(settings.lease_ttl) != GOAL_TTL:
        for goal in goals.values():
            goal["note"] = f"goal stated for lease TTL {GOAL_TTL:g} s"
    return goals


def print_summary(summary: dict[str, Any], settings: Settings) -> None:
    print(f"\nfailover summary: {settings.nodes} nodes, lease TTL {settings.lease_ttl} s, {settings.rate:g} msg/s; "
          "unavailability = fault -> first accepted send on the new primary (nearest-rank percentiles)")
    width = max([8, *(len(name) + 1 for name in summary)])
    header = (f"{'case':<{width}}{'faulted':>8}{'recov':>6}{'unavail p50':>12}{'p90':>7}{'max':>7}"
              f"{'ack gap p50':>12}{'lost acked':>11}{'dup total':>10}{'dup p50':>8}{'bk p50':>9}{'bk max':>7}  phases p50 s (detect/elect/promote/reconnect/first-send)")
    print("(bk: fault -> every surviving backup caught up with the new primary, s)")
    print(header)
    for fault, row in summary.items():
        u = row["unavailability_s"]
        p50 = row["phases_s_p50"]
        print(f"{fault:<{width}}{row['faulted']:>8}{row['recovered']:>6}{_fmt(u['p50'], ' s'):>12}{_fmt(u['p90']):>7}"
              f"{_fmt(u['max']):>7}{_fmt(row['largest_ack_gap_s_p50'], ' s'):>12}{row['lost_acknowledged']:>11}"
              f"{row['duplicated_total']:>10}{_fmt(row['duplicated_p50'], digits=0):>8}"
              f"{_fmt(row['surviving_backups_ready_s']['p50']):>9}{_fmt(row['surviving_backups_ready_s']['max']):>7}  "
              f"{_fmt(p50['detection'])}/{_fmt(p50['election'], digits=3)}/{_fmt(p50['promotion'], digits=3)}/"
              f"{_fmt(p50['reconnect'])}/{_fmt(p50['first_send'])}  reattach {_fmt(p50['reattach'])}")
    for fault, row in summary.items():
        if row["failed_before_fault"]:
            print(f"{fault}: {row['failed_before_fault']} of {row['rounds']} rounds failed before the fault "
                  "(see the round's error; not counted in the figures)")
    print("\ngoals (at lease TTL 2 s):")
    for fault, row in summary.items():
        for name, goal in row["goals"].items():
            verdict = "met" if goal["met"] else "MISSED"
            measured = goal["measured"]
            by = ""
            if (not goal["met"] and isinstance(measured, (int, float)) and isinstance(goal["goal"], (int, float))
                    and measured > goal["goal"]):
                by = f" (by {measured - goal['goal']:.3g})"
            elif not goal["met"] and name == "unavailability_max_s":
                by = f" ({row['faulted'] - row['recovered']} faulted rounds did not recover)"
            print(f"  {fault:<{width}} {name:<32} goal {goal['goal']:<5} measured {measured}{by}  {verdict}"
                  + (f"  [{goal['note']}]" if goal.get("note") else ""))


# -- main ----------------------------------------------------------------------------------------


def parse_cases(text: str, via: str) -> list[Case]:
    """``kill,stop,urls:cut`` -> the cases: each fault through ``via``, or through the way written before it."""
    cases: list[Case] = []
    for entry in (part.strip().lower() for part in text.split(",") if part.strip()):
        where, _, name = entry.rpartition(":")
        if (where or via) not in VIAS:
            raise ValueError(f"unknown way {where!r} in {entry!r}: use {', '.join(VIAS)}")
        if name not in FAULT_ALIASES:
            raise ValueError(f"unknown fault {name!r}: use kill, stop, term, kill9-broker, cut")
        case = Case(FAULT_ALIASES[name], where or via)
        if case.fault == ts.FAULT_CUT and not case.on_lan:
            raise ValueError("cut needs the LAN of namespaces: --via urls or virtual-ip, or write urls:cut")
        if case not in cases:
            cases.append(case)
    if not cases:
        raise ValueError("no fault given")
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds per fault type")
    parser.add_argument("--faults", default="kill,stop,term",
                        help="comma-separated: kill (SIGKILL), stop (SIGSTOP 2 x TTL), term (SIGTERM), "
                             "kill9-broker (SIGKILL of the broker under serve --supervise), cut (on a LAN: the "
                             "primary's link down for --cut-for s); VIA:FAULT runs one fault another way (urls:cut)")
    parser.add_argument("--via", choices=VIAS, default=VIA_LOOPBACK,
                        help="how the clients reach the nodes: loopback (every node's URL, 127.0.0.1), urls (nodes "
                             "on a LAN of network namespaces, every node's address), virtual-ip (on the LAN, only "
                             "the virtual IP the primary holds); the LAN needs root")
    parser.add_argument("--cut-for", type=float, default=CUT_FOR, help="seconds a cut link stays down")
    parser.add_argument("--lease-ttl", type=int, default=LEASE_TTL.default, help="etcd lease TTL of the nodes, seconds "
                        f"({LEASE_TTL.describe()})")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200.0, help="producer messages per second")
    parser.add_argument("--out", type=Path, help="trace directory (default results/failover-traces-<UTC>/)")
    parser.add_argument("--results", type=Path, default=DEFAULT_OUT, help="where the summary JSON goes")
    parser.add_argument("--steady", type=float, default=2.5, help="seconds of acknowledged load before the fault")
    parser.add_argument("--steady-after", type=float, default=2.0, help="seconds of load after recovery")
    parser.add_argument("--client-heartbeat", type=float, default=HEARTBEAT,
                        help="clients' idle timeout, seconds (detects a SIGSTOPped node)")
    parser.add_argument("--recovery-timeout", type=float, default=30.0)
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep every round's node logs (default: only rounds with a problem)")
    args = parser.parse_args(argv)
    try:
        cases = parse_cases(args.faults, args.via)
    except ValueError as error:
        parser.error(f"--faults: {error}")
    if args.nodes < 2:
        parser.error("--nodes must be at least 2 (a primary and a backup)")
    if not LEASE_TTL.accepts(args.lease_ttl):
        parser.error(f"--lease-ttl must be {LEASE_TTL.describe()}")
    if args.rounds < 1 or args.rate <= 0 or args.cut_for <= 0:
        parser.error("--rounds, --rate and --cut-for must be positive")
    if any(case.on_lan for case in cases) and os.geteuid() != 0:
        parser.error("the LAN of network namespaces (--via urls, virtual-ip) needs root")
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    settings = Settings(
        rounds=args.rounds, cases=cases, lease_ttl=args.lease_ttl, nodes=args.nodes, rate=args.rate,
        out=args.out or DEFAULT_OUT / f"failover-traces-{stamp}", results=args.results, steady=args.steady,
        steady_after=args.steady_after, heartbeat=args.client_heartbeat, recovery_timeout=args.recovery_timeout,
        keep_logs=args.keep_logs, cut_for=args.cut_for,
    )
    run_id = f"failover-{stamp}"
    command = shlex.join([sys.executable, "-m", "benchmarks.failover", *(sys.argv[1:] if argv is None else argv)])
    host_at_start, code_at_start = host_info(), uncommitted_changes()  # the nodes run whatever is checked out
    logs = Path(tempfile.mkdtemp(prefix="failover-logs-"))
    print(f"failover: {settings.rounds} rounds x {', '.join(c.name for c in cases)}; {settings.nodes} nodes, lease TTL "
          f"{settings.lease_ttl} s, {settings.rate:g} msg/s; traces in {settings.out}; node logs in {logs}", flush=True)
    results: list[dict[str, Any]] = []
    interrupted = False
    main_thread = threading.current_thread() is threading.main_thread()
    # SIGTERM (e.g. from `timeout`) as Ctrl-C: the round's processes are stopped before exiting.
    previous_term = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    lan: FailoverLan | None = None
    try:
        if any(case.on_lan for case in cases):
            lan = FailoverLan(node_ids(settings))
        for index in range(1, settings.rounds + 1):
            for case in cases:  # alternate the cases, so machine noise hits all alike
                retried: list[str] = []
                for attempt in range(1, PORT_RETRIES + 2):
                    result = RoundRunner(settings, run_id, case, index, logs, lan).run()
                    result["notes"] = retried + result["notes"]
                    # free_port() races with other processes: a node that lost its port before the
                    # fault is a harness problem, not a failover result; run the round again.
                    if result["faulted"] or "Address already in use" not in (result["error"] or ""):
                        break
                    print(f"{case.name:<8} round {index:>2}: a node lost its port to another process; "
                          f"starting the round again", flush=True)
                    shutil.rmtree(logs / result["round"], ignore_errors=True)
                    retried.append(f"attempt {attempt} failed before the fault: {result['error'][:200]}")
                results.append(result)
                progress(result, settings.rounds)
                _keep_logs(result, settings, logs)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: every process of the round was stopped; summarising the finished rounds", flush=True)
    finally:
        if lan is not None:
            lan.close()
        if main_thread:
            signal.signal(signal.SIGTERM, previous_term)
    summary = summarize(results, settings)
    print_summary(summary, settings)
    report = {
        "benchmark": "failover",
        "command": command,
        "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(UTC) - started).total_seconds(), 1),
        "interrupted": interrupted,
        "host": host_at_start,
        "node_code": code_at_start,
        "settings": {"rounds": settings.rounds, "faults": list(dict.fromkeys(c.fault for c in cases)),
                     "cases": [{"name": c.name, "fault": c.fault, "via": c.via} for c in cases],
                     "cut_for_s": settings.cut_for, "lease_ttl_s": settings.lease_ttl,
                     "nodes": settings.nodes, "rate_msg_s": settings.rate, "steady_s": settings.steady,
                     "steady_after_s": settings.steady_after, "client_heartbeat_s": settings.heartbeat,
                     "reconnect_delay_s": settings.reconnect_delay, "recovery_timeout_s": settings.recovery_timeout},
        "traces": str(settings.out),
        "summary": summary,
        "rounds": results,
    }
    commit_at_end, code_at_end = host_info().get("git_commit"), uncommitted_changes()
    if (commit_at_end, code_at_end) != (host_at_start.get("git_commit"), code_at_start):
        report["node_code_changed_during_run"] = {"git_commit_at_end": commit_at_end, "node_code_at_end": code_at_end}
        print(f"WARNING: the node code changed during the run (commit {host_at_start.get('git_commit')} -> "
              f"{commit_at_end}); rounds before and after the change ran different code", flush=True)
    settings.results.mkdir(parents=True, exist_ok=True)
    path = settings.results / f"failover-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults: {path}\ntraces:  {settings.out}")
    shutil.rmtree(logs, ignore_errors=True)
    if (settings.out / "node-logs").exists():
        print(f"node logs: {settings.out / 'node-logs'}")
    bad = interrupted or any(not r["ok"] for r in results)
    return 1 if bad else 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _keep_logs(result: dict[str, Any], settings: Settings, logs: Path) -> None:
    """Copy a round's node and etcd logs next to the traces if it had a problem (or --keep-logs)."""
    slow = (result["unavailability_s"] or 0) > 2 * max(settings.lease_ttl, MIN_LEASE_TTL)
    problem = not result["ok"] or result["node_problems"] or result["notes"] or slow
    source = logs / result["round"]
    if (problem or settings.keep_logs) and source.exists():
        target = settings.out / "node-logs" / result["round"]
        target.mkdir(parents=True, exist_ok=True)
        for path in [*source.glob("*.log"), *source.glob("*.json")]:  # node/etcd logs, client records
            shutil.copy2(path, target / path.name)
        result["logs"] = str(target)
    else:
        result["logs"] = None
    shutil.rmtree(source, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
