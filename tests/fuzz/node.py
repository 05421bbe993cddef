"""The node under fuzz: a real ``hastandby serve`` process, its JSON log, and what in it is a failure.

``FuzzNode`` starts a node with a users file of the run's own
(``hastandby/testing/auth.py``: ``admin``, ``peer`` in group ``cluster``, ``app``),
``--log-format json`` into a file, and authentication required (or
``--allow-anonymous`` when a kind asks for it); it is stopped by PID, and
restarted after a crash or a hang so that a long run goes on.

What counts in the log (``classify``), decided once for every kind:

- **failure** (an unhandled error):
  - a record with ``exception`` (a traceback) whose exception the node did
    not raise on purpose.  Every ``log.exception`` in ``hastandby/`` is a
    containment path (the driver's ``link endpoint failed`` / ``event handler
    failed`` / ``timer failed`` / ``scheduled call failed``, the server's
    ``link error`` / ``connection error``, ``management request failed``):
    an exception that got that far is one no code meant to raise for this
    input.  The one exception is a *clean refusal through the safety net*:
    the innermost frame of the traceback is a ``raise`` statement in
    ``hastandby/`` of ``ValueError`` or a ``BrokerError`` (the node's own
    validation, e.g. ``decode_batch`` on a cut batch), so the node meant to
    refuse the input and closed only that link.  Those are counted as
    ``contained`` refusals, listed, and not failures.  A ``TypeError``,
    ``KeyError``, ``AttributeError``, ``OverflowError``, an error from proton
    or the standard library, or a ``ValueError`` of a conversion such as
    ``int('x')``, is a failure.
  - level ``critical``, or ``replication halted`` (the node gave up its role);
  - any line that is not JSON (an uncaught traceback on stderr, a thread's
    exception): the node writes nothing else with ``--log-format json``.
    The exception is proton's C engine, which writes its own log lines to
    stderr (``[0x...]: AMQP:WARNING:Peer advertised bad max-frame ...``):
    those count by their level, as errors or refusals.
- **error**: other ``error`` records (e.g. a DR replica's ``replication link
  failed`` after its source sent a bad lineage, an older primary's term
  refused as an ``illegal transition``): the node refused something and
  said so; listed per kind as distinct errors, not failures.
- **refusal**: warnings and refusal notes (``connection not authenticated``,
  ``link refused``, ``management request refused``, ``denied`` ...); counted.

The process exiting is a crash, whatever the log says.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hastandby.testing.auth import ADMIN, Users
from hastandby.testing.processes import free_port

REPO = Path(__file__).resolve().parents[2]
REFUSAL_TYPES = {"ValueError", "CredentialsError", "BrokerError", "InvalidArgument", "NotFound", "NotAllowed", "AlreadyExists",
                 "ResourceLimitExceeded", "ResourceLocked", "MalformedMessage", "NotPromotable",
                 "StoreUnavailable", "SaslError", "ScramError", "PipeError"}
FAILURE_EVENTS = {"replication halted"}
REFUSAL_EVENTS = ("refused", "denied", "not authenticated", "resync", "failed", "error", "rejected", "diverged")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
# proton's C engine logs some of what peers do wrong to stderr itself, e.g.
# "[0x55...]: AMQP:WARNING:Peer advertised bad max-frame (37), forcing to 512"
_PROTON_LOG = re.compile(r"^\[0x[0-9a-f]+\]:\s*(\w+):(\w+):(.*)$")


@dataclass
class LogFinding:
    """One log record that matters, reduced to what tells it apart from the others."""

    verdict: str  # failure | contained | error | refusal
    signature: str  # event and exception (or reason) without the variable parts
    record: dict[str, Any] | str

    def excerpt(self, limit: int = 1500) -> str:
        text = self.record if isinstance(self.record, str) else json.dumps(self.record)
        return text if len(text) <= limit else text[:limit] + "..."


def _exception_origin(traceback: str) -> tuple[str, str, str, str]:
    """(exception type, its message, file|source line of the innermost frame, the innermost frame in
    hastandby/ as ``module.py:function``) of a rendered traceback."""
    lines = [line for line in traceback.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    kind, _, message = last.partition(":")
    kind = kind.strip().rsplit(".", 1)[-1]
    innermost_file, innermost_code, ours = "", "", ""
    for index, line in enumerate(lines):
        match = _FRAME.match(line)
        if match:
            innermost_file = match.group(1)
            following = lines[index + 1].strip() if index + 1 < len(lines) else ""
            innermost_code = "" if _FRAME.match(following) else following
            path = innermost_file.replace("\\", "/")
            if "/hastandby/" in path and "/site-packages/" not in path:
                ours = f"{path.rsplit('/hastandby/', 1)[1]}:{match.group(3)}"
    return kind, message.strip(), f"{innermost_file}|{innermost_code}", ours


def _variable_free(text: str) -> str:
    """A message with its numbers, quoted names and addresses blanked, to count distinct errors."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"0x[0-9a-f]+|\d+", "N", text)
    return text[:100]


def classify(line: str) -> LogFinding | None:
    """What one log line says, as far as the fuzzer is concerned (None: nothing to note)."""
    stripped = line.strip()
    if not stripped:
        return None
    try:
        record = json.loads(stripped)
    except ValueError:
        return LogFinding("failure", f"non-JSON output: {_variable_free(stripped)}", stripped)
    if not isinstance(record, dict):
        return LogFinding("failure", f"non-JSON output: {_variable_free(stripped)}", stripped)
    event = str(record.get("event", ""))
    level = str(record.get("level", ""))
    exception = record.get("exception")
    if exception:
        kind, message, origin, ours = _exception_origin(str(exception))
        file_part, _, code = origin.partition("|")
        path = file_part.replace("\\", "/")
        deliberate = (kind in REFUSAL_TYPES and code.startswith("raise ")
                      and "/hastandby/" in path and "/site-packages/" not in path)
        signature = f"{event}: {kind}: {_variable_free(message)} (in {ours or '?'})"
        return LogFinding("contained" if deliberate else "failure", signature, record)
    if level == "critical" or event in FAILURE_EVENTS:
        return LogFinding("failure", f"{event}: {_variable_free(str(record.get('reason', '')))}", record)
    if level == "error":
        detail = record.get("error") or record.get("reason") or ""
        return LogFinding("error", f"{event}: {_variable_free(str(detail))}", record)
    if level == "warning" or any(word in event for word in REFUSAL_EVENTS):
        detail = record.get("reason") or record.get("error") or record.get("condition") or ""
        return LogFinding("refusal", f"{event}: {_variable_free(str(detail))}", record)
    return None


class FuzzNode:
    """One ``hastandby serve`` process under fuzz; ``stop()`` always runs (SIGTERM, then SIGKILL, by PID)."""

    def __init__(self, directory: Path, users: Users, name: str, *extra: str, anonymous: bool = False,
                 port: int | None = None) -> None:
        self.directory = directory
        self.users = users
        self.name = name
        self.extra = list(extra)
        self.anonymous = anonymous
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.address = f"{self.host}:{self.port}"
        self.log_path = directory / f"{name}-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self._offset = 0
        self._partial = b""
        self.starts = 0

    def command(self) -> list[str]:
        security = ["--users-file", str(self.users.users_file),
                    "--allow-anonymous" if self.anonymous else "--no-allow-anonymous",
                    "--peer-user", "peer", "--peer-password-file", str(self.users.password_file("peer")),
                    # The fuzzer's wrong logins and its checks all come from 127.0.0.1: a throttled source
                    # would make every check wait (docs/limits.md), and read as a hang.
                    "--limit", "failed_logins_per_source=0"]
        return [sys.executable, "-m", "hastandby", "serve", "--listen", self.address, "--log-format", "json",
                *security, *self.extra]

    def start(self, timeout: float = 20.0) -> FuzzNode:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        from .checks import ping

        deadline = time.monotonic() + timeout
        error = ""
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.returncode()}: {self.tail()}")
            ok, error = ping(self, ADMIN, timeout=2.0)
            if ok:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} ({self.address}) not ready after {timeout:g} s ({error}): {self.tail()}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def stop(self, timeout: float = 10.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return proc.returncode

    def restart(self) -> None:
        self.stop(timeout=5.0)
        self.start()

    # -- the log -------------------------------------------------------------------

    def new_lines(self) -> list[str]:
        """Log lines written since the last call (whole lines only)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._offset)
                data = log.read()
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [line.decode(errors="replace") for line in lines]

    def findings(self) -> list[LogFinding]:
        """What the lines written since the last call say; a run of non-JSON lines (a traceback) is one."""
        found: list[LogFinding] = []
        block: list[str] = []
        lines = self.new_lines()
        for index, line in enumerate([*lines, None]):
            engine = _PROTON_LOG.match(line.strip()) if line is not None else None
            if engine is not None and not block:
                level = engine.group(2).upper()
                verdict = "error" if level in ("ERROR", "CRITICAL") else "refusal"
                found.append(LogFinding(verdict, f"proton {engine.group(1)} {level.lower()}: "
                                                 f"{_variable_free(engine.group(3))}", line))
                continue
            if line is not None and (line.strip() and not line.lstrip().startswith("{")
                                     or not line.strip() and block and index + 1 < len(lines)):
                block.append(line)  # a traceback's lines, blank ones between its parts included
                continue
            if block:
                text = "\n".join(block)
                last = next((b for b in reversed(block) if b.strip()), "")
                found.append(LogFinding("failure", f"non-JSON output: {_variable_free(last.strip())}", text))
                block = []
            finding = classify(line) if line is not None else None
            if finding is not None:
                found.append(finding)
        return found

    def tail(self, size: int = 3000) -> str:
        try:
            text = self.log_path.read_bytes()[-size:]
        except OSError:
            return ""
        return text.decode(errors="replace")


@dataclass
class NodeSet:
    """Every node a kind started, stopped together."""

    nodes: list[FuzzNode] = field(default_factory=list)

    def add(self, node: FuzzNode) -> FuzzNode:
        self.nodes.append(node)
        return node

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
