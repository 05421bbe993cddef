"""scripts/systemd: the units checked by ``systemd-analyze``, and their commands run as systemd would.

``systemd-analyze verify`` and ``systemd-analyze security --offline=true`` read
unit files without a running systemd, so they work in this container, where
PID 1 is not systemd (scripts/setup installs the Debian package ``systemd``,
which brings them).  Without ``systemd-analyze`` these tests fail, saying so:
they never pass unchecked.

The units name their helper by its installed path
(/usr/local/libexec/hastandby/hastandby-service); verify checks that every
command exists, so the copies it reads here name the repository's helper
instead, and that is the only change (asserted).

No systemd can start the units here, so ``run_unit`` does what systemd would
do with their [Service] section: it reads the EnvironmentFile= lines (the
instance's file from the test's directory), sets STATE_DIRECTORY for
StateDirectory=, runs ExecStart= (the main process) and then ExecStartPost=,
and sends KillSignal= to stop.  Every node process is stopped by its PID at
teardown.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from hastandby.client import ManagementClient, ManagementError
from hastandby.testing import auth
from hastandby.testing.nodes import REPO, free_port
from hastandby.testing.waiting import wait_for

UNITS = REPO / "scripts" / "systemd"
NODE_UNIT = UNITS / "hastandby@.service"
PRIMARY_UNIT = UNITS / "hastandby-primary@.service"
HELPER = UNITS / "hastandby-service"
INSTALLED_HELPER = "/usr/local/libexec/hastandby/hastandby-service"


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail("systemd-analyze is not installed, so the systemd units cannot be checked: "
                    "install the Debian package systemd (scripts/setup does)")
    return path


def unit_lines(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of every setting, in order (keys may repeat, as EnvironmentFile= does)."""
    section, lines = "", []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        lines.append((section, key.strip(), value.strip()))
    return lines


def setting(path: Path, key: str, section: str = "Service") -> list[str]:
    return [v for s, k, v in unit_lines(path) if s == section and k == key]


@pytest.fixture
def unit_dir(tmp_path) -> Path:
    """Copies of both units naming the repository's helper, for systemd-analyze."""
    directory = tmp_path / "units"
    directory.mkdir()
    for unit in (NODE_UNIT, PRIMARY_UNIT):
        text = unit.read_text()
        copied = text.replace(INSTALLED_HELPER, str(HELPER))
        changed = [(a, b) for a, b in zip(text.splitlines(), copied.splitlines()) if a != b]
        assert changed and all(a.startswith("ExecStart") and INSTALLED_HELPER in a for a, _ in changed), changed
        (directory / unit.name).write_text(copied)
    return directory


def test_systemd_analyze_verify_accepts_both_units_without_a_warning(unit_dir):
    analyze = systemd_analyze()
    for instance in ("hastandby@n1.service", "hastandby-primary@n1.service"):
        result = subprocess.run([analyze, "verify", "--man=no", str(unit_dir / instance)],
                                capture_output=True, text=True, timeout=120)
        output = (result.stdout + result.stderr).strip()
        assert result.returncode == 0 and output == "", f"{instance}: exit {result.returncode}\n{output}"


def test_systemd_analyze_verify_does_check_here(unit_dir):
    """The check above means something: verify rejects an unknown key and a missing command in this container."""
    analyze = systemd_analyze()
    broken = unit_dir / "hastandby@.service"
    broken.write_text(broken.read_text().replace("LimitNOFILE=", "LimitNOFILES=")
                      .replace(str(HELPER), "/nonexistent/hastandby-service"))
    result = subprocess.run([analyze, "verify", "--man=no", str(unit_dir / "hastandby@n1.service")],
                            capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Unknown key" in output and "LimitNOFILES" in output, output
    assert "/nonexistent/hastandby-service" in output, output


def test_the_units_are_hardened_below_exposure_2(unit_dir):
    """``systemd-analyze security`` on the unit files: exposure at most 2.0 of 10 for both."""
    analyze = systemd_analyze()
    for instance in ("hastandby@n1.service", "hastandby-primary@n1.service"):
        result = subprocess.run([analyze, "security", "--offline=true", "--threshold=20",
                                 str(unit_dir / instance)], capture_output=True, text=True, timeout=120)
        overall = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
        assert result.returncode == 0 and overall is not None, f"{instance}:\n{result.stdout}{result.stderr}"
        assert float(overall.group(1)) <= 2.0


def test_the_node_unit_stops_with_sigterm_restarts_on_failure_and_writes_only_its_data_dir():
    assert setting(NODE_UNIT, "KillSignal") == ["SIGTERM"]
    assert setting(NODE_UNIT, "Restart") == ["on-failure"]
    assert setting(NODE_UNIT, "RestartSec") == ["5s"]
    assert setting(NODE_UNIT, "StartLimitBurst", "Unit") and setting(NODE_UNIT, "StartLimitIntervalSec", "Unit")
    assert setting(NODE_UNIT, "RestartPreventExitStatus") == ["2 6"]
    assert setting(NODE_UNIT, "LimitNOFILE") == ["65536"]
    assert setting(NODE_UNIT, "NoNewPrivileges") == ["yes"]
    assert setting(NODE_UNIT, "ProtectSystem") == ["strict"]
    assert setting(NODE_UNIT, "StateDirectory") == ["hastandby/%i"]
    assert setting(NODE_UNIT, "ReadWritePaths") == ["/var/lib/hastandby/%i"]
    assert setting(NODE_UNIT, "EnvironmentFile") == ["-/etc/hastandby/cluster.env", "/etc/hastandby/%i.env"]
    assert setting(PRIMARY_UNIT, "EnvironmentFile") == setting(NODE_UNIT, "EnvironmentFile")
    for key in ("BindsTo", "After", "PropagatesStopTo"):
        assert setting(PRIMARY_UNIT, key, "Unit") == ["hastandby@%i.service"], key


# -- the units' commands, run as systemd runs them -------------------------------------------------


def read_environment_file(path: Path) -> dict[str, str]:
    """systemd's EnvironmentFile= format as far as the example uses it: VAR=value, quotes removed."""
    values = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        words = shlex.split(value)
        values[key.strip()] = " ".join(words)
    return values


class UnitRunner:
    """Runs a unit's [Service] commands for one instance as systemd would, with /etc/hastandby in ``etc``."""

    def __init__(self, etc: Path, state: Path) -> None:
        self.etc = etc
        self.state = state
        self.mains: list[subprocess.Popen] = []

    def environment(self, unit: Path, instance: str) -> dict[str, str]:
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
        for value in setting(unit, "EnvironmentFile"):
            optional = value.startswith("-")
            path = Path(value.lstrip("-").replace("%i", instance).replace("/etc/hastandby", str(self.etc)))
            if not path.exists():
                assert optional, f"{unit.name}: {path} is required"
                continue
            env.update(read_environment_file(path))
        for directory in setting(unit, "StateDirectory"):
            state = self.state / directory.replace("%i", instance)
            state.mkdir(parents=True, exist_ok=True)
            env["STATE_DIRECTORY"] = str(state)
        return env

    def command(self, unit: Path, key: str) -> list[str]:
        (line,) = setting(unit, key)
        return [word.replace(INSTALLED_HELPER, str(HELPER)) for word in shlex.split(line)]

    def start(self, unit: Path, instance: str) -> subprocess.Popen:
        """ExecStart (the main process), then ExecStartPost, which must succeed."""
        env = self.environment(unit, instance)
        log = open(self.state / f"{instance}.log", "ab")
        main = subprocess.Popen(self.command(unit, "ExecStart"), env=env, stdout=log, stderr=subprocess.STDOUT)
        self.mains.append(main)
        post = subprocess.run(self.command(unit, "ExecStartPost"), env=env, capture_output=True, text=True,
                              timeout=60)
        assert post.returncode == 0, f"ExecStartPost: {post.stdout}{post.stderr}\n{self.log(instance)}"
        return main

    def run(self, unit: Path, instance: str) -> subprocess.CompletedProcess:
        """A oneshot unit's ExecStart."""
        return subprocess.run(self.command(unit, "ExecStart"), env=self.environment(unit, instance),
                              capture_output=True, text=True, timeout=120)

    def log(self, instance: str) -> str:
        path = self.state / f"{instance}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop_all(self) -> None:
        for main in self.mains:
            if main.poll() is None:
                os.kill(main.pid, signal.SIGCONT)
                os.kill(main.pid, signal.SIGTERM)
                try:
                    main.wait(15)
                except subprocess.TimeoutExpired:
                    os.kill(main.pid, signal.SIGKILL)
                    main.wait(5)


@pytest.fixture
def runner(tmp_path) -> Iterator[UnitRunner]:
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir()
    state.mkdir()
    units = UnitRunner(etc, state)
    yield units
    units.stop_all()


def state_of(address: str) -> str | None:
    try:
        with ManagementClient(address, timeout=5) as client:
            return client.request("STATUS").get("state")
    except ManagementError:
        return None


def write_env(etc: Path, name: str, listen: str, brokers_url: str) -> None:
    """An instance's settings in the example file's form (quoted QPID_HA_ARGS included)."""
    (etc / f"{name}.env").write_text("\n".join([
        f"# {name}",
        f"HASTANDBY={sys.executable} -m hastandby",
        f"QPID_HA_LISTEN={listen}",
        f"QPID_HA_BROKERS_URL={brokers_url}",
        f"QPID_HA_NODE_ID={name}",
        f"QPID_HA_USERS_FILE={auth.USERS_FILE}",
        f"QPID_HA_PEER_USER={auth.PEER}",
        f"QPID_HA_PEER_PASSWORD_FILE={auth.password_file(auth.PEER)}",
        f"QPID_HA_ADMIN_USER={auth.ADMIN}",
        f"QPID_HA_ADMIN_PASSWORD_FILE={auth.password_file(auth.ADMIN)}",
        'QPID_HA_ARGS="--backup-timeout 5 --log-format json"',
        "QPID_HA_START_TIMEOUT=30",
        "",
    ]))


def test_the_units_commands_start_promote_reload_and_stop_a_cluster(runner):
    ports = [free_port(), free_port()]
    brokers = ",".join(f"127.0.0.1:{p}" for p in ports)
    (runner.etc / "cluster.env").write_text("QPID_HA_PING_TIMEOUT=5\n")
    for index, port in enumerate(ports):
        write_env(runner.etc, f"n{index}", f"127.0.0.1:{port}", brokers)
    nodes = [runner.start(NODE_UNIT, f"n{index}") for index in range(2)]
    for index, port in enumerate(ports):
        assert state_of(f"127.0.0.1:{port}") == "connecting"
        assert (runner.state / f"hastandby/n{index}").is_dir()  # StateDirectory= is the data dir
    a, b = (f"127.0.0.1:{p}" for p in ports)
    # The helper execs the node: the unit's main process ($MAINPID) is `hastandby serve` itself.
    command = Path(f"/proc/{nodes[0].pid}/cmdline").read_bytes().split(b"\0")
    assert b"serve" in command and b"--ha-cluster" in command and b"--data-dir" in command, command

    promoted = runner.run(PRIMARY_UNIT, "n0")
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr
    assert state_of(a) == "primary"
    wait_for(lambda: state_of(b) == "backup", 20, "n1 a backup")
    again = runner.run(PRIMARY_UNIT, "n0")
    assert again.returncode == 0 and "already the primary" in again.stdout

    # hastandby-primary@n1 refuses while n0 is the primary, and n1 stays a backup.
    refused = runner.run(PRIMARY_UNIT, "n1")
    assert refused.returncode == 1 and f"{a} is already the primary" in refused.stderr, refused.stderr
    assert state_of(b) == "backup"

    # ExecReload: SIGHUP to the main process reloads the ACL; the node goes on.
    reload = runner.command(NODE_UNIT, "ExecReload")
    assert reload == ["/bin/kill", "-HUP", "$MAINPID"]
    subprocess.run([reload[0], reload[1], str(nodes[0].pid)], check=True, timeout=10)
    time.sleep(0.5)
    assert nodes[0].poll() is None and state_of(a) == "primary"

    # KillSignal=SIGTERM: the node stops cleanly (exit 0, so Restart=on-failure does not restart it).
    (kill_signal,) = setting(NODE_UNIT, "KillSignal")
    nodes[0].send_signal(getattr(signal, kill_signal))
    assert nodes[0].wait(int(setting(NODE_UNIT, "TimeoutStopSec")[0].rstrip("s"))) == 0
    promoted = runner.run(PRIMARY_UNIT, "n1")
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr
    assert state_of(b) == "primary"


def test_a_node_without_a_brokers_url_exits_6_which_the_unit_does_not_restart(runner):
    (runner.etc / "n0.env").write_text(f"HASTANDBY={sys.executable} -m hastandby\nQPID_HA_LISTEN=127.0.0.1:{free_port()}\n")
    result = subprocess.run(runner.command(NODE_UNIT, "ExecStart"), env=runner.environment(NODE_UNIT, "n0"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 6 and "QPID_HA_BROKERS_URL is not set" in result.stderr
    assert "6" in setting(NODE_UNIT, "RestartPreventExitStatus")[0].split()


VIRTUAL_IP_DROP_IN = UNITS / "hastandby@.service.d" / "virtual-ip.conf"


def test_the_virtual_ip_drop_in_grants_two_capabilities_and_verifies(unit_dir):
    """The drop-in --virtual-ip needs: CAP_NET_ADMIN and CAP_NET_RAW as ambient capabilities, netlink and packet
    sockets; systemd-analyze reads it with the unit without a warning, and the exposure stays low."""
    assert setting(VIRTUAL_IP_DROP_IN, "AmbientCapabilities") == ["CAP_NET_ADMIN CAP_NET_RAW"]
    assert setting(VIRTUAL_IP_DROP_IN, "CapabilityBoundingSet") == ["CAP_NET_ADMIN CAP_NET_RAW"]
    drop_ins = unit_dir / "hastandby@.service.d"
    drop_ins.mkdir()
    shutil.copy(VIRTUAL_IP_DROP_IN, drop_ins)
    analyze = systemd_analyze()
    unit = str(unit_dir / "hastandby@n1.service")
    result = subprocess.run([analyze, "verify", "--man=no", unit], capture_output=True, text=True, timeout=120)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and output == "", output
    result = subprocess.run([analyze, "security", "--offline=true", "--threshold=30", unit],
                            capture_output=True, text=True, timeout=120)
    assert "RestrictAddressFamilies=~AF_PACKET" in result.stdout  # the drop-in was read
    overall = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert result.returncode == 0 and overall is not None and float(overall.group(1)) <= 2.5, result.stdout


def test_the_helper_passes_the_virtual_ip_and_the_role_hook(tmp_path):
    """``hastandby-service serve`` turns QPID_HA_VIRTUAL_IP(_INTERFACE) and QPID_HA_ON_ROLE_CHANGE (one
    argument, spaces kept) into the node's options."""
    argv_file = tmp_path / "argv"
    recorder = tmp_path / "hastandby"
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{argv_file}"\n')
    recorder.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HASTANDBY": str(recorder), "QPID_HA_BROKERS_URL": "n1:5672,n2:5672",
           "QPID_HA_VIRTUAL_IP": "10.0.0.100/24", "QPID_HA_VIRTUAL_IP_INTERFACE": "eth0",
           "QPID_HA_ON_ROLE_CHANGE": "/usr/local/bin/move address", "QPID_HA_DATA_DIR": str(tmp_path)}
    result = subprocess.run([str(HELPER), "serve"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    argv = argv_file.read_text().splitlines()
    assert argv[argv.index("--virtual-ip") + 1] == "10.0.0.100/24"
    assert argv[argv.index("--virtual-ip-interface") + 1] == "eth0"
    assert argv[argv.index("--on-role-change") + 1] == "/usr/local/bin/move address"
