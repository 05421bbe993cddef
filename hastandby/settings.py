"""Every hot-standby setting in one table: its default, range, unit and one line of help.

After Patroni's ``config.py`` (``__DEFAULT_CONFIG``: one table of defaults, ranges checked once) and Qpid
HA's ``Settings.h`` (every default in one constructor).  Whoever needs an HA default or range reads it
here and types no number of its own: ``hastandby serve`` and ``hastandby cluster up`` (``cli.py`` builds
their click options from these entries), ``HaConfig`` (``ha/node.py``), the coordinators
(``election/coordinator.py``), the local cluster, the test harness and the benchmarks
(``tests/unit/test_settings.py`` reads their defaults back and greps for copies).

A value is checked against its entry where it comes in: a command-line value out of range is a usage
error naming the option and the range (exit code 2), ``HaConfig`` checks what it is given, and
``LeasedCoordinator`` checks its lease again as the last line of defence, with the same ``check``.

This module imports nothing from ``hastandby`` (nor click): it is the lowest layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T", int, float, str)

#: Longest idle timeout AMQP can carry: the Open frame's ``idle-time-out`` is a uint of milliseconds.
AMQP_MAX_IDLE_TIMEOUT = 4_294_967.0


class SettingError(ValueError):
    """A value outside its setting's range; the message names the setting, the range and the value."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One entry of the table.  ``name`` is the Python name (``HaConfig``'s field, a keyword argument); the
    command-line option is the same with dashes (``option``).  A number lies in ``[min, max]`` (above
    ``min``, not at it, when ``min_open``) and is finite; a string is one of ``choices``, or else a name:
    non-empty, without any of ``forbidden``."""

    name: str
    default: T
    unit: str
    help: str
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    choices: tuple[str, ...] = ()
    forbidden: str = ""

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def describe(self) -> str:
        """The range in words: "at least 2 (seconds)", "one of abort, forced"."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if isinstance(self.default, str):
            return "a non-empty name" + (f" without {', '.join(map(repr, self.forbidden))}" if self.forbidden else "")
        low = None if self.min is None else f"{'greater than' if self.min_open else 'at least'} {self.min:g}"
        if low is not None and self.max is not None:
            words = f"between {self.min:g} and {self.max:g}" if not self.min_open else f"{low} and at most {self.max:g}"
        elif low is not None:
            words = low
        elif self.max is not None:
            words = f"at most {self.max:g}"
        else:
            words = "a finite number"
        return f"{words} ({self.unit})" if self.unit else words

    def accepts(self, value: Any) -> bool:
        if self.choices:
            return value in self.choices
        if isinstance(self.default, str):
            return isinstance(value, str) and value != "" and not any(c in value for c in self.forbidden)
        if isinstance(value, bool) or not isinstance(value, int if isinstance(self.default, int) else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if self.min is not None and not (value > self.min if self.min_open else value >= self.min):
            return False
        return self.max is None or value <= self.max

    def check(self, value: T, name: str | None = None) -> T:
        """``value`` if it lies in this setting's range, else ``SettingError`` naming ``name`` (default: the
        setting's), the range and the value."""
        if not self.accepts(value):
            raise SettingError(f"{name or self.name} must be {self.describe()}, not {value!r}")
        return value


# -- the table ---------------------------------------------------------------------------------------
# Hot standby (hastandby serve --ha-cluster / --etcd; HaConfig).

#: The shortest lease TTL, s: etcd grants no lease shorter than 1.5 x its election timeout (1000 ms by default),
#: rounded up to whole seconds, and raises a shorter TTL to that without a word; a node asking for 1 s would be
#: replaced after 2 s all the same, so 1 is refused rather than promised.
MIN_LEASE_TTL = 2
LEASE_TTL = Setting("lease_ttl", 2, "seconds", "etcd lease TTL, seconds: a dead primary is replaced after about "
                    "this long", min=MIN_LEASE_TTL)
#: Less than 2/3 of the TTL (``check_lease``), so that at least a third of it is left as the safe lease age.
LEASE_MARGIN = Setting("lease_margin", 0.5, "seconds", "how long before the earliest server-side expiry of its "
                       "lease a primary must have stepped down: the node loop's reaction, excluding clients, and "
                       "clock-rate differences", min=0, min_open=True)
#: The handover target's key (``election/cluster.py``) lives on a lease of its own, so that a handover that
#: cannot happen expires by itself.
HANDOVER_TTL = Setting("handover_ttl", 10, "seconds", "how long the node an operator promotes (hastandby promote) "
                       "alone may campaign", min=MIN_LEASE_TTL)
#: Taken as the number of members instead when --brokers-url names fewer (``sync_quorum``).
MIN_SYNC = Setting("min_sync", 2, "nodes", "with etcd: nodes (the primary included) that must hold a message "
                   "before it is acknowledged; fewer reachable, and producers wait (at most the size of "
                   "--brokers-url)", min=1)
HEARTBEAT = Setting("heartbeat", 2.0, "seconds", "idle timeout advertised to peers, seconds; 0 is off",
                    min=0, max=AMQP_MAX_IDLE_TIMEOUT)
#: The same option's default for a node that is no cluster member: clients, not peers, are its peers.
STANDALONE_HEARTBEAT = Setting("heartbeat", 60.0, "seconds", HEARTBEAT.help, min=0, max=AMQP_MAX_IDLE_TIMEOUT)
BACKUP_TIMEOUT = Setting("backup_timeout", 10.0, "seconds", "seconds a new primary waits for an expected backup "
                         "to reconnect", min=0)
CLIENT_REFUSAL = Setting("client_refusal", "abort", "", "how a backup turns clients away otherwise: drop the "
                         "connection (clients with a URL list move on) or an AMQP close with "
                         "amqp:connection:forced naming the primary", choices=("abort", "forced"))
#: The etcd keys of a cluster live under its name (``election/cluster.py``): no '/' in it.
CLUSTER = Setting("cluster", "hastandby", "", "cluster name in etcd", forbidden="/")
ON_ROLE_CHANGE_TIMEOUT = Setting("on_role_change_timeout", 10.0, "seconds", "seconds one --on-role-change call "
                                 "may take; it is killed after that", min=0.1)

# The local cluster (hastandby cluster up; local_cluster.up), which also takes LEASE_TTL.
LOCAL_NODES = Setting("nodes", 3, "nodes", "how many nodes", min=1)
#: The nodes listen on this port and the ones after it (``check_local_ports``).
LOCAL_BASE_PORT = Setting("base_port", 5672, "TCP port", "first node's AMQP port; the others follow",
                          min=1, max=65000)
#: etcd's peer port is the one after it.
LOCAL_ETCD_PORT = Setting("etcd_port", 2379, "TCP port", "etcd's client port; its peer port is the next one",
                          min=1, max=65000)

TABLE: tuple[Setting[Any], ...] = (
    LEASE_TTL, LEASE_MARGIN, HANDOVER_TTL, MIN_SYNC, HEARTBEAT, STANDALONE_HEARTBEAT, BACKUP_TIMEOUT,
    CLIENT_REFUSAL, CLUSTER, ON_ROLE_CHANGE_TIMEOUT, LOCAL_NODES, LOCAL_BASE_PORT, LOCAL_ETCD_PORT,
)


# -- checks across settings ----------------------------------------------------------------------------


def check_named(values: Mapping[str, Any]) -> None:
    """Each of ``values`` whose name is a setting's in that setting's range, and the lease as a whole: what a
    configuration object (``HaConfig``) checks, by its fields' names."""
    for setting in TABLE:
        if setting.name in values:
            setting.check(values[setting.name])
    if "lease_ttl" in values and "lease_margin" in values:
        check_lease(values["lease_ttl"], values["lease_margin"])


def check_lease(lease_ttl: int, lease_margin: float) -> None:
    """Both in range, and the margin less than 2/3 of the TTL: at least a third of it stays safe lease age."""
    LEASE_TTL.check(lease_ttl)
    LEASE_MARGIN.check(lease_margin)
    if lease_margin >= lease_ttl * 2 / 3:
        raise SettingError(f"lease_margin must be less than 2/3 of lease_ttl ({lease_ttl * 2 / 3:g} s with a TTL "
                           f"of {lease_ttl} s), leaving at least a third of it as safe lease age, not {lease_margin!r}")


def sync_quorum(min_sync: int, members: int) -> int:
    """The ``min_sync`` a primary keeps with ``members`` members named (0: none named): at most all of them."""
    return min(min_sync, members or min_sync)


def check_local_ports(nodes: int, base_port: int, etcd_port: int) -> None:
    """The nodes' ports (``base_port`` on) exist and miss etcd's two (``etcd_port`` and the next)."""
    last = base_port + nodes - 1
    if last > 65535:
        raise SettingError(f"{nodes} nodes from port {base_port} need ports up to {last}: past 65535")
    if base_port <= etcd_port + 1 and etcd_port <= last:
        raise SettingError(f"etcd's ports {etcd_port} and {etcd_port + 1} are among the nodes' "
                           f"{base_port}-{last}")
