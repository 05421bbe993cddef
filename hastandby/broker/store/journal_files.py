"""The small files beside the journal that say what the journal itself cannot: what is known to be on disk,
and what a damaged journal lost.

- ``journal.synced``, the **checkpoint** (Kafka's recovery point): the journal file's token (the ``file``
  of its first ``OPEN`` record), how many of its bytes are known to be on disk, and whether the node
  stopped cleanly after them.  The writer thread refreshes it at most once a second after an fsync, and
  at a clean stop.  A record that is not intact *below* those bytes is damage, not a torn write, even
  when nothing intact follows it (damage to the last records, or a file cut short); and a clean stop is
  told by this file, which damage to the journal cannot erase.  It is JSON with a checksum of its own:
  a checkpoint that is damaged itself is ignored (the journal is then read as after a crash), never
  trusted.
- ``journal.damaged.json``: what this node lost to damage, one entry per time damage was found (the
  quarantined copy, the byte ranges, what they probably held).  While it exists the node **lacks data**:
  it is not elected and does not start a restarted cluster; it is removed once the node holds everything
  again (caught up from a healthy primary) or an operator accepts the loss (``promote --force``).
- ``journal.quarantined-<time>``: the damaged journal as it was found, a hard link (no space needed), kept
  for the operator.

Plain I/O, called at recovery (before the node serves) and from the journal's writer thread.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from hastandby.files import write_atomically

log = structlog.get_logger("hastandby.journal")

CHECKPOINT = "journal.synced"
DAMAGE = "journal.damaged.json"
QUARANTINE_PREFIX = "journal.quarantined-"


@dataclass(frozen=True)
class Checkpoint:
    """How much of the journal file named ``file`` is known to be on disk; ``clean``: the node stopped after it."""

    file: str
    bytes: int
    clean: bool = False


def _sealed(fields: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return {**fields, "crc": zlib.crc32(text.encode())}


def write_checkpoint(directory: Path, checkpoint: Checkpoint) -> None:
    """Replace the checkpoint (a new file fsynced, then renamed over the old one).

    The directory is not fsynced: a rename lost to a power cut leaves the previous checkpoint, which claims
    less, never more, except across a compaction, where it names the previous file and is ignored.
    """
    path = directory / CHECKPOINT
    temporary = path.with_name(f".{CHECKPOINT}.tmp")
    sealed = _sealed({"file": checkpoint.file, "bytes": checkpoint.bytes, "clean": checkpoint.clean})
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(sealed).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def read_checkpoint(directory: Path) -> Checkpoint | None:
    """The checkpoint, or None if there is none or it is not intact (logged: the journal is read as after a
    crash)."""
    path = directory / CHECKPOINT
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        fields = json.loads(text)
        crc = fields.pop("crc")
        if not isinstance(fields, dict) or _sealed(fields)["crc"] != crc:
            raise ValueError("checksum does not match")
        return Checkpoint(str(fields["file"]), int(fields["bytes"]), bool(fields["clean"]))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("journal checkpoint unreadable: the journal is read as after a crash", path=str(path),
                    error=str(error))
        return None


def quarantine(journal: Path) -> Path:
    """Keep the damaged journal as found, under a name of its own (a hard link: the bytes stay, no space)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = journal.with_name(QUARANTINE_PREFIX + stamp)
    serial = 1
    while target.exists():
        serial += 1
        target = journal.with_name(f"{QUARANTINE_PREFIX}{stamp}.{serial}")
    try:
        os.link(journal, target)
    except OSError:  # a file system without hard links: a copy, if there is room for one
        target.write_bytes(journal.read_bytes())
    return target


def read_damage(directory: Path) -> list[dict[str, Any]]:
    """What this node lost to damage and has not recovered (empty: nothing).

    A damage file that cannot be read is itself damage: it says the node lacks data, in the safe direction.
    """
    path = directory / DAMAGE
    try:
        found = json.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except ValueError as error:
        return [{"file": str(path), "what": f"the damage record itself is unreadable ({error})"}]
    return found if isinstance(found, list) and found else [{"file": str(path), "what": "unreadable damage record"}]


def write_damage(directory: Path, incidents: list[dict[str, Any]]) -> None:
    write_atomically(directory / DAMAGE, json.dumps(incidents, indent=1) + "\n", 0o600)


def clear_damage(directory: Path) -> None:
    path = directory / DAMAGE
    if path.exists():
        path.unlink()
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
