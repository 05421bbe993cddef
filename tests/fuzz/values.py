"""Random AMQP values: every type proton can encode, edge values first, nested and large on purpose.

``value(rng)`` is any AMQP value (for a field of a performative, a link or
connection property, a management body); ``like(rng, original)`` is a
mutation of a given value (often of the same type, sometimes of another);
``text(rng)`` and ``integer(rng)`` are the strings and numbers the
generators mostly pick: the names and ids a node looks at, then edge values
(empty, huge, negative, the type's limits, a wrong type).

Everything is drawn from the ``random.Random`` given, so a case is the same
for the same seed.
"""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

from proton import (
    UNDESCRIBED,
    Array,
    Data,
    Described,
    byte,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)

# Integers a node checks or stores: ids, counts, terms, sizes, handles.
EDGE_INTEGERS = [0, 1, 2, -1, -2, 7, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -(2**31), 2**32 - 1, 2**32,
                 2**53, 2**62, 2**63 - 1, -(2**63), 10**6, 10**9]
EDGE_STRINGS = ["", " ", "a", "\x00", "fz.q", "$management", "$ha.wiring", "$ha.status", "$dr.ack", "$dr.k.fz.q",
                "amq.direct", "amq.topic", "amq.fanout", "qpid.", "#", "*", "..", "/", "\\", "%s%n", "' OR 1=1",
                "é\u2028\U0001f600", "\ud7ff", "TEMP_", "$", "x" * 300, "fz." + "y" * 5000]
MAX_DEPTH = 4


def encodable(number: int) -> int:
    """``number`` as AMQP can carry it: a long, or a ulong above the long range (clamped to 64 bits)."""
    if number < -(2**63):
        return -(2**63)
    if number < 2**63:
        return number
    return ulong(min(number, 2**64 - 1))


def integer(rng: random.Random) -> int:
    """An int: an edge value, a small number, or a large one of either sign (a ulong above the long range)."""
    roll = rng.random()
    if roll < 0.5:
        return encodable(rng.choice(EDGE_INTEGERS))
    if roll < 0.8:
        return rng.randint(-10, 1000)
    return encodable(rng.randint(-(2**63), 2**64 - 1))


def text(rng: random.Random, size: int | None = None) -> str:
    roll = rng.random()
    if size is None and roll < 0.5:
        return rng.choice(EDGE_STRINGS)
    if size is None:
        size = rng.choice([0, 1, 3, 8, 20, 100, 1000, rng.randint(0, 70000)])
    alphabet = rng.choice(["abcdefghijklmnopqrstuvwxyz.-_", "\x00\x01\x7f\x80é\u2603\U0001f600 \t\n",
                           "".join(chr(c) for c in range(32, 127))])
    return "".join(rng.choice(alphabet) for _ in range(min(size, 200))) * max(1, size // 200)


def ascii_symbol(rng: random.Random, size: int | None = None) -> symbol:
    """A symbol (proton encodes only ASCII ones; other bytes in a symbol come from byte mutations)."""
    return symbol(text(rng, size).encode("ascii", "replace").decode())


def binary(rng: random.Random) -> bytes:
    size = rng.choice([0, 1, 4, 8, 16, 64, 300, 4096, rng.randint(0, 200_000)])
    return rng.randbytes(size)


def _bounded(rng: random.Random, cls: Any, lo: int, hi: int) -> Any:
    return cls(rng.choice([lo, hi, 0, 1, rng.randint(lo, hi)]))


def scalar(rng: random.Random) -> Any:
    """One value of a primitive type (none of them containers)."""
    kind = rng.randrange(26)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return _bounded(rng, ubyte, 0, 255)
    if kind == 3:
        return _bounded(rng, ushort, 0, 65535)
    if kind == 4:
        return _bounded(rng, uint, 0, 2**32 - 1)
    if kind == 5:
        return _bounded(rng, ulong, 0, 2**64 - 1)
    if kind == 6:
        return _bounded(rng, byte, -128, 127)
    if kind == 7:
        return _bounded(rng, short, -(2**15), 2**15 - 1)
    if kind == 8:
        return _bounded(rng, int32, -(2**31), 2**31 - 1)
    if kind in (9, 10):
        return integer(rng)  # long (or ulong)
    if kind == 11:
        return float32(rng.choice([0.0, -0.0, 1.5, math.inf, -math.inf, math.nan, 3.4e38]))
    if kind == 12:
        return rng.choice([0.0, 1e308, -1e-308, math.inf, math.nan, rng.random()])
    if kind == 13:
        return char(chr(rng.choice([0, 65, 0x2603, 0x10FFFF])))
    if kind == 14:
        return timestamp(rng.choice([0, -1, 2**62, rng.randint(0, 2**41)]))
    if kind == 15:
        return uuid.UUID(int=rng.getrandbits(128))
    if kind == 16:
        return decimal32(rng.getrandbits(32))
    if kind == 17:
        return decimal64(rng.getrandbits(64))
    if kind == 18:
        return decimal128(rng.randbytes(16))
    if kind in (19, 20):
        return binary(rng)
    if kind in (21, 22, 23):
        return text(rng)
    return ascii_symbol(rng)


def array(rng: random.Random) -> Array:
    """A homogeneous AMQP array (of ints, symbols, strings or longs)."""
    count = rng.choice([0, 1, 3, 100])
    kind = rng.choice(["int", "symbol", "string", "long", "ulong"])
    if kind == "int":
        return Array(UNDESCRIBED, Data.INT, *[rng.randint(-(2**31), 2**31 - 1) for _ in range(count)])
    if kind == "long":
        return Array(UNDESCRIBED, Data.LONG, *[rng.randint(-(2**63), 2**63 - 1) for _ in range(count)])
    if kind == "ulong":
        return Array(UNDESCRIBED, Data.ULONG, *[ulong(rng.randint(0, 2**64 - 1)) for _ in range(count)])
    if kind == "symbol":
        return Array(UNDESCRIBED, Data.SYMBOL, *[ascii_symbol(rng, 5) for _ in range(count)])
    return Array(UNDESCRIBED, Data.STRING, *[text(rng, 5) for _ in range(count)])


def value(rng: random.Random, depth: int = 0) -> Any:
    """Any AMQP value: mostly scalars, some containers (nested up to MAX_DEPTH), some described."""
    roll = rng.random()
    if depth >= MAX_DEPTH or roll < 0.6:
        return scalar(rng)
    if roll < 0.72:
        return [value(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 5, 30]))]
    if roll < 0.86:
        return {key(rng): value(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 5, 30]))}
    if roll < 0.93:
        return array(rng)
    descriptor = rng.choice([ulong(rng.choice([0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x70, 0x73, 0x75, 0x77])),
                             ulong(rng.getrandbits(64)), ascii_symbol(rng, 8)])
    return Described(descriptor, value(rng, depth + 1))


def key(rng: random.Random) -> Any:
    """A map key: usually a string or symbol (what a node expects), sometimes anything hashable."""
    roll = rng.random()
    if roll < 0.45:
        return text(rng)
    if roll < 0.8:
        return ascii_symbol(rng)
    candidate = scalar(rng)
    try:
        hash(candidate)
    except TypeError:
        return text(rng)
    if isinstance(candidate, float) and math.isnan(candidate):
        return "nan"  # NaN keys never compare equal: proton cannot round-trip them meaningfully
    return candidate


def like(rng: random.Random, original: Any) -> Any:
    """A mutation of ``original``: a neighbour of the same type, an edge value, a container of it, or anything."""
    roll = rng.random()
    if roll < 0.25:
        return value(rng)
    if isinstance(original, bool):
        return rng.choice([not original, None, 0, "true"])
    if isinstance(original, (ubyte, ushort, uint, ulong, byte, short, int32)):
        return _retype(rng, original)
    if isinstance(original, int):
        return rng.choice([integer(rng), encodable(original + 1), encodable(original - 1), encodable(-original),
                           encodable(original * 2**32), str(original)])
    if isinstance(original, symbol):
        return rng.choice([ascii_symbol(rng), str(original), symbol(str(original) + "\x00")])
    if isinstance(original, str):
        return rng.choice([text(rng), original + text(rng, 3), original[: len(original) // 2],
                           symbol(original.encode("ascii", "replace").decode()),
                           original.encode(errors="replace"), original * 100])
    if isinstance(original, (bytes, bytearray)):
        return rng.choice([binary(rng), bytes(original) + b"\x00", bytes(original)[:1], str(bytes(original))])
    if isinstance(original, dict):
        result = dict(original)
        if result and rng.random() < 0.5:
            target = rng.choice(list(result))
            if rng.random() < 0.3:
                del result[target]
            else:
                result[target] = like(rng, result[target])
        else:
            result[key(rng)] = value(rng)
        return result
    if isinstance(original, list):
        result = list(original)
        if result and rng.random() < 0.6:
            index = rng.randrange(len(result))
            if rng.random() < 0.3:
                del result[index]
            else:
                result[index] = like(rng, result[index])
        else:
            result.insert(rng.randint(0, len(result)), value(rng))
        return result
    return value(rng)


def _retype(rng: random.Random, original: Any) -> Any:
    """A sized integer: its limits, a neighbour, or the same number in another AMQP integer type."""
    limits = {ubyte: (0, 255), ushort: (0, 65535), uint: (0, 2**32 - 1), ulong: (0, 2**64 - 1),
              byte: (-128, 127), short: (-(2**15), 2**15 - 1), int32: (-(2**31), 2**31 - 1)}
    cls = type(original)
    lo, hi = limits[cls]
    roll = rng.random()
    if roll < 0.6:
        return cls(rng.choice([lo, hi, max(lo, min(hi, int(original) + rng.choice([-1, 1, 1000])))]))
    other = rng.choice(list(limits))
    lo, hi = limits[other]
    return other(max(lo, min(hi, int(original))))
