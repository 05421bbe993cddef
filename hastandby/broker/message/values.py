"""Plain Python values from decoded AMQP data.

proton decodes into subclasses (``symbol``, ``ulong``, ``Described`` ...);
comparing, printing or JSON-encoding configuration wants plain values.
"""

from __future__ import annotations

from typing import Any

from proton import ulong


LONG_MAX = (1 << 63) - 1


def plain(value: Any) -> Any:
    """``value`` with proton's typed wrappers turned into str/int/float/dict/list.

    An integer past a signed long (an AMQP ulong up to 2**64 - 1) stays a
    ``ulong``: as a plain int it could not be encoded again, and a reply
    naming it (a queue's arguments in QUERY) failed (fuzz).
    """
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value) if value <= LONG_MAX else ulong(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
