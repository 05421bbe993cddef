"""Message groups (--group-header, --shared-groups; docs/queues.md) with real nodes, python-qpid-proton and rhea.

On a standalone node: two consumers and several groups, each group's messages
at one consumer at a time and in order; a consumer's detach frees its groups.
Across kill -9 of the primary and an etcd election, and across kill -9 and a
promotion: every message arrives, none at two consumers at once, and ownership
starts afresh.  A DR replica declared alike keeps the options.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from proton import Message

from tests.integration.test_queue_features import Taker, admin_browse, describe, hastandby, rhea
from hastandby.testing.clients import browse, send
from hastandby.testing.waiting import wait_for

GROUPS = "abcd"


def grouped_messages(prefix: str = "", per_group: int = 4, header: str = "grp") -> list[Message]:
    """``per_group`` messages of each group, interleaved, and two without the header (group qpid.no-group)."""
    messages = [Message(body=f"{prefix}{g}{i}", properties={header: g}) for i in range(per_group) for g in GROUPS]
    messages.insert(3, Message(body=f"{prefix}-0", properties={"other": 1}))
    messages.append(Message(body=f"{prefix}-1"))
    return messages


def group_of(body: str) -> str:
    letter = body.lstrip("xyz")[0]
    return "qpid.no-group" if letter == "-" else letter


def drain(taker: Taker, limit: int = 200, timeout: float = 1.0) -> list[Message]:
    """What the taker is given until nothing more comes within ``timeout`` (left unsettled)."""
    got = []
    for _ in range(limit):
        try:
            got.append(taker.receiver.receive(timeout=timeout))
        except Exception:  # proton.Timeout: nothing more for now
            break
    return got


def settle(taker: Taker, count: int) -> None:
    """Accept the taker's ``count`` oldest unsettled messages, and let the dispositions go out."""
    for _ in range(count):
        taker.accept()
    try:
        taker.connection.wait(lambda: False, timeout=0.2)
    except Exception:  # proton.Timeout: the connection was pumped meanwhile
        pass


def check_groups(held: dict[str, list[str]], sent_order: list[str]) -> None:
    """Each group at one consumer only (``held``: consumer -> bodies it holds unsettled), in sent order."""
    owner: dict[str, str] = {}
    for consumer, bodies in held.items():
        for body in bodies:
            assert owner.setdefault(group_of(body), consumer) == consumer, f"{body} at two consumers' group"
        for group in {group_of(b) for b in bodies}:
            mine = [b for b in bodies if group_of(b) == group]
            assert mine == [b for b in sent_order if b in mine], f"{group} out of order at {consumer}: {mine}"


def owned(address: str, queue: str) -> dict[str, Any]:
    return {g["group"]: g for g in describe(address, queue)["groups"]}


# -- standalone ----------------------------------------------------------------------------------------------------


def test_two_consumers_several_groups_each_at_one_consumer_in_order(node):
    hastandby("add", "queue", "orders", "--group-header", "grp", "--shared-groups", "-b", node.address)
    first, second = Taker(node.address, "orders", credit=50), Taker(node.address, "orders", credit=50)
    try:
        messages = grouped_messages()
        send(node.address, "orders", messages)
        sent = [m.body for m in messages]
        got = {"first": [m.body for m in drain(first)], "second": [m.body for m in drain(second)]}
        assert sorted(got["first"] + got["second"]) == sorted(sent)  # every message, once
        assert got["first"] and got["second"]  # shared out between the two
        check_groups(got, sent)
        described = describe(node.address, "orders")
        assert (described["group_header"], described["shared_groups"]) == ("grp", True)
        assert described["arguments"]["qpid.group_header_key"] == "grp"
        assert described["arguments"]["qpid.shared_msg_group"] is True
        groups = owned(node.address, "orders")
        assert set(groups) == set(GROUPS) | {"qpid.no-group"}
        assert sum(g["acquired"] for g in groups.values()) == len(sent)
        assert len({g["consumer"] for g in groups.values()}) == 2
        assert '"qpid.group_header_key": "grp"' in hastandby("query", "-b", node.address).stdout
        # The first settles everything it holds: its groups are free, and go to whoever has credit next.
        first_groups = {group_of(b) for b in got["first"]}
        settle(first, len(got["first"]))
        wait_for(lambda: not first_groups & set(owned(node.address, "orders")), 10, "the first's groups freed")
        first.close()
        more = grouped_messages("x", per_group=2)
        send(node.address, "orders", more)
        later = [m.body for m in drain(second)]
        assert sorted(later) == sorted(m.body for m in more)
        check_groups({"second": got["second"] + later}, sent + [m.body for m in more])
    finally:
        first.close()
        second.close()


def test_a_consumers_detach_frees_its_groups(node):
    hastandby("add", "queue", "orders", "--group-header", "grp", "-b", node.address)
    first = Taker(node.address, "orders", credit=20)
    second = Taker(node.address, "orders", credit=20)
    try:
        send(node.address, "orders", [Message(body=f"a{i}", properties={"grp": "a"}) for i in range(5)])
        by_first, by_second = drain(first), drain(second, timeout=0.5)
        # Whichever consumer took the first message owns the group: it has all five, the other none.
        assert not (by_first and by_second), "the group reached a second consumer while the first held it"
        holder, waiter, taken = (first, second, by_first) if by_first else (second, first, by_second)
        assert [m.body for m in taken] == [f"a{i}" for i in range(5)]
        groups = owned(node.address, "orders")
        assert list(groups) == ["a"] and groups["a"]["acquired"] == 5
        settle(holder, 2)  # a0 and a1 settled; a2-a4 still held when its connection goes
        assert waiter.nothing(0.5)  # the group is still the holder's
        holder.close()
        got = [waiter.take() for _ in range(3)]
        assert [(m.body, m.delivery_count) for m in got] == [("a2", 1), ("a3", 1), ("a4", 1)]
        assert list(owned(node.address, "orders")) == ["a"]
        settle(waiter, len(got))
        wait_for(lambda: owned(node.address, "orders") == {}, 10, "the group free once all is settled")
        assert describe(node.address, "orders")["depth"] == 0
    finally:
        first.close()
        second.close()


def test_groups_with_a_rhea_producer_and_rhea_consumers(node):
    """rhea's application properties (``--property grp --values 3``) make the groups; two python-qpid-proton
    consumers each hold whole groups, in order; then two rhea consumers on one session, holding what they
    get unsettled (``--outcome none``), each get whole groups only."""
    hastandby("add", "queue", "orders", "--group-header", "grp", "-b", node.address)
    url = f"amqp://{node.address}"
    assert rhea("--url", url, "--queue", "orders", "--send", "12", "--property", "grp", "--values", "3")["accepted"] == 12
    sent = [f"rhea-{i}" for i in range(12)]
    group = {f"rhea-{i}": f"v{i % 3}" for i in range(12)}
    first, second = Taker(node.address, "orders", credit=50), Taker(node.address, "orders", credit=50)
    try:
        got = {"first": [m.body for m in drain(first)], "second": [m.body for m in drain(second)]}
        assert sorted(got["first"] + got["second"]) == sorted(sent)
        for bodies in got.values():  # each group's messages at one consumer, in the order sent
            for g in {group[b] for b in bodies}:
                assert [b for b in bodies if group[b] == g] == [b for b in sent if group[b] == g]
        assert not {group[b] for b in got["first"]} & {group[b] for b in got["second"]}
    finally:
        first.close()  # unsettled: every message goes back, each group free once its holder is gone
        second.close()
    wait_for(lambda: owned(node.address, "orders") == {}, 10, "every group free")
    held = rhea("--url", url, "--queue", "orders", "--receive", "12", "--consumers", "2", "--outcome", "none")
    assert sorted(held["bodies"]) == sorted(sent)
    at: dict[str, set[int]] = {}
    for body, consumer in zip(held["bodies"], held["consumers"]):
        at.setdefault(group[body], set()).add(consumer)
    assert all(len(consumers) == 1 for consumers in at.values()), at


def test_bad_group_options_are_refused_with_a_clear_error(node):
    result = hastandby("add", "queue", "bad", "--shared-groups", "-b", node.address, ok=False)
    assert result.returncode != 0 and "needs --group-header" in result.stderr, result.stderr
    result = hastandby("add", "queue", "bad", "--group-header", "", "-b", node.address, ok=False)
    assert result.returncode != 0 and "must name an application property" in result.stderr, result.stderr
    for arguments, error in ((("--argument", "qpid.shared_msg_group=1"), "qpid.shared_msg_group needs "
                              "qpid.group_header_key"),
                             (("--group-header", "g", "--priorities", "3"), "do not combine with qpid.priorities"),
                             (("--group-header", "g", "--single-active-consumer"),
                              "do not combine with x-single-active-consumer")):
        result = hastandby("add", "queue", "bad", *arguments, "-b", node.address, ok=False)
        assert result.returncode != 0 and error in result.stderr, result.stderr
    assert "bad" not in {q["name"] for q in json.loads(hastandby("query", "--json", "-b", node.address).stdout)
                         ["queues"]}


# -- across a failover -----------------------------------------------------------------------------------------


def _after_failover(address: str, sent: list[str], settled: set[str]) -> None:
    """Two consumers on the new primary: every message not settled before arrives, none at both, groups whole."""
    first, second = Taker(address, "orders", credit=50), Taker(address, "orders", credit=50)
    try:
        got = {"first": [m.body for m in drain(first, timeout=2.0)],
               "second": [m.body for m in drain(second, timeout=1.0)]}
        everything = got["first"] + got["second"]
        assert len(everything) == len(set(everything)), f"a message at two consumers: {got}"
        assert set(everything) == set(sent) - settled
        check_groups(got, sent)
        assert sum(g["acquired"] for g in owned(address, "orders").values()) == len(everything)
    finally:
        first.close()
        second.close()


@pytest.mark.etcd
def test_groups_across_kill_9_and_an_election(ha):
    c = ha(3)
    primary = c.wait_replicating()
    backups = [i for i in range(3) if i != primary]
    address = c[primary].address
    hastandby("add", "queue", "orders", "--group-header", "grp", "--shared-groups", "-b", address)
    messages = grouped_messages()
    sent = [m.body for m in messages]
    send(address, "orders", messages)  # accepted: every ready backup has them
    holder = Taker(address, "orders", credit=50)
    try:
        held = [m.body for m in drain(holder)]
        assert sorted(held) == sorted(sent)  # one consumer: every group is its
        settled = set(held[:3])
        settle(holder, 3)
        assert len(owned(address, "orders")) == len(GROUPS) + 1
        for index in backups:  # the settled ones are gone from each backup; no ownership there
            wait_for(lambda: len(admin_browse(c[index].address, "orders", len(sent))) == len(sent) - 3, 10,
                     f"{c.ids[index]} to drop the settled messages")
            replica = c.queue(index, "orders")
            assert replica["group_header"] == "grp" and replica["groups"] == []
        c[primary].kill()  # the holder's other messages were never settled: still on the queue
        new, _ = c.wait_new_primary(backups, 30)
        address = c[new].address
        wait_for(lambda: c.state(new) == "primary" and describe(address, "orders")["group_header"] == "grp", 20,
                 "the new primary serving")
        assert owned(address, "orders") == {}  # ownership starts fresh
        _after_failover(address, sent, settled)
    finally:
        holder.close()


def test_groups_across_kill_9_and_promote(cluster_factory):
    c = cluster_factory(2)
    hastandby("add", "queue", "orders", "--group-header", "grp", "-b", c[0].address)
    wait_for(lambda: c.queue(1, "orders") is not None, 10, "the backup to have the queue")
    messages = grouped_messages()
    sent = [m.body for m in messages]
    send(c[0].address, "orders", messages)
    wait_for(lambda: (c.queue(1, "orders") or {}).get("depth") == len(sent), 10, "the backup to hold them")
    one, two = Taker(c[0].address, "orders", credit=6), Taker(c[0].address, "orders", credit=6)
    try:
        held = {"one": [m.body for m in drain(one)], "two": [m.body for m in drain(two)]}
        check_groups(held, sent)  # taken, never settled
        assert len(held["one"]) + len(held["two"]) > 0
        c[0].kill()
        c.promote(1)
        assert owned(c[1].address, "orders") == {}
        _after_failover(c[1].address, sent, set())
    finally:
        one.close()
        two.close()


# -- a durable queue across a restart -------------------------------------------------------------------------------


def test_a_durable_grouped_queue_across_a_restart(node_factory, tmp_path):
    data = str(tmp_path / "data")
    node = node_factory("--data-dir", data)
    hastandby("add", "queue", "orders", "--durable", "--group-header", "grp", "-b", node.address)
    messages = grouped_messages()
    for message in messages:
        message.durable = True
    send(node.address, "orders", messages)
    holder = Taker(node.address, "orders", credit=50)
    try:
        assert len(drain(holder)) == len(messages)  # every group the holder's, none settled, when the node dies
        port = node.port
        node.kill()
    finally:
        holder.close()
    restarted = node_factory("--data-dir", data, port=port)
    described = describe(restarted.address, "orders")
    assert (described["group_header"], described["groups"], described["depth"]) == ("grp", [], len(messages))
    _after_failover(restarted.address, [m.body for m in messages], set())


# -- DR replicas ----------------------------------------------------------------------------------------------------


def test_a_dr_replica_declared_alike_keeps_its_groups_options(node_factory):
    source = node_factory(name="source")
    replica = node_factory(name="replica")
    options = ("--group-header", "grp", "--shared-groups")
    hastandby("add", "queue", "orders", *options, "-b", source.address)
    hastandby("add", "queue", "orders", *options, "-b", replica.address, "--start-replica", source.address)
    messages = grouped_messages()
    send(source.address, "orders", messages)
    wait_for(lambda: [m.body for m in browse(replica.address, "orders", len(messages), timeout=0.5)]
             == [m.body for m in messages], 20, "the replica to hold the messages")
    described = describe(replica.address, "orders")
    assert (described["group_header"], described["shared_groups"], described["groups"]) == ("grp", True, [])


def test_a_plain_queue_shows_no_group_fields(node):
    hastandby("add", "queue", "plain", "-b", node.address)
    described = describe(node.address, "plain")
    assert "group_header" not in described and "groups" not in described
