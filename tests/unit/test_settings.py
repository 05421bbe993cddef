"""The HA settings table (``hastandby/settings.py``) is the only place an HA default or range is typed.

Every option of ``hastandby serve`` and ``hastandby cluster up`` that the table holds takes its default,
range and help from it, and a value out of range is click's usage error (exit code 2, naming the option and
the range), never a traceback; ``HaConfig``, the coordinators, the local cluster, DR and the harness hold the
table's defaults (read back from them here, not restated); and no module of ``hastandby/`` or
``benchmarks/`` types a copy of one.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from hastandby import cli, local_cluster, settings
from hastandby.dr.replica import ReplicaLink
from hastandby.dr.service import DisasterRecovery
from hastandby.election.coordinator import LeasedCoordinator
from hastandby.election.etcd_coordinator import EtcdCoordinator
from hastandby.ha.node import HaConfig
from hastandby.testing import etcd_ha, netns_cluster
from hastandby.testing.fake_coordinator import FakeCluster, FakeCoordinator

ROOT = Path(__file__).resolve().parents[2]

SERVE: dict[str, settings.Setting[Any]] = {  # serve's parameter name -> its entry
    "lease_ttl": settings.LEASE_TTL, "min_sync": settings.MIN_SYNC, "heartbeat": settings.HEARTBEAT,
    "backup_timeout": settings.BACKUP_TIMEOUT, "client_refusal": settings.CLIENT_REFUSAL,
    "cluster_name": settings.CLUSTER, "on_role_change_timeout": settings.ON_ROLE_CHANGE_TIMEOUT,
}
CLUSTER_UP: dict[str, settings.Setting[Any]] = {
    "nodes": settings.LOCAL_NODES, "base_port": settings.LOCAL_BASE_PORT, "etcd_port": settings.LOCAL_ETCD_PORT,
    "lease_ttl": settings.LEASE_TTL,
}
COMMANDS = {("serve",): (cli.serve, SERVE), ("cluster", "up"): (cli.cluster_up, CLUSTER_UP)}


def _param(command: click.Command, name: str) -> click.Parameter:
    return next(p for p in command.params if p.name == name)


def _option(command: click.Command, name: str) -> str:
    return max(_param(command, name).opts, key=len)


def _outside(setting: settings.Setting[Any]) -> list[str]:
    """Values just out of ``setting``'s range, as typed on a command line."""
    if setting.choices:
        return ["none-of-them"]
    if isinstance(setting.default, str):
        return ["", *(f"a{c}b" for c in setting.forbidden)]
    values: list[str] = ["nan"]
    step = 1 if isinstance(setting.default, int) else 0.01
    if setting.min is not None:
        values += [str(setting.min) if setting.min_open else str(setting.min - step), "-inf"]
    if setting.max is not None:
        values += [str(setting.max + step), "inf"]
    return values


def _inside(setting: settings.Setting[Any]) -> list[str]:
    """The range's own ends, and the default: accepted."""
    if setting.choices:
        return list(setting.choices)
    values = [str(setting.default)]
    if setting.min is not None and not setting.min_open:
        values.append(str(setting.min))
    if setting.max is not None:
        values.append(str(setting.max))
    return values


def _run(monkeypatch: pytest.MonkeyPatch, words: tuple[str, ...], *args: str) -> tuple[Any, list[dict[str, Any]]]:
    """``hastandby WORDS ARGS`` through click, the command's body replaced: nothing starts."""
    command = COMMANDS[words][0]
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(command, "callback", lambda **params: calls.append(params))
    return CliRunner().invoke(cli.main, [*words, *args]), calls


CASES = [(words, name, value) for words, (_, table) in COMMANDS.items() for name, setting in table.items()
         for value in _outside(setting)]


@pytest.mark.parametrize(("words", "name", "value"), CASES, ids=[f"{' '.join(w)} {n}={v}" for w, n, v in CASES])
def test_a_value_out_of_range_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, words: tuple[str, ...], name: str,
                                                value: str) -> None:
    command, _ = COMMANDS[words]
    option = _option(command, name)
    result, calls = _run(monkeypatch, words, f"{option}={value}")
    assert result.exit_code == 2, result.output
    assert calls == []
    assert f"Invalid value for '{option}'" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_lease_ttl_1_names_the_option_and_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: ``IntRange(min=1)`` let 1 through, and the coordinator raised an uncaught ValueError."""
    for words in COMMANDS:
        result, calls = _run(monkeypatch, words, "--lease-ttl", "1")
        assert (result.exit_code, calls) == (2, [])
        assert "Invalid value for '--lease-ttl': 1 is not in the range x>=2." in result.output
        assert "Traceback" not in result.output


def test_a_node_id_that_cannot_be_an_etcd_key_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--node-id a/b`` used to reach election/cluster.py's key check as an uncaught ValueError."""
    for value in ("a/b", ""):
        result, calls = _run(monkeypatch, ("serve",), "--node-id", value)
        assert (result.exit_code, calls) == (2, [])
        assert "Invalid value for '--node-id'" in result.output and "Traceback" not in result.output
    result, calls = _run(monkeypatch, ("serve",), "--node-id", "n1")
    assert result.exit_code == 0 and calls[0]["node_id"] == "n1"


INSIDE = [(words, name, value) for words, (_, table) in COMMANDS.items() for name, setting in table.items()
          for value in _inside(setting)]


@pytest.mark.parametrize(("words", "name", "value"), INSIDE, ids=[f"{' '.join(w)} {n}={v}" for w, n, v in INSIDE])
def test_the_ends_of_each_range_are_accepted(monkeypatch: pytest.MonkeyPatch, words: tuple[str, ...], name: str,
                                            value: str) -> None:
    command, table = COMMANDS[words]
    extra = ("--nodes", "1") if name == "base_port" else ()  # the highest base port leaves room for one node
    result, calls = _run(monkeypatch, words, f"{_option(command, name)}={value}", *extra)
    assert result.exit_code == 0, result.output
    expected = table[name].default
    assert calls[0][name] == type(expected)(value)


def test_local_ports_are_checked_together(tmp_path: Path) -> None:
    """The real command: it checks before it starts anything (and ``local_cluster.up`` checks again)."""
    for args in (("--base-port", "65000", "--nodes", "600"), ("--base-port", "2379"), ("--etcd-port", "5671"),
                 ("--etcd-port", "5674")):
        result = CliRunner().invoke(cli.main, ["cluster", "up", "--dir", str(tmp_path / "cluster"), *args])
        assert result.exit_code == 2, (args, result.output)
        assert "--nodes / --base-port / --etcd-port" in result.output and "Traceback" not in result.output
    with pytest.raises(local_cluster.ClusterError, match="lease_ttl must be at least 2"):
        local_cluster.up(tmp_path / "cluster", lease_ttl=1)
    with pytest.raises(local_cluster.ClusterError, match="past 65535"):
        local_cluster.up(tmp_path / "cluster", nodes=600, base_port=65000)
    assert not (tmp_path / "cluster").exists()


# -- every default is the table's -----------------------------------------------------------------


@pytest.mark.parametrize("words", list(COMMANDS), ids=" ".join)
def test_the_cli_defaults_and_help_are_the_tables(words: tuple[str, ...]) -> None:
    command, table = COMMANDS[words]
    for name, setting in table.items():
        option = _param(command, name)
        assert isinstance(option, click.Option)
        if setting is settings.HEARTBEAT:  # its default depends on --ha-cluster: both named in its help
            assert option.default is None
            assert f"[{settings.STANDALONE_HEARTBEAT.default:g}; {setting.default:g} with --ha-cluster]" in (
                option.help or "")
        else:
            assert option.default == setting.default, name
            assert option.help == setting.help, name


def _defaults(function: Any) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_every_default_elsewhere_is_the_tables() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(HaConfig)}
    for setting in (settings.LEASE_TTL, settings.LEASE_MARGIN, settings.MIN_SYNC, settings.HEARTBEAT,
                    settings.BACKUP_TIMEOUT, settings.CLIENT_REFUSAL, settings.CLUSTER):
        assert fields[setting.name] == setting.default, setting.name
    for coordinator in (LeasedCoordinator.__init__, EtcdCoordinator.__init__, FakeCoordinator.__init__):
        defaults = _defaults(coordinator)
        assert (defaults["lease_ttl"], defaults["lease_margin"]) == (settings.LEASE_TTL.default,
                                                                     settings.LEASE_MARGIN.default)
    up = _defaults(local_cluster.up)
    for setting in (settings.LOCAL_NODES, settings.LOCAL_BASE_PORT, settings.LOCAL_ETCD_PORT, settings.LEASE_TTL):
        assert up[setting.name] == setting.default, setting.name
    for dr in (DisasterRecovery.__init__, ReplicaLink.__init__):  # DR's links to peers: the HA heartbeat
        assert _defaults(dr)["heartbeat"] == settings.HEARTBEAT.default
    assert netns_cluster.LEASE_TTL == settings.LEASE_TTL.default
    assert etcd_ha.TTL == settings.MIN_LEASE_TTL == settings.LEASE_TTL.min


# -- the checks ------------------------------------------------------------------------------------------


def test_check_names_the_setting_the_range_and_the_value() -> None:
    with pytest.raises(settings.SettingError, match=r"^lease_ttl must be at least 2 \(seconds\), not 1$"):
        settings.LEASE_TTL.check(1)
    with pytest.raises(settings.SettingError, match=r"^--min-sync must be at least 1 \(nodes\), not 0$"):
        settings.MIN_SYNC.check(0, "--min-sync")
    with pytest.raises(settings.SettingError, match="greater than 0"):
        settings.LEASE_MARGIN.check(0.0)
    for bad in (math.nan, math.inf, True, 2.5):
        assert not settings.LEASE_TTL.accepts(bad)
    assert settings.LEASE_MARGIN.check(1) == 1 and settings.HEARTBEAT.check(0) == 0
    with pytest.raises(settings.SettingError, match="one of abort, forced"):
        settings.CLIENT_REFUSAL.check("polite")
    with pytest.raises(settings.SettingError, match="without '/'"):
        settings.CLUSTER.check("a/b")
    assert all(s.accepts(s.default) for s in settings.TABLE)


@pytest.mark.parametrize(("ttl", "margin"), [(1, 0.5), (2, 0.0), (2, -1.0), (2, 4 / 3), (2, 2.0), (3, 2.5)])
def test_the_lease_is_checked_by_config_and_coordinator_alike(ttl: int, margin: float) -> None:
    with pytest.raises(settings.SettingError):
        settings.check_lease(ttl, margin)
    with pytest.raises(ValueError, match="lease_"):
        HaConfig(lease_ttl=ttl, lease_margin=margin)
    with pytest.raises(ValueError, match="lease_"):  # the last line of defence, with the table's range
        FakeCoordinator(FakeCluster("c"), "a", "h:1", lambda event: None, lease_ttl=ttl, lease_margin=margin)


def test_ha_config_checks_what_it_is_given() -> None:
    HaConfig()  # the table's defaults
    for wrong in ({"min_sync": 0}, {"heartbeat": -1.0}, {"backup_timeout": math.nan}, {"client_refusal": "x"},
                  {"cluster": ""}):
        with pytest.raises(settings.SettingError, match=next(iter(wrong))):
            HaConfig(**wrong)  # type: ignore[arg-type]


def test_sync_quorum_is_at_most_the_members_named() -> None:
    assert HaConfig(min_sync=2).sync_quorum == 2  # no --brokers-url: as asked
    assert HaConfig(min_sync=3, brokers=["a:1", "b:2"]).sync_quorum == 2
    assert HaConfig(min_sync=1, brokers=["a:1", "b:2"]).sync_quorum == 1


# -- no copies ------------------------------------------------------------------------------------------

# A default or range of an HA setting typed as a number or string outside settings.py: an annotated default or an
# assignment, a command-line pair, an argparse or click default.
_NAMES = r"(?:lease_ttl|lease_margin|handover_ttl|min_sync|backup_timeout|client_refusal|on_role_change_timeout|" \
         r"ttl|TTL|LEASE_TTL|MIN_LEASE_TTL|LEASE_MARGIN|HANDOVER_TTL)"
COPIES = [
    re.compile(rf"\b{_NAMES}\s*:\s*[\w .|\[\]]+=\s*[-\d\"']"),
    re.compile(rf"^\s*{_NAMES}\s*=\s*[-\d\"']"),
    re.compile(r"\"--(?:lease-ttl|min-sync|backup-timeout|client-refusal)\",\s*\"[\w.]+\""),
    re.compile(r"\"--(?:lease-ttl|min-sync|heartbeat|backup-timeout)\"[^)\n]*\bdefault=[\d\"']"),
    re.compile(r"\bIntRange\(min=[12]\)[^\n]*\bdefault=2\b"),
    re.compile(r"\b2\.0 if ha_cluster else 60\.0\b|\bmin\(heartbeat, 2\.0\)"),
]
# The node's own code passes no literal for one either (the harness may: a test chooses its values).
PASSED = re.compile(rf"\b{_NAMES}=[-\d\"']")
ALLOWED = {
    # Not the HA default: what a primary replication built on its own keeps (no sync set: the primary alone).
    ("hastandby/ha/primary.py", "min_sync: int = 1,"),
}


def test_no_module_types_an_ha_default_of_its_own() -> None:
    found = []
    for path in sorted([*(ROOT / "hastandby").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "hastandby/settings.py" or "__pycache__" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            own = relative.startswith("hastandby/") and not relative.startswith("hastandby/testing/")
            copied = any(p.search(code) for p in COPIES) or (own and PASSED.search(code))
            if copied and (relative, code.strip()) not in ALLOWED:
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []
