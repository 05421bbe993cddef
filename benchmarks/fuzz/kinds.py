"""The input kinds, by the name ``--kinds`` takes."""

from __future__ import annotations

from .base import Kind
from .frames import Frames
from .management import ManagementKind

KINDS: dict[str, type[Kind]] = {
    "frames": Frames,
    "management": ManagementKind,
}
