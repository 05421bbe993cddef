"""A standalone node, driven by real AMQP clients: python-qpid-proton and the proton C examples."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest
from proton import Delivery, Message, Timeout
from proton.reactor import Copy
from proton.utils import LinkDetached, SendException

from hastandby.testing import cexamples
from hastandby.testing import auth
from hastandby.testing.clients import connect, receive, send, topic_filter
from hastandby.testing.waiting import wait_for

ACCEPTED = Delivery.ACCEPTED
REJECTED = Delivery.REJECTED


def depth(node, queue: str) -> int:
    return next(q["depth"] for q in node.request("QUERY")["queues"] if q["name"] == queue)


def queue_names(node) -> set[str]:
    return {q["name"] for q in node.request("QUERY")["queues"]}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hastandby", *args], capture_output=True, text=True, timeout=30)


def test_c_examples_send_then_receive_100000(node):
    host, port = "127.0.0.1", node.port
    env = auth.client_environment()
    sent = cexamples.Client([str(cexamples.build("send")), host, str(port), "q", "100000"], env).wait(120)
    assert sent.returncode == 0, sent.stdout
    assert "100000 messages sent and acknowledged" in sent.stdout
    assert depth(node, "q") == 100000
    got = cexamples.Client([str(cexamples.build("receive")), host, str(port), "q", "100000"], env).wait(120)
    assert got.returncode == 0, got.stdout[-500:]
    assert "100000 messages received" in got.stdout
    bodies = [line for line in got.stdout.splitlines() if line.startswith("{")]
    assert len(bodies) == 100000
    assert bodies[0] == '{"sequence"=1}' and bodies[-1] == '{"sequence"=100000}'


def test_c_bench_clients_concurrently_move_every_message(node):
    env = auth.client_environment()
    receiver = cexamples.start_receive("127.0.0.1", node.port, "conc", 20000, env=env)
    sender = cexamples.start_send("127.0.0.1", node.port, "conc", 20000, env=env)
    assert cexamples.sent_count(sender.wait(60)) == 20000
    assert cexamples.received_count(receiver.wait(60)) == 20000
    assert depth(node, "conc") == 0


def test_browser_sees_messages_without_consuming_and_follows_new_ones(node):
    send(node.address, "b", [Message(body=f"m{i}") for i in range(5)])
    conn = connect(node.address)
    try:
        browser = conn.create_receiver("b", credit=100, options=Copy())
        seen = [browser.receive(timeout=5).body for _ in range(5)]
        send(node.address, "b", [Message(body="late")])
        seen.append(browser.receive(timeout=5).body)
        browser.accept()
    finally:
        conn.close()
    assert seen == ["m0", "m1", "m2", "m3", "m4", "late"]
    assert depth(node, "b") == 6
    assert [m.body for m in receive(node.address, "b", 6)] == seen


def test_unacknowledged_messages_return_in_place_with_delivery_count_on_disconnect(node):
    send(node.address, "r", [Message(body=f"m{i}") for i in range(2)])
    conn = connect(node.address)
    receiver = conn.create_receiver("r", credit=2)
    first = receiver.receive(timeout=5)
    receiver.receive(timeout=5)
    assert first.delivery_count == 0
    conn.close()  # two delivered, neither settled
    send(node.address, "r", [Message(body="m2")])
    again = receive(node.address, "r", 3)
    assert [m.body for m in again] == ["m0", "m1", "m2"]
    assert [m.delivery_count for m in again] == [1, 1, 0]


def test_released_and_modified_outcomes(node):
    send(node.address, "rel", [Message(body="m0")])
    conn = connect(node.address)
    try:
        receiver = conn.create_receiver("rel", credit=1)
        receiver.receive(timeout=5)
        receiver.release(delivered=False)  # released: not a failed attempt
        m = receiver.receive(timeout=5)
        assert (m.body, m.delivery_count) == ("m0", 0)
        delivery = receiver.fetcher.unsettled.popleft()  # modified with delivery-failed set
        delivery.local.failed = True
        delivery.update(Delivery.MODIFIED)
        delivery.settle()
        m = receiver.receive(timeout=5)
        assert (m.body, m.delivery_count) == ("m0", 1)
        receiver.accept()
    finally:
        conn.close()
    assert depth(node, "rel") == 0


def test_rejected_message_goes_to_the_alternate_exchange(node):
    node.request("CREATE", "exchange", "dlx", {"exchange-type": "fanout"})
    node.request("CREATE", "queue", "dead")
    node.request("BIND", body={"exchange": "dlx", "queue": "dead"})
    node.request("CREATE", "queue", "work", {"alternate-exchange": "dlx"})
    send(node.address, "work", [Message(body="poison")])
    conn = connect(node.address)
    try:
        receiver = conn.create_receiver("work", credit=1)
        receiver.receive(timeout=5)
        receiver.reject()
    finally:
        conn.close()
    assert depth(node, "work") == 0
    assert [m.body for m in receive(node.address, "dead", 1)] == ["poison"]


def test_topic_fanout_direct_subscriptions_and_unroutable_count(node):
    node.request("CREATE", "exchange", "news", {"exchange-type": "topic"})
    node.request("CREATE", "exchange", "all", {"exchange-type": "fanout"})
    conn = connect(node.address)
    try:
        sports = conn.create_receiver("news", credit=10, name="sports", options=topic_filter("sport.*"))
        everything = conn.create_receiver("news", credit=10, name="everything")
        fan1 = conn.create_receiver("all", credit=10, name="fan1")
        fan2 = conn.create_receiver("all", credit=10, name="fan2")
        sender = conn.create_sender("news")
        for subject in ("sport.tennis", "weather.rain", "sport.golf.open"):
            sender.send(Message(subject=subject, body=subject))
        conn.create_sender("all").send(Message(body="hello"))
        assert sports.receive(timeout=5).body == "sport.tennis"
        assert [everything.receive(timeout=5).body for _ in range(3)] == [
            "sport.tennis", "weather.rain", "sport.golf.open"]
        assert fan1.receive(timeout=5).body == fan2.receive(timeout=5).body == "hello"
        for r in (sports, everything, fan1, fan2):
            r.accept()
        with pytest.raises(Timeout):
            sports.receive(timeout=0.5)  # sport.golf.open does not match sport.*
        node.request("CREATE", "exchange", "orders", {"exchange-type": "direct"})
        conn.create_sender("orders").send(Message(subject="nobody", body="x"))
    finally:
        conn.close()
    orders = next(e for e in node.request("QUERY")["exchanges"] if e["name"] == "orders")
    assert orders["dropped"] == 1
    assert not any(name.startswith("news.") for name in queue_names(node))  # subscriptions went away


def test_reject_policy_gives_the_producer_a_clear_error_and_loses_nothing(node):
    node.request("CREATE", "queue", "small", {"arguments": {"qpid.max_count": 2, "qpid.policy_type": "reject"}})
    outcomes = send(node.address, "small", [Message(body=f"m{i}") for i in range(3)])
    assert outcomes[:2] == [ACCEPTED, ACCEPTED]
    assert isinstance(outcomes[2], SendException) and outcomes[2].state == REJECTED
    assert [m.body for m in receive(node.address, "small", 3, timeout=1)] == ["m0", "m1"]


def test_ring_policy_keeps_the_newest(node):
    node.request("CREATE", "queue", "ring", {"arguments": {"qpid.max_count": 3, "qpid.policy_type": "ring"}})
    send(node.address, "ring", [Message(body=f"m{i}") for i in range(5)])
    assert [m.body for m in receive(node.address, "ring", 5, timeout=1)] == ["m2", "m3", "m4"]


def test_ttl_expires_messages(node):
    send(node.address, "ttl", [Message(body="short", ttl=0.2), Message(body="long", ttl=60)])
    time.sleep(0.8)
    assert depth(node, "ttl") == 1
    assert [m.body for m in receive(node.address, "ttl", 2, timeout=1)] == ["long"]


def test_exclusive_queue_refuses_a_second_consumer(node):
    node.request("CREATE", "queue", "excl", {"exclusive": True})
    conn = connect(node.address)
    try:
        conn.create_receiver("excl", name="first")
        with pytest.raises(LinkDetached, match="resource-locked"):
            conn.create_receiver("excl", name="second")
        browser = conn.create_receiver("excl", name="browser", options=Copy())  # browsing is not consuming
        assert browser is not None
    finally:
        conn.close()


def test_auto_delete_queue_goes_away_after_last_consumer_and_timeout(node):
    node.request("CREATE", "queue", "ad", {"auto-delete": True})
    node.request("CREATE", "queue", "adt", {"auto-delete": True, "arguments": {"qpid.auto_delete_timeout": 5}})
    conn = connect(node.address)
    conn.create_receiver("ad")
    conn.create_receiver("adt")
    conn.close()
    closed = time.monotonic()
    wait_for(lambda: "ad" not in queue_names(node), 5, "'ad' deleted with its last consumer")
    assert "adt" in queue_names(node), "'adt' deleted before its 5 s timeout"
    wait_for(lambda: "adt" not in queue_names(node), 15, "'adt' deleted after its timeout")
    assert time.monotonic() - closed >= 5


def test_no_auto_create_refuses_unknown_addresses_with_not_found(node_factory):
    strict = node_factory("--no-auto-create")
    conn = connect(strict.address)
    try:
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            conn.create_sender("unknown")
    finally:
        conn.close()
    assert "unknown" not in queue_names(strict)


def test_oversized_message_closes_only_that_link(node_factory):
    small = node_factory("--max-message-size", "1000")
    conn = connect(small.address)
    try:
        sender = conn.create_sender("big")
        sender.send(Message(body="ok"))
        with pytest.raises(Exception, match="message-size-exceeded|closed"):
            sender.send(Message(body="x" * 5000))
    finally:
        conn.close()
    assert [m.body for m in receive(small.address, "big", 2, timeout=1)] == ["ok"]


def test_malformed_management_requests_get_clear_errors(node):
    conn = connect(node.address)
    try:
        receiver = conn.create_receiver(None, dynamic=True)
        reply_to = receiver.remote_source.address
        sender = conn.create_sender("$management")
        sender.send(Message(reply_to=reply_to, properties={"operation": "FROBNICATE"}, body={}))
        reply = receiver.receive(timeout=5)
        assert reply.properties["statusCode"] == 400
        assert "unknown operation" in reply.properties["statusDescription"]
        sender.send(Message(reply_to=reply_to, properties={"operation": "CREATE", "type": "queue"}, body=[1, 2]))
        reply = receiver.receive(timeout=5)
        assert reply.properties["statusCode"] == 400 and "map" in reply.properties["statusDescription"]
        with pytest.raises(SendException):
            sender.send(Message(properties={"operation": "PING"}))  # no reply-to: rejected
        receiver.accept()
    finally:
        conn.close()
    assert node.request("PING") == {}


def test_garbage_on_the_socket_closes_that_connection_only(node):
    with socket.create_connection(("127.0.0.1", node.port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
        sock.settimeout(5)
        reply = b""
        try:
            while chunk := sock.recv(4096):
                reply += chunk
        except OSError:
            pass
    assert reply.startswith(b"AMQP")  # the peer is told which protocol is spoken, then closed
    assert send(node.address, "alive", 1) == [ACCEPTED]


def test_cli_manages_the_node_and_reports_errors_without_tracebacks(node):
    b = ["-b", node.address]
    assert cli("add", "queue", "cq", "--max-count", "10", "--policy", "ring", *b).returncode == 0
    assert cli("add", "exchange", "topic", "ct", *b).returncode == 0
    assert cli("bind", "ct", "cq", "a.#", *b).returncode == 0
    q = cli("query", "--json", *b)
    assert q.returncode == 0
    result = json.loads(q.stdout)
    cq = next(x for x in result["queues"] if x["name"] == "cq")
    assert cq["arguments"]["qpid.max_count"] == 10 and cq["arguments"]["qpid.policy_type"] == "ring"
    assert {"exchange": "ct", "queue": "cq", "key": "a.#", "arguments": {}} in result["bindings"]
    assert cli("unbind", "ct", "cq", "a.#", *b).returncode == 0
    bad = cli("add", "queue", "bad", "--argument", "qpid.replicate=sometimes", *b)
    assert bad.returncode != 0 and "qpid.replicate" in bad.stderr and "Traceback" not in bad.stderr
    missing = cli("del", "queue", "nope", *b)
    assert missing.returncode != 0 and "no such queue" in missing.stderr and "Traceback" not in missing.stderr
    assert cli("del", "queue", "cq", *b).returncode == 0
    assert cli("del", "exchange", "ct", *b).returncode == 0
    status = cli("status", *b)
    assert status.returncode == 0 and status.stdout.strip() == "standalone"
    assert cli("status", "--expect", "standalone", *b).returncode == 0
    assert cli("status", "--expect", "primary", *b).returncode == 1
    assert cli("ping", *b).returncode == 0
    down = cli("ping", "-b", "127.0.0.1:1", "--timeout", "2")
    assert down.returncode != 0 and "Traceback" not in down.stderr


def test_durable_wiring_survives_restart(node_factory, tmp_path):
    data = tmp_path / "data"
    first = node_factory("--data-dir", str(data))
    first.request("CREATE", "queue", "keep", {"durable": True, "arguments": {"qpid.max_count": 7}})
    first.request("CREATE", "queue", "forget")
    first.request("CREATE", "exchange", "kx", {"exchange-type": "topic", "durable": True})
    first.request("BIND", body={"exchange": "kx", "queue": "keep", "key": "k.#"})
    node_id = first.request("STATUS")["node_id"]
    assert first.stop() == 0
    second = node_factory("--data-dir", str(data), port=first.port)
    result = second.request("QUERY")
    names = {q["name"]: q for q in result["queues"]}
    assert "keep" in names and "forget" not in names
    assert names["keep"]["arguments"]["qpid.max_count"] == 7
    assert {"exchange": "kx", "queue": "keep", "key": "k.#", "arguments": {}} in result["bindings"]
    assert second.request("STATUS")["node_id"] == node_id


def test_sigterm_stops_cleanly_and_promptly(node):
    conn = connect(node.address)
    started = time.monotonic()
    node.signal(signal.SIGTERM)
    assert node.proc.wait(10) == 0
    assert time.monotonic() - started < 5
    assert '"node stopped"' in node.log() or "node stopped" in node.log()
    try:
        conn.close()
    except Exception:
        pass


def test_anonymous_relay_routes_on_the_to_field(node):
    conn = connect(node.address)
    try:
        sender = conn.create_sender(None)
        node.request("CREATE", "queue", "relayed")
        sender.send(Message(address="relayed", body="via relay"))
        with pytest.raises(SendException):
            sender.send(Message(address="no-such-queue", body="lost?"))
    finally:
        conn.close()
    assert [m.body for m in receive(node.address, "relayed", 1)] == ["via relay"]


def test_json_logs(node):
    send(node.address, "logged", 1)
    first = node.log().splitlines()[0]
    record = json.loads(first)
    assert record["event"] == "node serving" and record["level"] == "info"



def test_empty_transfer_is_rejected_not_queued(node):
    """python-qpid-proton re-sends an in-doubt delivery after a reconnect as an empty transfer."""
    conn = connect(node.address)
    try:
        sender = conn.create_sender("empties")
        delivery = sender.link.delivery(sender.link.delivery_tag())
        sender.link.advance()  # a transfer with no payload at all
        conn.wait(lambda: delivery.remote_state != 0, timeout=5)
        assert delivery.remote_state == Delivery.REJECTED
        assert delivery.remote.condition.name == "amqp:invalid-field"
    finally:
        conn.close()
    assert depth(node, "empties") == 0
