"""Arrival samples: one ArrivalFeed per queue samples for every replica's Arrivals."""

from __future__ import annotations

from hastandby.broker.queues.arrivals import ArrivalFeed, Arrivals
from hastandby.broker.queues.queue import Queue, QueueSettings


def test_one_feed_samples_for_every_follower_and_each_drops_what_it_is_done_with() -> None:
    queue = Queue("q", QueueSettings(replicate="all"))
    first, second = Arrivals(), Arrivals()
    done_first: set[int] = set()
    ArrivalFeed.of(queue).follow(first, done_first.__contains__)
    ArrivalFeed.of(queue).follow(second, lambda msg_id: False)
    assert sum(isinstance(o, ArrivalFeed) for o in queue.observers) == 1  # one observer for both
    queue.enqueue(b"a")  # sampled for both
    feed = ArrivalFeed.of(queue)
    feed._last -= 1.0  # noqa: SLF001 - the next arrival is a resolution later
    done_first.add(1)
    queue.enqueue(b"b")  # sampled again; the first follower drops id 1, which it is done with
    assert first.oldest(done_first.__contains__)[0] == 2  # type: ignore[index]
    assert second.oldest(lambda msg_id: False)[0] == 1  # type: ignore[index]
    assert second.age(lambda msg_id: False) >= 0.0


def test_the_feed_leaves_the_queue_with_its_last_follower() -> None:
    queue = Queue("q", QueueSettings(replicate="all"))
    first, second = Arrivals(), Arrivals()
    ArrivalFeed.of(queue).follow(first, lambda msg_id: False)
    ArrivalFeed.of(queue).follow(second, lambda msg_id: False)
    ArrivalFeed.of(queue).unfollow(first)
    assert any(isinstance(o, ArrivalFeed) for o in queue.observers)
    ArrivalFeed.of(queue).unfollow(second)
    assert not any(isinstance(o, ArrivalFeed) for o in queue.observers)
    queue.enqueue(b"a")
    assert second.oldest(lambda msg_id: False) is None
