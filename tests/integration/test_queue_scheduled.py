"""Scheduled delivery (x-opt-delivery-time, x-opt-delivery-delay; docs/queues.md) with real nodes and clients.

On a standalone node (python-qpid-proton producers and consumers): held
until its time and never before, in order of due time then arrival, counted
in the depth and as ``scheduled``, bad values refused; then across kill -9 of
the primary and an etcd election (the time is the old primary's, carried to
the backups in the message); and a durable queue across a kill -9 and
restart of its node, on its journal.  Times are the test machine's wall
clock, which the nodes share.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from proton import Delivery, Message, Timeout, symbol

from tests.integration.test_queue_features import Taker, describe, hastandby, take_all
from hastandby.testing import auth, cexamples
from hastandby.testing.clients import connect, send
from hastandby.testing.waiting import wait_for

DELIVERY_TIME = symbol("x-opt-delivery-time")
DELIVERY_DELAY = symbol("x-opt-delivery-delay")


def now_ms() -> int:
    return int(time.time() * 1000)


def later(body: str, *, delay: int | None = None, at: int | None = None, durable: bool = False) -> Message:
    annotations: dict[Any, Any] = {}
    if delay is not None:
        annotations[DELIVERY_DELAY] = delay
    if at is not None:
        annotations[DELIVERY_TIME] = at
    return Message(body=body, annotations=annotations or None, durable=durable)


def timed_take(taker: Taker, count: int, timeout: float) -> list[tuple[str, int, Message]]:
    """``count`` messages, each with the wall-clock ms it was received at (accepted)."""
    got = []
    for _ in range(count):
        message = taker.take(timeout=timeout)
        got.append((message.body, now_ms(), message))
        taker.accept()
    return got


def flush(taker: Taker) -> None:
    """Let the taker's dispositions go out (a wait whose condition holds at once sends nothing)."""
    try:
        taker.connection.wait(lambda: False, timeout=0.3)
    except Timeout:
        pass


def refused(address: str, queue: str, message: Message) -> tuple[Any, str]:
    """Send one message; its outcome and the description of the error the node gave with it."""
    connection = connect(address)
    try:
        sender = connection.create_sender(queue)
        delivery = sender.link.delivery(b"bad")
        sender.link.send(message.encode())
        sender.link.advance()
        connection.wait(lambda: delivery.settled or bool(delivery.remote_state), timeout=10)
        condition = delivery.remote.condition
        return delivery.remote_state, (condition.description if condition is not None else "")
    finally:
        connection.close()


# -- standalone ------------------------------------------------------------------------------------------------


def test_a_delay_and_a_delivery_time_hold_a_message_until_then_and_never_earlier(node):
    hastandby("add", "queue", "later", "-b", node.address)
    taker = Taker(node.address, "later", credit=10)
    try:
        start = now_ms()
        at = start + 1200
        assert send(node.address, "later", [later("delayed", delay=1800), later("timed", at=at), later("now")]) \
            == [Delivery.ACCEPTED] * 3  # acknowledged on enqueue, long before their time
        sent = now_ms()
        assert taker.take(timeout=1).body == "now"
        taker.accept()
        flush(taker)
        wait_for(lambda: describe(node.address, "later")["depth"] == 2, 5, "the plain message's acceptance")
        described = describe(node.address, "later")
        assert (described["depth"], described["scheduled"], described["acquired"]) == (2, 2, 0), described
        query = hastandby("query", "-b", node.address).stdout
        assert "scheduled" in query.splitlines()[1], query
        got = timed_take(taker, 2, timeout=5)
        (first, first_at, first_msg), (second, second_at, second_msg) = got
        assert (first, second) == ("timed", "delayed")
        assert first_at >= at, f"delivered {at - first_at} ms early"
        due = second_msg.annotations[DELIVERY_TIME]  # the node's absolute time for the delay, kept on the message
        assert start + 1800 <= due <= sent + 1800 and second_msg.annotations[DELIVERY_DELAY] == 1800
        assert second_at >= due, f"delivered {due - second_at} ms early"
        assert first_at - at < 1000 and second_at - due < 1000, "delivered late by a second or more"
        assert describe(node.address, "later")["scheduled"] == 0
    finally:
        taker.close()


def test_due_messages_go_in_order_of_due_time_then_arrival_ahead_of_those_waiting(node):
    hastandby("add", "queue", "order", "-b", node.address)
    base = now_ms()
    messages = [later("a-1500", at=base + 1500), later("plain-1"), later("b-600", delay=600),
                later("c-1000", at=base + 1000), later("d-1000", at=base + 1000), later("plain-2"),
                later("e-800", delay=800)]
    send(node.address, "order", messages)
    assert describe(node.address, "order")["scheduled"] == 5
    wait_for(lambda: describe(node.address, "order")["scheduled"] == 0, 10, "every time to come")
    assert [m.body for m in take_all(node.address, "order", 7)] == [
        "b-600", "e-800", "c-1000", "d-1000", "a-1500", "plain-1", "plain-2"]


def test_a_bad_delay_or_time_is_refused_with_a_clear_error_and_nothing_enqueued(node):
    hastandby("add", "queue", "bad", "-b", node.address)
    for message, words in ((later("neg", delay=-5), "x-opt-delivery-delay must be a delay in milliseconds"),
                           (Message(body="str", annotations={DELIVERY_DELAY: "1000"}), "got '1000' (str)"),
                           (Message(body="float", annotations={DELIVERY_TIME: 1.5e12}), "(float)")):
        state, description = refused(node.address, "bad", message)
        assert state == Delivery.REJECTED and words in description, (state, description)
    assert describe(node.address, "bad")["depth"] == 0
    hastandby("add", "queue", "lvq", "--lvq-key", "k", "-b", node.address)
    state, description = refused(node.address, "lvq", later("v", delay=500))
    assert state == Delivery.REJECTED and "does not combine with a last-value queue" in description, description


# -- across a failover --------------------------------------------------------------------------------------------


@pytest.mark.etcd
def test_a_message_scheduled_on_the_old_primary_is_delivered_by_the_new_one_at_its_time(ha):
    c = ha(3)
    primary = c.wait_replicating()
    backups = [i for i in range(3) if i != primary]
    address = c[primary].address
    hastandby("add", "queue", "later", "-b", address)
    start = now_ms()
    delay = 6000  # past the kill and the election (a 2 s lease): the new primary serves before it is due
    assert send(address, "later", [later("delayed", delay=delay), later("now")]) == [Delivery.ACCEPTED] * 2
    sent = now_ms()
    for index in backups:  # each backup holds it back too, under the primary's time
        wait_for(lambda: (c.queue(index, "later") or {}).get("scheduled") == 1, 10,
                 f"{c.ids[index]} to hold the scheduled message")
    c[primary].kill()
    new, _ = c.wait_new_primary(backups, 30)
    address = c[new].address
    wait_for(lambda: c.state(new) == "primary" and describe(address, "later")["depth"] == 2, 20,
             "the new primary serving")
    taker = Taker(address, "later", credit=10)
    try:
        assert taker.take(timeout=5).body == "now"
        taker.accept()
        assert now_ms() < start + delay - 500, "the failover took too long to check the message is not early"
        got = timed_take(taker, 1, timeout=start + delay - now_ms() + 10)
        body, received_at, message = got[0]
        due = message.annotations[DELIVERY_TIME]
        assert body == "delayed" and start + delay <= due <= sent + delay, "the time is the old primary's"
        assert received_at >= due, f"delivered {due - received_at} ms early"
        assert received_at - due < 2000, "delivered late by two seconds or more"
    finally:
        taker.close()


# -- a durable queue across a restart ---------------------------------------------------------------------------


def test_a_durable_scheduled_message_comes_back_after_a_restart_and_waits_for_its_time(node_factory, tmp_path):
    data = str(tmp_path / "data")
    node = node_factory("--data-dir", data)
    hastandby("add", "queue", "later", "--durable", "-b", node.address)
    start = now_ms()
    delay = 4000
    send(node.address, "later", [later("delayed", delay=delay, durable=True), later("now", durable=True)])
    sent = now_ms()
    port = node.port
    node.kill()
    restarted = node_factory("--data-dir", data, port=port)
    described = describe(restarted.address, "later")
    assert (described["depth"], described["scheduled"]) == (2, 1), described
    taker = Taker(restarted.address, "later", credit=10)
    try:
        assert taker.take(timeout=5).body == "now"
        taker.accept()
        assert now_ms() < start + delay - 500, "the restart took too long to check the message is not early"
        body, received_at, message = timed_take(taker, 1, timeout=start + delay - now_ms() + 10)[0]
        due = message.annotations[DELIVERY_TIME]
        assert body == "delayed" and start + delay <= due <= sent + delay
        assert received_at >= due, f"delivered {due - received_at} ms early"
        assert received_at - due < 1000
    finally:
        taker.close()


# -- a DR replica -----------------------------------------------------------------------------------------------


def test_a_dr_replica_holds_a_scheduled_message_until_the_sources_time(node_factory):
    source = node_factory(name="source")
    replica = node_factory(name="replica")
    hastandby("add", "queue", "later", "-b", source.address)
    hastandby("add", "queue", "later", "-b", replica.address, "--start-replica", source.address)
    send(source.address, "later", [later("delayed", delay=600_000), later("now")])
    wait_for(lambda: describe(replica.address, "later")["depth"] == 2, 20, "the replica to hold both")
    assert describe(replica.address, "later")["scheduled"] == 1
    assert [m.body for m in take_all(source.address, "later", 1)] == ["now"]  # the source gives out what is due


def test_the_proton_c_sender_s_delays_hold_its_messages_too(node):
    """A second client library: the proton C ``send-bench`` (hastandby.testing.cexamples) puts
    ``x-opt-delivery-delay`` on every message; the C ``receive-bench`` gets none before the delay is over."""
    hastandby("add", "queue", "c-later", "-b", node.address)
    environment = {**auth.client_environment(), "HASTANDBY_DELAY_MS": "1500", "HASTANDBY_DELAYED_PERCENT": "100"}
    start = time.monotonic()
    sent = cexamples.run_send("127.0.0.1", node.port, "c-later", 200, env=environment)
    assert cexamples.sent_count(sent) == 200, sent.stdout + sent.stderr
    described = describe(node.address, "c-later")
    assert (described["depth"], described["scheduled"]) == (200, 200), described
    received = cexamples.run_receive("127.0.0.1", node.port, "c-later", 200, env=auth.client_environment())
    assert cexamples.received_count(received) == 200, received.stdout + received.stderr
    assert time.monotonic() - start >= 1.5, "received before the delay was over"
    assert describe(node.address, "c-later")["depth"] == 0
