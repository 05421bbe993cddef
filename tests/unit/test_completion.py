"""A producer's acknowledgement waits for every holder; its creator may finish it itself when nobody holds it."""

from hastandby.broker.queues.completion import Completion


def test_a_countdown_nobody_else_holds_is_finished_by_its_creator_without_the_callback():
    calls: list[object] = []
    completion = Completion(calls.append, "token", lambda token, error: calls.append(error))
    assert completion.finish_unless_held() is True
    assert completion.done and calls == []
    completion.fail(RuntimeError("late"))  # over: a late failure reaches nobody
    completion.release()
    assert calls == []


def test_a_held_countdown_is_released_and_completes_with_its_last_holder():
    done: list[object] = []
    completion = Completion(done.append, "token")
    completion.hold()
    assert completion.finish_unless_held() is False
    assert not completion.done and done == []
    completion.release()
    assert completion.done and done == ["token"]


def test_a_countdown_failed_while_held_is_not_finished_again():
    failed: list[object] = []
    completion = Completion(lambda token: failed.append("completed"), "token",
                            lambda token, error: failed.append(str(error)))
    completion.hold()
    completion.fail(RuntimeError("journal full"))
    assert completion.finish_unless_held() is False
    completion.release()
    assert failed == ["journal full"]
