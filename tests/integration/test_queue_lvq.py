"""Last-value queues (--lvq-key, docs/queues.md) with real nodes and real clients.

On a standalone node (python-qpid-proton and rhea producers), then across a
failover: kill -9 of the primary and an etcd election, a backup away while
values were replaced, then promoted; a durable queue across a restart on
its journal; a DR replica declared alike.
"""

from __future__ import annotations

import json

import pytest
from proton import Message, Timeout

from tests.integration.test_queue_features import Taker, describe, hastandby, rhea, take_all
from hastandby.testing.clients import browse, send
from hastandby.testing.waiting import wait_for


def prices(*pairs: tuple[str, str | None], durable: bool = False) -> list[Message]:
    """A message per (symbol, body); a None symbol: a message without the key property."""
    return [Message(body=body, properties={"sym": sym} if sym is not None else {"other": 1}, durable=durable)
            for sym, body in pairs]


TICKS = [("IBM", "ibm-1"), ("MSFT", "msft-1"), (None, "plain-1"), ("IBM", "ibm-2"), ("RHT", "rht-1"),
         ("MSFT", "msft-2"), ("IBM", "ibm-3")]
LAST = ["plain-1", "rht-1", "msft-2", "ibm-3"]  # what stays, in arrival order


def bodies(address: str, queue: str, count: int = 50, **options) -> list[str]:
    return [m.body for m in browse(address, queue, count, timeout=options.pop("timeout", 1.0), **options)]


# -- standalone ------------------------------------------------------------------------------------------------


def test_a_new_value_replaces_the_older_one(node):
    hastandby("add", "queue", "prices", "--lvq-key", "sym", "-b", node.address)
    send(node.address, "prices", prices(*TICKS))
    assert bodies(node.address, "prices") == LAST
    described = describe(node.address, "prices")
    assert (described["lvq_key"], described["lvq_values"], described["depth"]) == ("sym", 3, 4)
    assert described["stats"]["replaced"] == 3 and described["arguments"]["qpid.last_value_queue_key"] == "sym"
    assert '"qpid.last_value_queue_key": "sym"' in hastandby("query", "-b", node.address).stdout
    assert [m.body for m in take_all(node.address, "prices", 4)] == LAST


def test_a_rhea_producer_and_a_held_message(node):
    hastandby("add", "queue", "prices", "--lvq-key", "sym", "-b", node.address)
    result = rhea("--url", f"amqp://{node.address}", "--queue", "prices", "--send", "9", "--property", "sym",
                  "--values", "3", "--prefix", "r")
    assert result["accepted"] == 9
    assert bodies(node.address, "prices") == ["r6", "r7", "r8"]  # v0, v1, v2: the last of each
    held = Taker(node.address, "prices")
    try:
        assert held.take().body == "r6"
        send(node.address, "prices", prices(("v0", "new-v0")))
        assert bodies(node.address, "prices") == ["r7", "r8", "new-v0"]  # browsers skip what is held
        assert describe(node.address, "prices")["depth"] == 4  # the held one stays with its consumer...
        held.receiver.release(delivered=False)
        try:  # let the disposition go out (a wait whose condition holds at once sends nothing)
            held.connection.wait(lambda: False, timeout=0.5)
        except Timeout:
            pass
        wait_for(lambda: describe(node.address, "prices")["depth"] == 3, 10, "the released, replaced one to go")
    finally:
        held.close()
    assert [m.body for m in take_all(node.address, "prices", 3)] == ["r7", "r8", "new-v0"]


def test_bad_keys_are_refused_with_a_clear_error(node):
    result = hastandby("add", "queue", "bad", "--lvq-key", "", "-b", node.address, ok=False)
    assert result.returncode != 0 and "must name an application property" in result.stderr, result.stderr
    for argument in ("qpid.last_value_queue_key=" + "k" * 256,):
        result = hastandby("add", "queue", "bad", "--argument", argument, "-b", node.address, ok=False)
        assert result.returncode != 0, result.stderr
        assert "qpid.last_value_queue_key must be the name of an application property" in result.stderr
    assert "bad" not in {q["name"] for q in json.loads(hastandby("query", "--json", "-b", node.address).stdout)
                         ["queues"]}


# -- across a failover -----------------------------------------------------------------------------------------


@pytest.mark.etcd
def test_last_values_survive_kill_9_and_an_election(ha):
    c = ha(3)
    primary = c.wait_replicating()
    backups = [i for i in range(3) if i != primary]
    address = c[primary].address
    hastandby("add", "queue", "prices", "--lvq-key", "sym", "-b", address)
    send(address, "prices", prices(*TICKS))  # accepted: every ready backup has them
    for index in backups:  # each backup dropped the same ids
        wait_for(lambda: bodies(c[index].address, "prices", admin=True) == LAST, 10,
                 f"{c.ids[index]} to hold the last values")
    c[primary].kill()
    new, _ = c.wait_new_primary(backups, 30)
    address = c[new].address
    wait_for(lambda: c.state(new) == "primary" and describe(address, "prices")["lvq_key"] == "sym", 20,
             "the new primary serving")
    send(address, "prices", prices(("IBM", "ibm-4"), ("NEW", "new-1")))  # the new primary replaces as the old did
    expected = ["plain-1", "rht-1", "msft-2", "ibm-4", "new-1"]
    assert bodies(address, "prices") == expected
    assert [m.body for m in take_all(address, "prices", 5)] == expected


def test_a_backup_away_while_values_were_replaced_then_promoted(cluster_factory):
    c = cluster_factory(2)
    hastandby("add", "queue", "prices", "--lvq-key", "sym", "-b", c[0].address)
    wait_for(lambda: c.queue(1, "prices") is not None, 10, "the backup to have the queue")
    send(c[0].address, "prices", prices(*TICKS[:3]))
    wait_for(lambda: (c.queue(1, "prices") or {}).get("depth") == 3, 10, "the backup to hold 3")
    c[1].kill()
    send(c[0].address, "prices", prices(*TICKS[3:]))  # replaces ibm-1 and msft-1 while the backup is away
    c.restart(1)
    c.wait_state(1, "backup")
    wait_for(lambda: (c.queue(1, "prices") or {}).get("depth") == 4, 20, "the backup to catch up")
    c[0].kill()
    c.promote(1)
    assert bodies(c[1].address, "prices") == LAST
    send(c[1].address, "prices", prices(("RHT", "rht-2")))
    assert bodies(c[1].address, "prices") == ["plain-1", "msft-2", "ibm-3", "rht-2"]


# -- durable queues across a restart --------------------------------------------------------------------------------


def test_a_durable_last_value_queue_keeps_its_last_values_across_a_restart(node_factory, tmp_path):
    data = str(tmp_path / "data")
    node = node_factory("--data-dir", data)
    hastandby("add", "queue", "prices", "--durable", "--lvq-key", "sym", "-b", node.address)
    send(node.address, "prices", prices(*TICKS, durable=True))
    port = node.port
    node.kill()
    restarted = node_factory("--data-dir", data, port=port)
    assert bodies(restarted.address, "prices") == LAST
    send(restarted.address, "prices", prices(("MSFT", "msft-3"), durable=True))
    assert bodies(restarted.address, "prices") == ["plain-1", "rht-1", "ibm-3", "msft-3"]
    assert describe(restarted.address, "prices")["lvq_key"] == "sym"


# -- DR replicas ----------------------------------------------------------------------------------------------------


def test_a_dr_replica_declared_alike_keeps_the_last_values(node_factory):
    source = node_factory(name="source")
    replica = node_factory(name="replica")
    hastandby("add", "queue", "prices", "--lvq-key", "sym", "-b", source.address)
    hastandby("add", "queue", "prices", "--lvq-key", "sym", "-b", replica.address, "--start-replica",
              source.address)
    send(source.address, "prices", prices(*TICKS))
    wait_for(lambda: bodies(replica.address, "prices", timeout=0.5) == LAST, 20, "the replica to hold the last values")
    assert describe(replica.address, "prices")["lvq_key"] == "sym"
