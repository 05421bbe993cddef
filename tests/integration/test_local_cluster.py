"""``hastandby cluster up|status|down``: the local cluster of the README's quick start, for real.

A real etcd and three real nodes on free ports under a state directory of the
test's own; authentication is on (the cluster makes its admin and peer users),
and SIGTERM to ``cluster up --foreground`` stops everything it started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hastandby.local_cluster import alive, port_free
from tests.support.nodes import REPO, free_port

pytestmark = pytest.mark.etcd


def hastandby(*args: str, env: dict[str, str] | None = None, timeout: float = 90.0) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HASTANDBY_")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "hastandby", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=environment)


def ports() -> list[str]:
    base = free_port()
    while not all(port_free(base + i) for i in range(3)):
        base = free_port()
    return ["--base-port", str(base), "--etcd-port", str(free_port())]


def pids(directory: Path) -> list[int]:
    state = json.loads((directory / "cluster.json").read_text())
    return [n["pid"] for n in state["nodes"]] + [state["etcd"]["pid"]]


def test_cluster_up_authenticates_and_down_stops_everything(tmp_path):
    directory = tmp_path / "cluster"
    up = hastandby("cluster", "up", "--dir", str(directory), *ports())
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "primary (active)" in up.stdout and up.stdout.count(" backup") == 2, up.stdout
        password_file = directory / "admin.password"
        assert f"HASTANDBY_PASSWORD_FILE={password_file}" in up.stdout
        assert oct(password_file.stat().st_mode & 0o777) == "0o600"
        first = json.loads((directory / "cluster.json").read_text())["nodes"][0]["address"]
        anonymous = hastandby("status", "-b", first)
        assert anonymous.returncode != 0 and "unauthorized-access" in anonymous.stderr, anonymous.stderr
        admin = {"HASTANDBY_USER": "admin", "HASTANDBY_PASSWORD_FILE": str(password_file)}
        every = hastandby("status", "--all", "-b", first, env=admin)
        assert every.returncode == 0 and every.stdout.count("backup") == 2, every.stdout + every.stderr
        status = hastandby("cluster", "status", "--dir", str(directory))
        assert status.returncode == 0 and "primary" in status.stdout
    finally:
        started = pids(directory) if (directory / "cluster.json").exists() else []
        down = hastandby("cluster", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    assert not any(alive(pid) for pid in started)


def test_sigterm_to_a_foreground_cluster_stops_what_it_started(tmp_path):
    directory = tmp_path / "cluster"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HASTANDBY_")}
    runner = subprocess.Popen([sys.executable, "-m", "hastandby", "cluster", "up", "--foreground",
                               "--dir", str(directory), *ports()], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=environment)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 90
        output = ""
        while "stops the cluster" not in output and time.monotonic() < deadline and runner.poll() is None:
            output += runner.stdout.readline()
        assert "stops the cluster" in output, output
        started = pids(directory)
        assert all(alive(pid) for pid in started)
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(30) == 0
        assert "cluster stopped" in runner.stdout.read()
        assert not any(alive(pid) for pid in started), "SIGTERM left processes running"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(5)
        for pid in started:  # never leave them behind, even when the test failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
