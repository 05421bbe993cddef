"""scripts/init.d/qpid-backup and qpid-primary, run as a resource manager would run them.

Every path the scripts use (pidfile, lockfile, log, data dir, defaults file)
is overridden through the environment into the test's tmp dir, ``HASTANDBY``
is this venv's ``python -m hastandby``, and every node gets a free loopback
port.  No etcd: these scripts are for sites where a resource manager
(rgmanager, pacemaker) decides which node is primary.  Authentication is on
as at a site: the nodes require it (``--no-allow-anonymous``) and read the
test run's users file, backups authenticate as ``peer``, and the scripts' own
management requests use the admin user of their configuration
(``QPID_HA_ADMIN_USER``/``QPID_HA_ADMIN_PASSWORD_FILE``), not the test
process's environment.

The nodes are not children of the test (the scripts detach them), so each
one's PID is read from its pidfile when it starts and every such process is
stopped by that PID at teardown (SIGCONT, SIGTERM, then SIGKILL), even when
the test fails.  Node logs are printed at teardown.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from hastandby.client import ManagementClient, ManagementError
from hastandby.testing import auth
from hastandby.testing.nodes import REPO, free_port

SCRIPTS = REPO / "scripts" / "init.d"
BACKUP = SCRIPTS / "qpid-backup"
PRIMARY = SCRIPTS / "qpid-primary"

# LSB exit codes
OK, FAILED, USAGE = 0, 1, 2
RUNNING, DEAD_WITH_PIDFILE, NOT_RUNNING = 0, 1, 3


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


class ScriptNode:
    """One cluster node as the init scripts see it: an environment and its files."""

    def __init__(self, root: Path, name: str, port: int, brokers_url: str, lockfile: Path,
                 started: set[int]) -> None:
        self.name = name
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.dir = root / name
        self.pidfile = self.dir / "run" / "qpid-ha.pid"
        self.log = self.dir / "log" / "qpid-ha.log"
        self.started = started
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("HASTANDBY_")},
            "QPID_HA_DEFAULTS": str(root / "no-such-defaults"),
            "HASTANDBY": f"{sys.executable} -m hastandby",
            "QPID_HA_LISTEN": self.address,
            "QPID_HA_BROKERS_URL": brokers_url,
            "QPID_HA_DATA_DIR": str(self.dir / "data"),
            "QPID_HA_PIDFILE": str(self.pidfile),
            "QPID_HA_LOG": str(self.log),
            "QPID_HA_LOCKFILE": str(lockfile),
            "QPID_HA_ARGS": "--log-format json --backup-timeout 5 --no-allow-anonymous",
            "QPID_HA_USERS_FILE": str(auth.USERS_FILE),
            "QPID_HA_PEER_USER": auth.PEER,
            "QPID_HA_PEER_PASSWORD_FILE": str(auth.password_file(auth.PEER)),
            "QPID_HA_ADMIN_USER": auth.ADMIN,
            "QPID_HA_ADMIN_PASSWORD_FILE": str(auth.password_file(auth.ADMIN)),
            "QPID_HA_PING_TIMEOUT": "2",
            "QPID_HA_STOP_TIMEOUT": "10",
            "QPID_HA_START_TIMEOUT": "20",
            "QPID_HA_LOCK_TIMEOUT": "30",
        }
        self.env.pop("QPID_HA_LOCK_HELD", None)

    def run(self, script: Path, *args: str, timeout: float = 60.0, **env: str) -> subprocess.CompletedProcess[str]:
        """Run ``script args`` for this node; remember the node's PID if a pidfile appeared."""
        try:
            return subprocess.run([str(script), *args], env={**self.env, **env}, cwd=self.dir.parent,
                                  capture_output=True, text=True, timeout=timeout)
        finally:
            pid = self.pid()
            if pid is not None:
                self.started.add(pid)

    def backup(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run(BACKUP, *args, **env)

    def primary(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run(PRIMARY, *args, **env)

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def status(self) -> dict | None:
        try:
            with ManagementClient(self.address, timeout=2) as client:
                return client.request("STATUS")
        except ManagementError:
            return None

    def state(self) -> str | None:
        status = self.status()
        return status["state"] if status else None

    def wait_state(self, state: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.state()
            if seen == state:
                return
            time.sleep(0.1)
        raise AssertionError(f"{self.name} is {seen}, not {state}, after {timeout} s")


def check(result: subprocess.CompletedProcess[str], code: int, *phrases: str) -> str:
    """Assert the exit code and that the output holds every phrase; return the output."""
    output = result.stdout + result.stderr
    assert result.returncode == code, f"{result.args}: exit {result.returncode}, not {code}:\n{output}"
    for phrase in phrases:
        assert phrase in output, f"{result.args}: {phrase!r} not in:\n{output}"
    return output


@pytest.fixture
def nodes(tmp_path) -> Iterator[Callable[[int], list[ScriptNode]]]:
    """Make clusters of script-driven nodes; every node process is stopped by PID at teardown."""
    started: set[int] = set()
    made: list[ScriptNode] = []

    def make(count: int = 2) -> list[ScriptNode]:
        ports = [free_port() for _ in range(count)]
        brokers_url = ",".join(f"127.0.0.1:{p}" for p in ports)
        lockfile = tmp_path / f"lock-{ports[0]}" / "qpid-ha.lock"
        cluster = [ScriptNode(tmp_path, f"node{len(made) + i}", port, brokers_url, lockfile, started)
                   for i, port in enumerate(ports)]
        for node in cluster:
            node.dir.mkdir(parents=True)
        made.extend(cluster)
        return cluster

    yield make
    for pid in started:
        if not alive(pid):
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "hastandby" not in cmdline:
            continue  # the pid was reused by someone else: not ours to stop
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, 10):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 5)
    for node in made:
        try:
            print(f"===== {node.name} {node.log} =====\n{node.log.read_text(errors='replace')[-4000:]}")
        except OSError:
            pass


# -- qpid-backup ---------------------------------------------------------------------------------


def test_backup_start_status_stop_on_two_nodes(nodes):
    a, b = nodes(2)
    for node in (a, b):
        check(node.backup("status"), NOT_RUNNING, "not running")
        check(node.backup("start"), OK, "started")
        pid = node.pid()
        assert pid is not None and alive(pid)
        assert node.status()["pid"] == pid, "the pidfile names another process than the node"
        check(node.backup("status"), RUNNING, f"running (pid {pid})", "connecting")
    assert a.state() == b.state() == "connecting"  # no resource manager promoted anyone
    for node in (a, b):
        pid = node.pid()
        check(node.backup("stop"), OK, "stopped")
        assert wait_gone(pid, 1), "stop returned before the node was gone"
        assert not node.pidfile.exists()
        check(node.backup("status"), NOT_RUNNING)


@pytest.mark.etcd
def test_with_etcd_the_node_runs_under_its_supervisor(nodes, etcd):
    """QPID_HA_ARGS with --etcd: the script starts ``serve --supervise``; the pidfile names the supervisor,
    whose child is the node, and ``stop`` ends both."""
    (a,) = nodes(1)
    a.env["QPID_HA_ARGS"] += f" --etcd {etcd.client_url} --cluster init{a.port} --lease-ttl 2"
    check(a.backup("start"), OK, "started")
    supervisor = a.pid()
    assert supervisor is not None
    with open(f"/proc/{supervisor}/cmdline", "rb") as cmdline:
        assert b"--supervise" in cmdline.read().split(b"\0")
    node = a.status()["pid"]
    assert node != supervisor
    with open(f"/proc/{node}/stat") as stat:
        assert int(stat.read().rsplit(")", 1)[1].split()[1]) == supervisor, "the node is the supervisor's child"
    check(a.backup("stop", "--force"), OK, "stopped")  # with etcd and alone, it became the primary
    assert wait_gone(supervisor, 1) and wait_gone(node, 1)


def test_backup_start_and_stop_are_idempotent(nodes):
    (a,) = nodes(1)
    check(a.backup("stop"), OK, "not running")
    check(a.backup("start"), OK, "started")
    pid = a.pid()
    check(a.backup("start"), OK, f"already running (pid {pid})")
    assert a.pid() == pid
    check(a.backup("stop"), OK, "stopped")
    check(a.backup("stop"), OK, "not running")
    check(a.backup("status"), NOT_RUNNING)


def test_backup_status_dead_with_pidfile_then_start_again(nodes):
    (a,) = nodes(1)
    check(a.backup("start"), OK)
    pid = a.pid()
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid, 5)
    check(a.backup("status"), DEAD_WITH_PIDFILE, "dead", str(a.pidfile))
    check(a.backup("start"), OK, "started")  # replaces the stale pidfile
    assert a.pid() != pid and alive(a.pid())
    os.kill(a.pid(), signal.SIGKILL)
    assert wait_gone(a.pid(), 5)
    check(a.backup("stop"), OK, "not running")  # cleans the stale pidfile up
    assert not a.pidfile.exists()
    check(a.backup("status"), NOT_RUNNING)


def test_backup_status_of_a_hung_node_is_1_and_stop_still_works(nodes):
    """A node that is alive but does not answer is not running as far as clients go (Qpid's QPID-5719)."""
    (a,) = nodes(1)
    check(a.backup("start"), OK)
    pid = a.pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        check(a.backup("status", QPID_HA_PING_TIMEOUT="1"), DEAD_WITH_PIDFILE, "does not answer")
        check(a.backup("stop", QPID_HA_PING_TIMEOUT="1"), OK, "stopped")  # its role cannot be known: a hung node may be stopped
        assert not alive(pid)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGCONT)


def test_backup_restart_gives_a_new_process_that_rejoins_as_backup(nodes):
    a, b = nodes(2)
    check(a.primary("start"), OK, "is primary")
    check(b.backup("start"), OK)
    b.wait_state("backup")
    old = b.pid()
    check(b.backup("restart"), OK, "stopped", "started")
    assert b.pid() != old and not alive(old) and alive(b.pid())
    b.wait_state("backup")
    check(b.backup("status"), RUNNING, "backup")


def test_usage_errors(nodes):
    (a,) = nodes(1)
    check(a.backup("bogus"), USAGE, "Usage")
    check(a.primary("bogus"), USAGE, "Usage")
    check(a.backup("stop", "--bogus"), USAGE, "usage")
    check(a.backup("start", QPID_HA_BROKERS_URL=""), 6, "QPID_HA_BROKERS_URL")
    check(a.backup("start", HASTANDBY="/no/such/hastandby"), 5, "HASTANDBY")
    assert a.pid() is None


# -- qpid-primary --------------------------------------------------------------------------------


def test_primary_start_starts_and_promotes_the_node(nodes):
    a, b = nodes(2)
    check(b.backup("start"), OK)
    check(a.primary("status"), NOT_RUNNING, "not the primary")  # nothing runs on a yet
    check(a.primary("start"), OK, f"{a.address} is primary")  # qpid-backup start, then promote
    assert a.state() == "primary"
    b.wait_state("backup")
    check(a.primary("status"), OK, "is the primary")
    check(b.primary("status"), NOT_RUNNING, "not the primary", "backup")
    check(a.backup("status"), RUNNING, "primary")
    check(b.backup("status"), RUNNING, "backup")
    pid = a.pid()
    check(a.primary("start"), OK, "already the primary")  # idempotent
    assert a.pid() == pid


def test_primary_start_refuses_while_another_node_is_primary_then_relocates(nodes):
    """The primary service moves as rgmanager moves it: stop on the old node, then start on the new."""
    a, b = nodes(2)
    check(a.primary("start"), OK)
    check(b.backup("start"), OK)
    b.wait_state("backup")
    check(b.primary("start"), FAILED, f"{a.address} is already the primary")
    assert a.state() == "primary" and b.state() == "backup"

    check(a.primary("stop"), OK, "stopped")
    check(b.primary("start"), OK, f"{b.address} is primary")  # a caught-up backup takes over
    check(b.primary("status"), OK)
    check(a.backup("start"), OK)  # the old primary's node comes back as a backup
    a.wait_state("backup")
    check(a.primary("status"), NOT_RUNNING, "backup")


def test_stop_refuses_the_other_roles_node(nodes):
    """qpid-backup stop leaves the primary alone, qpid-primary stop leaves backups alone (Qpid's QPID-5942)."""
    a, b = nodes(2)
    check(b.backup("start"), OK)
    check(a.primary("start"), OK)
    b.wait_state("backup")
    pid_a, pid_b = a.pid(), b.pid()

    check(a.backup("stop"), FAILED, "is the primary", "qpid-primary stop")
    check(a.backup("restart"), FAILED, "is the primary")
    check(b.primary("stop"), FAILED, "not the primary", "qpid-backup stop")
    check(b.primary("restart"), FAILED, "not the primary")
    assert alive(pid_a) and alive(pid_b) and a.pid() == pid_a and b.pid() == pid_b
    assert a.state() == "primary" and b.state() == "backup"

    check(a.backup("stop", "--force"), OK, "stopped")  # an operator may insist
    assert not alive(pid_a) and not a.pidfile.exists()
    check(a.primary("status"), NOT_RUNNING, "not answering")
    check(a.primary("stop"), OK, "not running")  # nothing to stop: idempotent
    check(b.backup("stop"), OK, "stopped")
    assert not alive(pid_b)


# -- configuration and locking ---------------------------------------------------------------------


def test_defaults_file_and_environment_precedence(nodes, tmp_path):
    """Settings come from $QPID_HA_DEFAULTS; a variable set in the environment wins over the file."""
    (a,) = nodes(1)
    port = free_port()
    defaults = tmp_path / "qpid-ha"
    defaults.write_text(
        f"QPID_HA_LISTEN=127.0.0.1:{port}\n"
        f"QPID_HA_BROKERS_URL=127.0.0.1:{port}\n"
        f"QPID_HA_PIDFILE={tmp_path}/from-file.pid\n"
        "QPID_HA_ARGS='--node-id from-defaults --log-format json --no-allow-anonymous'\n")
    env = {k: v for k, v in a.env.items() if k not in ("QPID_HA_LISTEN", "QPID_HA_BROKERS_URL", "QPID_HA_ARGS")}
    env["QPID_HA_DEFAULTS"] = str(defaults)
    a.env = env  # QPID_HA_PIDFILE stays in the environment: it must win over the file
    a.address = f"127.0.0.1:{port}"
    check(a.backup("start"), OK, f"on 127.0.0.1:{port}")
    assert not (tmp_path / "from-file.pid").exists()
    status = a.status()
    assert status["node_id"] == "from-defaults" and status["pid"] == a.pid()
    check(a.backup("status"), RUNNING)
    check(a.primary("start"), OK, "is primary")
    check(a.primary("stop"), OK)


def test_example_defaults_file_is_valid_shell():
    example = SCRIPTS / "qpid-ha.defaults"
    result = subprocess.run(["bash", "-n", str(example)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    result = subprocess.run(["bash", "-c", f'. "{example}"; echo "$QPID_HA_LISTEN|$QPID_HA_BROKERS_URL"'],
                            capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert result.stdout.strip() == "node1:5672|node1:5672,node2:5672,node3:5672"


def test_start_waits_for_the_lock(nodes):
    (a,) = nodes(1)
    lockfile = Path(a.env["QPID_HA_LOCKFILE"])
    lockfile.parent.mkdir(parents=True, exist_ok=True)
    with open(lockfile, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        check(a.backup("start", QPID_HA_LOCK_TIMEOUT="1"), FAILED, "holds")
        check(a.primary("start", QPID_HA_LOCK_TIMEOUT="1"), FAILED, "holds")
        assert a.pid() is None
        check(a.backup("status"), NOT_RUNNING)  # status never waits for the lock
    check(a.backup("start"), OK, "started")
    # The node must not inherit the lock: another start/stop can take it at once.
    with open(lockfile, "a") as again:
        fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_concurrent_starts_make_one_node(nodes):
    """Qpid serialised start/stop with flock because concurrent starts left orphan brokers."""
    (a,) = nodes(1)
    results: list[subprocess.CompletedProcess[str]] = []
    threads = [threading.Thread(target=lambda: results.append(a.backup("start"))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert [r.returncode for r in results] == [OK] * 3, [r.stdout + r.stderr for r in results]
    outputs = sorted(r.stdout for r in results)
    assert sum("started" in o for o in outputs) == 1 and sum("already running" in o for o in outputs) == 2, outputs
    pid = a.pid()
    serving = [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
               if alive(p) and f"--listen {a.address} ".encode() in _cmdline(p)]
    assert serving == [pid], f"more than one node process for {a.address}: {serving}"
    check(a.backup("stop"), OK)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def test_the_role_hook_and_the_virtual_ip_settings_reach_the_node(nodes, tmp_path):
    """QPID_HA_ON_ROLE_CHANGE (one argument, spaces kept) and QPID_HA_VIRTUAL_IP(_INTERFACE) become the node's
    --on-role-change, --virtual-ip and --virtual-ip-interface (docs/lifecycle.md section 14)."""
    (a,) = nodes(1)
    hooks = tmp_path / "hook dir"
    hooks.mkdir()
    calls = hooks / "calls"
    hook = hooks / "hook"
    hook.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\n')
    hook.chmod(0o755)
    a.env["QPID_HA_ON_ROLE_CHANGE"] = f"'{hook}' --tag 'a b'"
    check(a.backup("start"), OK, "started")
    check(a.primary("start"), OK, "is primary")
    check(a.backup("stop", "--force"), OK, "stopped")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "stopped" not in (calls.read_text() if calls.exists() else ""):
        time.sleep(0.05)
    roles = [line.split()[3] for line in calls.read_text().splitlines()]
    assert roles == ["connecting", "primary-recovering", "primary-active", "stopped"], calls.read_text()
    assert calls.read_text().splitlines()[0] == "--tag a b connecting hastandby 0"

    # The virtual IP: the node is started with both options (here on lo, which it refuses: no Ethernet).
    argv_file = tmp_path / "argv"
    wrapper = tmp_path / "hastandby-wrapper"
    wrapper.write_text(f'#!/bin/sh\n[ "$1" = serve ] && printf "%s\\n" "$@" > "{argv_file}"\n'
                       f'exec {sys.executable} -m hastandby "$@"\n')
    wrapper.chmod(0o755)
    (b,) = nodes(1)
    b.env.update(HASTANDBY=str(wrapper), QPID_HA_VIRTUAL_IP="10.78.254.100/24", QPID_HA_VIRTUAL_IP_INTERFACE="lo",
                 QPID_HA_START_TIMEOUT="5")
    check(b.backup("start"), FAILED)
    argv = argv_file.read_text().splitlines()
    assert argv[argv.index("--virtual-ip") + 1] == "10.78.254.100/24"
    assert argv[argv.index("--virtual-ip-interface") + 1] == "lo"
    assert "--virtual-ip-interface lo: cannot send ARP there" in b.log.read_text()
