"""The local cluster's processes: started in the background, known by PID and start time, stopped together.

Why the start time: ``cluster.json`` outlives what it names (a reboot, a
kill), and a PID read back from it later may belong to another program by
then, which must never be signalled.  A process is ours while the kernel's
start time of that PID is the one recorded when we started it.

Why together: a stop asks every process at once (SIGTERM) and waits for all
of them against one deadline, then kills what is left by PID, with its
children (a supervised node's broker process).  One frozen or stuck node
then costs the grace period once, not once per node, and a node already dead
costs nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL = 0.05  # seconds between looks at processes we wait for


@dataclass(frozen=True)
class Started:
    """A process we started: its PID and the kernel's start time of it (None: not known, PID only)."""

    pid: int
    start_time: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Started":
        """From a record ``as_dict`` wrote (a record without a start time: the PID alone)."""
        return cls(int(record["pid"]), record.get("start_time"))


def spawn(argv: list[str], log: Path) -> Started:
    """Start ``argv`` in a session of its own (a Ctrl-C in the terminal is not its), output to ``log``."""
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    return Started(process.pid, _stat(process.pid)[1])


def _stat(pid: int) -> tuple[str, int | None]:
    """(state letter, start time) from ``/proc/PID/stat``; ("", None) if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", None
    fields = text[text.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return fields[0], int(fields[19])


def alive(process: Started) -> bool:
    """Running, and still the process we started (a zombie waiting for its parent is not running)."""
    state, start_time = _stat(process.pid)
    if not state or state == "Z":
        return False
    return process.start_time is None or start_time == process.start_time


def children(pid: int) -> list[int]:
    """The PIDs of ``pid``'s children, from every thread's ``/proc`` children list."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for thread in threads:
        try:
            found += [int(word) for word in Path(f"/proc/{pid}/task/{thread}/children").read_text().split()]
        except OSError:
            continue
    return found


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def stop_all(processes: Iterable[Started], grace: float) -> list[Started]:
    """SIGTERM every one still running at once, wait for them all until ``grace`` s have passed, then SIGKILL
    those left and their children; returns the ones that had to be killed."""
    running = [p for p in processes if alive(p)]
    for process in running:
        _kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in running):
        time.sleep(POLL)
    stragglers = [p for p in running if alive(p)]
    for process in stragglers:
        for child in children(process.pid):
            _kill(child, signal.SIGKILL)
        _kill(process.pid, signal.SIGKILL)
    return stragglers
