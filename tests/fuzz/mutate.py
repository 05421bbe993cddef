"""Mutators: of bytes, of a frame's fields, of a conversation's frames.

Each takes a ``random.Random`` and returns the mutated thing plus a short
description (for the case's record: what was done to the valid input).
Byte mutators are the classic ones (bit flips, interesting bytes and
integers, truncation, insertion, deletion, duplication of a range); frame
mutators change a field (to a neighbour or to any AMQP value), a channel, a
performative code, the frame type or data offset, the size field (too
short, too long, huge), and the order and number of frames (dropped,
repeated up to thousands of times, swapped, moved out of order).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

from proton import Described, ulong

from . import amqp, values
from .amqp import Frame

REPEAT_BYTES = 16 << 20  # a repeated frame is copied at most up to this many bytes in all

# Bytes an AMQP decoder treats specially: null, described, the variable-width and
# compound constructors (vbin, str, sym, list, map, array in 8- and 32-bit size),
# booleans, and the extremes.
INTERESTING_BYTES = [0x00, 0x40, 0x41, 0x42, 0x45, 0x50, 0x53, 0x70, 0x71, 0x80, 0xA0, 0xA1, 0xA3, 0xB0, 0xB1,
                     0xB3, 0xC0, 0xC1, 0xD0, 0xD1, 0xE0, 0xF0, 0x7F, 0xFF, 0x01, 0x02, 0x08]
INTERESTING_U32 = [0, 1, 7, 8, 9, 255, 256, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE,
                   0xFFFFFFFF]


# -- bytes ------------------------------------------------------------------------------------


def flip_bits(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if not data:
        return b"\xff", "bytes: empty -> ff"
    out = bytearray(data)
    count = rng.choice([1, 1, 2, 4, 8])
    for _ in range(count):
        index = rng.randrange(len(out))
        out[index] ^= 1 << rng.randrange(8)
    return bytes(out), f"bytes: flip {count} bit(s)"


def set_byte(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if not data:
        return bytes([rng.choice(INTERESTING_BYTES)]), "bytes: one interesting byte"
    out = bytearray(data)
    index = rng.randrange(len(out))
    out[index] = rng.choice(INTERESTING_BYTES)
    return bytes(out), f"bytes: set byte {index} to {out[index]:#x}"


def set_u32(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if len(data) < 4:
        return data + struct.pack(">I", rng.choice(INTERESTING_U32)), "bytes: append u32"
    index = rng.randrange(len(data) - 3)
    number = rng.choice(INTERESTING_U32 + [len(data), len(data) + 1, len(data) - index])
    return data[:index] + struct.pack(">I", number) + data[index + 4:], f"bytes: u32 {number:#x} at {index}"


def truncate(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    cut = rng.randrange(len(data)) if data else 0
    return data[:cut], f"bytes: truncate to {cut}"


def insert(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    index = rng.randint(0, len(data))
    blob = rng.choice([rng.randbytes(rng.choice([1, 2, 4, 16, 300])), bytes([rng.choice(INTERESTING_BYTES)]) * 64,
                       amqp.AMQP_HEADER, amqp.SASL_HEADER])
    return data[:index] + blob + data[index:], f"bytes: insert {len(blob)} at {index}"


def delete(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if not data:
        return data, "bytes: delete nothing"
    start = rng.randrange(len(data))
    stop = min(len(data), start + rng.choice([1, 2, 4, 8, 64]))
    return data[:start] + data[stop:], f"bytes: delete {start}:{stop}"


def duplicate(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if not data:
        return data, "bytes: duplicate nothing"
    start = rng.randrange(len(data))
    stop = min(len(data), start + rng.choice([1, 4, 16, 256]))
    times = rng.choice([1, 2, 10, 100])
    return data[:stop] + data[start:stop] * times + data[stop:], f"bytes: repeat {start}:{stop} x{times}"


BYTE_MUTATORS: list[Callable[[random.Random, bytes], tuple[bytes, str]]] = [
    flip_bits, set_byte, set_u32, truncate, insert, delete, duplicate]


def mutate_bytes(rng: random.Random, data: bytes, rounds: int | None = None) -> tuple[bytes, list[str]]:
    notes = []
    for _ in range(rounds or rng.choice([1, 1, 1, 2, 3])):
        data, note = rng.choice(BYTE_MUTATORS)(rng, data)
        notes.append(note)
    return data, notes


# -- one frame ----------------------------------------------------------------------------------


def mutate_field(rng: random.Random, frame: Frame) -> str:
    """Change, remove or add one field of ``frame`` (in place)."""
    fields = frame.fields
    roll = rng.random()
    if fields and roll < 0.7:
        index = rng.randrange(len(fields))
        fields[index] = values.like(rng, fields[index])
        return f"{frame.name}: field {index} -> {_short(fields[index])}"
    if fields and roll < 0.8:
        index = rng.randrange(len(fields))
        del fields[index:]
        return f"{frame.name}: fields from {index} dropped"
    extra = [values.value(rng) for _ in range(rng.choice([1, 2, 20]))]
    fields.extend(extra)
    return f"{frame.name}: {len(extra)} extra field(s)"


def mutate_nested(rng: random.Random, frame: Frame) -> str:
    """Change a field inside a described field (a source, target, outcome or error)."""
    described = [i for i, f in enumerate(frame.fields) if isinstance(f, Described) and isinstance(f.value, list)]
    if not described:
        return mutate_field(rng, frame)
    index = rng.choice(described)
    inner = list(frame.fields[index].value)
    if inner and rng.random() < 0.8:
        position = rng.randrange(len(inner))
        inner[position] = values.like(rng, inner[position])
        note = f"{frame.name}: field {index}.{position} -> {_short(inner[position])}"
    else:
        inner.append(values.value(rng))
        note = f"{frame.name}: field {index} gets an extra entry"
    descriptor = frame.fields[index].descriptor
    if rng.random() < 0.1:
        descriptor = ulong(rng.choice([0x23, 0x24, 0x28, 0x29, 0x1D, 0x70, rng.getrandbits(64)]))
        note += f" (descriptor {int(descriptor):#x})"
    frame.fields[index] = type(frame.fields[index])(descriptor, inner)
    return note


def mutate_header(rng: random.Random, frame: Frame) -> str:
    roll = rng.random()
    if roll < 0.35:
        frame.channel = rng.choice([1, 2, 255, 256, 32767, 65535, rng.randrange(65536)])
        return f"{frame.name}: channel {frame.channel}"
    if roll < 0.6:
        old = frame.name
        frame.code = rng.choice([*range(0x10, 0x19), 0x0F, 0x19, 0x1D, 0x23, 0x28, 0x40, 0x41, 0x44, 0x70, 0xFF])
        return f"{old}: performative code {frame.code:#x}"
    if roll < 0.8:
        frame.kind = rng.choice([1, 2, 0xFF])
        return f"{frame.name}: frame type {frame.kind}"
    frame.doff = rng.choice([0, 1, 3, 16, 255])
    return f"{frame.name}: data offset {frame.doff}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def encode_mutated(rng: random.Random, frame: Frame) -> tuple[bytes, str]:
    """Encode ``frame``, then break its bytes: the size field, or bytes of the body (size fixed up or not)."""
    data = frame.encode()
    roll = rng.random()
    if roll < 0.3:
        size = rng.choice([0, 1, 7, 8, len(data) - 1, len(data) + 1, len(data) + 1000, 0x7FFFFFFF, 0xFFFFFFFF,
                           2 * 1024 * 1024])
        return struct.pack(">I", size) + data[4:], f"{frame.name}: size field {size:#x} (is {len(data)})"
    body, notes = mutate_bytes(rng, data[8:])
    if roll < 0.75:
        return struct.pack(">I", 8 + len(body)) + data[4:8] + body, f"{frame.name}: {'; '.join(notes)} (size fixed)"
    return data[:8] + body, f"{frame.name}: {'; '.join(notes)}"


# -- a conversation ------------------------------------------------------------------------------


def mutate_script(rng: random.Random, frames: list[Any]) -> tuple[list[Any], list[str]]:
    """Apply one to three structural mutations; some frames may come out already encoded (broken bytes)."""
    out: list[Any] = [amqp.copy_frame(f) for f in frames]
    notes: list[str] = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        if not out:
            out.append(amqp.open_())
        index = rng.randrange(len(out))
        target = out[index]
        roll = rng.random()
        if isinstance(target, Frame) and roll < 0.3:
            notes.append(mutate_field(rng, target))
        elif isinstance(target, Frame) and roll < 0.4:
            notes.append(mutate_nested(rng, target))
        elif isinstance(target, Frame) and roll < 0.5:
            notes.append(mutate_header(rng, target))
        elif isinstance(target, Frame) and roll < 0.62:
            out[index], note = encode_mutated(rng, target)
            notes.append(note)
        elif roll < 0.68:
            del out[index]
            notes.append(f"frame {index} dropped")
        elif roll < 0.78:
            times = rng.choice([1, 2, 3, 70, 1100, 3000])
            if isinstance(target, amqp.Wait):
                times = min(times, 2)
            times = max(1, min(times, REPEAT_BYTES // max(_size(target), 1)))
            copies = [amqp.copy_frame(target) for _ in range(times)]
            out[index + 1:index + 1] = copies
            notes.append(f"frame {index} repeated {times} more time(s)")
        elif roll < 0.86:
            other = rng.randrange(len(out))
            out[index], out[other] = out[other], out[index]
            notes.append(f"frames {index} and {other} swapped")
        elif roll < 0.92:
            moved = out.pop(index)
            place = rng.randint(0, len(out))
            out.insert(place, moved)
            notes.append(f"frame {index} moved to {place}")
        elif roll < 0.96:
            count = rng.choice([1, 5, 500])
            out[index:index] = [Frame(None) for _ in range(count)]
            notes.append(f"{count} empty frame(s) at {index}")
        elif roll < 0.97:
            size = rng.choice([1024 * 1024 + 1, 3 * 1024 * 1024 // 2, 4 * 1024 * 1024])
            if isinstance(target, Frame) and target.code == amqp.TRANSFER:
                target.payload = rng.randbytes(64) * (size // 64)
                notes.append(f"transfer payload of {size} bytes")
            elif isinstance(target, Frame):
                target.fields.append(b"\x00" * size)
                notes.append(f"{target.name}: a field of {size} bytes")
            else:
                notes.append("huge: nothing to grow")
        else:
            if isinstance(target, Frame) and target.code == amqp.TRANSFER:
                target.payload, payload_notes = mutate_bytes(rng, target.payload)
                notes.append("transfer payload: " + "; ".join(payload_notes))
            else:
                out.insert(index, Frame(amqp.TRANSFER, [values.value(rng) for _ in range(6)],
                                        payload=values.binary(rng)))
                notes.append(f"random transfer at {index}")
    return out, notes


def serialise(parts: list[Any]) -> list[Any]:
    """The script as writes and waits: consecutive frames and bytes joined into one ``bytes``."""
    segments: list[Any] = []
    run: list[bytes] = []  # joined once: adding to a bytes each time was quadratic in a repeated frame
    for part in parts:
        if isinstance(part, amqp.Wait):
            if run:
                segments.append(b"".join(run))
                run = []
            segments.append(part)
            continue
        run.append(part.encode() if isinstance(part, Frame) else part)
    if run:
        segments.append(b"".join(run))
    return segments


def _size(part: Any) -> int:
    """Encoded bytes of a script's part (0 for a wait, or a frame proton cannot encode)."""
    if isinstance(part, bytes):
        return len(part)
    try:
        return len(part.encode()) if isinstance(part, Frame) else 0
    except Exception:  # noqa: BLE001 - a mutated field: serialise falls back to valid frames
        return 0


def flatten(segments: list[Any]) -> bytes:
    return b"".join(s for s in segments if isinstance(s, bytes))


def chunks(rng: random.Random, data: bytes, bytewise: bool = False) -> list[bytes]:
    """How bytes are written: in random pieces, or (``bytewise``) the first 200 one at a time."""
    if bytewise:
        head = [data[i:i + 1] for i in range(min(200, len(data)))]
        return head + ([data[200:]] if len(data) > 200 else [])
    pieces, pos = [], 0
    while pos < len(data):
        step = rng.choice([1, 3, 8, 64, 1000, 65536])
        pieces.append(data[pos:pos + step])
        pos += step
        if len(pieces) > 400:
            pieces.append(data[pos:])
            break
    return pieces
