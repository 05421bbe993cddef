"""A few threads for the expensive parts of logging in, so that the node's reactor thread never does them.

Two things a client that has not authenticated can make the node compute:
a PLAIN password check derives PBKDF2 (milliseconds of CPU, on purpose:
that is what makes a stolen users file slow to attack), and a TLS handshake
makes a private-key operation.  Done on the reactor thread, every attempt
stalled every connection of the node: a flood of wrong passwords took an
authenticated producer down to a twentieth of its rate.  Here they run on
worker threads instead (hashlib and OpenSSL let other threads run
meanwhile), and each result comes back to the reactor thread through
``call_soon_threadsafe``.

Bounded: at most ``limit`` pieces of work wait or run at once; ``submit``
refuses more (the caller answers the client "try again later").  The count
is kept on the reactor thread alone (``submit`` and the results both run
there), so it needs no lock.

The workers run at the reactor's scheduling priority.  A lower one (nice)
was tried: a worker preempted while it holds the GIL (around each OpenSSL
and hashlib call) then holds up the reactor thread too, and under a flood
of TLS handshakes an authenticated producer fell to a third of what it
kept with workers at normal priority.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from typing import Any, Callable, TypeVar

import structlog

log = structlog.get_logger("hastandby.login_pool")

T = TypeVar("T")

WORKERS = max(1, min(4, (os.cpu_count() or 2) // 2))  # the reactor keeps a core of its own
LIMIT = 256  # pieces of work waiting or running


class LoginPool:
    """Bounded worker threads; ``submit`` on the reactor thread, ``done`` called back on it."""

    def __init__(self, call_soon_threadsafe: Callable[[Callable[[], None]], None], workers: int = WORKERS,
                 limit: int = LIMIT) -> None:
        self._call_soon_threadsafe = call_soon_threadsafe
        self.workers = workers
        self.limit = limit  # 0: no limit
        self.waiting = 0  # submitted, result not yet delivered
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any], None]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def submit(self, work: Callable[[], T], done: Callable[[T], None]) -> bool:
        """Run ``work`` on a worker, then ``done(result)`` on the reactor thread; False if the pool is full.

        ``work`` must not raise: a bug there is logged, and ``done`` is not called.
        """
        if self.limit and self.waiting >= self.limit:
            return False
        if not self._threads:
            self._start()
        self.waiting += 1
        self._queue.put((work, done))
        return True

    def close(self) -> None:
        """Stop the workers once the work queued before is done (a node simply exits with them)."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(5.0)
        self._threads = []

    def _start(self) -> None:
        for number in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"login-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            work, done = item
            try:
                result = work()
            except Exception:  # a bug in the work must not kill the worker
                log.exception("login work failed")
                self._call_soon_threadsafe(self._lost)
                continue
            self._call_soon_threadsafe(functools.partial(self._deliver, done, result))

    def _lost(self) -> None:
        self.waiting -= 1

    def _deliver(self, done: Callable[[Any], None], result: Any) -> None:
        self.waiting -= 1
        done(result)
