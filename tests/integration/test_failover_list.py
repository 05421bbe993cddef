"""The primary's Open frame lists the cluster's client addresses in ``failover-server-list``.

ActiveMQ Artemis sends this connection property and Qpid JMS reads it
(QPIDJMS-267): a list of maps with symbol keys ``network-host``, ``port``,
``scheme`` and ``hostname``, string values and an int port (Qpid JMS casts
``network-host``, ``scheme`` and ``hostname`` to ``String``, so a symbol value
would make it drop the entry).  These tests read the Open frame of real nodes
with a python-qpid-proton client.
"""

from __future__ import annotations

from typing import Any

from proton import int32, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container

from hastandby.client import ManagementClient
from hastandby.security.credentials import Credentials
from hastandby.testing import auth
from hastandby.testing.certs import make_pki
from hastandby.testing.clients import connect
from hastandby.testing.nodes import free_port
from hastandby.testing.waiting import wait_for

FAILOVER_SERVER_LIST = symbol("failover-server-list")


def open_properties(address: str) -> dict[Any, Any]:
    """The connection properties of the Open frame a node answers a client (``app``) with."""
    connection = connect(address)
    try:
        return dict(connection.conn.remote_properties or {})
    finally:
        connection.close()


def entries(properties: dict[Any, Any]) -> list[tuple[str, int, str, str]]:
    """The failover list as (network-host, port, scheme, hostname), checking the AMQP types on the way."""
    assert FAILOVER_SERVER_LIST in properties, properties
    key = next(k for k in properties if k == FAILOVER_SERVER_LIST)
    assert type(key) is symbol
    value = properties[FAILOVER_SERVER_LIST]
    assert isinstance(value, list), value
    found = []
    for entry in value:
        assert set(entry) == {"network-host", "port", "scheme", "hostname"}, entry
        assert all(type(k) is symbol for k in entry), entry  # symbol keys, as Artemis and Qpid JMS use
        for name in ("network-host", "scheme", "hostname"):
            assert type(entry[symbol(name)]) is str, entry  # AMQP strings, not symbols
        assert type(entry[symbol("port")]) is int32, entry  # an AMQP int, as Artemis's Integer
        found.append((entry[symbol("network-host")], int(entry[symbol("port")]), entry[symbol("scheme")],
                      entry[symbol("hostname")]))
    return found


class _OpenRecorder(MessagingHandler):
    """Records the remote Open frame's properties and the close condition of a refused connection."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.properties: dict[Any, Any] | None = None
        self.condition: tuple[str, str] | None = None

    def on_start(self, event: Any) -> None:
        event.container.connect(self.url, reconnect=False)

    def on_connection_opened(self, event: Any) -> None:
        self.properties = dict(event.connection.remote_properties or {})

    def on_connection_remote_close(self, event: Any) -> None:
        condition = event.connection.remote_condition
        if condition is not None:
            self.condition = (condition.name, condition.description)
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        if event.connection is not None:
            event.connection.close()


def test_the_primary_lists_every_node_and_a_backup_names_the_primary(cluster_factory):
    c = cluster_factory(3, "--client-refusal", "forced")
    every = [("127.0.0.1", port, "amqp", "127.0.0.1") for port in c.ports]  # the brokers URL, in its order
    assert entries(open_properties(c[0].address)) == every

    # A backup sends an Open (no list: it is not where clients should be) and closes, naming the primary.
    recorder = _OpenRecorder(auth.url(c[1].address))
    Container(recorder).run()
    assert recorder.properties is not None and FAILOVER_SERVER_LIST not in recorder.properties
    assert recorder.condition is not None
    name, description = recorder.condition
    assert name == "amqp:connection:forced"
    assert f"the primary is 127.0.0.1:{c.ports[0]}" in description

    # The new primary lists every node too (the brokers URL: the dead one stays in it).
    c[0].kill()
    c.promote(1)
    assert entries(open_properties(c[1].address)) == every


def test_a_standalone_node_sends_no_list(node):
    assert FAILOVER_SERVER_LIST not in open_properties(node.address)


def test_with_etcd_the_elected_primary_lists_every_node(ha):
    cluster = ha(2)
    primary = cluster.wait_settled()
    backup = 1 - primary
    cluster.wait_state(backup, "backup")
    assert entries(open_properties(cluster[primary].address)) == [
        ("127.0.0.1", port, "amqp", "127.0.0.1") for port in cluster.ports]
    # The backup refuses clients (it drops the connection by default): no Open, so no list either.
    recorder = _OpenRecorder(auth.url(cluster[backup].address))
    Container(recorder).run()
    assert not (recorder.properties or {}).get(FAILOVER_SERVER_LIST)


def test_with_peer_tls_the_list_names_the_tls_listeners_as_amqps(node_factory, tmp_path):
    """With --peer-tls the brokers URL names each node's --listen-tls address: those are listed, scheme amqps."""
    pki = make_pki(tmp_path / "pki")
    users = Credentials(tmp_path / "users.json")  # the run's users, and the nodes' certificate (EXTERNAL)
    for user, groups in auth.GROUPS.items():
        users.add(user, auth.PASSWORDS[user], groups)
    users.add("server", None, ["cluster"])
    users.save()
    ports, tls_ports = [free_port(), free_port()], [free_port(), free_port()]
    brokers = ",".join(f"127.0.0.1:{p}" for p in tls_ports)
    tls = ["--users-file", str(tmp_path / "users.json"), "--ssl-cert-file", str(pki.cert("server")),
           "--ssl-key-file", str(pki.key("server")), "--ssl-ca-file", str(pki.ca), "--peer-tls"]
    nodes = [node_factory("--ha-cluster", "--brokers-url", brokers, "--listen-tls", f"127.0.0.1:{tls_ports[i]}",
                          *tls, port=ports[i], name=f"tls{i}") for i in range(2)]
    with ManagementClient(nodes[0].address, timeout=10) as client:
        client.request("PROMOTE")
    wait_for(lambda: nodes[1].request("STATUS")["state"] == "backup", 20, "node 1 a backup over TLS")
    assert entries(open_properties(nodes[0].address)) == [
        ("127.0.0.1", port, "amqps", "127.0.0.1") for port in tls_ports]
