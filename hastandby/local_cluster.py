"""A local cluster for trying hastandby out: a real etcd plus N nodes on loopback.

``hastandby cluster up`` starts them as background processes under a state
directory (logs, data dirs, PIDs in ``cluster.json``), waits until etcd has
elected a primary and the others are backups, and prints their URLs.  Each
node runs as in production, under ``serve --supervise``
(``host/supervisor.py``): a broker process that dies has its lease
revoked at once and is started again, and comes back as a backup.
``cluster status`` asks every node (its state, its supervisor's and its
broker process's PIDs); ``cluster down`` stops the nodes together, then etcd,
by PID (``local_processes.py``: SIGTERM, one deadline, SIGKILL for what is
left).

Authentication is on, as everywhere: the first ``up`` makes a users file in
the state directory with ``admin`` (group admin) and ``peer`` (group
cluster, what the backups authenticate as), each with a generated password
kept in ``<user>.password`` (mode 600) beside it, and prints how to use them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hastandby import settings
from hastandby.client import Login, ManagementClient, ManagementError, read_password
from hastandby.local_processes import Started, alive, spawn, stop_all
from hastandby.security.credentials import Credentials

STATE_FILE = "cluster.json"
USERS_FILE = "users.json"
ADMIN, PEER = "admin", "peer"
STATUS_TIMEOUT = 2.0  # seconds for one node's status (connect included): a node that takes longer is unreachable
NODE_GRACE = 6.0
"""Seconds the nodes have, together, to stop after SIGTERM before they are killed: a graceful stop (the
node revokes its lease and closes its connections and journal, its supervisor revokes what is left)
takes well under one."""
ETCD_GRACE = 2.0  # seconds etcd has to stop after the nodes


def password_file(directory: Path, user: str) -> Path:
    return directory.resolve() / f"{user}.password"


def admin_login(directory: Path) -> Login:
    return Login(ADMIN, read_password(password_file(directory, ADMIN)))


def _make_users(directory: Path) -> None:
    """The users file with admin and peer, and their passwords (kept from an earlier ``up``)."""
    users_path = directory / USERS_FILE
    if users_path.exists():
        return
    store = Credentials(users_path)
    for user, groups in ((ADMIN, ["admin"]), (PEER, ["cluster"])):
        password = secrets.token_urlsafe(18)
        path = password_file(directory, user)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(password + "\n")
        store.add(user, password, groups)
    store.save()


def _node_users(directory: Path, name: str) -> Path:
    """A node's own users file, seeded from the cluster's first one (as on machines of their own: the
    primary replicates every later change to it)."""
    path = directory / name / USERS_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(directory / USERS_FILE, path)
    return path


class ClusterError(Exception):
    """Something a person must fix (a port in use, no etcd binary, ...)."""


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class NodeView:
    """A node as ``cluster status`` shows it."""

    name: str
    address: str
    state: str  # its state (and detail), "unreachable" (not answering: e.g. being restarted) or "stopped"
    supervisor: int | None  # PID of its ``serve --supervise`` process; None when stopped
    broker: int | None  # PID of the broker process under it, when the node answers


def _ask_status(address: str, login: Login) -> dict[str, Any] | None:
    """The node's STATUS reply, or None if it does not answer within STATUS_TIMEOUT."""
    try:
        with ManagementClient(address, timeout=STATUS_TIMEOUT, login=login) as client:
            return dict(client.request("STATUS"))
    except ManagementError:
        return None


def _state_words(status: dict[str, Any] | None) -> str:
    if status is None:
        return "unreachable"
    return str(status["state"]) + (f" ({status['detail']})" if status.get("detail") else "")


def up(directory: Path, nodes: int = settings.LOCAL_NODES.default, base_port: int = settings.LOCAL_BASE_PORT.default,
       etcd_port: int = settings.LOCAL_ETCD_PORT.default, lease_ttl: int = settings.LEASE_TTL.default,
       timeout: float = 60.0, serve_args: Sequence[str] = ()) -> dict[str, Any]:
    """Start etcd and ``nodes`` nodes; returns the state written to ``cluster.json``.

    ``serve_args`` go to every node's ``serve`` (e.g. ``--on-role-change``, ``--virtual-ip``).  The numbers
    are checked against ``settings`` first (``ClusterError``).
    """
    try:
        for setting, value in ((settings.LOCAL_NODES, nodes), (settings.LOCAL_BASE_PORT, base_port),
                               (settings.LOCAL_ETCD_PORT, etcd_port), (settings.LEASE_TTL, lease_ttl)):
            setting.check(value)
        settings.check_local_ports(nodes, base_port, etcd_port)
    except settings.SettingError as error:
        raise ClusterError(str(error)) from None
    directory = directory.resolve()
    if running(directory):
        raise ClusterError(f"a cluster is already running from {directory} (hastandby cluster down)")
    etcd = shutil.which("etcd")
    if etcd is None:
        raise ClusterError("no etcd binary on PATH: apt-get install etcd-server (scripts/setup does)")
    ports = [base_port + i for i in range(nodes)]
    busy = [p for p in ports + [etcd_port, etcd_port + 1] if not port_free(p)]
    if busy:
        raise ClusterError(f"ports in use: {busy}; choose others with --base-port / --etcd-port")
    directory.mkdir(parents=True, exist_ok=True)
    _make_users(directory)
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    state: dict[str, Any] = {"directory": str(directory), "etcd": {"url": etcd_url}, "nodes": []}
    shutil.rmtree(directory / "etcd-data", ignore_errors=True)
    state["etcd"].update(spawn([
        etcd, "--name", "hastandby-local", "--data-dir", str(directory / "etcd-data"),
        "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
        "--listen-peer-urls", f"http://127.0.0.1:{etcd_port + 1}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_port + 1}",
        "--initial-cluster", f"hastandby-local=http://127.0.0.1:{etcd_port + 1}",
    ], directory / "etcd.log").as_dict())
    save(directory, state)
    _wait_port(etcd_port, timeout, "etcd")
    brokers = ",".join(f"127.0.0.1:{p}" for p in ports)
    for index, port in enumerate(ports, start=1):
        name = f"node{index}"
        argv = [sys.executable, "-m", "hastandby", "serve", "--supervise", "--listen", f"127.0.0.1:{port}",
                "--etcd", etcd_url, "--cluster", "local", "--node-id", name, "--brokers-url", brokers,
                "--lease-ttl", str(lease_ttl), "--data-dir", str(directory / name),
                "--no-allow-anonymous", "--users-file", str(_node_users(directory, name)),
                "--peer-user", PEER, "--peer-password-file", str(password_file(directory, PEER)), *serve_args]
        started = spawn(argv, directory / f"{name}.log")
        state["nodes"].append({"name": name, "address": f"127.0.0.1:{port}", **started.as_dict()})
        save(directory, state)
    _wait_roles(state, admin_login(directory), timeout)
    return state


def _wait_port(port: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise ClusterError(f"{what} did not start listening on port {port} within {timeout:.0f} s")


def _wait_roles(state: dict[str, Any], login: Login, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    states: list[str] = []
    while time.monotonic() < deadline:
        states = [_state_words(_ask_status(n["address"], login)) for n in state["nodes"]]
        primaries = [s for s in states if s.startswith("primary")]
        if len(primaries) == 1 and all(s.startswith(("primary", "backup")) for s in states):
            return
        time.sleep(0.2)
    raise ClusterError(f"cluster did not settle within {timeout:.0f} s: {states}")


def save(directory: Path, state: dict[str, Any]) -> None:
    (directory / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")


def load(directory: Path) -> dict[str, Any]:
    path = directory.resolve() / STATE_FILE
    if not path.exists():
        raise ClusterError(f"no cluster state in {path.parent} (start one with hastandby cluster up)")
    return json.loads(path.read_text())


def running(directory: Path) -> bool:
    """Is a process of a cluster started from ``directory`` still running?"""
    if not (directory.resolve() / STATE_FILE).exists():
        return False
    state = load(directory)
    records = state.get("nodes", []) + ([state["etcd"]] if "pid" in state.get("etcd", {}) else [])
    return any(alive(Started.from_record(record)) for record in records)


def status(directory: Path) -> list[NodeView]:
    state, login = load(directory), admin_login(directory)
    views = []
    for node in state["nodes"]:
        process = Started.from_record(node)
        if not alive(process):
            views.append(NodeView(node["name"], node["address"], "stopped", None, None))
            continue
        reply = _ask_status(node["address"], login)
        views.append(NodeView(node["name"], node["address"], _state_words(reply), process.pid,
                              reply.get("pid") if reply is not None else None))
    return views


def down(directory: Path) -> list[str]:
    """Stop the nodes together, then etcd (the nodes revoke their leases in it on the way out); returns the
    names of those that did not stop in time and were killed."""
    state = load(directory)
    nodes = {node["name"]: Started.from_record(node) for node in state["nodes"]}
    killed = stop_all(nodes.values(), NODE_GRACE)
    names = [name for name, process in nodes.items() if process in killed]
    if "pid" in state["etcd"] and stop_all([Started.from_record(state["etcd"])], ETCD_GRACE):
        names.append("etcd")
    (directory.resolve() / STATE_FILE).unlink()
    return names
