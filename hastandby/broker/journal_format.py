"""The journal's file format: checksummed records, appended; a torn or corrupt tail is cut off.

Each record is ``length (u32) | crc32 of type and body (u32) | type (u8) | body``,
little-endian, with ``length`` counting the type byte and the body.  A reader
stops at the first record that is incomplete or whose checksum fails (a
crash in the middle of a write, or a corrupt tail): everything before it is
what the journal holds, and the node cuts the file there with a log line
instead of refusing to start.

Record types and bodies:

- ``OPEN``: JSON ``{"node": id, "term": n, "format": 2}``, first in every
  file written and first of every run that appends to a file.  ``format`` 2
  writers follow each enqueue run that has messages with a ttl by an
  ``EXPIRY`` record; the runs of an earlier writer (no ``format``) carry their
  ttls only in the messages' headers;
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
from itertools import accumulate
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Union

OPEN, QUEUE, ENQUEUE, DEQUEUE, LINEAGE, TERM, CLOSE, ENQUEUE_RUN, EXPIRY, COUNTS, MESSAGE_IDS = range(1, 12)
FORMAT = 2  # in OPEN records: this writer follows runs with EXPIRY records
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


def open_record(node: str, term: int) -> bytes:
    return record(OPEN, json.dumps({"node": node, "term": term, "format": FORMAT}).encode())


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
    """What a reader found: the records' decoded contents, and where the good part ends."""

    valid_bytes: int = 0
    torn: bool = False  # something after valid_bytes was not a whole, intact record


def read_records(data: Buffer, result: Read) -> Iterator[tuple[int, Any]]:
    """Decoded records of ``data`` (a file's bytes, or its mmap), in order, until the end or the first damaged
    one (``result`` says which).

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
    head = _HEAD.size
    # An enqueue record's head and fixed fields in one unpack: most records are enqueues.
    enqueue_head, enqueue_fields = _ENQUEUE_HEAD.unpack_from, _ENQUEUE_HEAD.size
    crc32, kind_crc = zlib.crc32, _KIND_CRC
    while offset < end:
        if end - offset >= enqueue_fields:
            length, crc, kind, number, msg_id = enqueue_head(data, offset)
        elif end - offset >= head:
            length, crc, kind = _HEAD.unpack_from(data, offset)
        else:
            result.torn = True
            return
        start = offset + head
        stop = start + length - 1
        if length < 1 or length > MAX_RECORD or stop > end or crc32(view[start:stop], kind_crc[kind]) != crc:
            result.torn = True
            return
        try:
            if kind == ENQUEUE and stop >= offset + enqueue_fields:
                decoded: Any = (number, msg_id, data[offset + enqueue_fields:stop])
            elif kind == ENQUEUE_RUN:
                decoded = _decode_run(data, view, start, stop)
            else:
                decoded = _decode(kind, data[start:stop])
        except (ValueError, struct.error):
            result.torn = True
            return
        offset = stop
        result.valid_bytes = offset
        yield kind, decoded


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
