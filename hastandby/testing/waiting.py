"""Bounded polling: every wait has a deadline.

``wait_for`` (tests) fails with what it waited for and the last value seen;
``wait_until`` (benchmarks, harnesses) says whether the condition came true.
"""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition", interval: float = 0.05) -> Any:
    """Poll ``check`` every ``interval`` s until it returns something truthy (returned); fail with the last value seen."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        seen = check()
        if seen:
            return seen
        time.sleep(interval)
    raise AssertionError(f"{what}: not true after {timeout}s (last seen {seen!r})")


def wait_until(predicate: Callable[[], object], timeout: float, step: float = 0.05,
               tick: Callable[[], None] | None = None) -> bool:
    """Poll ``predicate`` every ``step`` s until it is true (True) or ``timeout`` has passed (False).

    ``tick`` runs before every poll (a harness pumping its children's output).
    The predicate is asked once more at the deadline, so a slow poll cannot
    miss a condition that became true meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        if tick is not None:
            tick()
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
