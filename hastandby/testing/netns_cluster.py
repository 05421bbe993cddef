"""A cluster in network namespaces: a real etcd and ``hastandby serve`` nodes, each in a namespace of its own.

The nemesis suite (``tests/nemesis``) runs its schedules on it, and the
client-cut benchmark (``benchmarks/client_cut.py``) its cuts.  Both act on it
only from outside, as an operator or a failing
machine would: signals to a node's PID (kill -9, SIGSTOP/SIGCONT, SIGTERM),
starting a node again, ``hastandby promote``, partitions of the network
(``hastandby/testing/netns.py``), and a node's disk: bytes of a stopped node's
journal flipped (bit rot), or its file system failed by the kernel and
repaired (``NodeDisks``).  What it knows of the nodes' roles it learns as an
operator does, from ``STATUS`` (what ``hastandby status`` prints), polled by
one thread per node (``status_poller.StatusPoller``), and from etcd's keys
(the sync set, the member keys).  Nodes require
authentication as in production (``hastandby/testing/auth.py``): backups as
``peer``, the harness as ``admin``, the clients as ``app``.

Every process started here is stopped by PID in :meth:`Cluster.stop`
(SIGCONT first for a frozen one, then SIGTERM, SIGKILL after a grace
period), which its user calls in a ``finally``; then the disks are
unmounted and their loop devices detached (also at exit, as a last resort).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hastandby.client import Login, ManagementClient, ManagementError
from hastandby.election.cluster import ClusterKeys, Member, decode_member, decode_sync

from hastandby import settings
from hastandby.testing import auth as _auth
from hastandby.testing.disks import Ext4Loop, flip
from hastandby.testing.etcd import EtcdServer
from hastandby.testing.netns import Host, Network
from hastandby.testing.paths import repo
from hastandby.testing.processes import Service, python_env
from hastandby.testing.status_poller import StatusPoller

NODE_PORT = 5672  # every node has a namespace, hence an address, of its own
VIRTUAL_IP_HOST = 100  # a virtual IP is 10.78.N.100 (hosts are .10 and up)
LEASE_TTL = settings.LEASE_TTL.default
QUEUE = "nemesis"
START_TIMEOUT = 40.0  # etcd up, one primary, every other node its backup
STOP_GRACE = 5.0
PROMOTE_TIMEOUT = 25.0  # `hastandby promote` waits up to 15 s itself
POLL = 0.05
DISK_MEGABYTES = 96  # each node's ext4 file system when the nodes have disks of their own (NodeDisks)
ROT_BYTES = 3  # bytes a `rot` inverts
ROT_POSITIONS = ("middle", "tail", "header", "checkpoint")
JOURNAL = "journal"  # in the data dir (hastandby/broker/store/journal.py)
CHECKPOINT = "journal.synced"  # hastandby/broker/store/journal_files.py
QUARANTINED = "journal.quarantined-"


class ClusterError(RuntimeError):
    """The cluster could not be brought to the state asked for; the message says what was seen."""


class NodeExited(ClusterError):
    """A node's process ended without the nemesis asking: a crash of the product."""


class NamespacedEtcd(EtcdServer):
    """``hastandby.testing.etcd.EtcdServer`` run inside a namespace, listening on its bridge address."""

    def __init__(self, host: Host) -> None:
        super().__init__(host=host.address)  # its URLs, client and peer, on the bridge address
        self.namespace = host

    def _command(self) -> list[str]:
        return self.namespace.command(*super()._command())


@dataclass
class Node:
    """One broker node: its namespace, the process now running (if any), and what the nemesis did to it."""

    node_id: str
    host: Host
    argv: list[str]
    log_path: Path
    poller: StatusPoller
    service: Service | None = None
    frozen: bool = False  # SIGSTOPped and not yet resumed
    down: bool = False  # killed or terminated and not yet started again
    rejoining: bool = False  # started again and not yet seen as a backup
    disk_failed: bool = False  # its file system failed (read-only) and not yet repaired

    @property
    def address(self) -> str:
        return f"{self.host.address}:{NODE_PORT}"

    @property
    def url(self) -> str:
        return f"amqp://{self.address}"

    @property
    def status(self) -> dict[str, Any] | None:
        """The latest STATUS reply (None: no answer: down, frozen or starting)."""
        return self.poller.latest

    @property
    def state(self) -> str | None:
        return self.poller.state()

    @property
    def running(self) -> bool:
        return self.service is not None and self.service.running()

    @property
    def pid(self) -> int | None:
        return self.service.pid if self.service is not None else None

    def start(self) -> None:
        self.service = Service(self.node_id, self.argv, self.log_path, cwd=repo(), env=python_env())
        self.down = False

    def signal(self, signum: int) -> None:
        if self.running:
            assert self.service is not None
            os.kill(self.service.pid, signum)

    def stop(self) -> None:
        """SIGCONT (a stopped process cannot act on SIGTERM), SIGTERM, SIGKILL after the grace period."""
        if self.service is None:
            return
        if self.service.running():
            try:
                os.kill(self.service.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.service.stop(timeout=STOP_GRACE)
        self.frozen = False


def _mount(*argv: str) -> None:
    done = subprocess.run(["mount", *argv], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise ClusterError(f"mount {' '.join(argv)}: {done.stderr.strip()}")


_open_disks: set["NodeDisks"] = set()


class NodeDisks:
    """Each node's ``--data-dir`` on a small ext4 file system of its own (``disks.Ext4Loop``: a loop device),
    so that one node's disk can fail (the kernel turns it read-only) and be repaired (umount, e2fsck, mount).

    The loops are mounted under ``root``, a bind mount of itself made *shared*.  The root mount namespace
    here is private, and every process ``ip netns exec`` starts gets a copy of the mount table (made a slave
    of ours): without propagation every node's namespace would hold a copy of every other node's file
    system, umount here would not release it, and e2fsck would find the device in use.  Under a shared mount
    our mounts and umounts reach every namespace.  ``close()`` (from ``Cluster.stop``, and at exit as a last
    resort) unmounts and detaches everything, whatever state it is in.
    """

    def __init__(self, root: Path, node_ids: list[str], megabytes: int) -> None:
        self.root = root
        self.node_ids = node_ids
        self.megabytes = megabytes
        self.loops: dict[str, Ext4Loop] = {}
        self.images: list[str] = []  # every loop's backing file (deleted at close): what a test checks is gone
        self._bound = False

    def open(self) -> None:
        _open_disks.add(self)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            _mount("--bind", str(self.root), str(self.root))
            self._bound = True
            _mount("--make-private", str(self.root))
            _mount("--make-shared", str(self.root))
            for node_id in self.node_ids:
                loop = Ext4Loop(self.root / node_id, self.megabytes)
                loop.__enter__()
                self.loops[node_id] = loop
                self.images.append(str(loop.image))
                self.data_dir(node_id).mkdir(exist_ok=True)
            os.sync()  # the data dirs on disk before any failure
        except BaseException:
            self.close()
            raise

    def data_dir(self, node_id: str) -> Path:
        return self.root / node_id / "data"

    def device(self, node_id: str) -> str | None:
        return self.loops[node_id].device

    def fail(self, node_id: str) -> None:
        """The kernel fails the file system (``trigger_fs_error``): read-only at once; waits until it shows."""
        loop = self.loops[node_id]
        loop.fail()
        deadline = time.monotonic() + 5.0
        while not loop.read_only:
            if time.monotonic() >= deadline:
                raise ClusterError(f"{node_id}'s file system ({loop.device}) did not turn read-only")
            time.sleep(0.05)

    def read_only(self, node_id: str) -> bool:
        return self.loops[node_id].read_only

    def repair(self, node_id: str) -> None:
        """Unmount (nothing may use it: the node is dead), e2fsck, mount writable again."""
        loop = self.loops[node_id]
        loop.repair()
        self.data_dir(node_id).mkdir(exist_ok=True)  # (e2fsck keeps it; a data dir lost to the error comes back)

    def keep(self, target: Callable[[str], Path]) -> None:
        """Copy each node's data dir off its disk (to ``target(node_id)``), for the logs of a failed schedule."""
        for node_id, loop in self.loops.items():
            if loop.mounted and self.data_dir(node_id).is_dir():
                shutil.copytree(self.data_dir(node_id), target(node_id), dirs_exist_ok=True,
                                ignore_dangling_symlinks=True)

    def close(self) -> None:
        """Unmount every loop (lazily: a process left in a namespace does not block it), detach it, delete its
        image, then the shared bind mount; safe to call twice."""
        for loop in self.loops.values():
            try:
                loop.close()
            except Exception:  # noqa: BLE001 - the others still go
                pass
        if self._bound:
            done = subprocess.run(["umount", str(self.root)], capture_output=True, timeout=30, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(self.root)], capture_output=True, timeout=30, check=False)
            self._bound = False
        _open_disks.discard(self)


@atexit.register
def _close_leftover_disks() -> None:
    """Last resort if a run ends without its ``finally``."""
    for disks in list(_open_disks):
        disks.close()


class Cluster:
    """etcd and the nodes of one schedule, on a network of their own; ``stop()`` always runs."""

    def __init__(self, network: Network, node_ids: list[str], workdir: Path, cluster_name: str,
                 serve_options: tuple[str, ...] = (), virtual_ip: bool = False,
                 queue_arguments: dict[str, Any] | None = None, disks: bool = False) -> None:
        """``serve_options``: more ``hastandby serve`` arguments for every node (e.g. ``--heartbeat 1``);
        ``virtual_ip``: the primary holds an address of the network no host has (``serve --virtual-ip``), for
        clients that know only it; ``queue_arguments``: more arguments of the queue (e.g. ``x-dedup-window``);
        ``disks``: every node's data dir on an ext4 file system of its own (``NodeDisks``), which
        ``fail_disk`` and ``repair_disk`` act on."""
        self.network = network
        self.queue_arguments = dict(queue_arguments or {})
        self.serve_options = serve_options
        self.virtual_ip = network.address(VIRTUAL_IP_HOST) if virtual_ip else None
        self.workdir = workdir
        self.cluster_name = cluster_name
        self.etcd = NamespacedEtcd(network["etcd"])
        self.users = _auth.users()
        self.admin: Login = self.users.login(_auth.ADMIN)  # the harness's management login
        self.nodes: dict[str, Node] = {}
        brokers = ",".join(f"{network[n].address}:{NODE_PORT}" for n in node_ids)
        self._node_ids = node_ids
        self._brokers = brokers
        self.disks = NodeDisks(workdir / "disks", node_ids, DISK_MEGABYTES) if disks else None

    def data_dir(self, node_id: str) -> Path:
        """The node's ``--data-dir``: its durable wiring and its journal of durable messages (on its own disk
        if the nodes have disks; copied to ``<workdir>/<node>-data`` when they are unmounted)."""
        if self.disks is not None:
            return self.disks.data_dir(node_id)
        return self.workdir / f"{node_id}-data"

    # -- bringing it up and down ---------------------------------------------------------------------

    def start(self) -> None:
        """etcd, then the nodes; returns once one is primary and the others follow it, with the queue made.

        The queue is durable and every node has a ``--data-dir``: the workload's
        messages (durable) are in each node's journal before they are
        acknowledged, so they outlive a kill -9 of every node (``kill9-all``).
        """
        if self.disks is not None:
            self.disks.open()
        etcd_url = self.etcd.start()
        for node_id in self._node_ids:
            host = self.network[node_id]
            address = f"{host.address}:{NODE_PORT}"
            listen = ["--listen", address]
            if self.virtual_ip is not None:  # every address: the virtual IP's too, while it holds it
                listen = ["--listen", f"0.0.0.0:{NODE_PORT}", "--public-url", address,
                          "--virtual-ip", f"{self.virtual_ip}/24", "--virtual-ip-interface", host.device]
            argv = host.command(
                sys.executable, "-m", "hastandby", "serve", *listen,
                "--etcd", etcd_url, "--cluster", self.cluster_name, "--node-id", node_id,
                "--lease-ttl", str(LEASE_TTL), "--brokers-url", self._brokers, "--log-format", "json",
                "--data-dir", str(self.data_dir(node_id)), *self.users.serve_arguments(), *self.serve_options)
            node = Node(node_id, host, argv, self.workdir / f"{node_id}.log",
                        StatusPoller(node_id, address, self.admin))
            self.nodes[node_id] = node
            node.start()
            node.poller.start()
        primary = self.wait(self.settled, START_TIMEOUT, "one primary and every other node its backup")
        queues_before = {n.node_id: int((n.status or {}).get("queues") or 0) for n in self.nodes.values()}
        with ManagementClient(self.nodes[primary].address, timeout=10, login=self.admin) as client:
            client.request("CREATE", "queue", QUEUE, {"arguments": {"qpid.replicate": "all", **self.queue_arguments},
                                                      "durable": True})
        self.wait(lambda: all(int((n.status or {}).get("queues") or 0) > queues_before[n.node_id]
                              for n in self.nodes.values()), 15.0, f"queue {QUEUE!r} on every node")

    def stop(self) -> None:
        """Stop every node (backups first: no needless elections) and etcd, by PID; then unmount the disks
        (their data dirs copied to ``<workdir>/<node>-data`` first, for the logs)."""
        try:
            primaries = {n.node_id for n in self.nodes.values() if n.state == "primary"}
            for node in self.nodes.values():
                node.poller.stop()
            for node in sorted(self.nodes.values(), key=lambda n: n.node_id in primaries):
                node.stop()
            self.etcd.stop()
        finally:
            if self.disks is not None:
                try:
                    self.disks.keep(lambda node_id: self.workdir / f"{node_id}-data")
                except Exception:  # noqa: BLE001 - a copy for the logs must not keep the disks mounted
                    pass
                finally:
                    self.disks.close()

    def keep_etcd_log(self, target: Path) -> None:
        """Copy etcd's log (its directory goes when it stops)."""
        path = self.etcd.log_path
        if path is not None and path.exists():
            target.write_bytes(path.read_bytes())

    # -- what the operator sees -----------------------------------------------------------------------

    @property
    def virtual_ip_url(self) -> str | None:
        return f"amqp://{self.virtual_ip}:{NODE_PORT}" if self.virtual_ip is not None else None

    def virtual_ip_holders(self) -> list[str]:
        """The nodes whose interface carries the virtual IP now (none without one)."""
        if self.virtual_ip is None:
            return []
        return [name for name in self.network.holders(self.virtual_ip) if name in self.nodes]

    def states(self) -> dict[str, str | None]:
        return {node_id: node.state for node_id, node in self.nodes.items()}

    def describe(self) -> str:
        """States and what the nemesis did, for error messages."""
        parts = []
        for node in self.nodes.values():
            marks = [m for m, on in (("frozen", node.frozen), ("down", node.down), ("rejoining", node.rejoining),
                                     ("disk-failed", node.disk_failed)) if on]
            parts.append(f"{node.node_id}={node.state}" + (f"({','.join(marks)})" if marks else ""))
        return " ".join(parts)

    def primary(self, exclude: tuple[str, ...] = ()) -> str | None:
        """The one node that answers as primary and is neither frozen nor down, if there is exactly one."""
        found = [n.node_id for n in self.nodes.values()
                 if n.state == "primary" and not n.frozen and not n.down and n.node_id not in exclude]
        return found[0] if len(found) == 1 else None

    def backups(self) -> list[str]:
        """Nodes that answer as caught-up backups (``backup``) of the current primary."""
        primary = self.primary()
        if primary is None:
            return []
        address = self.nodes[primary].address
        return [n.node_id for n in self.nodes.values()
                if n.state == "backup" and (n.status or {}).get("primary") == address]

    def settled(self) -> str | None:
        """The primary's id if every node not frozen or down is its backup (and none is rejoining)."""
        primary = self.primary()
        if primary is None:
            return None
        self._note_rejoined()
        live = [n for n in self.nodes.values()
                if not n.frozen and not n.down and not n.disk_failed and n.node_id != primary]
        following = set(self.backups())
        return primary if all(n.node_id in following for n in live) else None

    def _note_rejoined(self) -> None:
        """A restarted node has rejoined once it is a backup, or primary (after a whole-cluster restart)."""
        for node in self.nodes.values():
            if node.rejoining and node.state in ("backup", "primary"):
                node.rejoining = False

    def faulted(self) -> list[str]:
        """Nodes down, rejoining (not yet backup), frozen, or with a failed disk now."""
        self._note_rejoined()
        return [n.node_id for n in self.nodes.values() if n.down or n.rejoining or n.frozen or n.disk_failed]

    def down_or_rejoining(self) -> list[str]:
        """Nodes down or rejoining, and those whose disk failed (they left their primary: as good as down)."""
        self._note_rejoined()
        return [n.node_id for n in self.nodes.values() if n.down or n.rejoining or n.disk_failed]

    def wait(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll ``check`` until truthy (returned); ClusterError after ``timeout`` or if a node died unasked."""
        deadline = time.monotonic() + timeout
        while True:
            for node in self.nodes.values():
                if not node.down and node.service is not None and not node.service.running():
                    node.down = True
                    raise NodeExited(f"{node.node_id} exited by itself with {node.service.popen.returncode}: "
                                     f"{node.service.log_tail()}")
            seen = check()
            if seen:
                return seen
            if time.monotonic() >= deadline:
                raise ClusterError(f"{what}: not within {timeout:g} s ({self.describe()})")
            time.sleep(POLL)

    # -- what the nemesis does -------------------------------------------------------------------------

    def kill(self, node_id: str) -> int | None:
        node = self.nodes[node_id]
        pid = node.pid
        node.signal(signal.SIGKILL)
        if node.service is not None:
            node.service.popen.wait(STOP_GRACE)
        node.down, node.frozen, node.rejoining = True, False, False
        return pid

    def kill_all(self) -> dict[str, int | None]:
        """SIGKILL every node that runs (frozen ones too), all before waiting for any; {node: pid} of those."""
        victims = {n: node for n, node in self.nodes.items() if node.running}
        for node in victims.values():
            node.signal(signal.SIGKILL)
        pids = {}
        for node_id, node in victims.items():
            pids[node_id] = node.pid
            if node.service is not None:
                node.service.popen.wait(STOP_GRACE)
            node.down, node.frozen, node.rejoining = True, False, False
        return pids

    def terminate(self, node_id: str) -> tuple[int | None, int | None]:
        """SIGTERM and wait for the exit (a graceful stop); SIGKILL after the grace period. (pid, exit code)"""
        node = self.nodes[node_id]
        pid = node.pid
        node.signal(signal.SIGTERM)
        code = node.service.stop(timeout=STOP_GRACE) if node.service is not None else None
        node.down, node.frozen, node.rejoining = True, False, False
        return pid, code

    def freeze(self, node_id: str) -> int | None:
        node = self.nodes[node_id]
        node.signal(signal.SIGSTOP)
        node.frozen = True
        return node.pid

    def thaw(self, node_id: str) -> int | None:
        node = self.nodes[node_id]
        node.signal(signal.SIGCONT)
        node.frozen = False
        return node.pid

    def restart(self, node_id: str) -> int | None:
        node = self.nodes[node_id]
        if node.running:
            raise ClusterError(f"{node_id} is still running")
        node.start()
        node.rejoining = True
        return node.pid

    def promote(self, node_id: str, force: bool = False) -> tuple[int, str]:
        """``hastandby promote -b NODE`` (``--force`` if ``force``) as an operator runs it: (exit code, what it
        printed)."""
        command = [sys.executable, "-m", "hastandby", "promote", *(["--force"] if force else []),
                   "-b", self.nodes[node_id].address]
        try:
            env = {**python_env(), **self.users.client_environment(_auth.ADMIN)}
            done = subprocess.run(command, cwd=repo(), env=env, capture_output=True, text=True,
                                  timeout=PROMOTE_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return -1, f"no answer within {PROMOTE_TIMEOUT:g} s"
        return done.returncode, (done.stdout + done.stderr).strip()

    # -- disks ------------------------------------------------------------------------------------------

    def fail_disk(self, node_id: str) -> str | None:
        """The node's file system fails (read-only at once, every write ``EROFS``); returns its device."""
        if self.disks is None:
            raise ClusterError("the nodes have no disks of their own (Cluster(disks=True))")
        self.disks.fail(node_id)
        self.nodes[node_id].disk_failed = True
        return self.disks.device(node_id)

    def repair_disk(self, node_id: str) -> dict[str, Any]:
        """kill -9 the node (by PID; nothing may use its file system), repair the file system (umount, e2fsck,
        mount); the caller starts the node again.  Returns what was done."""
        if self.disks is None:
            raise ClusterError("the nodes have no disks of their own (Cluster(disks=True))")
        node = self.nodes[node_id]
        pid = node.pid if node.running else None
        if node.running:
            self.kill(node_id)
        node.down, node.frozen, node.rejoining = True, False, False
        started = time.monotonic()
        was_read_only = self.disks.read_only(node_id)
        self.disks.repair(node_id)
        node.disk_failed = False
        return {"pid": pid, "was_read_only": was_read_only, "repair_s": round(time.monotonic() - started, 3),
                "device": self.disks.device(node_id)}

    def rot(self, node_id: str, where: str) -> dict[str, Any]:
        """Bit rot in a stopped node's files: ROT_BYTES bytes inverted in its journal (``middle``: at half its
        size, ``tail``: 6 bytes before its end, ``header``: at byte 12, inside its first record's body) or in
        its checkpoint (``checkpoint``: ``journal.synced``, at half its size).  Returns what was flipped."""
        node = self.nodes[node_id]
        if node.running:
            raise ClusterError(f"{node_id} is running: its files change under a rot")
        directory = self.data_dir(node_id)
        path = directory / (CHECKPOINT if where == "checkpoint" else JOURNAL)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise ClusterError(f"{node_id} has no {path.name}") from None
        offsets = {"middle": size // 2, "tail": size - 6, "header": 12, "checkpoint": size // 2}
        if where not in offsets:
            raise ValueError(f"unknown rot position {where!r}: use {', '.join(ROT_POSITIONS)}")
        offset = offsets[where]
        if not 0 <= offset <= size - ROT_BYTES:
            raise ClusterError(f"{path} has {size} bytes: nothing to flip at {where}")
        flip(path, offset, ROT_BYTES)
        return {"file": str(path), "offset": offset, "bytes": ROT_BYTES, "file_bytes": size}

    def quarantined(self, node_id: str) -> list[str]:
        """The damaged journals the node has kept aside (``journal.quarantined-<time>``)."""
        directory = self.data_dir(node_id)
        try:
            return sorted(p.name for p in directory.iterdir() if p.name.startswith(QUARANTINED))
        except OSError:
            return []

    # -- what the operator may ask besides ------------------------------------------------------------

    def status_of(self, node_id: str) -> dict[str, Any] | None:
        """The node's whole STATUS reply (the poller keeps only the roles); None if it does not answer."""
        try:
            with ManagementClient(self.nodes[node_id].address, timeout=2, login=self.admin) as client:
                return client.request("STATUS")
        except ManagementError:
            return None

    def etcd_view(self) -> tuple[frozenset[str] | None, dict[str, Member]]:
        """(the sync set's members, None if there is no sync key; the member keys) as etcd has them now."""
        keys = ClusterKeys(self.cluster_name)
        with closing(self.etcd.admin()) as client:
            response = client.range_prefix(keys.prefix, "nemesis read")
        sync: frozenset[str] | None = None
        members: dict[str, Member] = {}
        for kv in response.kvs:
            key = kv.key.decode()
            if key == keys.sync:
                sync = decode_sync(kv.value, kv.mod_revision).members
            elif key.startswith(keys.members):
                node_id = key[len(keys.members):]
                members[node_id] = decode_member(node_id, kv.value)
        return sync, members
