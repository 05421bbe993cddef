"""Bytes a connection's consumers hold in flight: framed but unwritten, or sent but unsettled.

A consumer's credit says how many messages it will take, not how many bytes.
Proton keeps each delivery's bytes until the peer settles it, and keeps
settled deliveries (their buffers with them) in a pool per connection, so a
consumer granting 32,768 credit made the node copy 145 MB of 10 KB messages
into its connection at once: 320 MB more in use, which stayed in use after
the queue was empty, and a memory alarm raised by the producer could never
clear.  Like Artemis's consumer window (1 MiB by default), a connection's
consumers stop taking messages once it holds ``UNSETTLED_LIMIT`` unsettled
bytes or ``UNWRITTEN_LIMIT`` bytes its socket has not taken, and go on once
both are back under half of that: a connection's memory is bounded in
bytes, whatever the credit.  A client that holds more than that unsettled
before it settles any waits for itself; docs/limits.md says so.
"""

from __future__ import annotations

from typing import Callable, Protocol

UNWRITTEN_LIMIT = 1 << 20
UNSETTLED_LIMIT = 16 << 20


class Pausable(Protocol):
    def resume(self) -> None: ...


def _now(fn: Callable[[], None]) -> None:
    fn()


class Backlog:
    """One connection's bytes in flight; pauses its consumers over the limits and resumes them (via ``later``)."""

    __slots__ = ("unwritten", "unsettled", "paused", "_later")

    def __init__(self, later: Callable[[Callable[[], None]], None] = _now) -> None:
        self.unwritten = 0
        self.unsettled = 0
        self.paused: list[Pausable] = []
        self._later = later

    def sent(self, size: int, settled: bool) -> bool:
        """A delivery of ``size`` bytes went out; True when the connection is now over a limit (pause)."""
        self.unwritten += size
        if not settled:
            self.unsettled += size
        return self.unwritten > UNWRITTEN_LIMIT or self.unsettled > UNSETTLED_LIMIT

    def settled(self, size: int) -> None:
        self.unsettled -= size
        if self.paused:  # asked here, not only inside: a consumer settles every message
            self._resume_if_under()

    def written(self, unwritten: int) -> None:
        """The socket took what it could; ``unwritten`` bytes remain."""
        self.unwritten = unwritten
        self._resume_if_under()

    def _resume_if_under(self) -> None:
        if self.paused and self.unwritten < UNWRITTEN_LIMIT // 2 and self.unsettled < UNSETTLED_LIMIT // 2:
            links, self.paused = self.paused, []
            self._later(lambda: _resume(links))


def _resume(links: list[Pausable]) -> None:
    for link in links:
        link.resume()
