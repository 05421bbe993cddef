"""``hastandby cluster up|status|down``: the local cluster of the README's quick start, for real.

A real etcd and three real nodes on free ports under a state directory of the
test's own; authentication is on (the cluster makes its admin and peer users).
Each node runs under ``serve --supervise`` as in production: a broker process
killed with SIGKILL comes back as a backup.  ``cluster down`` and SIGTERM to
``cluster up --foreground`` stop everything within 10 s, also with a node
already dead or one frozen (the times are printed: ``pytest -s``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hastandby.local_cluster import port_free
from hastandby.local_processes import Started, alive, children
from hastandby.testing.nodes import REPO, free_port
from hastandby.testing.waiting import wait_for

pytestmark = pytest.mark.etcd

STOP_BOUND = 10.0  # seconds a stop may take, whatever state the nodes are in
LINE = re.compile(r"^(?P<name>node\d+)\s+amqp://(?P<address>\S+)\s+(?P<state>.+?)"
                  r"(?:\s+pid supervisor (?P<supervisor>\d+)(?:, broker (?P<broker>\d+))?)?$")


def _environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HASTANDBY_")}
    environment.update(extra or {})
    return environment


def hastandby(*args: str, env: dict[str, str] | None = None, timeout: float = 90.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hastandby", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=_environment(env))


def ports() -> list[str]:
    """Free ports for three nodes and etcd (its client port and the peer port after it, as ``cluster up`` uses)."""
    base = free_port()
    while not all(port_free(base + i) for i in range(3)):
        base = free_port()
    etcd = free_port()
    while not port_free(etcd + 1) or etcd in range(base - 1, base + 3):
        etcd = free_port()
    return ["--base-port", str(base), "--etcd-port", str(etcd)]


def nodes(output: str) -> dict[str, dict[str, str | None]]:
    """``cluster up`` / ``cluster status`` lines by node name: address, state, supervisor and broker PIDs."""
    found = {}
    for line in output.splitlines():
        match = LINE.match(line)
        if match:
            found[match["name"]] = match.groupdict()
    return found


def status(directory: Path) -> dict[str, dict[str, str | None]]:
    done = hastandby("cluster", "status", "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    return nodes(done.stdout)


def in_state(directory: Path, name: str, state: str) -> dict[str, str | None] | None:
    """Node ``name`` as ``cluster status`` shows it, if in ``state``."""
    node = status(directory)[name]
    return node if node["state"] == state else None


def processes(directory: Path) -> list[Started]:
    """Every process the cluster runs now: etcd, the supervisors and the broker processes under them."""
    state = json.loads((directory / "cluster.json").read_text())
    supervisors = [Started.from_record(n) for n in state["nodes"]]
    brokers = [Started(pid) for s in supervisors for pid in children(s.pid)]
    return supervisors + brokers + [Started.from_record(state["etcd"])]


def kill_left(started: list[Started]) -> None:
    """Never leave a process behind, even when the test failed."""
    for process in started:
        if alive(process):
            os.kill(process.pid, signal.SIGKILL)


@pytest.fixture
def cluster_dir(tmp_path):
    """A cluster started in the background (``cluster up``); whatever is left of it is killed at the end."""
    directory = tmp_path / "cluster"
    up = hastandby("cluster", "up", "--dir", str(directory), *ports())
    assert up.returncode == 0, up.stdout + up.stderr
    started = processes(directory)
    yield directory, up.stdout
    kill_left(started + (processes(directory) if (directory / "cluster.json").exists() else []))


def timed_down(directory: Path) -> float:
    begun = time.monotonic()
    down = hastandby("cluster", "down", "--dir", str(directory))
    took = time.monotonic() - begun
    assert down.returncode == 0 and "cluster stopped" in down.stdout, down.stdout + down.stderr
    return took


def test_cluster_up_authenticates_and_down_stops_everything(cluster_dir):
    directory, output = cluster_dir
    assert "primary (active)" in output and output.count(" backup ") == 2, output
    shown = nodes(output)
    assert all(n["supervisor"] and n["broker"] for n in shown.values()), output
    password_file = directory / "admin.password"
    assert f"HASTANDBY_PASSWORD_FILE={password_file}" in output
    assert oct(password_file.stat().st_mode & 0o777) == "0o600"
    first = json.loads((directory / "cluster.json").read_text())["nodes"][0]["address"]
    anonymous = hastandby("status", "-b", first)
    assert anonymous.returncode != 0 and "unauthorized-access" in anonymous.stderr, anonymous.stderr
    admin = {"HASTANDBY_USER": "admin", "HASTANDBY_PASSWORD_FILE": str(password_file)}
    every = hastandby("status", "--all", "-b", first, env=admin)
    assert every.returncode == 0 and every.stdout.count("backup") == 2, every.stdout + every.stderr
    assert status(directory) == shown
    started = processes(directory)
    assert timed_down(directory) < STOP_BOUND
    assert not any(alive(p) for p in started)


def test_a_killed_broker_process_comes_back_as_a_backup(cluster_dir):
    directory, output = cluster_dir
    shown = nodes(output)
    old = next(name for name, n in shown.items() if n["state"] == "primary (active)")
    killed, supervisor = int(shown[old]["broker"] or 0), shown[old]["supervisor"]
    begun = time.monotonic()
    os.kill(killed, signal.SIGKILL)
    new = wait_for(lambda: next((name for name, n in status(directory).items()
                                 if name != old and n["state"] == "primary (active)"), None), 20, "a new primary")
    elected = time.monotonic() - begun
    back = wait_for(lambda: in_state(directory, old, "backup"), 30, f"{old} back as a backup")
    returned = time.monotonic() - begun
    print(f"\nkill -9 of {old}'s broker process (primary): {new} primary after {elected:.2f} s (status polled), "
          f"{old} a backup again after {returned:.2f} s")
    assert back["supervisor"] == supervisor and back["broker"] not in (None, str(killed))


def test_down_with_a_node_dead_is_quick_and_with_one_frozen_bounded(tmp_path):
    """Two clusters: the primary's supervisor killed (the node stays down, a backup takes over after the
    TTL) then ``down``; both backups' broker processes frozen (SIGSTOP: SIGTERM waits), then ``down``."""
    figures = []
    for case in ("dead", "frozen"):
        directory = tmp_path / case
        up = hastandby("cluster", "up", "--dir", str(directory), *ports())
        assert up.returncode == 0, up.stdout + up.stderr
        started = processes(directory)
        try:
            shown = nodes(up.stdout)
            if case == "dead":
                primary = next(name for name, n in shown.items() if n["state"] == "primary (active)")
                killed_at = time.monotonic()
                os.kill(int(shown[primary]["supervisor"] or 0), signal.SIGKILL)
                wait_for(lambda: any(n["state"] == "primary (active)" for n in status(directory).values()), 20,
                         "a backup took over")
                figures.append(f"primary's supervisor killed: a backup primary after "
                               f"{time.monotonic() - killed_at:.2f} s (lease TTL 2 s)")
                assert in_state(directory, primary, "stopped")
            else:  # stopped node by node, with a grace period each, two frozen nodes cost two grace periods
                for node in shown.values():
                    if node["state"] == "backup":
                        os.kill(int(node["broker"] or 0), signal.SIGSTOP)
            took = timed_down(directory)
            figures.append(f"down with {'a node dead' if case == 'dead' else 'two nodes frozen'}: {took:.2f} s")
            assert took < STOP_BOUND, figures
            assert not any(alive(p) for p in started)
        finally:
            kill_left(started)
    print(f"\n{'; '.join(figures)}")


def test_sigterm_to_a_foreground_cluster_stops_what_it_started_even_with_a_node_dead(tmp_path):
    directory = tmp_path / "cluster"
    runner = subprocess.Popen([sys.executable, "-m", "hastandby", "cluster", "up", "--foreground",
                               "--dir", str(directory), *ports()], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=_environment())
    started: list[Started] = []
    try:
        deadline = time.monotonic() + 90
        output = ""
        while "stops the cluster" not in output and time.monotonic() < deadline and runner.poll() is None:
            output += runner.stdout.readline()
        assert "stops the cluster" in output, output
        started = processes(directory)
        assert all(alive(p) for p in started)
        victim = next(n for n in nodes(output).values() if n["state"] == "backup")
        os.kill(int(victim["supervisor"] or 0), signal.SIGKILL)
        begun = time.monotonic()
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(30) == 0
        took = time.monotonic() - begun
        print(f"\nSIGTERM to cluster up --foreground, a node dead: stopped in {took:.2f} s")
        assert took < STOP_BOUND
        assert "cluster stopped" in runner.stdout.read()
        assert not any(alive(p) for p in started), "SIGTERM left processes running"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(5)
        kill_left(started)
