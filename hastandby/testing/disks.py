"""Real disk faults for tests: bit flips in real files, ext4 on a loop device that turns read-only, a small tmpfs.

No mocks: a test flips bytes of the journal file a node wrote, fails a real
ext4 file system through the kernel (``/sys/fs/ext4/<dev>/trigger_fs_error``
with ``errors=remount-ro``: every later write gets ``EROFS``, as after an I/O
error on a real disk; ``chmod`` does nothing to root), or fills a real tmpfs
(``ENOSPC``).  Each mount is a context manager that unmounts and detaches
what it made, also when the test fails.  Needs root.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


def flip(path: Path, offset: int, count: int = 3) -> None:
    """Invert ``count`` bytes of ``path`` from ``offset`` on (negative: from the end), in place, fsynced."""
    with open(path, "r+b") as file:
        size = os.fstat(file.fileno()).st_size
        at = offset % size if offset < 0 else offset
        if not 0 <= at <= size - count:
            raise ValueError(f"{path} has {size} bytes: cannot flip {count} at {offset}")
        file.seek(at)
        data = bytes(b ^ 0xFF for b in file.read(count))
        file.seek(at)
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _run(*command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


class Ext4Loop:
    """A small ext4 file system on a loop device, mounted ``errors=remount-ro`` at ``mount``.

    ``fail()`` makes the kernel treat it as a disk that erred: it turns read-only at once and every write
    fails with ``EROFS``.  ``repair()`` (nothing may have a file open on it) checks it and mounts it
    writable again, as an operator would after replacing the disk or clearing the error.
    """

    def __init__(self, mount: Path, megabytes: int = 64) -> None:
        self.mount = Path(mount)
        self.megabytes = megabytes
        self.image: Path | None = None
        self.device: str | None = None
        self.mounted = False

    def __enter__(self) -> "Ext4Loop":
        try:
            fd, name = tempfile.mkstemp(prefix="hastandby-ext4-", suffix=".img")
            os.close(fd)
            self.image = Path(name)
            os.truncate(self.image, self.megabytes << 20)
            _run("mkfs.ext4", "-q", "-F", str(self.image))
            self.device = _run("losetup", "--find", "--show", str(self.image)).strip()
            self.mount.mkdir(parents=True, exist_ok=True)
            self._mount()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _mount(self) -> None:
        assert self.device is not None
        _run("mount", "-t", "ext4", "-o", "errors=remount-ro", self.device, str(self.mount))
        self.mounted = True

    def fail(self) -> None:
        """The disk errs: the kernel remounts the file system read-only (``emergency_ro``)."""
        assert self.device is not None
        Path(f"/sys/fs/ext4/{Path(self.device).name}/trigger_fs_error").write_text("1")

    @property
    def read_only(self) -> bool:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 3 and fields[1] == str(self.mount):
                return "ro" in fields[3].split(",") or "emergency_ro" in fields[3].split(",")
        return False

    def repair(self) -> None:
        """Unmount, ``e2fsck -fy``, mount writable again."""
        assert self.device is not None
        _run("umount", str(self.mount))
        self.mounted = False
        for _ in range(20):  # the kernel may hold the device a moment after the unmount (udev's probe)
            result = subprocess.run(["e2fsck", "-fy", self.device], capture_output=True, text=True, timeout=120)
            if "in use" not in result.stdout + result.stderr:
                break
            time.sleep(0.25)
        if result.returncode not in (0, 1):  # 1: errors corrected
            raise RuntimeError(f"e2fsck {self.device} failed ({result.returncode}): {result.stdout[-500:]}")
        self._mount()

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.mount)], capture_output=True, timeout=60)
            self.mounted = False
        if self.device is not None:
            subprocess.run(["losetup", "-d", self.device], capture_output=True, timeout=60)
            self.device = None
        if self.image is not None:
            self.image.unlink(missing_ok=True)
            self.image = None


class Tmpfs:
    """A tmpfs of ``size`` bytes at ``mount``: a disk that fills (``ENOSPC``)."""

    def __init__(self, mount: Path, size: int) -> None:
        self.mount = Path(mount)
        self.size = size
        self.mounted = False

    def __enter__(self) -> "Tmpfs":
        self.mount.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.mount))
        self.mounted = True
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.mount)], capture_output=True, timeout=60)
            self.mounted = False

    def free(self) -> int:
        stat = os.statvfs(self.mount)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int, name: str = "filler") -> Path:
        """Take all but about ``leave`` bytes with a file of its own (removed to free them again)."""
        path = self.mount / name
        with open(path, "ab") as file:
            while self.free() > leave:
                chunk = min(1 << 20, self.free() - leave)
                if chunk <= 0:
                    break
                file.write(bytes(chunk))
                file.flush()
        return path
