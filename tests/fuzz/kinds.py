"""The input kinds, by the name ``--kinds`` takes."""

from __future__ import annotations

from .backup import Backup
from .base import Kind
from .dr import DrSourceKind
from .dr_replica import DrReplica
from .frames import Frames
from .management import ManagementKind
from .replication import Replication

KINDS: dict[str, type[Kind]] = {
    "frames": Frames,
    "management": ManagementKind,
    "replication": Replication,
    "backup": Backup,
    "dr": DrSourceKind,
    "dr-replica": DrReplica,
}
