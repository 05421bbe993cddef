"""QueueGuard with a real Queue and real Completions."""

from __future__ import annotations

from hastandby.broker.queues.completion import Completion
from hastandby.broker.queues.queue import Queue, QueueSettings
from hastandby.replication.guard import QueueGuard


class Producer:
    """Stands in for a producer link: records which messages were acknowledged."""

    def __init__(self) -> None:
        self.accepted: list[str] = []

    def send(self, queue: Queue, token: str) -> int:
        """Enqueue as the incoming link does: hold during routing, release after."""
        completion = Completion(self.accepted.append, token)
        msg_id = queue.enqueue(token.encode(), completion)
        completion.release()
        return msg_id


def make_queue() -> Queue:
    return Queue("q", QueueSettings(replicate="all"))


def test_without_guard_a_message_completes_at_once():
    queue, producer = make_queue(), Producer()
    producer.send(queue, "a")
    assert producer.accepted == ["a"]


def test_guard_holds_until_the_backup_accepts():
    queue, producer = make_queue(), Producer()
    guard = QueueGuard(queue)
    msg_id = producer.send(queue, "a")
    assert producer.accepted == []
    assert guard.is_guarded(msg_id) and guard.pending == 1
    guard.complete(msg_id)
    assert producer.accepted == ["a"]
    assert not guard.is_guarded(msg_id) and guard.pending == 0


def test_two_guards_must_both_release():
    queue, producer = make_queue(), Producer()
    first, second = QueueGuard(queue), QueueGuard(queue)
    msg_id = producer.send(queue, "a")
    first.complete(msg_id)
    assert producer.accepted == []
    second.skip(msg_id)
    assert producer.accepted == ["a"]


def test_dequeue_on_the_primary_releases():
    queue, producer = make_queue(), Producer()
    guard = QueueGuard(queue)
    msg_id = producer.send(queue, "a")
    queue.dequeue(msg_id, "consumed")
    assert producer.accepted == ["a"]
    assert guard.pending == 0


def test_cancel_releases_everything_and_detaches():
    queue, producer = make_queue(), Producer()
    guard = QueueGuard(queue)
    for token in "abc":
        producer.send(queue, token)
    guard.cancel()
    assert producer.accepted == ["a", "b", "c"]
    assert guard not in queue.observers
    producer.send(queue, "d")
    assert producer.accepted[-1] == "d" and guard.pending == 0


def test_double_release_is_harmless():
    queue, producer = make_queue(), Producer()
    first, second = QueueGuard(queue), QueueGuard(queue)
    msg_id = producer.send(queue, "a")
    first.complete(msg_id)
    first.complete(msg_id)
    first.skip(msg_id)
    first.cancel()
    first.cancel()
    assert producer.accepted == []  # the second guard still holds it
    queue.dequeue(msg_id, "consumed")
    second.complete(msg_id)
    assert producer.accepted == ["a"]


def test_messages_before_the_guard_are_not_held():
    queue, producer = make_queue(), Producer()
    early = producer.send(queue, "early")
    guard = QueueGuard(queue)
    assert guard.first_id == early + 1
    late = producer.send(queue, "late")
    assert producer.accepted == ["early"]
    assert not guard.is_guarded(early) and guard.is_guarded(late)
    guard.complete(early)  # never held: nothing happens
    assert guard.pending == 1


def test_a_message_without_completion_is_not_held():
    queue = make_queue()
    guard = QueueGuard(queue)
    msg_id = queue.enqueue(b"settled")  # pre-settled delivery: no acknowledgement to hold
    assert not guard.is_guarded(msg_id)


def test_guard_attached_while_a_message_is_being_enqueued_does_not_hold_it():
    """The attach-before-read order: a message already numbered belongs to catch-up."""
    queue, producer = make_queue(), Producer()
    guards: list[QueueGuard] = []

    class AttachOnEnqueue:
        def enqueued(self, queue, msg_id, data, completion):
            if not guards:
                guards.append(QueueGuard(queue))

        def acquired(self, queue, msg_id): ...

        def released(self, queue, msg_id): ...

        def dequeued(self, queue, msg_id, reason): ...

    queue.add_observer(AttachOnEnqueue())
    first = producer.send(queue, "a")
    assert producer.accepted == ["a"]
    assert guards[0].first_id == first + 1
    second = producer.send(queue, "b")
    assert guards[0].is_guarded(second)



def test_skip_all_releases_exactly_the_held_messages_in_the_set():
    from hastandby.broker.queues.idset import IdSet

    # Fewer ids than held messages (walks the ids, one of them not held), and a million (walks the held).
    for pick, extra in (("bc", [100]), ("ae", list(range(100, 1_000_000)))):
        queue, producer = make_queue(), Producer()
        guard = QueueGuard(queue)
        ids = {token: producer.send(queue, token) for token in "abcde"}
        guard.skip_all(IdSet.from_ids([ids[token] for token in pick] + extra))
        assert producer.accepted == list(pick)
        assert guard.pending == 3


def test_guards_of_one_queue_share_one_observer_and_each_holds_from_its_first_id():
    """QueueGuards holds a message for exactly the guards whose first id it reaches."""
    from hastandby.replication.guard import QueueGuards

    queue, producer = make_queue(), Producer()
    early = QueueGuard(queue)
    first = producer.send(queue, "a")  # before ``late``: catch-up's, not late's to hold
    late = QueueGuard(queue)
    assert [o for o in queue.observers if isinstance(o, QueueGuards)] == [QueueGuards.of(queue)]
    assert early.is_guarded(first) and not late.is_guarded(first)
    second = producer.send(queue, "b")
    early.complete_all([first, second])
    assert producer.accepted == ["a"]
    late.complete_all([second])
    assert producer.accepted == ["a", "b"]
    early.cancel()
    late.cancel()
    assert not any(isinstance(o, QueueGuards) for o in queue.observers)
