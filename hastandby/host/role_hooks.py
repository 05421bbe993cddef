"""Role-change hooks: an operator's command run, in order and bounded in time, each time the node's role changes.

Why a hook (``serve --on-role-change COMMAND``, Patroni's ``on_role_change``):
how clients find the primary differs from site to site (a cloud provider's
floating IP, a DNS record, a load balancer's pool, a virtual IP on a LAN),
and the node cannot know them all.  It tells a command instead, which runs
as ``COMMAND ROLE CLUSTER TERM`` with ``HASTANDBY_ROLE``,
``HASTANDBY_CLUSTER``, ``HASTANDBY_TERM``, ``HASTANDBY_NODE_ID`` and
``HASTANDBY_PREVIOUS_ROLE`` in its environment.  The built-in virtual IP
(``virtual_ip.py``) is one such action, done by the node itself.

The roles (``role_name``): ``connecting``, ``catchup``, ``backup``,
``primary-recovering`` (elected; clients are admitted already, messages are
still guarded for the expected backups), ``primary-active``, ``halted`` (an
illegal transition stopped replication and client service) and ``stopped``
(a graceful stop, the last call).  A hook that moves an address takes it for
``primary-*`` and gives it up for anything else.  The first call, when the
node starts, says ``connecting``: a node restarted after a crash as primary
gives up what it may still hold.  A killed node (``kill -9``, a host crash)
runs nothing: the next primary's hook must take the address over.

Why these rules:

- **Never on the reactor thread.**  The reactor serves every client; a hook
  may take seconds.  The node only queues the change (``RoleCommand.role_changed``,
  which never blocks) and one worker thread (``OrderedWorker``) runs it.
- **In order, every one.**  One worker runs the calls one after the other,
  so a hook never sees ``connecting`` overtake the ``primary-active`` that
  came before it; no call is dropped, so each hook sees every role in turn
  (they must be idempotent anyway, as Patroni's are).
- **Bounded.**  Each call has a timeout; past it the hook's whole process
  group is killed (a shell script's children too), the timeout is logged and
  the next call runs.  A failing hook (exit status not 0, or not startable)
  is logged with the end of its output; the node's role does not depend on
  it.
- **Finished before the node exits.**  After a graceful stop the node waits
  (bounded) for the queued calls, ``stopped`` included (``close``).

This module holds no I/O of the state table (``states.py`` stays pure): it
is told role names by ``HaNode`` (``HaNode.on_role_change``).
"""

from __future__ import annotations

import os
import queue
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from hastandby.lifecycle.states import NodeStatus, State

log = structlog.get_logger("hastandby.role_hooks")

DEFAULT_TIMEOUT = 10.0  # seconds one call of --on-role-change may take before it is killed
OUTPUT_KEPT = 2000  # characters of a command's output kept for the log
_POLL = 0.02  # seconds between checks of a running command (timeout, cancel)
HALTED = "halted"


def role_name(status: NodeStatus) -> str:
    """The role a hook is told: the state, with the primary's detail (``primary-recovering``, ``primary-active``)."""
    if status.state is State.PRIMARY and status.detail is not None:
        return f"{status.state}-{status.detail}"
    return str(status.state)


def is_primary_role(role: str) -> bool:
    """Whether ``role`` is one in which the node admits clients (``primary-recovering`` or ``primary-active``)."""
    return role.startswith(f"{State.PRIMARY}-")


@dataclass(frozen=True)
class RoleChange:
    """One call of the hook: the new role, the cluster, the term, the node, and the role before."""

    role: str
    cluster: str
    term: int
    node_id: str
    previous: str = ""

    def arguments(self) -> list[str]:
        """``ROLE CLUSTER TERM``, appended to the command."""
        return [self.role, self.cluster, str(self.term)]

    def environment(self) -> dict[str, str]:
        """The ``HASTANDBY_*`` variables added to the node's environment."""
        return {"HASTANDBY_ROLE": self.role, "HASTANDBY_CLUSTER": self.cluster, "HASTANDBY_TERM": str(self.term),
                "HASTANDBY_NODE_ID": self.node_id, "HASTANDBY_PREVIOUS_ROLE": self.previous}


@dataclass(frozen=True)
class CommandResult:
    """How a bounded command ended: ``returncode`` None if it could not start or was killed."""

    returncode: int | None
    seconds: float
    output: str
    timed_out: bool = False
    cancelled: bool = False
    start_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_bounded(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
                cancel: threading.Event | None = None) -> CommandResult:
    """Run ``argv`` to its end, ``timeout`` seconds at most, or until ``cancel`` is set; never raises.

    The command runs in a session (process group) of its own, and past its
    time, or when cancelled, the whole group is killed, so a shell script's
    children go too.  Its output goes to an unlinked temporary file rather
    than a pipe: a child that outlives it (``sleep &``) cannot make the
    caller wait for the pipe's end.  Call it from a worker thread only.
    """
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        try:
            process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       env=dict(env) if env is not None else None, start_new_session=True)
        except OSError as error:
            return CommandResult(None, time.monotonic() - started, "", start_error=str(error))
        deadline = started + timeout
        timed_out = cancelled = False
        while True:
            try:
                process.wait(_POLL)
                break
            except subprocess.TimeoutExpired:
                pass
            if cancel is not None and cancel.is_set():
                cancelled = True
            elif time.monotonic() >= deadline:
                timed_out = True
            else:
                continue
            _kill_group(process)
            break
        out.seek(0)
        output = out.read().decode(errors="replace")[-OUTPUT_KEPT:]
    returncode = None if (timed_out or cancelled) else process.returncode
    return CommandResult(returncode, time.monotonic() - started, output.strip(), timed_out, cancelled)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:  # unkillable (stuck in the kernel): leave it, the caller goes on
        log.error("command did not die after SIGKILL", pid=process.pid)


class OrderedWorker:
    """One thread that runs the jobs given to it one after the other, in the order given.

    ``submit`` never blocks, so it is safe on the reactor thread.  A job that
    raises is logged and the next one runs.  ``close`` waits, at most
    ``timeout`` seconds, for the jobs already given; the thread is a daemon,
    so a job still running then does not keep the process alive.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], object]) -> None:
        if self._closed:
            log.warning("worker closed; job dropped", worker=self.name)
            return
        self._jobs.put(job)

    def close(self, timeout: float) -> bool:
        """No more jobs; wait for those given (bounded). True if they all ran."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("worker still busy at close; leaving it", worker=self.name, waited=timeout)
            return False
        return True

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # one bad job must not stop the ones after it
                log.exception("worker job failed", worker=self.name)


class RoleCommandError(ValueError):
    """The ``--on-role-change`` command cannot be run (empty, not found, not executable)."""


def parse_command(command: str) -> list[str]:
    """``COMMAND`` split as a shell would split words (no shell runs it); checked that it can be run."""
    try:
        argv = shlex.split(command)
    except ValueError as error:
        raise RoleCommandError(f"cannot split {command!r}: {error}") from None
    if not argv:
        raise RoleCommandError("the command is empty")
    program = argv[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise RoleCommandError(f"{program} is not an executable file")
    elif shutil.which(program) is None:
        raise RoleCommandError(f"{program} is not on PATH")
    return argv


class RoleCommand:
    """``--on-role-change COMMAND``: ``COMMAND ROLE CLUSTER TERM`` on every role change, in order, bounded.

    ``role_changed`` (an observer of ``HaNode.on_role_change``) is called on
    the reactor thread and only queues the call; the command runs on this
    object's own worker thread.  Calls are never merged or dropped.
    """

    def __init__(self, command: str | Sequence[str], cluster: str, node_id: str,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.argv = parse_command(command) if isinstance(command, str) else list(command)
        self.cluster = cluster
        self.node_id = node_id
        self.timeout = timeout
        self._previous = ""
        self._worker = OrderedWorker("hastandby-role-hook")

    def role_changed(self, role: str, term: int) -> None:
        """The node's role is now ``role`` (reactor thread): queue one call."""
        change = RoleChange(role, self.cluster, term, self.node_id, self._previous)
        self._previous = role
        self._worker.submit(lambda: self.run(change))

    def run(self, change: RoleChange) -> CommandResult:
        """Run the command for ``change`` now, on this thread (the worker's), and log how it ended."""
        argv = [*self.argv, *change.arguments()]
        result = run_bounded(argv, self.timeout, {**os.environ, **change.environment()})
        fields = {"role": change.role, "term": change.term, "command": shlex.join(argv),
                  "seconds": round(result.seconds, 3)}
        if result.start_error is not None:
            log.error("role-change hook could not start", error=result.start_error, **fields)
        elif result.timed_out:
            log.error("role-change hook timed out; killed", timeout=self.timeout, output=result.output, **fields)
        elif not result.ok:
            log.error("role-change hook failed", returncode=result.returncode, output=result.output, **fields)
        else:
            log.info("role-change hook ran", **fields)
        return result

    def close(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) for the calls queued, the last role included."""
        return self._worker.close(timeout)
