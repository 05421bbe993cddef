"""What the benchmarks share: management requests to a node on loopback, waits on its answers, and their figures
and report files.

Each was written once in one benchmark and imported by the others under its private name
(``benchmarks.ha_throughput._request``); it lives here once, under a public name, re-exported by
``hastandby.testing``.
"""

from __future__ import annotations

import json
import signal
import statistics
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from hastandby.client import Login, ManagementClient, ManagementError
from hastandby.testing import auth
from hastandby.testing.processes import LOOPBACK, Service

#: Seconds a started node has to answer, or to reach a state.
READY_TIMEOUT = 60.0


def request(port: int, operation: str, type: str = "", name: str = "", body: dict | None = None,
            login: Login | None = None) -> Any:
    """A management request to the node on loopback ``port``, as ``admin`` (``login``: another, e.g. an
    anonymous ``Login()`` for a baseline tree without authentication)."""
    with ManagementClient(f"{LOOPBACK}:{port}", timeout=10, login=login or auth.users().login()) as client:
        return client.request(operation, type, name, body)


def wait_answering(service: Service, port: int, login: Login | None = None, timeout: float = READY_TIMEOUT) -> None:
    """Until the node answers a management PING (cluster nodes refuse plain clients until primary); fails at
    once if ``service`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.running():
            raise RuntimeError(f"{service.name} exited: {service.log_tail()}")
        try:
            request(port, "PING", login=login)
            return
        except ManagementError:
            time.sleep(0.1)
    raise TimeoutError(f"{service.name} not answering on port {port}")


def wait_state(port: int, state: str, timeout: float = READY_TIMEOUT, login: Login | None = None) -> float:
    """Until the node's STATUS says ``state``; return the seconds that took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if request(port, "STATUS", login=login)["state"] == state:
                return time.monotonic() - started
        except ManagementError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"node on port {port} not {state} after {timeout:.0f} s")


def interrupt_on_sigterm() -> Callable[[], None]:
    """SIGTERM (e.g. from ``timeout``) as Ctrl-C, so that ``finally`` blocks stop our processes; returns the undo
    (off the main thread, where no handler can be set, nothing is done)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def _interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _interrupt)

    def undo() -> None:
        signal.signal(signal.SIGTERM, previous)

    return undo


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(mine: float | None, reference: float | None) -> float | None:
    """``mine / reference``; None without both (or with a zero reference)."""
    return mine / reference if mine is not None and reference else None


def fmt(value: float | None, spec: str) -> str:
    """``value`` in ``format`` ``spec``; "-" for None."""
    return "-" if value is None else format(value, spec)


def output_tail(text: str | bytes | None, lines: int = 5) -> str:
    """A process's last ``lines`` of output on one line (``" | "`` between them), for an error message."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return " | ".join((text or "").strip().splitlines()[-lines:]) or "(no output)"


def write_report(out: Path, name: str, started: datetime, report: dict[str, Any]) -> Path:
    """``report`` as JSON in ``out/<name>-<started, UTC>.json``; return the path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
