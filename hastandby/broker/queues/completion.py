"""Holding back a producer's acknowledgement until every guard releases it.

Qpid called this "ingress completion".  The producer link creates one
``Completion`` per unsettled incoming message; routing holds it while the
message is enqueued, and any queue observer (an HA guard) may ``hold`` it too.
The producer gets its ``accepted`` disposition when the last holder releases.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable


class Completion:
    """A countdown that calls ``on_complete(token)`` once, when it reaches zero.

    A holder that cannot keep its promise (the journal could not write the
    message) calls ``fail(error)`` instead: ``on_fail(token, error)`` runs at
    once, and the countdown is over.
    """

    __slots__ = ("_pending", "_on_complete", "_on_fail", "token", "done")

    def __init__(self, on_complete: Callable[[Any], None], token: Any = None,
                 on_fail: Callable[[Any, Exception], None] | None = None) -> None:
        self._pending = 1
        self._on_complete: Callable[[Any], None] | None = on_complete
        self._on_fail = on_fail
        self.token = token
        # A plain attribute, not a property: every guard reads it for every
        # replicated message.
        self.done = False

    def fail(self, error: Exception) -> None:
        if self._on_complete is None:
            return
        self._on_complete = None
        self.done = True
        if self._on_fail is not None:
            self._on_fail(self.token, error)

    def hold(self, count: int = 1) -> None:
        """``count`` more holders (the guards of every backup, at once)."""
        if self._on_complete is not None:
            self._pending += count

    def finish_unless_held(self) -> bool:
        """The creator's own release, for a creator that can act at once: True when nobody else holds
        the countdown (it is over, and ``on_complete`` is not called: the creator acts itself, one call
        chain less per message); False after a plain ``release`` when someone does."""
        if self._pending == 1 and self._on_complete is not None:
            self._pending = 0
            self._on_complete = None
            self.done = True
            return True
        self.release()
        return False

    def release(self) -> None:
        self._pending -= 1
        if self._pending == 0 and self._on_complete is not None:
            callback, self._on_complete = self._on_complete, None
            self.done = True
            callback(self.token)


def release_all(completions: Iterable[Completion]) -> None:
    """``release`` each of ``completions``, without a call per message: a backup's acknowledgement
    of a batch releases the batch's messages at once."""
    for completion in completions:  # ``Completion.release`` inlined
        pending = completion._pending - 1
        completion._pending = pending
        if pending == 0 and completion._on_complete is not None:
            callback, completion._on_complete = completion._on_complete, None
            completion.done = True
            callback(completion.token)
