"""Blocking calls (etcd, a peer's management port) off the reactor thread, their results back on it.

The reactor thread serves every client; a call that may wait seconds (etcd
with a 2 s timeout, a management request to another node) must never run
there.  ``BlockingCalls.run(fn, done)`` runs ``fn`` on one worker thread and
calls ``done(result, error)`` back on the reactor (``call_soon_threadsafe``).
One worker keeps the calls in order, which the callers rely on (a save
before a later remove of the same configuration).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

Done = Callable[[Any, "Exception | None"], None]


class BlockingCalls:
    def __init__(self, call_soon_threadsafe: Callable[[Callable[[], None]], None]) -> None:
        self._call_soon_threadsafe = call_soon_threadsafe
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hastandby-blocking")

    def run(self, fn: Callable[[], Any], done: Done) -> None:
        def work() -> None:
            try:
                result, error = fn(), None
            except Exception as failure:  # handed to ``done``, which decides what it means
                result, error = None, failure
            self._call_soon_threadsafe(lambda: done(result, error))

        self._executor.submit(work)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
