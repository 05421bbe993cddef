"""The ``hastandby`` command: run a node, and manage nodes over AMQP.

Thin by design: parse, call, print.  Every failure is one clear line on
stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from hastandby import settings
from hastandby.broker.vocabulary import LEVELS
from hastandby.client import Login, ManagementClient, ManagementError, read_password, redirected
from hastandby.connect_timeout import CONNECT_TIMEOUT
from hastandby.logs import FORMATS
from hastandby.verify import verify as run_verify

BROKER_HELP = "node to talk to, HOST:PORT"
DEFAULT_BROKER = "127.0.0.1:5672"
CONNECT_TIMEOUT_KEY = "hastandby.connect_timeout"  # where main keeps --connect-timeout (click's Context.meta)


def _broker_option(fn: Any) -> Any:
    return click.option("-b", "--broker", default=DEFAULT_BROKER, show_default=True, help=BROKER_HELP)(fn)


def _login() -> Login:
    """The credentials given to the ``hastandby`` command (see ``main``)."""
    context = click.get_current_context(silent=True)
    login = context.find_object(Login) if context is not None else None
    return login or Login.from_environment()


def _connect_timeout() -> float:
    """``--connect-timeout`` given to the ``hastandby`` command (see ``main``)."""
    context = click.get_current_context(silent=True)
    return float(context.meta.get(CONNECT_TIMEOUT_KEY, CONNECT_TIMEOUT)) if context is not None else CONNECT_TIMEOUT


def _client(broker: str, timeout: float = 10.0) -> ManagementClient:
    return ManagementClient(broker, timeout=timeout, login=_login(), connect_timeout=_connect_timeout())


def _request(broker: str, operation: str, type: str = "", name: str = "", body: dict[str, Any] | None = None) -> Any:
    try:
        with _client(broker) as client:
            return client.request(operation, type, name, body)
    except ManagementError as error:
        raise click.ClickException(str(error)) from None


def _request_primary(broker: str, operation: str, body: dict[str, Any] | None = None) -> Any:
    """A change to cluster state (users, ACL): a backup names its primary, and the request goes there."""
    try:
        with _client(broker) as client:
            return client.request(operation, body=body)
    except ManagementError as error:
        if error.primary is None:
            raise click.ClickException(str(error)) from None
        primary = error.primary
    click.echo(f"{broker} is a backup: sent to the primary, {primary}", err=True)
    return _request(redirected(broker, primary), operation, body=body)


@click.group()
@click.version_option(package_name="hastandby")
@click.option("--user", envvar="HASTANDBY_USER", help="user to authenticate as (or amqp://USER:PASSWORD@HOST:PORT "
              "in -b) [env HASTANDBY_USER]")
@click.option("--password-file", envvar="HASTANDBY_PASSWORD_FILE", type=click.Path(dir_okay=False, path_type=Path),
              help="file whose first line is the password [env HASTANDBY_PASSWORD_FILE; or HASTANDBY_PASSWORD]")
@click.option("--ssl-ca-file", envvar="HASTANDBY_SSL_CA_FILE", help="CA to verify the node's TLS certificate with")
@click.option("--ssl-cert-file", envvar="HASTANDBY_SSL_CERT_FILE", help="client certificate (EXTERNAL)")
@click.option("--ssl-key-file", envvar="HASTANDBY_SSL_KEY_FILE", help="client certificate's key")
@click.option("--connect-timeout", envvar="HASTANDBY_CONNECT_TIMEOUT", type=click.FloatRange(min=0.1),
              default=CONNECT_TIMEOUT, show_default=True,
              help="seconds a node has to answer a connect before it counts as unreachable (a node behind a cut "
                   "link never answers) [env HASTANDBY_CONNECT_TIMEOUT]")
@click.pass_context
def main(context: click.Context, user: str | None, password_file: Path | None, ssl_ca_file: str | None,
         ssl_cert_file: str | None, ssl_key_file: str | None, connect_timeout: float) -> None:
    """hastandby: a hot-standby AMQP 1.0 broker cluster.

    Node addresses (-b) are HOST:PORT, amqp://HOST:PORT or amqps://HOST:PORT (TLS).
    """
    environment = Login.from_environment()
    try:
        password = read_password(password_file) if password_file else environment.password
    except ManagementError as error:
        raise click.ClickException(str(error)) from None
    context.obj = Login(user, password, ssl_ca_file, ssl_cert_file, ssl_key_file)
    context.meta[CONNECT_TIMEOUT_KEY] = connect_timeout


# -- serve: how to reach etcd ---------------------------------------------------------

import functools  # here, with the etcd options that use them
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hastandby.election.etcd_client import EtcdSettings


def _etcd_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--etcd`` and its TLS and login options, handed to ``command`` as one ``etcd``:
    the ``EtcdSettings`` every etcd client of the node uses, or None without ``--etcd``."""
    options = [
        click.option("--etcd", "etcd_endpoints", metavar="URL[,URL...]",
                     help="etcd client URLs, comma-separated, all http://HOST:PORT or all https://HOST:PORT: "
                          "etcd elects the primary; when one fails the node moves to the next"),
        click.option("--etcd-ca-file", type=click.Path(exists=True, dir_okay=False),
                     help="CA that signs etcd's server certificate (needed with https)"),
        click.option("--etcd-cert-file", type=click.Path(exists=True, dir_okay=False),
                     help="this node's client certificate for etcd (etcd --client-cert-auth)"),
        click.option("--etcd-key-file", type=click.Path(exists=True, dir_okay=False), help="its private key"),
        click.option("--etcd-user", help="etcd user (etcd authentication; needs --etcd-password-file)"),
        click.option("--etcd-password-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="that user's password (first line of the file)"),
    ]

    @functools.wraps(command)
    def run(*args: Any, etcd_endpoints: str | None, etcd_ca_file: str | None, etcd_cert_file: str | None,
            etcd_key_file: str | None, etcd_user: str | None, etcd_password_file: Path | None,
            **kwargs: Any) -> Any:
        kwargs["etcd"] = _etcd_settings(etcd_endpoints, etcd_ca_file, etcd_cert_file, etcd_key_file, etcd_user,
                                        etcd_password_file)
        return command(*args, **kwargs)

    for option in reversed(options):
        run = option(run)
    return run


def _etcd_settings(endpoints: str | None, ca_file: str | None, cert_file: str | None, key_file: str | None,
                   user: str | None, password_file: Path | None) -> EtcdSettings | None:
    if not endpoints:
        if ca_file or cert_file or key_file or user or password_file:
            raise click.UsageError("the --etcd-* options need --etcd")
        return None
    if (user is None) != (password_file is None):
        raise click.UsageError("--etcd-user and --etcd-password-file go together")
    try:
        password = read_password(password_file) if password_file else None
    except ManagementError as error:
        raise click.ClickException(str(error)) from None
    from hastandby.election.etcd_client import EtcdSettings

    try:
        return EtcdSettings(endpoints, ca_file=ca_file, cert_file=cert_file, key_file=key_file, user=user,
                            password=password)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--etcd") from None


# -- the HA settings as options --------------------------------------------------------------
# Each option of settings.py's table takes its default, range and help from its entry: a value out of range
# is click's usage error (exit code 2) naming the option and the range, never a traceback further on.


class _FiniteFloatRange(click.FloatRange):
    """``FloatRange`` that also refuses nan and inf, which pass its comparisons or mean nothing here."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        converted = super().convert(value, param, ctx)
        if not math.isfinite(converted):
            self.fail(f"{converted} is not a finite number.", param, ctx)
        return converted


class _SettingName(click.types.StringParamType):
    """A name checked against its entry (``settings.CLUSTER``: non-empty, no '/')."""

    def __init__(self, setting: settings.Setting[str]) -> None:
        self.setting = setting

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self.setting.check(str(super().convert(value, param, ctx)))
        except settings.SettingError:
            self.fail(f"{value!r} is not {self.setting.describe()}.", param, ctx)


def setting_type(setting: settings.Setting[Any]) -> click.ParamType[Any, Any]:
    """The click type that holds ``setting``'s range: ``IntRange``, ``FloatRange`` (finite), ``Choice``, a name."""
    if setting.choices:
        return click.Choice(setting.choices)
    if isinstance(setting.default, str):
        return _SettingName(setting)
    if isinstance(setting.default, int):
        return click.IntRange(min=None if setting.min is None else math.ceil(setting.min),
                              max=None if setting.max is None else math.floor(setting.max), min_open=setting.min_open)
    return _FiniteFloatRange(min=setting.min, max=setting.max, min_open=setting.min_open)


def setting_option(setting: settings.Setting[Any], *decls: str, default: bool = True,
                   help: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A click option for ``setting`` (``--name``, or ``decls``): its type, default and help from the table;
    ``default=False``: no default (None), for an option whose default depends on others (``--heartbeat``)."""
    return click.option(*(decls or (setting.option,)), type=setting_type(setting),
                        default=setting.default if default else None, show_default=default,
                        help=help if help is not None else setting.help)


def _node_id(value: str | None) -> str | None:
    """``--node-id``: a part of the cluster's etcd keys (``election/cluster.py``), so non-empty and without '/'."""
    if value is not None and (value == "" or "/" in value):
        raise click.BadParameter(f"{value!r} is not a non-empty name without '/' (it is part of etcd's keys).")
    return value


def _checked(check: Callable[[], None], *options: str) -> None:
    """A check across options (``settings.check_local_ports``): its ``SettingError`` as a usage error."""
    try:
        check()
    except settings.SettingError as error:
        raise click.UsageError(f"{' / '.join(options)}: {error}") from None


# -- serve -----------------------------------------------------------------------


@main.command()
@click.option("--listen", default=DEFAULT_BROKER, show_default=True, help="address to accept AMQP connections on")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), help="node id, durable wiring and the journal of durable messages (docs/durability.md)")
@click.option("--log-format", type=click.Choice(FORMATS), default="console", show_default=True)
@click.option("--log-level", default="info", show_default=True)
@click.option("--replicate", type=click.Choice(LEVELS),
              help="default qpid.replicate level of new queues and exchanges [none; all with --ha-cluster]")
@click.option("--max-message-size", type=click.IntRange(min=0), default=64 * 1024 * 1024, show_default=True,
              help="largest message accepted, in bytes (0: no limit)")
@click.option("--no-auto-create", is_flag=True, help="refuse links to unknown addresses instead of creating queues")
@setting_option(settings.HEARTBEAT, default=False,
                help=f"{settings.HEARTBEAT.help} [{settings.STANDALONE_HEARTBEAT.default:g}; "
                     f"{settings.HEARTBEAT.default:g} with --ha-cluster]")
@click.option("--ha-cluster", is_flag=True, help="run as a member of a hot-standby cluster (starts connecting)")
@click.option("--brokers-url", default="", help="every member's HOST:PORT, comma-separated")
@click.option("--public-url", help="the HOST:PORT clients and peers know this node by (default: --listen)")
@setting_option(settings.BACKUP_TIMEOUT)
@click.option("--client-redirect", is_flag=True,
              help="a backup closes client connections with amqp:connection:redirect to the primary")
@setting_option(settings.CLIENT_REFUSAL)
@_etcd_options
@setting_option(settings.CLUSTER, "--cluster", "cluster_name")
@click.option("--node-id", callback=lambda ctx, param, value: _node_id(value),
              help="this node's id (default: kept in --data-dir, or random)")
@setting_option(settings.LEASE_TTL)
@setting_option(settings.MIN_SYNC)
@click.option("--users-file", type=click.Path(dir_okay=False, path_type=Path),
              help="users and their salted secrets [default: DATA_DIR/users.json] (hastandby user add)")
@click.option("--allow-anonymous/--no-allow-anonymous", default=False,
              help="accept connections without credentials, with every right unless --acl-file says otherwise "
                   "(development and trials only)")
@click.option("--acl-file", type=click.Path(dir_okay=False, path_type=Path),
              help="who may do what (docs/security.md); reloaded on SIGHUP and by 'hastandby acl reload'")
@click.option("--listen-tls", metavar="HOST:PORT", help="also accept TLS connections here (port 5671 if omitted)")
@click.option("--ssl-cert-file", type=click.Path(dir_okay=False, path_type=Path), help="this node's certificate")
@click.option("--ssl-key-file", type=click.Path(dir_okay=False, path_type=Path), help="its private key")
@click.option("--ssl-ca-file", type=click.Path(dir_okay=False, path_type=Path),
              help="CA that signs client and peer certificates")
@click.option("--ssl-require-client-cert", is_flag=True, help="TLS clients must present a certificate")
@click.option("--peer-user", help="user this node authenticates as to its primary and DR sources (group cluster)")
@click.option("--peer-password-file", type=click.Path(dir_okay=False, path_type=Path),
              help="that user's password (first line of the file)")
@click.option("--memory-high-watermark", metavar="SIZE|FRACTION",
              help="above this resident memory producers get no more credit until it falls below 80 % of it: "
                   "a size (256MB, 2GiB) or a fraction of RAM [default: 0.4]")
@click.option("--journal-sync", type=click.Choice(["batch", "always", "off"]), default="batch", show_default=True,
              help="with --data-dir, durable messages are journaled before they are acknowledged: one fsync per "
                   "pass of events (batch), per message (always), or none (off) (docs/durability.md)")
@click.option("--limit", "limits", multiple=True, metavar="NAME=VALUE",
              help="a resource limit, e.g. --limit connections=20000 (0: none); names and defaults in "
                   "docs/limits.md")
@click.option("--peer-tls", is_flag=True,
              help="connect to peers with TLS (verified with --ssl-ca-file; --ssl-cert-file presented); "
                   "peers then know this node by its --listen-tls address")
@click.option("--metrics-listen", metavar="HOST:PORT",
              help="serve Prometheus metrics at http://HOST:PORT/metrics (docs/metrics.md)")
@click.option("--supervise", is_flag=True,
              help="run the node as a child process: when it dies, revoke its etcd lease at once (a backup "
                   "takes over without waiting for the TTL) and start it again (docs/lifecycle.md)")
@click.option("--virtual-ip", metavar="ADDRESS/PREFIX",
              help="an address that follows the primary: added to --virtual-ip-interface while this node serves "
                   "clients as primary and announced with gratuitous ARP, removed when it stops; needs "
                   "CAP_NET_ADMIN and CAP_NET_RAW (docs/lifecycle.md section 14)")
@click.option("--virtual-ip-interface", metavar="NAME", help="the interface that carries --virtual-ip")
@click.option("--on-role-change", metavar="COMMAND",
              help="run COMMAND ROLE CLUSTER TERM (HASTANDBY_ROLE, _CLUSTER, _TERM, _NODE_ID in its environment) "
                   "on every role change, in order, off the reactor thread (docs/lifecycle.md section 14)")
@setting_option(settings.ON_ROLE_CHANGE_TIMEOUT)
def serve(listen: str, data_dir: Path | None, log_format: str, log_level: str, replicate: str | None,
          max_message_size: int, no_auto_create: bool, heartbeat: float | None, ha_cluster: bool,
          brokers_url: str, public_url: str | None, backup_timeout: float, client_redirect: bool,
          client_refusal: str, etcd: EtcdSettings | None, cluster_name: str, node_id: str | None, lease_ttl: int,
          min_sync: int,
          users_file: Path | None, allow_anonymous: bool, acl_file: Path | None, listen_tls: str | None,
          ssl_cert_file: Path | None, ssl_key_file: Path | None, ssl_ca_file: Path | None,
          ssl_require_client_cert: bool, peer_user: str | None, peer_password_file: Path | None,
          memory_high_watermark: str | None, journal_sync: str, limits: tuple[str, ...], peer_tls: bool,
          metrics_listen: str | None, supervise: bool, virtual_ip: str | None, virtual_ip_interface: str | None,
          on_role_change: str | None, on_role_change_timeout: float) -> None:
    """Run a node until SIGINT/SIGTERM.  --listen none: no plain listener (TLS only)."""
    from hastandby import logs
    from hastandby.dr.service import DisasterRecovery, config_store
    from hastandby.broker.admission.memory import parse_watermark
    from hastandby.node import Node, NodeConfig
    from hastandby.security.acl import AclError
    from hastandby.security.credentials import CredentialsError
    from hastandby.security.tls import TlsError, TlsSettings

    logs.configure(log_format, log_level)
    from hastandby.host.supervised import die_with_supervisor

    die_with_supervisor()
    follower = _follow_primary_options(ha_cluster or bool(etcd), virtual_ip, virtual_ip_interface, on_role_change)
    if supervise:
        from hastandby.host.supervisor import Supervisor

        node_argv = [sys.executable, "-m", "hastandby", *(arg for arg in sys.argv[1:] if arg != "--supervise")]
        # A dead node cannot remove its virtual IP; its supervisor, on the same host, can.
        sys.exit(Supervisor(node_argv, etcd, after_exit=follower.remove if follower is not None else None).run())
    if etcd:
        ha_cluster = True
    if heartbeat is None:
        heartbeat = settings.HEARTBEAT.default if ha_cluster else settings.STANDALONE_HEARTBEAT.default
    try:
        peer_password = read_password(peer_password_file) if peer_password_file else None
    except ManagementError as error:
        raise click.ClickException(str(error)) from None
    try:
        watermark = parse_watermark(memory_high_watermark) if memory_high_watermark else None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--memory-high-watermark") from None
    config = NodeConfig(
        listen=None if listen == "none" else listen,
        data_dir=data_dir,
        replicate=replicate or ("all" if ha_cluster else "none"),
        max_message_size=max_message_size,
        auto_create=not no_auto_create,
        heartbeat=heartbeat,
        node_id=node_id,
        users_file=users_file,
        allow_anonymous=allow_anonymous,
        acl_file=acl_file,
        listen_tls=listen_tls,
        tls=TlsSettings(ssl_cert_file, ssl_key_file, ssl_ca_file, ssl_require_client_cert),
        peer_user=peer_user,
        peer_password=peer_password,
        peer_tls=peer_tls,
        memory_high_watermark=watermark,
        limits=_parse_limits(limits),
        journal_sync=journal_sync,
    )
    if not config.listen and not config.listen_tls:
        raise click.UsageError("--listen none needs --listen-tls")
    closers: list[Callable[[], object]] = []
    try:
        node = Node(config)
        dr = DisasterRecovery(node, config_store(data_dir, etcd, cluster_name),
                              public_url or config.peer_address,
                              heartbeat=min(heartbeat, settings.HEARTBEAT.default) or settings.HEARTBEAT.default)
        if ha_cluster:
            from hastandby.ha.node import HaConfig, HaNode

            brokers = [b.strip() for b in brokers_url.split(",") if b.strip()]
            ha = HaNode(node, HaConfig(brokers=brokers, public_url=public_url, backup_timeout=backup_timeout,
                                       client_redirect=client_redirect, client_refusal=client_refusal,
                                       heartbeat=heartbeat, etcd=etcd, cluster=cluster_name, lease_ttl=lease_ttl,
                                       min_sync=min_sync))
            ha.on_serving.append(dr.set_serving)
            closers = _attach_role_actions(ha, follower, on_role_change, cluster_name, on_role_change_timeout)
        else:
            node.on_start.append(lambda: dr.set_serving(True))
            if node.journal is not None and node.journal.damage:  # logged and shown in status (found_damaged)
                node.journal.repaired("a standalone node has no other copy to recover from: the loss is final")
        if metrics_listen:
            from hastandby.metrics import serve_metrics
            try:
                serve_metrics(node, metrics_listen)
            except (OSError, ValueError) as error:
                raise click.ClickException(f"cannot serve metrics on {metrics_listen}: {error}") from None
        try:
            node.run()
        finally:
            for close in closers:  # after a graceful stop: the address removed, the last hook call run (bounded)
                close()
    except (AclError, CredentialsError, TlsError) as error:
        raise click.ClickException(str(error)) from None
    except OSError as error:
        raise click.ClickException(f"cannot serve on {config.address}: {error}") from None


def _follow_primary_options(clustered: bool, virtual_ip: str | None, interface: str | None,
                            on_role_change: str | None) -> Any:
    """Check --virtual-ip / --on-role-change before anything starts; the VirtualIp to manage, or None."""
    if (virtual_ip or on_role_change) and not clustered:
        raise click.UsageError("--virtual-ip and --on-role-change need --ha-cluster or --etcd")
    if on_role_change:
        from hastandby.host.role_hooks import RoleCommandError, parse_command

        try:
            parse_command(on_role_change)
        except RoleCommandError as error:
            raise click.BadParameter(str(error), param_hint="--on-role-change") from None
    if bool(virtual_ip) != bool(interface):
        raise click.UsageError("--virtual-ip and --virtual-ip-interface go together")
    if not virtual_ip or not interface:
        return None
    from hastandby.host.virtual_ip import VirtualIp, VirtualIpError, check_setup, parse_address

    try:
        address = parse_address(virtual_ip)
        check_setup(address, interface)
    except VirtualIpError as error:
        raise click.ClickException(str(error)) from None
    return VirtualIp(address, interface)


def _attach_role_actions(ha: Any, follower: Any, on_role_change: str | None, cluster_name: str,
                         timeout: float) -> list[Callable[[], object]]:
    """The virtual IP follows client service, the hook every role change; what to wait for at the end."""
    closers: list[Callable[[], object]] = []
    if follower is not None:
        from hastandby.host.virtual_ip import COMMAND_TIMEOUT

        follower.start()  # removes what a node killed as primary may have left here
        ha.on_serving.append(follower.serving)
        closers.append(lambda: follower.close(COMMAND_TIMEOUT + 1))
    if on_role_change:
        from hastandby.host.role_hooks import RoleCommand

        command = RoleCommand(on_role_change, cluster_name, ha.node_id, timeout)
        ha.on_role_change.append(command.role_changed)
        closers.append(lambda: command.close(timeout + 1))
    return closers


def _parse_limits(pairs: tuple[str, ...]) -> Any:
    """``--limit NAME=VALUE`` options onto the default Limits."""
    import dataclasses

    from hastandby.broker.admission.limits import Limits

    known = {f.name for f in dataclasses.fields(Limits)}
    values: dict[str, int] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        name = name.strip().replace("-", "_")
        if name not in known or not value.strip().isdigit():
            raise click.BadParameter(f"{pair!r}: expected NAME=NUMBER with NAME one of {', '.join(sorted(known))}",
                                     param_hint="--limit")
        values[name] = int(value)
    return Limits(**values)


# -- add / del ---------------------------------------------------------------------


@main.group()
def add() -> None:
    """Create a queue or an exchange."""


@add.command("queue")
@click.argument("name")
@_broker_option
@click.option("--replicate", type=click.Choice(LEVELS), help="qpid.replicate level (default: the node's)")
@click.option("--max-count", type=click.IntRange(min=0), help="most messages the queue holds")
@click.option("--max-size", type=click.IntRange(min=0), help="most bytes the queue holds")
@click.option("--policy", type=click.Choice(["reject", "ring"]), help="what happens at the limit")
@click.option("--exclusive", is_flag=True, help="one consumer at a time")
@click.option("--auto-delete", is_flag=True, help="delete when the last consumer leaves")
@click.option("--auto-delete-timeout", type=click.FloatRange(min=0), help="seconds to wait before auto-deleting")
@click.option("--alternate-exchange", help="where rejected and unroutable messages go")
@click.option("--durable", is_flag=True, help="keep the queue's definition across restarts")
@click.option("--priorities", type=click.IntRange(1, 10),
              help="priority levels, 1-10 (qpid.priorities): higher priority first, FIFO within a level")
@click.option("--delivery-limit", type=click.IntRange(min=1),
              help="failed deliveries before a message goes to the alternate exchange, or is dropped "
                   "(x-delivery-limit)")
@click.option("--single-active-consumer", is_flag=True,
              help="one consumer receives, the others wait in attach order (x-single-active-consumer)")
@click.option("--dedup-window", type=click.IntRange(1, 86_400), metavar="SECONDS",
              help="a message whose message-id the queue took within SECONDS (1-86400) is accepted, not "
                   "enqueued again (x-dedup-window)")
@click.option("--lvq-key", metavar="KEY",
              help="a last-value queue: a message replaces the older one with the same value of application "
                   "property KEY (qpid.last_value_queue_key)")
@click.option("--group-header", metavar="HEADER",
              help="message groups: the messages with one value of application property HEADER go to one "
                   "consumer at a time (qpid.group_header_key; without it: the group qpid.no-group)")
@click.option("--shared-groups", is_flag=True,
              help="with --group-header, as qpid-config names it (qpid.shared_msg_group)")
@click.option("--argument", "extra", multiple=True, metavar="KEY=VALUE", help="any other queue argument")
@click.option("--start-replica", metavar="SOURCE", help="then replicate it from SOURCE (see: hastandby replicate)")
@click.option("--mode", type=click.Choice(["full", "enqueue"]), default="full", show_default=True,
              help="with --start-replica: the replication mode")
def add_queue(name: str, broker: str, replicate: str | None, max_count: int | None, max_size: int | None,
              policy: str | None, exclusive: bool, auto_delete: bool, auto_delete_timeout: float | None,
              alternate_exchange: str | None, durable: bool, extra: tuple[str, ...], start_replica: str | None,
              mode: str, priorities: int | None = None, delivery_limit: int | None = None,
              single_active_consumer: bool = False, dedup_window: int | None = None,
              lvq_key: str | None = None, group_header: str | None = None, shared_groups: bool = False) -> None:
    """Create queue NAME (docs/queues.md: priorities, delivery limit, single active consumer, duplicate
    detection, last-value queues, message groups)."""
    if lvq_key is not None and not lvq_key:
        raise click.BadParameter("must name an application property, not be empty", param_hint="'--lvq-key'")
    if group_header is not None and not group_header:
        raise click.BadParameter("must name an application property, not be empty", param_hint="'--group-header'")
    if shared_groups and group_header is None:
        raise click.BadParameter("needs --group-header (the groups of which header?)", param_hint="'--shared-groups'")
    arguments = _parse_arguments(extra)
    for key, value in (("qpid.replicate", replicate), ("qpid.max_count", max_count), ("qpid.max_size", max_size),
                       ("qpid.policy_type", policy), ("qpid.auto_delete_timeout", auto_delete_timeout),
                       ("qpid.priorities", priorities), ("x-delivery-limit", delivery_limit),
                       ("x-single-active-consumer", single_active_consumer or None),
                       ("x-dedup-window", dedup_window), ("qpid.last_value_queue_key", lvq_key),
                       ("qpid.group_header_key", group_header), ("qpid.shared_msg_group", shared_groups or None)):
        if value is not None:
            arguments[key] = value
    body = {"arguments": arguments, "exclusive": exclusive, "auto-delete": auto_delete, "durable": durable}
    if alternate_exchange:
        body["alternate-exchange"] = alternate_exchange
    _request(broker, "CREATE", "queue", name, body)
    if start_replica:
        _start_replica(broker, start_replica, name, mode, create=False, sync=False, backlog=(), wait=5.0)


@add.command("exchange")
@click.argument("type", type=click.Choice(["direct", "fanout", "topic"]))
@click.argument("name")
@_broker_option
@click.option("--replicate", type=click.Choice(LEVELS), help="qpid.replicate level (default: the node's)")
@click.option("--alternate-exchange", help="where unroutable messages go")
@click.option("--durable", is_flag=True, help="keep the exchange's definition across restarts")
def add_exchange(type: str, name: str, broker: str, replicate: str | None, alternate_exchange: str | None,
                 durable: bool) -> None:
    """Create exchange NAME of TYPE."""
    arguments = {"qpid.replicate": replicate} if replicate else {}
    body: dict[str, Any] = {"exchange-type": type, "arguments": arguments, "durable": durable}
    if alternate_exchange:
        body["alternate-exchange"] = alternate_exchange
    _request(broker, "CREATE", "exchange", name, body)


def _parse_arguments(pairs: tuple[str, ...]) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--argument")
        try:
            arguments[key] = json.loads(value)
        except ValueError:
            arguments[key] = value
    return arguments


@main.command("del")
@click.argument("type", type=click.Choice(["queue", "exchange"]))
@click.argument("name")
@_broker_option
def delete(type: str, name: str, broker: str) -> None:
    """Delete queue or exchange NAME."""
    _request(broker, "DELETE", type, name)


@main.command()
@click.argument("exchange")
@click.argument("queue")
@click.argument("key", default="")
@_broker_option
@click.option("--replicate", type=click.Choice(LEVELS), help="qpid.replicate of the binding itself")
def bind(exchange: str, queue: str, key: str, broker: str, replicate: str | None) -> None:
    """Bind QUEUE to EXCHANGE with binding KEY."""
    arguments = {"qpid.replicate": replicate} if replicate else {}
    _request(broker, "BIND", "binding", body={"exchange": exchange, "queue": queue, "key": key,
                                               "arguments": arguments})


@main.command()
@click.argument("exchange")
@click.argument("queue")
@click.argument("key", default="")
@_broker_option
def unbind(exchange: str, queue: str, key: str, broker: str) -> None:
    """Remove the binding of QUEUE to EXCHANGE with KEY."""
    _request(broker, "UNBIND", "binding", body={"exchange": exchange, "queue": queue, "key": key})


@main.command()
@click.argument("name")
@_broker_option
def purge(name: str, broker: str) -> None:
    """Remove every available message from queue NAME."""
    result = _request(broker, "PURGE", "queue", name)
    click.echo(f"purged {result.get('purged', 0)} messages")


# -- query / status / ping -----------------------------------------------------------


@main.command()
@_broker_option
@click.option("--json", "as_json", is_flag=True, help="print the raw JSON")
def query(broker: str, as_json: bool) -> None:
    """Show queues (depth, consumers, arguments), exchanges and bindings."""
    result = _request(broker, "QUERY")
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
        return
    click.echo(_format_query(result))


def _format_query(result: dict[str, Any]) -> str:
    lines = ["Queues:"]
    lines.append(f"  {'name':<30} {'depth':>8} {'acquired':>8} {'scheduled':>9} {'consumers':>9} {'replicate':<13} "
                 "arguments")
    for q in sorted(result.get("queues", []), key=lambda q: q["name"]):
        args = {k: v for k, v in q["arguments"].items() if k != "qpid.replicate"}
        lines.append(f"  {q['name']:<30} {q['depth']:>8} {q['acquired']:>8} {q.get('scheduled', 0):>9} "
                     f"{q['consumers']:>9} "
                     f"{q['replicate']:<13} {json.dumps(args, default=str) if args else ''}")
    lines.append("Exchanges:")
    for e in sorted(result.get("exchanges", []), key=lambda e: e["name"]):
        lines.append(f"  {e['name']:<30} {e['type']:<8} bindings={e['bindings']} routed={e['routed']} "
                     f"dropped={e['dropped']} replicate={e['replicate']}")
    lines.append("Bindings:")
    for b in result.get("bindings", []):
        lines.append(f"  {b['exchange']} -> {b['queue']} key={b['key']!r}")
    lines.extend(_replication_lines(result.get("replication") or {}))
    ha = result.get("ha")
    if ha:
        lines.append(f"Cluster: this node is {ha['state']}, term {ha['term']}")
        for member in ha.get("members", []):
            lines.append(f"  {member.get('node_id')} {member.get('url')} {member.get('state')}")
        for queue, per_backup in sorted(ha.get("lag", {}).items()):
            lags = ", ".join(f"{backup}={lag}" for backup, lag in sorted(per_backup.items()))
            lines.append(f"  lag {queue}: {lags}")
    return "\n".join(lines)


def _replication_lines(replication: dict[str, Any]) -> list[str]:
    """One line per DR replication, replica side ("<-") and source side ("->")."""
    lines = []
    for r in replication.get("replicas", []):
        lines.append(f"replica {r['queue']} <- {r['source']} {r['mode']}{' sync' if r.get('sync') else ''}: "
                     f"{r['state']}, lag {_lag(r)}" + (f", error {r['error']}" if r.get("error") else ""))
    for r in replication.get("sources", []):
        lines.append(f"source {r['queue']} -> {r.get('replica') or '(replica away)'} {r['mode']}: "
                     f"{r['state']}, lag {_lag(r)}")
    return lines


def _lag(report: dict[str, Any]) -> str:
    if report.get("lag_messages") is None:
        return "unknown"
    text = f"{report['lag_messages']} msgs / {report.get('lag_seconds') or 0:g} s"
    return text + (f", overflow dropped {report['overflow']}" if report.get("overflow") else "")


@main.command()
@_broker_option
@click.option("--expect", help="exit 0 if the node's state is this word, else 1")
@click.option("--is-primary", is_flag=True, help="exit 0 if the node is the primary, else 1")
@click.option("--all", "every", is_flag=True, help="the state of every node of the node's brokers URL")
@click.option("--json", "as_json", is_flag=True, help="print the whole status as JSON")
def status(broker: str, expect: str | None, is_primary: bool, every: bool, as_json: bool) -> None:
    """Print the node's state word (standalone, connecting, catchup, backup, primary)."""
    result = _request(broker, "STATUS")
    if every:
        for member in result.get("brokers") or [broker]:
            try:
                with _client(member, timeout=3) as client:
                    state = client.request("STATUS")
                line = f"{member} {state['state']}" + (f" ({state['detail']})" if state.get("detail") else "")
                line += "".join(f"; {problem}" for problem in _problems(state))
            except ManagementError as error:
                line = f"{member} unreachable: {error}"
            click.echo(line)
        return
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        click.echo(result["state"] + (f" ({result['detail']})" if result.get("detail") else ""))
        for line in _problems(result):
            click.echo(f"  {line}")
        for line in _replication_lines(result.get("replication") or {}):
            click.echo(line)
    if expect is not None and result["state"] != expect:
        sys.exit(1)
    if is_primary and result["state"] != "primary":
        sys.exit(1)


def _problems(status: dict[str, Any]) -> list[str]:
    """What keeps a node from serving or taking over as it should (its disk, a backup's disk), one line each."""
    journal = status.get("journal") or {}
    found = []
    if status.get("not_ready_because"):
        found.append(f"not ready: {status['not_ready_because']}")
    else:
        if journal.get("writing") is False:
            found.append(f"journal cannot write ({journal.get('error')}): durable messages are refused")
        if journal.get("damaged"):
            found.append("journal damaged: this node lacks data it lost (docs/durability.md)")
    if status.get("refusing"):
        found.append(f"refusing messages for replicated queues: {status['refusing']}")
    elif status.get("acks_waiting_for"):
        found.append(f"acknowledgements wait: {status['acks_waiting_for']}")
    return found


def _parse_backlog(values: tuple[str, ...]) -> dict[str, int]:
    """``--max-backlog 10000`` (messages) and/or ``--max-backlog 64MB`` (bytes: B, KB, MB, GB)."""
    limits: dict[str, int] = {}
    units = {"GB": 1 << 30, "MB": 1 << 20, "KB": 1 << 10, "B": 1}
    for value in values:
        text = value.strip().upper()
        unit = next((u for u in units if text.endswith(u)), None)
        number = text[: -len(unit)] if unit else text
        if not number.isdigit() or int(number) <= 0:
            raise click.BadParameter(f"{value!r}: give a number of messages (10000) or a size (64MB)",
                                     param_hint="--max-backlog")
        limits["max-backlog-bytes" if unit else "max-backlog-count"] = int(number) * (units[unit] if unit else 1)
    return limits


def _start_replica(broker: str, source: str, queue: str, mode: str, create: bool, sync: bool,
                   backlog: tuple[str, ...], wait: float) -> None:
    body: dict[str, Any] = {"source": source, "mode": mode, "create": create, "sync": sync, **_parse_backlog(backlog)}
    report = _request(broker, "REPLICATE", "queue", queue, body)
    deadline = time.monotonic() + wait
    while report.get("state") in ("connecting", "catching up") and time.monotonic() < deadline:
        time.sleep(0.2)
        replicas = (_request(broker, "STATUS").get("replication") or {}).get("replicas", [])
        report = next((r for r in replicas if r["queue"] == queue), report)
    click.echo(_replication_lines({"replicas": [report]})[0])


@main.command()
@click.argument("nodes", nargs=-1, required=True)
@_broker_option
@click.option("--mode", type=click.Choice(["full", "enqueue"]), default="full", show_default=True,
              help="full: mirror the source queue; enqueue: copy every new message, dequeues stay local")
@click.option("--create", is_flag=True, help="create the local queue if it does not exist")
@click.option("--sync", is_flag=True, help="the source holds producers' acknowledgements until the replica has "
              "each message (default: asynchronous)")
@click.option("--max-backlog", "backlog", multiple=True, metavar="N|SIZE",
              help="enqueue mode: most messages (10000) or bytes (64MB) the source keeps for an absent replica")
@click.option("--stop", is_flag=True, help="stop replicating QUEUE (the source forgets its backlog)")
@click.option("--wait", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="seconds to wait for the replication to come up before printing its state")
def replicate(nodes: tuple[str, ...], broker: str, mode: str, create: bool, sync: bool, backlog: tuple[str, ...],
              stop: bool, wait: float) -> None:
    """Replicate a queue to this node (-b) from SOURCE: replicate -b NODE2 SOURCE QUEUE.

    SOURCE is HOST:PORT, or the comma-separated nodes of an HA cluster (the
    replication follows its primary).  With --stop: replicate --stop -b NODE2 QUEUE.
    """
    if stop:
        if len(nodes) != 1:
            raise click.UsageError("replicate --stop -b NODE QUEUE takes just the queue")
        _request(broker, "REPLICATE-STOP", "queue", nodes[0])
        click.echo(f"stopped replicating {nodes[0]} on {broker}")
        return
    if len(nodes) != 2:
        raise click.UsageError("replicate -b NODE2 SOURCE QUEUE: give the source and the queue")
    _start_replica(broker, nodes[0], nodes[1], mode, create, sync, backlog, wait)


@main.command()
@_broker_option
@click.option("--force", is_flag=True,
              help="after a whole-cluster restart, start the cluster from this node without waiting for the "
                   "sync members that hold the latest store (what only they hold is lost; see docs/durability.md)")
def promote(broker: str, force: bool) -> None:
    """Make a caught-up backup node the primary."""
    result = _request(broker, "PROMOTE", body={"force": True} if force else None)
    if force:
        click.echo(f"{broker}: {result.get('message')}")
    if result.get("message", "").startswith(("handover", "forced")):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            result = _request(broker, "STATUS")
            if result.get("state") == "primary":
                break
            time.sleep(0.1)
        else:
            raise click.ClickException(f"{broker} did not take over within 15 s (state {result.get('state')})")
    click.echo(f"{broker} is {result.get('state')}" + (f" (term {result['term']})" if "term" in result else ""))


@main.command()
@_broker_option
@click.option("--timeout", type=float, default=5.0, show_default=True)
def ping(broker: str, timeout: float) -> None:
    """Exit 0 if the node answers."""
    try:
        with _client(broker, timeout=timeout) as client:
            client.request("PING")
    except ManagementError as error:
        raise click.ClickException(str(error)) from None
    click.echo("ok")


@main.command()
@_broker_option
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--settle", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="seconds before ids found on one side only are read again (a live cluster moves)")
def verify(broker: str, as_json: bool, settle: float) -> None:
    """Compare the primary's replicated queues with every ready backup's copy; exit 1 on any difference.

    -b names any node of the cluster: its primary is found.  Compared are
    each queue's lineage, its replication ids and a digest of each message's
    bytes (see docs/lifecycle.md, section 9).  Run it after an incident.
    """
    try:
        report = run_verify(broker, settle=settle, login=_login(), connect_timeout=_connect_timeout())
    except ManagementError as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        click.echo(f"primary {report.primary}; ready backups: {', '.join(report.backups) or 'none'}; "
                   f"{len(report.queues)} replicated queues, {report.compared} messages compared")
        for difference in report.differences:
            click.echo(f"DIFFERENT {difference}")
        click.echo("equal" if report.equal else f"{len(report.differences)} differences")
    if not report.equal:
        sys.exit(1)


# -- users and ACL ------------------------------------------------------------------------


def _users_target(fn: Any) -> Any:
    fn = click.option("--users-file", type=click.Path(dir_okay=False, path_type=Path),
                      help="edit this users file directly (the node's --users-file) instead of asking a node")(fn)
    return click.option("-b", "--broker", help="node to ask (its users file is written), HOST:PORT")(fn)


def _new_password(password_file: Path | None) -> str:
    """The new password: from a file, else from standard input (prompted, hidden, on a terminal)."""
    try:
        if password_file is not None:
            return read_password(password_file)
    except ManagementError as error:
        raise click.ClickException(str(error)) from None
    if sys.stdin.isatty():
        return str(click.prompt("Password", hide_input=True, confirmation_prompt=True))
    line = sys.stdin.readline()
    if not line.strip("\n"):
        raise click.ClickException("no password on standard input")
    return line.rstrip("\n")


def _edit_users(users_file: Path | None, broker: str | None, operation: str, body: dict[str, Any],
                change: Any) -> None:
    from hastandby.security.credentials import Credentials, CredentialsError

    if (users_file is None) == (broker is None):
        raise click.UsageError("give --users-file FILE (offline) or -b NODE (a running node)")
    if broker is not None:
        result = _request_primary(broker, operation, body=body) if operation != "USER-LIST" \
            else _request(broker, operation, body=body)
    else:
        try:
            store = Credentials.load(users_file)
            change(store)
            if operation != "USER-LIST":
                store.save()
        except CredentialsError as error:
            raise click.ClickException(str(error)) from None
        result = {"users": store.describe()}
    for user in result["users"]:
        click.echo(f"{user['user']}  groups: {', '.join(user['groups']) or '-'}"
                   f"{'' if user['password'] else '  (certificate only)'}")


@main.group()
def user() -> None:
    """Manage the users (salted secrets only; groups admin and cluster mean something to the node).

    In a cluster the users are the cluster's: a change given to a backup goes to its primary, which
    replicates it to every node."""


@user.command("add")
@click.argument("name")
@click.option("--group", "groups", multiple=True, help="a group to put the user in (repeat for several)")
@click.option("--new-password-file", type=click.Path(dir_okay=False, path_type=Path),
              help="read the password from this file (default: standard input)")
@click.option("--no-password", is_flag=True, help="a user who authenticates with a TLS certificate only")
@_users_target
def user_add(name: str, groups: tuple[str, ...], new_password_file: Path | None, no_password: bool,
             broker: str | None, users_file: Path | None) -> None:
    """Add a user."""
    password = None if no_password else _new_password(new_password_file)
    _edit_users(users_file, broker, "USER-ADD", {"user": name, "password": password, "groups": list(groups)},
                lambda store: store.add(name, password, list(groups)))


@user.command("passwd")
@click.argument("name")
@click.option("--new-password-file", type=click.Path(dir_okay=False, path_type=Path),
              help="read the password from this file (default: standard input)")
@_users_target
def user_passwd(name: str, new_password_file: Path | None, broker: str | None, users_file: Path | None) -> None:
    """Set a user's password."""
    password = _new_password(new_password_file)
    _edit_users(users_file, broker, "USER-PASSWD", {"user": name, "password": password},
                lambda store: store.set_password(name, password))


@user.command("del")
@click.argument("name")
@_users_target
def user_del(name: str, broker: str | None, users_file: Path | None) -> None:
    """Remove a user."""
    _edit_users(users_file, broker, "USER-DEL", {"user": name}, lambda store: store.delete(name))


@user.command("list")
@_users_target
def user_list(broker: str | None, users_file: Path | None) -> None:
    """List users and their groups."""
    _edit_users(users_file, broker, "USER-LIST", {}, lambda store: None)


@main.group()
def acl() -> None:
    """The node's ACL file."""


@acl.command("reload")
@_broker_option
def acl_reload(broker: str) -> None:
    """Read the primary's ACL file again and give its rules to every node (a file with a mistake leaves the
    rules as they were); on a backup, the request goes to its primary."""
    result = _request_primary(broker, "ACL-RELOAD")
    click.echo(f"{broker}: ACL reloaded from {result['acl']}")


# -- benchmarks and dashboards ---------------------------------------------------------------
# The benchmarks are not part of the installed package: they are the repository's benchmarks/ folder, and
# the two test suites with a command line of their own, tests/nemesis/ and tests/fuzz/.  `bench` runs one
# in this process when its top-level package (`benchmarks`, `tests`) is importable (python -m hastandby from
# a checkout's root); when this package is a checkout's (pip install -e), as `python -m MODULE` with that
# checkout on the child's PYTHONPATH; otherwise it says that it needs a checkout.  sys.path is left alone.

_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}
BENCHMARKS = {"throughput": "benchmarks.throughput", "ha-throughput": "benchmarks.ha_throughput",
              "catchup": "benchmarks.catchup", "failover": "benchmarks.failover", "dr-lag": "benchmarks.dr_lag",
              "nemesis": "tests.nemesis", "fuzz": "tests.fuzz",
              "security": "benchmarks.security", "auth-flood": "benchmarks.auth_flood",
              "overload": "benchmarks.overload", "durable": "benchmarks.durable",
              "journal-cost": "benchmarks.journal_cost"}
_CHECKOUT_PACKAGES = ("benchmarks", "tests")  # where BENCHMARKS' modules live: a checkout's, never installed
_CHECKOUT = Path(__file__).resolve().parent.parent  # the repository's root, if this package lies in one


def _run_module_main(module: str, argv: list[str]) -> None:
    import importlib
    import importlib.util

    top = module.split(".")[0]
    try:
        available = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        available = False
    if not available and top in _CHECKOUT_PACKAGES:
        if (_CHECKOUT / top / "__init__.py").is_file() and (_CHECKOUT / "pyproject.toml").is_file():
            import os

            path = os.pathsep.join(filter(None, [str(_CHECKOUT), os.environ.get("PYTHONPATH")]))
            os.execve(sys.executable, [sys.executable, "-m", module, *argv], {**os.environ, "PYTHONPATH": path})
        command = " ".join(["python", "-m", module, *argv])
        raise click.ClickException(
            "hastandby bench needs a checkout of the hastandby repository: the benchmarks are not part of the "
            f"installed package. In a clone, run `{command}` from its root (or `pip install -e '.[bench]'` there "
            "and use `hastandby bench` again)")
    try:
        entry = importlib.import_module(module).main
    except ImportError as error:
        raise click.ClickException(f"{module} is not available ({error})") from None
    sys.exit(entry(argv))


@main.command(context_settings=_PASS_THROUGH)
@click.argument("name", type=click.Choice(sorted(BENCHMARKS)))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(name: str, args: tuple[str, ...]) -> None:
    """Run a benchmark (arguments go to it; --help shows them)."""
    _run_module_main(BENCHMARKS[name], list(args))


@main.command(context_settings=_PASS_THROUGH)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def dashboard(args: tuple[str, ...]) -> None:
    """Build the failover-timing dashboard from traces (arguments go to spark_analysis.failover_dashboard)."""
    _run_module_main("spark_analysis.failover_dashboard", list(args))


# -- local cluster -------------------------------------------------------------------


@main.group()
def cluster() -> None:
    """A local cluster to try things on: a real etcd plus nodes on loopback."""


_CLUSTER_DIR = click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
                            default=Path(".cluster"), show_default=True, help="state, logs and data dirs")


@cluster.command("up")
@_CLUSTER_DIR
@setting_option(settings.LOCAL_NODES)
@setting_option(settings.LOCAL_BASE_PORT)
@setting_option(settings.LOCAL_ETCD_PORT)
@setting_option(settings.LEASE_TTL)
@click.option("--foreground", is_flag=True, help="stay until Ctrl-C, then stop everything")
@click.option("--on-role-change", metavar="COMMAND", help="every node's serve --on-role-change")
@click.option("--virtual-ip", metavar="ADDRESS/PREFIX",
              help="every node's serve --virtual-ip (the nodes share this host: for trying it out only)")
@click.option("--virtual-ip-interface", metavar="NAME", help="every node's serve --virtual-ip-interface")
def cluster_up(directory: Path, nodes: int, base_port: int, etcd_port: int, lease_ttl: int,
               foreground: bool, on_role_change: str | None, virtual_ip: str | None,
               virtual_ip_interface: str | None) -> None:
    """Start etcd and the nodes (each under serve --supervise); print their URLs, states and PIDs."""
    from hastandby import local_cluster

    _checked(lambda: settings.check_local_ports(nodes, base_port, etcd_port), "--nodes", "--base-port", "--etcd-port")
    # In the foreground, what this command starts it stops: on Ctrl-C, on SIGTERM (timeout, a service
    # manager, a container stop), and when the start fails half way; never a cluster that was already running.
    ours = foreground and not local_cluster.running(directory)
    if ours:
        signal.signal(signal.SIGTERM, _interrupt)
    serve_args = [*(("--on-role-change", on_role_change) if on_role_change else ()),
                  *(("--virtual-ip", virtual_ip) if virtual_ip else ()),
                  *(("--virtual-ip-interface", virtual_ip_interface) if virtual_ip_interface else ())]
    try:
        _start_local_cluster(directory, nodes, base_port, etcd_port, lease_ttl, foreground, serve_args)
        while foreground:
            time.sleep(1)
    except KeyboardInterrupt:
        if not foreground:
            raise
    finally:
        if ours:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the stop short
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            if (directory / local_cluster.STATE_FILE).exists():
                _stop_local_cluster(directory)


def _start_local_cluster(directory: Path, nodes: int, base_port: int, etcd_port: int, lease_ttl: int,
                         foreground: bool, serve_args: Sequence[str] = ()) -> None:
    from hastandby import local_cluster

    try:
        state = local_cluster.up(directory, nodes, base_port, etcd_port, lease_ttl, serve_args=serve_args)
    except local_cluster.ClusterError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"etcd   {state['etcd']['url']}")
    for view in local_cluster.status(directory):
        click.echo(_node_line(view))
    urls = ",".join(f"amqp://{n['address']}" for n in state["nodes"])
    click.echo(f"clients: connect with the URL list {urls}")
    admin_password = local_cluster.password_file(directory, local_cluster.ADMIN)
    click.echo(f"user admin (group admin), password in {admin_password}; for the CLI:\n"
               f"  export HASTANDBY_USER=admin HASTANDBY_PASSWORD_FILE={admin_password}\n"
               f"  clients: amqp://admin:$(cat {admin_password})@{state['nodes'][0]['address']}, or add users: "
               f"hastandby user add NAME -b {state['nodes'][0]['address']}")
    click.echo("kill -9 a broker pid: its supervisor starts it again, back as a backup; kill -9 a supervisor "
               "pid: the whole node is gone (a host crash)")
    click.echo("Ctrl-C (or SIGTERM) stops the cluster" if foreground
               else f"stop with: hastandby cluster down --dir {directory}")


def _node_line(view: Any) -> str:
    """One node of ``cluster up`` / ``cluster status``: name, URL, state, and the PIDs to kill -9."""
    pids = [f"supervisor {view.supervisor}"] if view.supervisor is not None else []
    pids += [f"broker {view.broker}"] if view.broker is not None else []
    return f"{view.name}  amqp://{view.address}  {view.state}" + (f"  pid {', '.join(pids)}" if pids else "")


def _stop_local_cluster(directory: Path) -> None:
    from hastandby import local_cluster

    killed = local_cluster.down(directory)
    if killed:
        click.echo(f"killed (did not stop in time): {', '.join(killed)}")
    click.echo("cluster stopped")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@cluster.command("status")
@_CLUSTER_DIR
def cluster_status(directory: Path) -> None:
    """Print every node's URL, state and PIDs (its supervisor's, its broker process's)."""
    from hastandby import local_cluster

    try:
        for view in local_cluster.status(directory):
            click.echo(_node_line(view))
    except local_cluster.ClusterError as error:
        raise click.ClickException(str(error)) from None


@cluster.command("down")
@_CLUSTER_DIR
def cluster_down(directory: Path) -> None:
    """Stop the nodes together, then etcd (SIGTERM; SIGKILL for what has not stopped within seconds)."""
    from hastandby import local_cluster

    try:
        _stop_local_cluster(directory)
    except local_cluster.ClusterError as error:
        raise click.ClickException(str(error)) from None


if __name__ == "__main__":
    main()
