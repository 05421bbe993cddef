"""A local cluster for trying hastandby out: a real etcd plus N nodes on loopback.

``hastandby cluster up`` starts them as background processes under a state
directory (logs, data dirs, pids in ``cluster.json``), waits until etcd has
elected a primary and the others are backups, and prints their URLs.
``cluster status`` asks every node; ``cluster down`` stops the nodes, then
etcd, each by its PID (SIGTERM, then SIGKILL after a grace period).

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
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .client import Login, ManagementClient, ManagementError, read_password
from .security.credentials import Credentials

STATE_FILE = "cluster.json"
USERS_FILE = "users.json"
ADMIN, PEER = "admin", "peer"


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


def _spawn(argv: list[str], log: Path) -> int:
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    return process.pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours is not alive
        return not open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    except OSError:
        return True


def _stop(pid: int, grace: float = 10.0) -> None:
    if not alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def node_state(address: str, login: Login) -> str:
    try:
        with ManagementClient(address, timeout=2, login=login) as client:
            status = client.request("STATUS")
    except ManagementError:
        return "unreachable"
    return status["state"] + (f" ({status['detail']})" if status.get("detail") else "")


def up(directory: Path, nodes: int = 3, base_port: int = 5672, etcd_port: int = 2379,
       lease_ttl: int = 2, timeout: float = 60.0) -> dict[str, Any]:
    """Start etcd and ``nodes`` nodes; returns the state written to ``cluster.json``."""
    directory = directory.resolve()
    if (directory / STATE_FILE).exists() and any(alive(p) for p in _pids(load(directory))):
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
    state["etcd"]["pid"] = _spawn([
        etcd, "--name", "hastandby-local", "--data-dir", str(directory / "etcd-data"),
        "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
        "--listen-peer-urls", f"http://127.0.0.1:{etcd_port + 1}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_port + 1}",
        "--initial-cluster", f"hastandby-local=http://127.0.0.1:{etcd_port + 1}",
    ], directory / "etcd.log")
    save(directory, state)
    _wait_port(etcd_port, timeout, "etcd")
    brokers = ",".join(f"127.0.0.1:{p}" for p in ports)
    for index, port in enumerate(ports, start=1):
        name = f"node{index}"
        argv = [sys.executable, "-m", "hastandby", "serve", "--listen", f"127.0.0.1:{port}",
                "--etcd", etcd_url, "--cluster", "local", "--node-id", name, "--brokers-url", brokers,
                "--lease-ttl", str(lease_ttl), "--data-dir", str(directory / name),
                "--no-allow-anonymous", "--users-file", str(_node_users(directory, name)),
                "--peer-user", PEER, "--peer-password-file", str(password_file(directory, PEER))]
        pid = _spawn(argv, directory / f"{name}.log")
        state["nodes"].append({"name": name, "address": f"127.0.0.1:{port}", "pid": pid})
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
        states = [node_state(n["address"], login) for n in state["nodes"]]
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


def _pids(state: dict[str, Any]) -> list[int]:
    return [n["pid"] for n in state.get("nodes", [])] + ([state["etcd"]["pid"]] if "pid" in state.get("etcd", {}) else [])


def status(directory: Path) -> list[tuple[str, str, str]]:
    state, login = load(directory), admin_login(directory)
    return [(n["name"], n["address"], node_state(n["address"], login) if alive(n["pid"]) else "stopped")
            for n in state["nodes"]]


def down(directory: Path) -> None:
    state = load(directory)
    for node in state["nodes"]:
        _stop(node["pid"])
    if "pid" in state["etcd"]:
        _stop(state["etcd"]["pid"])
    (directory.resolve() / STATE_FILE).unlink()
