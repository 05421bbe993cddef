"""The memory high watermark: above it the node grants producers no more credit.

RabbitMQ's model: the node samples its resident memory; once it passes the
high watermark (a size, or a fraction of the machine's RAM) every producer
link stops getting credit, so producers wait, nothing is rejected or lost,
and consumers keep draining; once memory falls below the low watermark
(``LOW_FRACTION`` of the high one) credit flows again.  A producer may still
send what it was already granted (at most a link's window), which is the
slack above the watermark.

In an HA cluster a backup's alarm counts too (``remote``): the primary holds
its producers while any backup is over its own watermark, so one node's
memory pressure cannot push its peers into the kernel's OOM killer.
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from typing import Callable

import structlog

log = structlog.get_logger("hastandby.memory")

LOW_FRACTION = 0.8  # the low watermark, as a fraction of the high one
DEFAULT_FRACTION = 0.4  # of the machine's RAM, as RabbitMQ
SAMPLE_INTERVAL = 0.1  # seconds between RSS samples
RELEASE_INTERVAL = 1.0  # seconds between malloc_trim calls while the alarm is on (it walks the heap)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def total_ram() -> int:
    return os.sysconf("SC_PHYS_PAGES") * _PAGE


def parse_watermark(text: str, ram: int | None = None) -> int:
    """``256MB``, ``2GiB``, ``1073741824`` (bytes) or ``0.4`` (of RAM) -> bytes; ValueError if not one of them."""
    text = text.strip()
    if re.fullmatch(r"0?\.\d+|1(\.0*)?", text):
        return int(float(text) * (ram if ram is not None else total_ram()))
    match = re.fullmatch(r"(\d+)\s*([A-Za-z]*)", text)
    if match is None or match.group(2).upper() not in _UNITS:
        raise ValueError(f"{text!r}: give a size (256MB, 2GiB, bytes) or a fraction of RAM (0.4)")
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if size <= 0:
        raise ValueError(f"{text!r}: the watermark must be positive")
    return size


def resident_bytes() -> int:
    """This process's resident set size, from /proc (a read of one small file)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0), or nothing where there is no glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _mallinfo2() -> Callable[[], dict[str, int]]:
    try:
        call = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return lambda: {}
    call.restype = _MallInfo2

    def heap() -> dict[str, int]:
        info = call()
        return {"heap_in_use": info.uordblks + info.hblkhd, "heap_free": info.fordblks}
    return heap


heap_figures = _mallinfo2()


release_free_memory = _malloc_trim()
"""Freed message bytes stay in malloc's arenas, so the resident size would not
fall after consumers drained the queues and the alarm would never clear;
``malloc_trim`` gives them back to the kernel (measured: 116 MB of 10 KB
messages freed left 42 MB resident, trimmed 11 MB)."""


class MemoryAlarm:
    """High/low watermark hysteresis over samples, local and from peers; tells listeners on a change."""

    def __init__(self, high: int, sample: Callable[[], int] = resident_bytes,
                 release: Callable[[], None] = release_free_memory) -> None:
        self.high = high
        self.low = int(high * LOW_FRACTION)
        self._sample = sample
        self._release = release
        self._released_at = 0.0
        self.resident = 0
        self.local = False
        self.remote: dict[str, bool] = {}  # peer -> its own alarm (HA backups)
        self.listeners: list[Callable[[bool], None]] = []

    @property
    def blocked(self) -> bool:
        """Producers get no credit now."""
        return self.local or any(self.remote.values())

    def check(self) -> None:
        """Take a sample; raise or clear the local alarm."""
        self.resident = self._sample()
        now = time.monotonic()
        if self.local and self.resident >= self.low and now - self._released_at >= RELEASE_INTERVAL:
            self._released_at = now
            self._release()  # what consumers freed may still sit in malloc's arenas
            self.resident = self._sample()
        if not self.local and self.resident >= self.high:
            self._set_local(True)
        elif self.local and self.resident < self.low:
            self._set_local(False)

    def set_remote(self, peer: str, alarm: bool | None) -> None:
        """A peer's alarm (None: the peer is gone)."""
        before = self.blocked
        if alarm is None:
            self.remote.pop(peer, None)
        else:
            self.remote[peer] = alarm
        if alarm is not None and alarm != before:
            log.warning("memory alarm on a peer" if alarm else "memory alarm cleared on a peer", peer=peer)
        self._tell(before)

    def _set_local(self, alarm: bool) -> None:
        before = self.blocked
        self.local = alarm
        if alarm:
            log.warning("memory alarm: producers get no more credit", resident=self.resident, high=self.high)
        else:
            log.info("memory alarm cleared: credit flows again", resident=self.resident, low=self.low)
        self._tell(before)

    def _tell(self, before: bool) -> None:
        if self.blocked != before:
            for listener in self.listeners:
                listener(self.blocked)

    def describe(self) -> dict[str, object]:
        return {"resident": self.resident, "high_watermark": self.high, "low_watermark": self.low,
                "alarm": self.local, "peers_in_alarm": sorted(p for p, a in self.remote.items() if a),
                "producers_blocked": self.blocked, **heap_figures()}
