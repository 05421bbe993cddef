"""A virtual IP that follows the primary: ``serve --virtual-ip ADDRESS/PREFIX --virtual-ip-interface NAME``.

Why: a client given a list of node URLs that is connected to a primary whose
link is cut waits for as long as the cut lasts (its packets vanish, no reset
comes back), and a client that knows a single address needs nobody to tell
it the others.  With a virtual IP clients know one address.  The node that
serves clients holds it: ``ip address add`` on the interface, then
gratuitous ARPs (unsolicited ARP requests, what ``arping -U`` sends) so
that every host on the LAN sends to its MAC from then on; the TCP
connections clients still have to the old primary now reach a host that
does not know them, which resets them, and the clients reconnect to the
same address at once.

When: the address follows ``HaNode.on_serving`` (told True when the node
starts admitting clients as primary, False when it stops: demotion, a lost
lease or a term that is not ours any more (``lost_lease``), a halt, a
graceful stop), so it is added when the node becomes primary and removed as
it stops being one, before it resigns its leader key.  It is also removed
when the node starts (a node killed as primary and started again must not
keep it) and, under ``--supervise``, by the supervisor as soon as its node
has died.  A node killed with its supervisor, or a host that dies, cannot
remove it: the next primary's announcement moves it, and until the killed
host's node starts again its kernel may still answer ARP requests for it
(docs/lifecycle.md section 14 says what that window means).

How: ``ip`` and the announcements run on one worker thread of this object
(``role_hooks.OrderedWorker``), never on the reactor thread, each bounded in
time (``run_bounded``), and their failures logged.  One worker keeps adds and
removes in order; a request already overtaken by a later one is skipped (the
last one always runs, so the interface ends as the node's role says), and a
removal stops the announcements at once.

Why the node sends the ARPs itself (a raw ``AF_PACKET`` socket, ``send_garp``)
rather than running ``arping -U -c N``: ``arping`` runs for N seconds, and a
node killed meanwhile leaves it running; it then announced the dead node's
MAC after the next primary had announced its own, and clients followed it
to a host that no longer had the address (measured in
``tests/integration/test_virtual_ip.py``: a second of silence instead of a
reset).  Frames the node sends itself die with it, and cost no process.

Needs ``CAP_NET_ADMIN`` (``ip address``, run as a child: root's bounding
set, or ambient capabilities) and ``CAP_NET_RAW`` (the ARP socket, in this
process): ``check_setup`` says at start which one is missing and how to
grant it, and opens the ARP socket once without sending anything.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from hastandby.host.role_hooks import CommandResult, OrderedWorker, run_bounded

log = structlog.get_logger("hastandby.virtual_ip")

COMMAND_TIMEOUT = 5.0  # seconds an ``ip`` command may take
ANNOUNCEMENTS = 3  # gratuitous ARPs sent after the address is added ...
ANNOUNCE_INTERVAL = 1.0  # ... this many seconds apart (a neighbour that missed one takes the next)
CAP_NET_ADMIN, CAP_NET_RAW = 12, 13  # capability bits (linux/capability.h)
ETH_P_ARP, ETHERTYPE_IPV4, ARPHRD_ETHER, ARPOP_REQUEST = 0x0806, 0x0800, 1, 1
_ALREADY_PRESENT = ("already assigned", "File exists")
_NOT_PRESENT = ("Address not found", "Cannot assign requested address")

Runner = Callable[..., CommandResult]
Announcer = Callable[[str, ipaddress.IPv4Address], None]


def garp_frame(mac: bytes, address: ipaddress.IPv4Address) -> bytes:
    """A gratuitous ARP as ``arping -U`` sends it: a broadcast request "who has ADDRESS, tell ADDRESS at MAC".

    Every host that has the address in its ARP table takes the new MAC
    (Linux does so for a request whose sender and target address are the
    same, whatever ``arp_accept`` says; ``arp_accept`` only decides whether
    hosts that never talked to the address add it).
    """
    ip = address.packed
    arp = struct.pack("!HHBBH", ARPHRD_ETHER, ETHERTYPE_IPV4, 6, 4, ARPOP_REQUEST) + mac + ip + bytes(6) + ip
    return (b"\xff" * 6 + mac + struct.pack("!H", ETH_P_ARP) + arp).ljust(60, b"\x00")  # padded to Ethernet's minimum


def _arp_socket(interface: str) -> tuple[socket.socket, bytes]:
    """A raw socket on ``interface`` that receives nothing, and the interface's MAC; OSError if not Ethernet."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        sock.setblocking(False)  # a full device queue fails the send rather than wait (it may hold a lock)
        sock.bind((interface, 0))
        _, _, _, hatype, mac = sock.getsockname()
        if hatype != ARPHRD_ETHER or len(mac) != 6:
            raise OSError(f"{interface} is not an Ethernet interface (hardware type {hatype})")
    except BaseException:
        sock.close()
        raise
    return sock, mac


def send_garp(interface: str, address: ipaddress.IPv4Address) -> None:
    """Send one gratuitous ARP for ``address`` from ``interface``'s MAC (needs CAP_NET_RAW); OSError on failure."""
    sock, mac = _arp_socket(interface)
    with sock:
        sock.send(garp_frame(mac, address))


class VirtualIpError(Exception):
    """The virtual IP cannot be managed here; the message says why and what to do."""


def parse_address(text: str) -> ipaddress.IPv4Interface:
    """``ADDRESS/PREFIX`` (IPv4: gratuitous ARP is IPv4's announcement) -> the interface address."""
    if "/" not in text:
        raise VirtualIpError(f"{text!r}: give the prefix too, ADDRESS/PREFIX (e.g. 10.0.0.100/24, or /32)")
    try:
        address = ipaddress.ip_interface(text)
    except ValueError as error:
        raise VirtualIpError(f"{text!r} is not an address with a prefix: {error}") from None
    if not isinstance(address, ipaddress.IPv4Interface):
        raise VirtualIpError(f"{text!r}: only IPv4 addresses are supported (announced with gratuitous ARP)")
    return address


@dataclass(frozen=True)
class Capabilities:
    """The capability sets of a process (``/proc/PID/status``) and its effective uid."""

    effective: int
    bounding: int
    ambient: int
    euid: int

    @classmethod
    def parse(cls, status: str, euid: int) -> Capabilities:
        fields: dict[str, str] = {}
        for line in status.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        return cls(int(fields.get("CapEff", "0"), 16), int(fields.get("CapBnd", "0"), 16),
                   int(fields.get("CapAmb", "0"), 16), euid)

    @classmethod
    def of_this_process(cls) -> Capabilities:
        return cls.parse(Path("/proc/self/status").read_text(), os.geteuid())

    def children_have(self, bit: int) -> bool:
        """Whether a program this process runs (``ip``) gets capability ``bit``.

        root's children get the bounding set; anyone else's only the ambient
        set (``ip`` has no file capabilities).
        """
        if self.euid == 0:
            return bool(self.bounding >> bit & 1)
        return bool(self.ambient >> bit & 1)


@dataclass
class VirtualIp:
    """Holds ``address`` on ``interface`` while the node serves clients as primary; see the module doc."""

    address: ipaddress.IPv4Interface
    interface: str
    command_timeout: float = COMMAND_TIMEOUT
    announcements: int = ANNOUNCEMENTS
    announce_interval: float = ANNOUNCE_INTERVAL
    ip_command: Sequence[str] = ("ip",)
    run: Runner = run_bounded
    announce: Announcer = send_garp
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _generation: int = field(default=0, init=False)
    _announcing: threading.Event | None = field(default=None, init=False, repr=False)
    _worker: OrderedWorker | None = field(default=None, init=False, repr=False)

    @property
    def ip(self) -> str:
        return str(self.address.ip)

    # -- called on the reactor thread (or any thread): queue, never block -------------------------------

    def start(self) -> None:
        """Start the worker and queue a removal: a node starts as no primary (module doc)."""
        if self._worker is None:
            self._worker = OrderedWorker("hastandby-virtual-ip")
        self.serving(False)

    def serving(self, admitting: bool) -> None:
        """``HaNode.on_serving``: hold the address (True) or give it up (False)."""
        with self._lock:
            self._generation += 1
            generation = self._generation
            if not admitting and self._announcing is not None:
                self._announcing.set()  # a removal stops the announcements at once
        if self._worker is None:
            self._worker = OrderedWorker("hastandby-virtual-ip")
        self._worker.submit(lambda: self._apply(generation, admitting))

    def close(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` s, for the queued changes (after a graceful stop: the removal)."""
        return self._worker.close(timeout) if self._worker is not None else True

    # -- the worker thread ----------------------------------------------------------------------

    def _apply(self, generation: int, hold: bool) -> None:
        with self._lock:
            if generation != self._generation:
                return  # overtaken: a later request is queued behind this one
        if hold:
            if self.add():
                self._announce(generation)
        else:
            self.remove()

    def add(self) -> bool:
        """``ip address add``; an address already there is no error. True if the node holds it now."""
        result = self._ip("add")
        if result.ok or any(text in result.output for text in _ALREADY_PRESENT):
            log.info("virtual IP added", address=str(self.address), interface=self.interface,
                     already=not result.ok, seconds=round(result.seconds, 3))
            return True
        self._failed("virtual IP not added", result)
        return False

    def remove(self) -> bool:
        """``ip address del`` (synchronous; the supervisor calls it directly). True if it is not held now."""
        result = self._ip("del")
        if result.ok:
            log.info("virtual IP removed", address=str(self.address), interface=self.interface,
                     seconds=round(result.seconds, 3))
            return True
        if any(text in result.output for text in _NOT_PRESENT):
            log.debug("virtual IP not held", address=str(self.address), interface=self.interface)
            return True
        self._failed("virtual IP not removed", result)
        return False

    def _ip(self, verb: str) -> CommandResult:
        argv = [*self.ip_command, "address", verb, str(self.address), "dev", self.interface]
        return self.run(argv, self.command_timeout)

    def _announce(self, generation: int) -> None:
        """Send the gratuitous ARPs, ``announce_interval`` apart, until a later request comes."""
        cancel = threading.Event()
        with self._lock:
            if generation != self._generation:
                return
            self._announcing = cancel
        sent = 0
        try:
            for number in range(self.announcements):
                if number and cancel.wait(self.announce_interval):
                    break
                with self._lock:  # never announce an address a removal is on its way for
                    if generation != self._generation:
                        break
                    try:
                        self.announce(self.interface, self.address.ip)
                    except OSError as error:
                        log.error("virtual IP announcement failed", address=self.ip, interface=self.interface,
                                  error=str(error))
                        return
                sent += 1
                if sent == 1:
                    log.info("virtual IP announced", address=self.ip, interface=self.interface)
        finally:
            with self._lock:
                self._announcing = None
        if sent < self.announcements:
            log.info("virtual IP announcements stopped by a removal", address=self.ip, sent=sent)

    def _failed(self, what: str, result: CommandResult) -> None:
        log.error(what, address=str(self.address), interface=self.interface, returncode=result.returncode,
                  timed_out=result.timed_out, error=result.start_error, output=result.output)


def check_setup(address: ipaddress.IPv4Interface, interface: str, ip: str = "ip",
                capabilities: Capabilities | None = None, arp_socket: bool = True) -> None:
    """At start, before anything is served: ``ip``, the interface and the privileges are there.

    Raises ``VirtualIpError`` naming what is missing.  Nothing is changed on
    the interface: the privileges are read from this process's capability
    sets, the interface is only looked at, and the ARP socket is opened and
    closed without sending (``arp_socket``).
    """
    if shutil.which(ip) is None:
        raise VirtualIpError(f"--virtual-ip needs {ip} on PATH (Debian: apt-get install iproute2)")
    caps = capabilities or Capabilities.of_this_process()
    missing = []
    if not caps.children_have(CAP_NET_ADMIN):
        missing.append("CAP_NET_ADMIN (to add and remove the address with ip)")
    if not caps.effective >> CAP_NET_RAW & 1:
        missing.append("CAP_NET_RAW (to announce it with gratuitous ARP)")
    if missing:
        if caps.euid == 0:
            how = ("this node runs as root, but without them in its capability bounding set (a container's or "
                   "systemd's CapabilityBoundingSet= dropped them): allow them there")
        else:
            how = (f"this node runs as uid {caps.euid}: run it as root, or grant them as ambient capabilities "
                   "(systemd: AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW, see docs/lifecycle.md section 14)")
        raise VirtualIpError(f"--virtual-ip needs the privilege {' and '.join(missing)}; {how}")
    shown = subprocess.run([ip, "-o", "link", "show", "dev", interface], capture_output=True, text=True,
                           timeout=COMMAND_TIMEOUT, check=False)
    if shown.returncode != 0:
        raise VirtualIpError(f"--virtual-ip-interface {interface}: no such interface here "
                             f"({(shown.stderr or shown.stdout).strip()})")
    if arp_socket:
        try:
            sock, _ = _arp_socket(interface)
        except OSError as error:
            raise VirtualIpError(f"--virtual-ip-interface {interface}: cannot send ARP there: {error} "
                                 "(needs CAP_NET_RAW and an Ethernet interface)") from None
        sock.close()
