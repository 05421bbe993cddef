"""Hot standby against real node processes: the core Qpid ha_tests scenarios.

Each test is named after the scenario of Qpid's src/tests/ha_tests.py it ports.
"""

from __future__ import annotations

import signal
import time

import pytest
from proton import Message
from proton.reactor import Copy

from hastandby.testing import cexamples
from hastandby.testing.numbered_client import NumberedSender
from hastandby.client import ManagementClient, ManagementError
from hastandby.testing import auth
from hastandby.testing.clients import browse, close_condition, connect, receive, send

ADMIN = {"properties": {"qpid.ha-admin": True}}


def test_replication(cluster_factory):
    """Wiring and messages reach every backup; consumed messages leave them too."""
    c = cluster_factory(3)
    c[0].request("CREATE", "queue", "q")
    c[0].request("CREATE", "exchange", "ex", {"exchange-type": "topic"})
    c[0].request("BIND", body={"exchange": "ex", "queue": "q", "key": "a.#"})
    send(c[0].address, "q", [Message(body=f"m{i}") for i in range(10)])
    send(c[0].address, "ex", [Message(subject="a.b", body="routed")])
    for backup in (1, 2):
        c.wait_depth(backup, "q", 11)
        result = c.query(backup)
        assert {"exchange": "ex", "queue": "q", "key": "a.#", "arguments": {}} in result["bindings"]
        assert [m.body for m in browse(c[backup].address, "q", 11, admin=True)] == [f"m{i}" for i in range(10)] + ["routed"]
    assert [m.body for m in receive(c[0].address, "q", 5)] == [f"m{i}" for i in range(5)]
    for backup in (1, 2):
        c.wait_depth(backup, "q", 6)


def test_failover_c_examples(cluster_factory):
    """10,000 messages sent with the C example to the primary survive kill -9 of it."""
    c = cluster_factory(3)
    c[0].request("CREATE", "queue", "q")
    sent = cexamples.run_send("127.0.0.1", c[0].port, "q", 10000, env=auth.client_environment())
    assert cexamples.sent_count(sent) == 10000
    c[0].kill()
    c.promote(1)
    got = cexamples.run_receive("127.0.0.1", c[1].port, "q", 10000, env=auth.client_environment())
    assert cexamples.received_count(got) == 10000
    c.wait_depth(2, "q", 0)


def test_backup_refuses_clients_with_forced_naming_the_primary(cluster_factory):
    c = cluster_factory(2, "--client-refusal", "forced")
    name, description, _ = close_condition(c[1].address)
    assert name == "amqp:connection:forced"
    assert f"the primary is 127.0.0.1:{c[0].port}" in description


def test_backup_aborts_clients_by_default_so_a_url_list_moves_on(cluster_factory):
    """python-qpid-proton gives up after an AMQP close, and restarts its URL list
    after an AMQP open; a dropped connection makes it try the next URL."""
    c = cluster_factory(2)
    assert close_condition(c[1].address) is None  # no AMQP open or close: the connection drops
    sender = NumberedSender([c[1].url, c[0].url], "q", count=5, time_limit=15)
    sender.run()
    assert sorted(sender.accepted_set) == [1, 2, 3, 4, 5]


def test_client_redirect(cluster_factory):
    """With --client-redirect a backup sends clients to the primary the AMQP 1.0 way."""
    c = cluster_factory(2, "--client-redirect")
    name, description, info = close_condition(c[1].address)
    assert name == "amqp:connection:redirect"
    assert info["network-host"] == "127.0.0.1" and info["hostname"] == "127.0.0.1"
    assert int(info["port"]) == c[0].port
    assert f"127.0.0.1:{c[0].port}" in description


def _first_of(cluster, index: int, states: tuple[str, ...], timeout: float = 20.0) -> str:
    """The first of ``states`` node ``index`` is seen in, looking as often as STATUS answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = cluster.state(index)
        if state in states:
            return state
        time.sleep(0.01)
    raise AssertionError(f"node {index} reached none of {states} in {timeout} s")


def test_promote_refuses_a_catchup_node(cluster_factory):
    """The primary is frozen while node 1 catches up, so node 1 cannot finish before PROMOTE reaches it
    (a catchup node stays catchup while its primary does not answer).  Catching up can still end between
    seeing ``catchup`` and the freeze: then node 1 is restarted again, a bounded number of times."""
    c = cluster_factory(2)
    c[0].request("CREATE", "queue", "big")
    sent = cexamples.run_send("127.0.0.1", c[0].port, "big", 200000, env=auth.client_environment())
    assert cexamples.sent_count(sent) == 200000
    for _attempt in range(5):
        c[1].kill()
        c.restart(1)
        if _first_of(c, 1, ("catchup", "backup")) != "catchup":
            continue  # caught up between two looks
        c[0].signal(signal.SIGSTOP)
        try:
            if c.state(1) != "catchup":
                continue
            with pytest.raises(ManagementError, match="still catching up"):
                with ManagementClient(c[1].address) as client:
                    client.request("PROMOTE")
            break
        finally:
            c[0].signal(signal.SIGCONT)
    else:
        raise AssertionError("node 1 caught up before the primary could be frozen, five times in a row")
    c.wait_state(1, "backup", timeout=60)
    c.wait_depth(1, "big", 200000)


def test_promote_refuses_a_connecting_node_while_another_is_past_connecting(cluster_factory):
    c = cluster_factory(3)
    c[0].signal(signal.SIGSTOP)  # the primary cannot answer: node 1 will stay connecting
    try:
        c[1].kill()
        c.restart(1)
        assert c.state(1) == "connecting"
        with pytest.raises(ManagementError, match=f"127.0.0.1:{c[2].port} is backup"):
            with ManagementClient(c[1].address) as client:
                client.request("PROMOTE")
    finally:
        c[0].signal(signal.SIGCONT)
    c.wait_state(1, "backup")


def test_empty_cluster_promotes_a_connecting_node(cluster_factory):
    c = cluster_factory(3, promote=False)
    assert [c.state(i) for i in range(3)] == ["connecting"] * 3
    c.promote(2)
    c.wait_state(0, "backup")
    c.wait_state(1, "backup")


def test_admin_may_browse_a_backup_but_not_modify_it(cluster_factory):
    c = cluster_factory(2)
    c[0].request("CREATE", "queue", "q")
    send(c[0].address, "q", 3)
    c.wait_depth(1, "q", 3)
    with ManagementClient(c[1].address) as admin:
        with pytest.raises(ManagementError, match="backup"):
            admin.request("CREATE", "queue", "other")
        with pytest.raises(ManagementError, match="backup"):
            admin.request("DELETE", "queue", "q")
    conn = connect(c[1].address, auth.ADMIN, **ADMIN)  # the property needs a user of group admin
    try:
        browser = conn.create_receiver("q", options=Copy(), name="b")
        assert [browser.receive(timeout=5).body for _ in range(3)] == ["m0", "m1", "m2"]
        with pytest.raises(Exception, match="backup"):
            conn.create_sender("q", name="s")
    finally:
        conn.close()
