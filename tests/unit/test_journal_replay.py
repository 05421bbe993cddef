"""A queue's journal records replayed: the fast form (lists and removed ranges) equals a plain dict by id."""

import random

import pytest

from hastandby.broker.store.journal_replay import QueueReplay


def model(records):
    """The obvious replay: a dict by id, each record applied in order."""
    held = {}
    for kind, a, b in records:
        if kind == "enqueue":
            held.update(zip(a, b))
        else:
            for lo, hi in a:
                for msg_id in [i for i in held if lo <= i <= hi]:
                    del held[msg_id]
    ids = sorted(held)
    return ids, [held[i] for i in ids]


def replayed(records):
    replay = QueueReplay()
    for kind, a, b in records:
        if kind == "enqueue":
            replay.enqueue(a, b)
        else:
            replay.dequeue(a)
    ids, payloads, ttls = replay.result()
    assert ttls == {}
    return ids, payloads


def run(lo, hi):
    ids = list(range(lo, hi + 1))
    return ("enqueue", ids, [b"m%d" % i for i in ids])


def test_runs_in_order_are_kept_as_they_came():
    records = [run(1, 3), run(4, 4), run(10, 12)]
    assert replayed(records) == model(records) == ([1, 2, 3, 4, 10, 11, 12], [b"m1", b"m2", b"m3", b"m4",
                                                                            b"m10", b"m11", b"m12"])


def test_dequeued_prefix_middle_and_ranges_past_the_end():
    records = [run(1, 10), ("dequeue", [(1, 3), (5, 5)], None), run(11, 12), ("dequeue", [(12, 2**62)], None)]
    assert replayed(records) == model(records) == ([4, 6, 7, 8, 9, 10, 11], [b"m%d" % i for i in
                                                                            (4, 6, 7, 8, 9, 10, 11)])


def test_a_dequeue_above_what_is_held_does_not_remove_a_later_enqueue():
    records = [run(1, 2), ("dequeue", [(3, 5)], None), run(3, 4)]
    assert replayed(records) == model(records) == ([1, 2, 3, 4], [b"m1", b"m2", b"m3", b"m4"])


@pytest.mark.parametrize("records", [
    [run(1, 5), run(3, 4)],  # a retransmission: the same ids again
    [run(5, 6), run(1, 2)],  # a run below what is held
    [run(1, 3), ("dequeue", [(2, 2)], None), run(2, 2)],  # enqueued again after its dequeue
    [("enqueue", [3, 1, 2], [b"c", b"a", b"b"])],  # a run out of order
    [("enqueue", [1, 1], [b"first", b"second"])],  # the same id twice in a run: the later one wins
])
def test_a_run_that_goes_back_takes_the_general_form(records):
    assert replayed(records) == model(records)


def test_random_histories_match_the_model():
    rng = random.Random(20261124)
    for _ in range(300):
        records, next_id = [], 1
        for _ in range(rng.randrange(1, 12)):
            roll = rng.random()
            if roll < 0.5:
                count = rng.randrange(1, 6)
                ids = list(range(next_id, next_id + count))
                next_id += count
            elif roll < 0.65:
                ids = [rng.randrange(1, next_id + 3) for _ in range(rng.randrange(1, 4))]
                next_id = max([next_id, *[i + 1 for i in ids]])
            else:
                lo = rng.randrange(1, next_id + 3)
                records.append(("dequeue", [(lo, lo + rng.randrange(0, 4))], None))
                continue
            records.append(("enqueue", ids, [bytes([rng.randrange(256)]) for _ in ids]))
        assert replayed(records) == model(records), records


def test_ttls_follow_the_messages_they_belong_to():
    replay = QueueReplay()
    replay.enqueue([1, 2, 3], [b"a", b"b", b"c"])
    replay.expire([(1, 500), (3, 900)])
    replay.dequeue([(1, 1)])
    replay.enqueue([4], [b"d"])
    replay.enqueue([3], [b"c again"])  # a retransmission without a ttl
    assert replay.result() == ([2, 3, 4], [b"b", b"c again", b"d"], {})
    replay.expire([(3, 100)])
    assert replay.result()[2] == {3: 100}
