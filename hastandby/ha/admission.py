"""Who may connect to a cluster node, and how everyone else is turned away.

Only an admitting primary serves clients.  Every node lets in an admin
(it may inspect a backup) and, on the primary, a peer acting as a backup
(its user must be in group ``cluster``).  Anyone else is refused the way the
operator chose: a redirect to the primary (``--client-redirect``, when the
primary is known), a forced close, or an abort (the default, which proton
clients take as a cue to try the next URL at once).  The primary's Open frame
names every member, as ActiveMQ Artemis does, so clients learn where to fail
over to.

Policy only: what the node's role is comes from the ``ClusterRole`` it is
given (``HaNode``).  ``ClientAdmission`` is the node's ``NodeHooks``
(``broker/hooks.py``), which ``HaNode`` gives the node once.
"""

from __future__ import annotations

from typing import Any, Protocol

import structlog
from proton import Condition, Connection, int32, symbol

from hastandby.broker.admission.authority import principal_of
from hastandby.broker.hooks import NodeHooks, Refusal
from hastandby.ha.primary import backup_info
from hastandby.broker.vocabulary import ADMIN_PROPERTY

from hastandby.broker.transport.address import split_hostport
from hastandby.node import Node

from hastandby.ha.roles import Role
from hastandby.lifecycle.standing import Standing
from hastandby.lifecycle.states import NodeStatus

log = structlog.get_logger("hastandby.ha")

FAILOVER_SERVER_LIST = symbol("failover-server-list")
"""The Open frame's connection property that lists where a client may fail over to, as ActiveMQ Artemis
sends it and Qpid JMS reads it (QPIDJMS-267): a list of maps shaped like the amqp:connection:redirect
error's info, with symbol keys and string values (the port an int)."""


class ClusterRole(Protocol):
    """What admission needs to know of the node: its standing (``lifecycle/standing.py``) and role."""

    url: str
    standing: Standing

    @property
    def status(self) -> NodeStatus: ...

    @property
    def role(self) -> Role:
        """The role object (``roles.py``): the primary it follows, if known."""
        ...

    def member_addresses(self) -> list[str]: ...


class ClientAdmission:
    """The broker's hooks (``broker/hooks.NodeHooks``) for a cluster node: admission, refusals, Open frame, state.

    Contract: the broker calls it on the reactor thread, as does ``HaNode`` (``close_clients``); it reads the
    node's standing and role and closes connections through the broker's handler, and calls nothing else back.
    """

    def __init__(self, ha: ClusterRole, node: Node, redirect: bool, abort: bool) -> None:
        self.ha = ha
        self.node = node
        self.redirect = redirect
        self.abort = abort

    def is_admin(self, connection: Connection) -> bool:
        """An admin connection (it may inspect a backup): it says so, and its user is an admin or a peer node."""
        try:
            properties = connection.remote_properties
        except Exception:  # noqa: BLE001 - proton fails on some legal maps (binary keys): not an admin's
            return False
        if not isinstance(properties, dict) or not properties.get(ADMIN_PROPERTY):
            return False
        principal, authority = principal_of(connection), self.node.authority
        return authority.is_admin(principal) or authority.is_cluster(principal)

    @property
    def state(self) -> str:
        return str(self.ha.status.state)

    def shutdown_refusal(self) -> Refusal:
        """Clients of a stopping cluster node should go straight to the next one."""
        return Refusal(Condition("amqp:connection:forced", "node shutting down"), abort=self.abort)

    def fenced_refusal(self) -> Refusal:
        return self.refusal()

    def refusal(self) -> Refusal:
        """How a client is turned away: redirect (if asked and known), forced close, or abort (default)."""
        ha = self.ha
        primary = ha.role.primary_url
        me = f"node {ha.url} is {ha.status.state}"
        if self.redirect and primary:
            host, port = split_hostport(primary)
            info: dict[Any, Any] = {symbol("network-host"): host, symbol("port"): port, symbol("hostname"): host}
            return Refusal(Condition("amqp:connection:redirect", f"{me}; the primary is {primary}", info))
        where = f"; the primary is {primary}" if primary else "; the primary is not known yet"
        return Refusal(Condition("amqp:connection:forced", f"{me}, not the primary{where}"), abort=self.abort)

    def admit(self, connection: Connection) -> Refusal | None:
        """The broker's admission hook: None lets the connection in."""
        if self.is_admin(connection):
            return None
        ha = self.ha
        info = backup_info(connection)
        if info is not None:
            principal = principal_of(connection)
            if not self.node.authority.is_cluster(principal):
                log.warning("denied", user=principal.user, action="act as a backup", object=ha.url)
                return Refusal(Condition("amqp:unauthorized-access",
                                         f"user {principal.user!r} is not in group 'cluster': "
                                         "it may not act as a backup"))
            if info.get("node_id") == self.node.node_id:
                return Refusal(Condition("amqp:connection:forced", "a node does not replicate from itself"))
            if ha.standing.is_primary:
                return None
            return Refusal(Condition("amqp:connection:forced", f"node {ha.url} is {ha.status.state}, not the primary"))
        return None if ha.standing.admitting and ha.standing.is_primary else self.refusal()

    def close_clients(self) -> None:
        """Close every client connection (admins and backups stay), refusing it as a new one would be."""
        refusal = self.refusal()
        handler = self.node.handler
        for connection in list(handler.connections):
            if not self.is_admin(connection) and backup_info(connection) is None:
                handler.close_connection(connection, refusal)

    def failover_list(self) -> list[dict[symbol, Any]]:
        """Every member's client address (the brokers URL, or etcd's members), in Artemis's form."""
        scheme = "amqps" if self.node.config.peer_tls else "amqp"  # the brokers URL names TLS listeners then
        entries = []
        for address in self.ha.member_addresses():
            host, port = split_hostport(address)
            entries.append({symbol("network-host"): host, symbol("port"): int32(port),
                            symbol("scheme"): scheme, symbol("hostname"): host})
        return entries

    def open_properties(self, connection: Connection) -> dict[symbol, Any] | None:
        """The primary's Open frame names every member, so that clients learn where to fail over to."""
        if not self.ha.standing.is_primary:
            return None
        return {FAILOVER_SERVER_LIST: self.failover_list()}


_hooks: type[NodeHooks] = ClientAdmission  # mypy checks that it is the broker's NodeHooks
