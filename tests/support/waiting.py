"""Bounded polling for tests: every wait has a deadline and says what it waited for."""

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
