"""Bounded polling for tests: every wait has a deadline and says what it waited for."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy (returned); fail with the last value seen."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        seen = check()
        if seen:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{what}: not true after {timeout}s (last seen {seen!r})")
