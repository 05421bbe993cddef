"""ReplicatingSubscription._deliver_skipping: what a (restarted) backup holds is left out a range at a time."""

from __future__ import annotations

import random
from types import SimpleNamespace

from hastandby.broker.queues.idset import IdSet
from hastandby.replication.subscription import ReplicatingSubscription


def run(skip: IdSet, ids: list[int], payloads: list[bytes | None]) -> list[int]:
    """The ids ``_deliver_skipping`` hands on (holes left out by ``deliver_each``, as the real one does)."""
    delivered: list[int] = []

    def deliver_each(queue: object, run_ids: list[int], run_payloads: list[bytes | None]) -> None:
        assert len(run_ids) == len(run_payloads)
        delivered.extend(i for i, p in zip(run_ids, run_payloads) if p is not None)

    fake = SimpleNamespace(skip=skip, deliver_each=deliver_each)
    ReplicatingSubscription._deliver_skipping(fake, None, ids, payloads)  # type: ignore[arg-type]
    return delivered


def test_a_run_the_backup_holds_whole_is_dropped_in_one_step():
    skip = IdSet.from_ids(range(1, 1_000_001))
    ids = list(range(1, 1_000_001))
    assert run(skip, ids, [b"x"] * len(ids)) == []
    assert skip == IdSet()  # skipped once: a later browse of the same ids would send them


def test_only_what_the_backup_lacks_is_delivered_in_order():
    rng = random.Random(5)
    for _ in range(300):
        ids = sorted(rng.sample(range(1, 80), rng.randint(1, 40)))  # gaps: ids removed and compacted
        payloads = [None if rng.random() < 0.15 else b"m" for _ in ids]  # holes: removed, not compacted
        held = {i for i in range(1, 90) if rng.random() < 0.6}
        skip = IdSet.from_ids(held)
        expected = [i for i, p in zip(ids, payloads) if p is not None and i not in held]
        assert run(skip, ids, payloads) == expected
        assert not any(i in skip for i in ids)
        assert all(i in skip for i in held if not ids[0] <= i <= ids[-1])
