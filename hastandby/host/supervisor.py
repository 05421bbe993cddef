"""``hastandby serve --supervise``: a parent that frees its node's etcd lease the moment the node dies.

Most crashes are process crashes on a live host.  Without a supervisor the
cluster learns of one only when the dead node's lease expires (the TTL,
2 s by default, plus etcd's rounding), and that wait is most of a failover.
The host itself knows at once: the supervisor runs the node as its child
(the same ``serve`` command without ``--supervise``) and hands it the write
end of a pipe (``SUPERVISOR_FD``); the node's coordinator writes there the id
of each lease etcd grants it.  When the child exits, for any reason, the
supervisor revokes the last lease it was told of: the node's member key and,
if it led, the leader key go with it, and a ready backup is elected at once.
Then it starts the node again, which rejoins as a backup (its journal gives
it back what it held), after a back-off that doubles while the node keeps
dying early.

Why this is safe: the lease is revoked only after the child has exited, so
no process that could still acknowledge a message holds it.  A frozen child
(SIGSTOP, a stalled VM) has not exited and is left alone; its lease expires
and the fence stops it, as without a supervisor.  A host crash takes both
processes: the lease then expires after its TTL, as before.

With ``--virtual-ip`` the supervisor also removes the address from this
host's interface as soon as the node has exited, before it revokes the
lease (``virtual_ip.py``): a dead broker process cannot, and the host is
alive.

SIGTERM, SIGINT and SIGHUP are passed to the node; after a stop it asked for
(or a node that exited 0: someone stopped it on purpose) the supervisor
exits with the node's code instead of starting it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Callable

import grpc
import structlog

from hastandby.election.etcd_client import EtcdClient, EtcdError, EtcdSettings
from hastandby.host.supervised import SUPERVISOR_FD, SUPERVISOR_PID

log = structlog.get_logger("hastandby.supervisor")

FIRST_DELAY = 0.5  # seconds before the first restart of a node that died
MAX_DELAY = 30.0  # the back-off doubles up to this while the node keeps dying early
STABLE_AFTER = 60.0  # a node that ran this long starts again after FIRST_DELAY
REVOKE_TIMEOUT = 2.0  # seconds a revocation may take, every etcd endpoint tried
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def parse_leases(lines: bytes) -> int | None:
    """The last lease id in what the node wrote (``lease <id>`` lines), or None."""
    last = None
    for line in lines.splitlines():
        word, _, value = line.partition(b" ")
        if word == b"lease" and value.strip().isdigit():
            last = int(value)
    return last


def next_delay(delay: float, ran_for: float) -> float:
    """The back-off before the next start, after a node that ran ``ran_for`` seconds and waited ``delay``."""
    if ran_for >= STABLE_AFTER:
        return FIRST_DELAY
    return min(MAX_DELAY, max(FIRST_DELAY, delay * 2))


class Supervisor:
    """Runs ``argv`` (a node) until asked to stop; revokes its lease each time it dies, then starts it again."""

    def __init__(self, argv: list[str], etcd: EtcdSettings | None,
                 revoke: Callable[[int], None] | None = None,
                 after_exit: Callable[[], object] | None = None) -> None:
        self.argv = argv
        self._revoke = revoke or (_etcd_revoker(etcd) if etcd is not None else None)
        # Undo on this host what the dead node held (its --virtual-ip), before its lease goes.
        self._after_exit = after_exit
        self._stopping = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        for signum in FORWARDED:
            signal.signal(signum, self._on_signal)
        delay = 0.0
        while True:
            started = time.monotonic()
            returncode, lease = self._run_child()
            if self._after_exit is not None:
                try:
                    self._after_exit()
                except Exception:  # the lease must be revoked whatever this does
                    log.exception("cleaning up after the node failed")
            if lease is not None and self._revoke is not None:
                self._revoke_lease(lease)
            if self._stopping.is_set() or returncode == 0:
                log.info("node stopped; supervisor exits", returncode=returncode)
                return returncode
            delay = next_delay(delay, time.monotonic() - started) if delay else FIRST_DELAY
            log.warning("node died; starting it again", returncode=returncode, lease=lease, delay=delay)
            if self._stopping.wait(delay):
                return returncode

    def _run_child(self) -> tuple[int, int | None]:
        """Start the node, read what it says of its leases until it exits; (its code, its last lease)."""
        read_end, write_end = os.pipe()
        try:
            self._child = subprocess.Popen(self.argv, pass_fds=(write_end,),
                                           env={**os.environ, SUPERVISOR_FD: str(write_end),
                                                SUPERVISOR_PID: str(os.getpid())})
        finally:
            os.close(write_end)
        log.info("node started", pid=self._child.pid)
        if self._stopping.is_set():  # a stop came while the node was being started: it gets one too
            self._child.send_signal(signal.SIGTERM)
        said = bytearray()
        with os.fdopen(read_end, "rb", buffering=0) as reader:
            while chunk := reader.read(4096):  # end of file: every copy of the write end is closed
                said += chunk
        returncode = self._child.wait()
        return returncode, parse_leases(bytes(said))

    def _revoke_lease(self, lease: int) -> None:
        assert self._revoke is not None
        try:
            self._revoke(lease)
        except EtcdError as error:
            if error.code is grpc.StatusCode.NOT_FOUND:  # a graceful stop revoked it, or it expired
                log.info("dead node's lease already gone", lease=lease)
            else:  # etcd unreachable: the lease expires after its TTL instead
                log.warning("cannot revoke the dead node's lease; it expires by itself", lease=lease,
                            error=str(error))
            return
        log.info("dead node's lease revoked", lease=lease)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stopping.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)


def _etcd_revoker(settings: EtcdSettings) -> Callable[[int], None]:
    def revoke(lease: int) -> None:
        client = EtcdClient(settings, REVOKE_TIMEOUT)
        try:
            client.revoke(lease)
        finally:
            client.close()
    return revoke
