"""Message groups (qpid.group_header_key, qpid.shared_msg_group: broker/queues/queue_kinds.py), without any I/O.

A fake consumer stands in for a link: the ownership rules (a group's messages
to one consumer at a time, until it has settled all it holds), a detach, the
combinations with the other queue features, and what a replica holds.
"""

from __future__ import annotations

import random

import pytest
from proton import Message

from hastandby.broker.errors import InvalidArgument
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.queue_kinds import MessageGroupQueue, queue_class
from hastandby.broker.queues.registry import Registry, queue_settings


class FakeConsumer:
    def __init__(self, credit: int = 0, presettled: bool = False) -> None:
        self.credit = credit
        self.browsing = False
        self.sees_acquired = False
        self.presettled = presettled
        self.got: list[int] = []
        self.seen = 0

    def deliver(self, queue, msg_id, data, delivery_count):
        self.credit -= 1
        self.got.append(msg_id)
        if self.presettled:
            queue.acknowledge(msg_id)

    def deliver_run(self, queue, ids, payloads):  # pragma: no cover - not a browser
        raise AssertionError


def msg(group=None, body="x", header: str = "grp") -> bytes:
    message = Message(body=body)
    if group is not None:
        message.properties = {header: group}
    return bytes(message.encode())


def grouped(registry: Registry | None = None, header: str = "grp", **arguments) -> Queue:
    registry = registry or Registry()
    queue, _ = registry.declare_queue("q", {"qpid.group_header_key": header, **arguments})
    return queue


def fill(queue: Queue, groups: str) -> dict[int, str]:
    """One message per letter, its group the letter ('-': no header); id -> group."""
    return {queue.enqueue(msg(None if g == "-" else g)): g for g in groups}


def test_a_groups_messages_go_to_one_consumer_until_it_settles_them_all():
    queue = grouped()
    group = fill(queue, "aabbab")
    first, second = FakeConsumer(), FakeConsumer()
    queue.add_consumer(first)
    queue.add_consumer(second)
    first.credit, second.credit = 10, 10
    queue.dispatch()
    assert [group[i] for i in first.got] == ["a", "a", "a"]
    assert [group[i] for i in second.got] == ["b", "b", "b"]
    assert first.got == sorted(first.got) and second.got == sorted(second.got)
    described = queue.describe()
    assert described["group_header"] == "grp" and described["shared_groups"] is False
    assert sorted((g["group"], g["acquired"]) for g in described["groups"]) == [("a", 3), ("b", 3)]
    # More of group a while the first consumer still holds some: to it, not to the idle second
    new = queue.enqueue(msg("a"))
    assert first.got[-1] == new and new not in second.got
    # The first settles all it holds of a: the group is free; its next message goes to whoever is next
    for msg_id in list(first.got):
        queue.acknowledge(msg_id)
    assert [g["group"] for g in queue.describe()["groups"]] == ["b"]
    queue.enqueue(msg("a"))
    queue.enqueue(msg("a"))
    assert len(first.got) + len(second.got) == 9


def test_an_owner_without_credit_holds_its_group_back_and_others_pass_it():
    queue = grouped()
    group = fill(queue, "aaab")
    first, second = FakeConsumer(), FakeConsumer()
    queue.add_consumer(first)
    queue.add_consumer(second)
    first.credit = 1
    queue.dispatch()
    assert [group[i] for i in first.got] == ["a"]
    second.credit = 5
    queue.dispatch()
    assert [group[i] for i in second.got] == ["b"]  # a's other messages wait for their owner
    first.credit = 5
    queue.dispatch()
    assert [group[i] for i in first.got] == ["a", "a", "a"] and first.got == sorted(first.got)


def test_messages_without_the_header_are_the_group_qpid_no_group():
    queue = grouped()
    fill(queue, "--")
    queue.enqueue(msg("qpid.no-group"))
    first, second = FakeConsumer(credit=10), FakeConsumer(credit=10)
    queue.add_consumer(first)
    queue.add_consumer(second)
    assert len(first.got) == 3 and second.got == []
    assert queue.describe()["groups"][0]["group"] == "qpid.no-group"


def test_a_release_of_the_last_held_message_frees_the_group_and_it_comes_back_first():
    queue = grouped()
    fill(queue, "aa")
    first, second = FakeConsumer(credit=1), FakeConsumer()
    queue.add_consumer(first)
    queue.add_consumer(second)
    second.credit = 5
    queue.dispatch()
    assert first.got == [1] and second.got == []
    queue.release(1, delivery_failed=False)
    assert second.got == [1, 2]  # free now: the next consumer with credit takes the group, in order


def test_a_detach_frees_the_consumers_groups_once_its_messages_are_back():
    queue = grouped()
    group = fill(queue, "aabbaa")
    first, second = FakeConsumer(credit=10), FakeConsumer()
    queue.add_consumer(first)
    queue.add_consumer(second)
    assert len(first.got) == 6
    second.credit = 10
    # What a link's close does: leave the queue, then release each unsettled message in id order
    queue.remove_consumer(first)
    unreleased = sorted(first.got)
    while unreleased:
        queue.release(unreleased.pop(0), delivery_failed=True)
        still_held = {group[i] for i in unreleased}  # a group is free only once the last of its messages is back
        assert not still_held & {group[i] for i in second.got}
    assert [group[i] for i in second.got] == ["b", "b", "a", "a", "a", "a"]
    assert sorted(second.got) == sorted(first.got)
    assert [group[i] for i in second.got if group[i] == "a"] == ["a"] * 4
    assert [i for i in second.got if group[i] == "a"] == sorted(i for i in second.got if group[i] == "a")
    assert {g["group"] for g in queue.describe()["groups"]} == {"a", "b"}
    assert all(g["consumer"] == repr(second) for g in queue.describe()["groups"])


def test_never_two_consumers_hold_one_group_random_schedules():
    rng = random.Random(28)
    for _ in range(200):
        queue = grouped()
        consumers = [FakeConsumer() for _ in range(rng.randint(1, 4))]
        for consumer in consumers:
            queue.add_consumer(consumer)
        group: dict[int, str] = {}
        holding: dict[int, FakeConsumer] = {}
        for _ in range(120):
            action = rng.random()
            if action < 0.4:
                g = rng.choice("abcd-")
                group[queue.enqueue(msg(None if g == "-" else g))] = g
            elif action < 0.6:
                rng.choice(consumers).credit += rng.randint(1, 3)
                queue.dispatch()
            elif holding and action < 0.85:
                msg_id = rng.choice(sorted(holding))
                del holding[msg_id]
                if rng.random() < 0.7:
                    queue.acknowledge(msg_id)
                else:
                    queue.release(msg_id, delivery_failed=rng.random() < 0.5)
            for consumer in consumers:  # record new deliveries
                while len(consumer.got) > consumer.seen:
                    msg_id = consumer.got[consumer.seen]
                    consumer.seen += 1
                    assert msg_id not in holding
                    holding[msg_id] = consumer
            owners: dict[str, FakeConsumer] = {}
            for msg_id, consumer in holding.items():
                assert owners.setdefault(group[msg_id], consumer) is consumer  # one owner per group
        for msg_id, consumer in holding.items():
            assert queue.owners[queue.group_of(queue.get(msg_id))][0] is consumer


def test_a_pre_settled_consumer_and_expired_messages():
    queue = grouped()
    fill(queue, "ab")
    queue.enqueue(msg("a"), ttl_ms=60_000)
    fill(queue, "a")
    consumer = FakeConsumer(presettled=True)
    queue.add_consumer(consumer)
    for message in queue._expires:
        queue._expires[message] = 0.0  # already past
    consumer.credit = 10
    queue.dispatch()
    assert consumer.got == [1, 2, 4] and queue.depth == 0 and queue.owners == {} and queue.held == {}


def test_groups_combine_with_a_delivery_limit_dedup_and_lvq():
    registry = Registry()
    queue = grouped(registry, **{"x-delivery-limit": 1, "x-dedup-window": 60, "qpid.last_value_queue_key": "k"})
    assert isinstance(queue, MessageGroupQueue)
    fill(queue, "aa")
    consumer = FakeConsumer(credit=1)
    other = FakeConsumer()
    queue.add_consumer(consumer)
    queue.add_consumer(other)
    queue.release(1, delivery_failed=True)  # its limit: dead-lettered (dropped), the group freed
    assert queue.stats["dead_lettered"] == 1 and queue.owners == {}
    other.credit = 1
    queue.dispatch()
    assert other.got == [2]


@pytest.mark.parametrize("arguments, error", [
    ({"qpid.shared_msg_group": 1}, "needs qpid.group_header_key"),
    ({"qpid.shared_msg_group": True}, "--shared-groups needs --group-header"),
    ({"qpid.group_header_key": ""}, "qpid.group_header_key must be the name of an application property"),
    ({"qpid.group_header_key": 7}, "qpid.group_header_key must be the name"),
    ({"qpid.group_header_key": "g", "qpid.shared_msg_group": 2}, "qpid.shared_msg_group must be true or false"),
    ({"qpid.group_header_key": "g", "qpid.priorities": 3}, "do not combine with qpid.priorities"),
    ({"qpid.group_header_key": "g", "x-single-active-consumer": True}, "do not combine with x-single-active"),
])
def test_bad_group_arguments_are_refused(arguments, error):
    with pytest.raises(InvalidArgument, match=error):
        queue_settings(arguments, default_replicate="none")
    registry = Registry()
    with pytest.raises(InvalidArgument):
        registry.declare_queue("q", arguments)
    assert "q" not in registry.queues


@pytest.mark.parametrize("value, shared", [(1, True), (0, False), ("1", True), ("true", True), (False, False)])
def test_shared_groups_as_qpid_config_sets_it(value, shared):
    settings = queue_settings({"qpid.group_header_key": "g", "qpid.shared_msg_group": value}, default_replicate="none")
    assert settings.group_header == "g" and settings.shared_groups is shared
    assert queue_class(settings) is MessageGroupQueue


def test_a_plain_queue_stays_plain_and_a_replica_holds_no_ownership():
    assert queue_class(queue_settings({}, default_replicate="none")) is Queue
    replica = grouped()
    for msg_id, g in ((3, "a"), (1, "a"), (2, "b")):
        replica.enqueue(msg(g), msg_id=msg_id)
    assert replica.ids() == [1, 2, 3] and replica.describe()["groups"] == []
    consumer = FakeConsumer(credit=10)  # promoted: the first consumer to attach takes the groups afresh
    replica.add_consumer(consumer)
    assert consumer.got == [1, 2, 3]
