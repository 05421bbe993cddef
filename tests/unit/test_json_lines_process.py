"""The harness's command-lines-in, JSON-lines-out child process: what it reports, and that it always ends."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from hastandby.testing.processes import JsonLinesProcess, python_env

ECHO = """
import json, sys
for line in sys.stdin:
    print(json.dumps({"got": line.strip()}), flush=True)
    print("not json", flush=True)
print(json.dumps({"bye": True}), flush=True)
"""


class Recorder(JsonLinesProcess):
    def __init__(self, script: str, log: Path) -> None:
        self.seen: list[dict[str, Any]] = []
        super().__init__([sys.executable, "-c", script], log, python_env(), "test-json-lines")

    def on_line(self, line: dict[str, Any]) -> None:
        self.seen.append(line)


def test_commands_go_in_and_json_objects_come_back_until_the_end_of_input(tmp_path):
    child = Recorder(ECHO, tmp_path / "echo.log")
    child.write_line("one")
    child.write_line("two")
    child.end_input()
    assert child.wait_or_kill(10) is True
    assert child.seen == [{"got": "one"}, {"got": "two"}, {"bye": True}]  # the line that is not JSON is left out
    assert not child.running


def test_a_child_that_does_not_end_is_killed_and_its_stderr_is_in_the_log(tmp_path):
    child = Recorder("import sys, time; print('stuck', file=sys.stderr, flush=True); time.sleep(60)",
                     tmp_path / "stuck.log")
    deadline = time.monotonic() + 10
    while "stuck" not in child.log_tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.log_tail() == "stuck"
    assert child.wait_or_kill(0.2) is False
    assert not child.running
