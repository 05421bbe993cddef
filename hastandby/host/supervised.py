"""The node's side of ``serve --supervise`` (``supervisor.py`` is the parent's).

Kept apart from the supervisor so that a node, supervised or not, loads
neither gRPC nor etcd3 for these two calls: a restarted node is ready
sooner, and most nodes never talk to etcd at all.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

import structlog

log = structlog.get_logger("hastandby.supervisor")

SUPERVISOR_FD = "HASTANDBY_SUPERVISOR_FD"
SUPERVISOR_PID = "HASTANDBY_SUPERVISOR_PID"
PR_SET_PDEATHSIG = 1


def die_with_supervisor() -> None:
    """In the node, at start: if a supervisor started it, die with the supervisor (Linux ``PR_SET_PDEATHSIG``).

    A supervisor killed outright (SIGKILL, the OOM killer) would otherwise
    leave its node running unsupervised, and a later supervisor would start
    a second one on the same data dir.  Dying together is what a host crash
    does, and the node's lease then expires after its TTL.
    """
    if SUPERVISOR_FD not in os.environ:
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        log.warning("cannot tie the node's life to its supervisor's (no prctl)")
        return
    if os.getppid() != int(os.environ.get(SUPERVISOR_PID, "0")):  # the supervisor died before the call
        os._exit(1)


def lease_reporter() -> Callable[[int], None] | None:
    """In the node: what tells the supervisor each lease it takes, or None when no supervisor started it."""
    value = os.environ.pop(SUPERVISOR_FD, None)
    if value is None:
        return None
    fd = int(value)
    os.set_blocking(fd, False)

    def tell(lease_id: int) -> None:
        try:
            os.write(fd, b"lease %d\n" % lease_id)
        except OSError as error:  # a full pipe or a gone supervisor: the lease then expires by itself
            log.warning("cannot tell the supervisor the lease", lease=lease_id, error=str(error))
    return tell
