"""Duplicate detection (--dedup-window, docs/queues.md) with real nodes and real clients.

On a standalone node (python-qpid-proton and rhea producers), then across a
failover: kill -9 of the primary and an etcd election with a producer that
re-sends what it had not seen acknowledged and some of what it had; a
backup that was away while messages were consumed, then promoted; a durable
queue across a restart on its journal.
"""

from __future__ import annotations

import time

import pytest
from proton import Delivery, Message

from tests.integration.test_queue_features import describe, hastandby, rhea, take_all
from hastandby.testing.clients import browse, connect, send
from hastandby.testing.waiting import wait_for


def with_ids(prefix: str, count: int, start: int = 0, durable: bool = False) -> list[Message]:
    return [Message(id=f"{prefix}{i}", body=f"{prefix}{i}", durable=durable) for i in range(start, start + count)]


def bodies(address: str, queue: str, count: int, **options) -> list[str]:
    return [m.body for m in browse(address, queue, count, **options)]


# -- standalone ------------------------------------------------------------------------------------------------


def test_a_duplicate_is_accepted_and_not_enqueued(node):
    hastandby("add", "queue", "orders", "--dedup-window", "60", "-b", node.address)
    outcomes = send(node.address, "orders", with_ids("o", 5) + with_ids("o", 3) + [Message(body="no id")] * 2)
    assert all(outcome == Delivery.ACCEPTED for outcome in outcomes), outcomes
    assert sorted(bodies(node.address, "orders", 20, timeout=1)) == ["no id", "no id", "o0", "o1", "o2", "o3", "o4"]
    # rhea sets the message-id to the body: the second run's are all duplicates
    for _ in range(2):
        result = rhea("--url", f"amqp://{node.address}", "--queue", "orders", "--send", "5", "--message-ids", "yes",
                      "--prefix", "r")
        assert result["accepted"] == 5
    described = describe(node.address, "orders")
    assert described["depth"] == 12 and described["stats"]["deduplicated"] == 8
    assert described["dedup_window"] == 60 and described["dedup_ids"] == 10
    assert described["arguments"]["x-dedup-window"] == 60
    assert '"x-dedup-window": 60' in hastandby("query", "-b", node.address).stdout
    # consumed, still remembered
    take_all(node.address, "orders", 12)
    send(node.address, "orders", with_ids("o", 5))
    assert describe(node.address, "orders")["depth"] == 0


def test_bad_windows_are_refused_with_a_clear_error(node):
    for value, error in (("0", "0 is not in the range 1<=x<=86400"), ("86401", "is not in the range"),
                         ("soon", "'soon' is not a valid integer")):
        result = hastandby("add", "queue", "bad", "--dedup-window", value, "-b", node.address, ok=False)
        assert result.returncode != 0 and error in result.stderr, result.stderr
    for argument, error in (("x-dedup-window=0", "x-dedup-window must be a whole number from 1 to 86400, got 0"),
                            ("x-dedup-window=1.5", "x-dedup-window must be a whole number from 1 to 86400")):
        result = hastandby("add", "queue", "bad", "--argument", argument, "-b", node.address, ok=False)
        assert result.returncode != 0 and error in result.stderr, result.stderr


def test_the_window_passes(node):
    hastandby("add", "queue", "short", "--dedup-window", "1", "-b", node.address)
    send(node.address, "short", with_ids("s", 2))
    send(node.address, "short", with_ids("s", 2))
    assert describe(node.address, "short")["depth"] == 2
    time.sleep(1.2)
    send(node.address, "short", with_ids("s", 2))
    assert describe(node.address, "short")["depth"] == 4


# -- across a failover ---------------------------------------------------------------------------------------------


class Producer:
    """Sends without waiting for each outcome, so some are unacknowledged when its node dies."""

    def __init__(self, address: str, queue: str) -> None:
        self.connection = connect(address)
        self.sender = self.connection.create_sender(queue)
        self.deliveries: dict[str, object] = {}

    def send_all(self, messages: list[Message]) -> None:
        for message in messages:
            self.deliveries[message.id] = self.sender.link.send(message)

    def acknowledged(self) -> set[str]:
        return {key for key, delivery in self.deliveries.items() if delivery.remote_state == Delivery.ACCEPTED}

    def wait_acknowledged(self, count: int, timeout: float = 20.0) -> None:
        self.connection.wait(lambda: len(self.acknowledged()) >= count, timeout=timeout)

    def close(self) -> None:
        try:
            self.connection.close()
        except Exception:  # noqa: BLE001 - its node was killed
            pass


@pytest.mark.etcd
def test_a_producer_re_sending_after_kill_9_and_an_election_makes_no_duplicate(ha):
    c = ha(3)
    primary = c.wait_replicating()
    backups = [i for i in range(3) if i != primary]
    address = c[primary].address
    hastandby("add", "queue", "orders", "--dedup-window", "300", "-b", address)
    total = 3000
    send(address, "orders", with_ids("m", 20))
    take_all(address, "orders", 10)  # consumed on the old primary: their ids stay remembered
    producer = Producer(address, "orders")
    try:
        producer.send_all(with_ids("m", total - 20, start=20))
        producer.wait_acknowledged(200)
        c[primary].kill()
        acknowledged = producer.acknowledged() | {f"m{i}" for i in range(20)}
    finally:
        producer.close()
    assert len(acknowledged) < total, "the producer saw everything acknowledged before the kill: nothing to re-send"
    new, _ = c.wait_new_primary(backups, 30)
    address = c[new].address
    wait_for(lambda: c.state(new) == "primary" and describe(address, "orders")["dedup_window"] == 300, 20,
             "the new primary serving")
    before = describe(address, "orders")
    assert before["depth"] >= len(acknowledged) - 10  # nothing acknowledged was lost
    # Re-send what was not acknowledged, and 100 that were (the 10 consumed among them).
    again = sorted(set(f"m{i}" for i in range(total)) - acknowledged) + sorted(acknowledged)[:100]
    outcomes = send(address, "orders", [Message(id=key, body=key) for key in again])
    assert all(outcome == Delivery.ACCEPTED for outcome in outcomes)
    after = describe(address, "orders")
    assert after["depth"] == total - 10, after
    assert after["stats"]["deduplicated"] >= 100
    got = [m.body for m in take_all(address, "orders", total - 10)]
    assert sorted(got) == sorted(f"m{i}" for i in range(10, total))  # each exactly once


def test_a_backup_away_while_messages_were_consumed_gets_their_ids_then_promoted_drops_them(cluster_factory):
    c = cluster_factory(2)
    hastandby("add", "queue", "orders", "--dedup-window", "300", "-b", c[0].address)
    wait_for(lambda: c.queue(1, "orders") is not None, 10, "the backup to have the queue")
    c[1].kill()
    send(c[0].address, "orders", with_ids("gone", 5) + with_ids("kept", 3))
    take_all(c[0].address, "orders", 5)  # consumed while the backup was away: it never gets these messages
    c.restart(1)
    c.wait_state(1, "backup")
    wait_for(lambda: (c.queue(1, "orders") or {}).get("dedup_ids") == 8, 20, "the backup to remember all 8 ids")
    c[0].kill()
    c.promote(1)
    send(c[1].address, "orders", with_ids("gone", 5) + with_ids("kept", 3) + with_ids("new", 1))
    described = describe(c[1].address, "orders")
    assert described["depth"] == 4 and described["stats"]["deduplicated"] == 8


# -- durable queues across a restart --------------------------------------------------------------------------------


def test_a_durable_queue_remembers_durable_messages_ids_across_a_restart(node_factory, tmp_path):
    data = str(tmp_path / "data")
    node = node_factory("--data-dir", data)
    hastandby("add", "queue", "orders", "--durable", "--dedup-window", "300", "-b", node.address)
    send(node.address, "orders", with_ids("d", 6, durable=True) + with_ids("t", 2))
    take_all(node.address, "orders", 3)  # d0-d2 consumed
    wait_for(lambda: describe(node.address, "orders")["depth"] == 5, 10, "the consumer's acknowledgements")
    port = node.port
    node.kill()
    restarted = node_factory("--data-dir", data, port=port)
    assert describe(restarted.address, "orders")["depth"] == 3
    send(restarted.address, "orders", with_ids("d", 6, durable=True) + with_ids("t", 2))
    # d0-d5 remembered (durable), t0-t1 were lost with the restart and are taken again
    assert sorted(bodies(restarted.address, "orders", 20, timeout=1)) == ["d3", "d4", "d5", "t0", "t1"]
    assert describe(restarted.address, "orders")["stats"]["deduplicated"] == 6


# -- DR replicas ----------------------------------------------------------------------------------------------------


def test_a_full_dr_replica_remembers_its_sources_ids(node_factory):
    source = node_factory(name="source")
    replica = node_factory(name="replica")
    hastandby("add", "queue", "orders", "--dedup-window", "300", "-b", source.address)
    hastandby("add", "queue", "orders", "--dedup-window", "300", "-b", replica.address,
              "--start-replica", source.address)
    send(source.address, "orders", with_ids("o", 6) + with_ids("o", 6))
    take_all(source.address, "orders", 2)
    wait_for(lambda: describe(replica.address, "orders")["dedup_ids"] == 6, 20, "the replica to remember 6 ids")
    described = describe(replica.address, "orders")
    assert described["dedup_window"] == 300 and described["arguments"]["x-dedup-window"] == 300
    wait_for(lambda: describe(replica.address, "orders")["depth"] == 4, 20, "the replica to mirror the source")
