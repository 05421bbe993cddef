"""The journal's file format: checksummed records, appended; a torn tail is cut off, damage is skipped.

Each record is ``length (u32) | crc32 of type and body (u32) | type (u8) | body``,
little-endian, with ``length`` counting the type byte and the body.

A record that is incomplete or whose checksum fails is either a **torn tail**
(a crash in the middle of the last write: nothing intact follows it, its
last record is cut short, and nothing in it was acknowledged) or **damage**
(bit rot, a bad sector, a stray write: intact records follow it, or it is
the last record and all its bytes are there).  The reader tells them apart by
looking for the next intact record (``_resync``): first where the bad
record's own length says the next one starts (damage inside a record's body,
by far the most bytes), then by a scan for a plausible record head whose
checksum holds and whose successor is intact too (damage to a length).  A
tail is reported as ``Read.torn`` and may be cut; damage is reported as
``Read.damaged`` byte ranges, and the records after it are read on: nothing
intact is ever cut.  (A last record whose *length* was damaged looks like a
torn tail to this reader; ``journal.py``'s checkpoint of the bytes known to
be on disk tells those apart, and so does a clean stop.)

Record types and bodies:

- ``OPEN``: JSON ``{"node": id, "term": n, "format": 3, "file": token}``,
  first in every file written and first of every run that appends to a
  file.  ``format`` 2 and later writers follow each enqueue run that has
  messages with a ttl by an ``EXPIRY`` record; the runs of an earlier writer
  (no ``format``) carry their ttls only in the messages' headers.  ``format``
  3 writers give each file a random ``file`` token in its first ``OPEN``
  record, which names the file in the checkpoint beside it (``journal.py``);
- ``QUEUE``: u32 number, then JSON ``{"uuid", "name"}`` (later records name
  the queue by number);
- ``ENQUEUE_RUN``: u32 queue number, u32 count, then count u64 replication
  ids, count u32 message lengths, and the messages' bytes one after the
  other: the messages of one queue enqueued in one pass of the event loop
  (or a stretch of a compacted file).  One record, one checksum and a few
  array copies per run instead of a record each: a restarted node reads a
  million messages back several times faster;
- ``ENQUEUE``: u32 queue number, u64 replication id, the message's bytes
  (one message: what journals written before runs hold; still read);
- ``DEQUEUE``: u32 queue number, u32 count, then count pairs of u64 (lo, hi),
  closed ranges of ids;
- ``LINEAGE``: u32 queue number, JSON of the lineage's wire form
  (``lineage.py``);
- ``TERM``: JSON ``{"term": n}``: the highest term this node has seen;
- ``CLOSE``: empty: a clean shutdown (the last record of its run);
- ``EXPIRY``: u32 queue number, u32 count, then count pairs of u64 id and
  u32 ttl in milliseconds: the messages of the run just before that have a
  ttl (at a compaction, what was left of it).  A restarted node gives each
  its ttl again without reading a million headers for the few that have one;
- ``COUNTS``: u32 queue number, u32 count, then count pairs of u64 id and
  u32 delivery-count: journaled messages whose delivery failed (a delivery
  limit counts on after a restart); the last record for an id wins, and a
  compacted file has one for each live message with a count.  A reader that
  predates the record type stops there, as at a torn tail;
- ``MESSAGE_IDS``: u32 queue number, u32 count, then count entries of u64
  milliseconds since the epoch, u16 key length and the key: message-ids a
  deduplicating queue remembers (of durable messages only: a message lost at
  a restart must be taken again when its producer re-sends it); a compacted
  file has those still within the queue's window.
"""

from __future__ import annotations

import json
import mmap
import struct
import sys
import zlib
from array import array
import re
from itertools import accumulate
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Union

OPEN, QUEUE, ENQUEUE, DEQUEUE, LINEAGE, TERM, CLOSE, ENQUEUE_RUN, EXPIRY, COUNTS, MESSAGE_IDS = range(1, 12)
FORMAT = 3  # in OPEN records: runs are followed by EXPIRY records (2), a file's first OPEN names it (3)
KINDS = range(OPEN, MESSAGE_IDS + 1)
NAMES = {OPEN: "open", QUEUE: "queue", ENQUEUE: "enqueue", DEQUEUE: "dequeue", LINEAGE: "lineage", TERM: "term",
         CLOSE: "close", ENQUEUE_RUN: "enqueue run", EXPIRY: "expiry", COUNTS: "counts", MESSAGE_IDS: "message ids"}
_HEAD = struct.Struct("<IIB")
_NUMBER = struct.Struct("<I")
_ENQUEUE = struct.Struct("<IQ")
_ENQUEUE_HEAD = struct.Struct("<IIBIQ")  # _HEAD then _ENQUEUE
_RANGE = struct.Struct("<QQ")
_TTL = struct.Struct("<QI")
_RUN = struct.Struct("<II")
_SWAP = sys.byteorder != "little"  # arrays are in the machine's order, the file is little-endian
MAX_RECORD = 1 << 31
Buffer = Union[bytes, mmap.mmap]
_KIND_CRC = [zlib.crc32(bytes([kind])) for kind in range(256)]  # a record's checksum starts with its type byte


def record(kind: int, body: bytes) -> bytes:
    typed = bytes([kind]) + body
    return _HEAD.pack(len(typed), zlib.crc32(typed), kind) + body


def open_record(node: str, term: int, file: str | None = None) -> bytes:
    """``file``: the token of a new file (its first record), None for a run appending to a file."""
    fields: dict[str, Any] = {"node": node, "term": term, "format": FORMAT}
    if file is not None:
        fields["file"] = file
    return record(OPEN, json.dumps(fields).encode())


def queue_record(number: int, uuid: str, name: str) -> bytes:
    return record(QUEUE, _NUMBER.pack(number) + json.dumps({"uuid": uuid, "name": name}).encode())


def enqueue_record(number: int, msg_id: int, payload: bytes) -> bytes:
    typed_len = 1 + _ENQUEUE.size + len(payload)
    head = _ENQUEUE.pack(number, msg_id)
    crc = zlib.crc32(payload, zlib.crc32(head, zlib.crc32(bytes([ENQUEUE]))))
    return _HEAD.pack(typed_len, crc, ENQUEUE) + head + payload


def enqueue_run_record(number: int, ids: list[int], payloads: list[bytes]) -> bytes:
    """The messages of one queue, ``ids`` (increasing) with their ``payloads``, as one record."""
    id_array, lengths = array("Q", ids), array("I", map(len, payloads))
    if _SWAP:
        id_array.byteswap()
        lengths.byteswap()
    return record(ENQUEUE_RUN, b"".join([_RUN.pack(number, len(ids)), id_array.tobytes(), lengths.tobytes(),
                                         *payloads]))


def dequeue_record(number: int, ranges: Iterable[tuple[int, int]]) -> bytes:
    pairs = list(ranges)
    body = _NUMBER.pack(number) + _NUMBER.pack(len(pairs)) + b"".join(_RANGE.pack(lo, hi) for lo, hi in pairs)
    return record(DEQUEUE, body)


def expiry_record(number: int, ttls: list[tuple[int, int]]) -> bytes:
    """The ttls (id, milliseconds) of messages in the run before it."""
    return record(EXPIRY, _RUN.pack(number, len(ttls)) + b"".join(_TTL.pack(msg_id, ttl) for msg_id, ttl in ttls))


def counts_record(number: int, counts: list[tuple[int, int]]) -> bytes:
    """Delivery-counts (id, count) of journaled messages of queue ``number``."""
    return record(COUNTS, _RUN.pack(number, len(counts)) + b"".join(_TTL.pack(msg_id, count)
                                                                        for msg_id, count in counts))


_KEY = struct.Struct("<QH")


def message_ids_record(number: int, entries: list[tuple[bytes, int]]) -> bytes:
    """Remembered message-ids (key, ms since the epoch) of deduplicating queue ``number``."""
    return record(MESSAGE_IDS, _RUN.pack(number, len(entries)) + b"".join(_KEY.pack(ms, len(key)) + key
                                                                            for key, ms in entries))


def lineage_record(number: int, wire: list[list[Any]]) -> bytes:
    return record(LINEAGE, _NUMBER.pack(number) + json.dumps(wire).encode())


def term_record(term: int) -> bytes:
    return record(TERM, json.dumps({"term": term}).encode())


def close_record() -> bytes:
    return record(CLOSE, b"")


@dataclass
class Read:
    """What a reader found beside the records: where the intact part ends, and what was not intact."""

    valid_bytes: int = 0  # the end of the last intact record
    torn: bool = False  # the bytes after valid_bytes are not a whole, intact record, and nothing intact follows
    damaged: list[tuple[int, int]] = field(default_factory=list)  # [start, end) ranges skipped between intact records


def read_records(data: Buffer, result: Read) -> Iterator[tuple[int, Any]]:
    """Decoded intact records of ``data`` (a file's bytes, or its mmap), in order, past any damage, until the
    end or a torn tail (``result`` says which, and where damage was skipped).

    A restarted node reads a million messages here, so the file is walked by
    offsets: a run's ids, lengths and payloads are taken straight from
    ``data`` (the journal maps the file instead of reading it into memory
    first), and only the payloads become bytes objects of their own.
    """
    view = memoryview(data)
    try:
        yield from _walk(data, view, result)
    finally:
        view.release()  # an mmap cannot close while a view of it exists


def _walk(data: Buffer, view: memoryview, result: Read) -> Iterator[tuple[int, Any]]:
    end = len(data)
    offset = 0
    while offset < end:
        stop = yield from _intact_run(data, view, offset, result)
        if stop >= end:
            return
        resume = _resync(data, view, stop)
        if resume is None:
            whole = _whole_end(data, stop)
            if whole is not None:  # all its bytes are there, yet its checksum fails: damaged, not torn
                result.damaged.append((stop, whole))
            result.torn = whole != end
            return
        result.damaged.append((stop, resume))
        offset = resume


def _whole_end(data: Buffer, offset: int) -> int | None:
    """Where the record at ``offset`` ends if every byte its length names is in the file (None: it is cut
    short).  A write torn by a crash leaves its last record short (a file system that orders data before
    the size that covers it, as ext4 does, shows a prefix of an interrupted append); a record that is whole
    and still fails its checksum was damaged after it was written, acknowledged perhaps."""
    if len(data) - offset < _HEAD.size:
        return None
    (length,) = _NUMBER.unpack_from(data, offset)
    stop = offset + _HEAD.size + length - 1
    return stop if 1 <= length <= MAX_RECORD and stop <= len(data) else None


def _intact_run(data: Buffer, view: memoryview, offset: int, result: Read) -> Iterator[tuple[int, Any]]:
    """Intact records from ``offset`` on (the hot loop of a restart); returns where they stop."""
    end = len(data)
    # An enqueue record's head and fixed fields in one unpack: most records are enqueues.
    enqueue_head, enqueue_fields = _ENQUEUE_HEAD.unpack_from, _ENQUEUE_HEAD.size
    while offset < end:
        if end - offset >= enqueue_fields:
            length, crc, kind, number, msg_id = enqueue_head(data, offset)
            if kind == ENQUEUE:
                stop = offset + _HEAD.size + length - 1
                if 1 + _ENQUEUE.size <= length <= MAX_RECORD and stop <= end \
                        and zlib.crc32(view[offset + _HEAD.size:stop], _KIND_CRC[kind]) == crc:
                    payload = data[offset + enqueue_fields:stop]
                    offset = result.valid_bytes = stop
                    yield kind, (number, msg_id, payload)
                    continue
                return offset
        found = _record_at(data, view, offset)
        if found is None:
            return offset
        offset, kind, decoded = found
        result.valid_bytes = offset
        yield kind, decoded
    return offset


def _record_at(data: Buffer, view: memoryview, offset: int) -> tuple[int, int, Any] | None:
    """(where it ends, type, decoded body) of an intact record at ``offset``; None if there is none."""
    end = len(data)
    if end - offset < _HEAD.size:
        return None
    length, crc, kind = _HEAD.unpack_from(data, offset)
    start = offset + _HEAD.size
    stop = start + length - 1
    if length < 1 or length > MAX_RECORD or stop > end or zlib.crc32(view[start:stop], _KIND_CRC[kind]) != crc:
        return None
    try:
        if kind == ENQUEUE_RUN:
            decoded: Any = _decode_run(data, view, start, stop)
        else:
            decoded = _decode(kind, data[start:stop])
    except (ValueError, struct.error):
        return None
    return stop, kind, decoded


def _resync(data: Buffer, view: memoryview, bad: int) -> int | None:
    """Where intact records start again after the record at ``bad`` that is not intact; None: nowhere (a torn
    tail).

    First where that record's own length says the next one begins: bit rot in a record's body (nearly every
    byte of a journal) leaves its length as written.  Then a scan for a plausible head (a length that fits the
    file, a known type) whose checksum holds and that is followed by the end of the file or by another intact
    record: a payload can hold bytes that look like one record, hardly two in a row.
    """
    end = len(data)
    if end - bad >= _HEAD.size:
        (length,) = _NUMBER.unpack_from(data, bad)
        following = bad + _HEAD.size + length - 1
        if 1 <= length <= MAX_RECORD and following < end and _record_at(data, view, following) is not None:
            return following
    for match in _head_pattern(end).finditer(data, bad + 1):
        candidate = match.start()
        found = _record_at(data, view, candidate)
        if found is not None and (found[0] == end or _record_at(data, view, found[0]) is not None):
            return candidate
    return None


def _head_pattern(size: int) -> "re.Pattern[bytes]":
    """Bytes that may begin a record in a file of ``size`` bytes: its length's high bytes no larger than the
    file's, a known type at byte 8.  Found in C, so a scan over megabytes of payload is quick."""
    high = min(size, MAX_RECORD) >> 16
    top, third = high >> 8, high & 0xFF if high < 0x100 else 0xFF
    length = rb".." + (rb"[\x00-%s]" % _byte(third) if top == 0 else rb".") + rb"[\x00-%s]" % _byte(top)
    kind = rb"[%s-%s]" % (_byte(KINDS[0]), _byte(KINDS[-1]))
    return re.compile(rb"(?s)(?=" + length + rb"...." + kind + rb")")  # a lookahead: heads may overlap


def _byte(value: int) -> bytes:
    return b"\\x%02x" % value


def describe(data: Buffer, start: int, stop: int) -> str:
    """What the damaged bytes ``[start, stop)`` probably held, for the operator (their head may be damaged too)."""
    if stop - start < _HEAD.size:
        return f"{stop - start} bytes, no whole record head"
    length, _, kind = _HEAD.unpack_from(data, start)
    name = NAMES.get(kind)
    if name is None or start + _HEAD.size + length - 1 != stop:
        return f"{stop - start} bytes of records (their heads damaged too)"
    text = f"one {name} record of {stop - start} bytes"
    if kind in (ENQUEUE_RUN, DEQUEUE, EXPIRY, COUNTS, MESSAGE_IDS) and length - 1 >= _RUN.size:
        number, count = _RUN.unpack_from(data, start + _HEAD.size)
        text += f", queue number {number}, {count} {'ranges' if kind == DEQUEUE else 'entries'} (if intact)"
    elif kind in (ENQUEUE, LINEAGE, QUEUE) and length - 1 >= _NUMBER.size:
        (number,) = _NUMBER.unpack_from(data, start + _HEAD.size)
        text += f", queue number {number} (if intact)"
    return text


def _decode(kind: int, body: bytes) -> Any:
    if kind in (OPEN, TERM):
        return json.loads(body)
    if kind == QUEUE:
        (number,) = _NUMBER.unpack_from(body)
        return number, json.loads(body[_NUMBER.size:])
    if kind == ENQUEUE:
        number, msg_id = _ENQUEUE.unpack_from(body)
        return number, msg_id, body[_ENQUEUE.size:]
    if kind == DEQUEUE:
        number, count = struct.unpack_from("<II", body)
        if len(body) != 8 + count * _RANGE.size:
            raise ValueError("a dequeue record's ranges do not fill it")
        return number, [_RANGE.unpack_from(body, 8 + i * _RANGE.size) for i in range(count)]
    if kind == EXPIRY:
        number, count = _RUN.unpack_from(body)
        if len(body) != _RUN.size + count * _TTL.size:
            raise ValueError("an expiry record's pairs do not fill it")
        return number, list(_TTL.iter_unpack(body[_RUN.size:]))
    if kind == COUNTS:
        number, count = _RUN.unpack_from(body)
        if len(body) != _RUN.size + count * _TTL.size:
            raise ValueError("a counts record's pairs do not fill it")
        return number, list(_TTL.iter_unpack(body[_RUN.size:]))
    if kind == MESSAGE_IDS:
        number, count = _RUN.unpack_from(body)
        entries, at = [], _RUN.size
        for _ in range(count):
            ms, size = _KEY.unpack_from(body, at)
            at += _KEY.size
            if at + size > len(body):
                raise ValueError("a message-ids record's keys overrun it")
            entries.append((bytes(body[at:at + size]), ms))
            at += size
        if at != len(body):
            raise ValueError("a message-ids record's entries do not fill it")
        return number, entries
    if kind == LINEAGE:
        (number,) = _NUMBER.unpack_from(body)
        return number, json.loads(body[_NUMBER.size:])
    if kind == CLOSE:
        return None
    raise ValueError(f"unknown record type {kind}")


def _decode_run(data: Buffer, view: memoryview, start: int, stop: int) -> tuple[int, list[int], list[bytes]]:
    number, count = _RUN.unpack_from(data, start)
    ids_at = start + _RUN.size
    lengths_at = ids_at + 8 * count
    payloads_at = lengths_at + 4 * count
    if payloads_at > stop:
        raise ValueError("an enqueue run's ids and lengths do not fit it")
    ids, lengths = array("Q"), array("I")
    ids.frombytes(view[ids_at:lengths_at])
    lengths.frombytes(view[lengths_at:payloads_at])
    if _SWAP:
        ids.byteswap()
        lengths.byteswap()
    ends = list(accumulate(lengths, initial=payloads_at))
    if ends[-1] != stop:
        raise ValueError("an enqueue run's lengths do not add up to its bytes")
    return number, ids.tolist(), [data[first:last] for first, last in zip(ends, ends[1:])]
