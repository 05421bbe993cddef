"""A replica's batch (Queue.enqueue_replicated): appended in one step where it can be, else an
``enqueue`` each; the queue ends the same either way."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message

from hastandby.broker.queues.completion import Completion
from hastandby.broker.queues.queue import Queue, QueueSettings
from hastandby.broker.message.sections import HEADER_PREFIX

PLAIN = HEADER_PREFIX + b"\x45" + b"\x00\x53\x75\xa0\x01x"  # the C clients': empty header, a data section


class Observer:
    def __init__(self) -> None:
        self.seen: list[tuple[int, bytes, Any]] = []

    def enqueued(self, queue: Queue, msg_id: int, data: bytes, completion: Any) -> None:
        self.seen.append((msg_id, data, completion))


def _queue() -> tuple[Queue, Observer]:
    queue, observer = Queue("q", QueueSettings(replicate="all")), Observer()
    queue.add_observer(observer)
    return queue, observer


def _no_enqueue(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a plain batch after the last message takes no enqueue per message")


def test_a_plain_batch_after_the_last_message_is_appended_in_one_step() -> None:
    queue, observer = _queue()
    queue.enqueue_replicated([1, 2], [PLAIN, PLAIN + b"y"], Completion(lambda token: None))
    queue.enqueue = _no_enqueue  # type: ignore[method-assign]
    completion = Completion(lambda token: None)
    queue.enqueue_replicated([3, 4, 5], [PLAIN] * 3, completion)
    assert list(queue.id_set()) == [1, 2, 3, 4, 5]
    assert queue.depth == 5 and queue.bytes == 5 * len(PLAIN) + 1 and queue.next_id == 6
    assert queue.stats["enqueued"] == 5 and queue.get(2) == PLAIN + b"y"
    assert [(msg_id, c is completion) for msg_id, _, c in observer.seen[2:]] == [(3, True), (4, True), (5, True)]


@pytest.mark.parametrize("ids, expected", [
    ([[1, 2, 3], [2, 3, 4]], [1, 2, 3, 4]),  # overlapping what the queue holds: duplicates dropped
    ([[5, 3]], [3, 5]),  # out of order
    ([[4, 5], [1, 2]], [1, 2, 4, 5]),  # before the last message
])
def test_other_batches_go_an_enqueue_each(ids: list[list[int]], expected: list[int]) -> None:
    queue, _ = _queue()
    for batch in ids:
        queue.enqueue_replicated(batch, [PLAIN] * len(batch), None)
    assert list(queue.id_set()) == expected and queue.depth == len(expected)
    assert queue.next_id == max(expected) + 1


def test_a_message_with_a_ttl_keeps_it() -> None:
    queue, _ = _queue()
    with_ttl = bytes(Message(body=b"x", ttl=5).encode())
    queue.enqueue_replicated([1, 2], [PLAIN, with_ttl], None)
    assert list(queue.id_set()) == [1, 2] and list(queue.deadlines()) == [2]
