"""Read and patch the few fields of an encoded AMQP 1.0 message the broker needs.

The broker keeps every message as the exact bytes its producer sent (decoding
and re-encoding each one with ``proton.Message`` costs about 3x throughput).
Routing needs at most the header's TTL, the properties' ``subject`` and ``to``;
redelivery needs to rewrite the header's ``delivery-count``.  These functions
decode only those sections, with proton's C codec, and only when asked.
"""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from typing import Any, Iterator

from proton import Data, Described, char, decimal32, decimal64, symbol, timestamp, uint, ulong

from hastandby.broker.errors import BrokerError

HEADER = 0x70  # section descriptor codes (AMQP 1.0 part 3.2)
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73

# A section starts with the descriptor 0x00 0x53 <code> (smallulong form),
# which is how every proton encoder writes it.  Public so that a hot path can
# skip even the call to ``header_ttl`` for the many messages without a header.
HEADER_PREFIX = b"\x00\x53\x70"
_EMPTY_LIST = 0x45

_HEADER_FIELDS = 5  # durable, priority, ttl, first-acquirer, delivery-count
MAX_SECTIONS = 16
"""Sections examined before the body at most: a well-formed message has five kinds
there (header, delivery and message annotations, properties, application
properties); a peer repeating one thousands of times gets an error, not a
loop over them."""


class MalformedMessage(BrokerError, ValueError):
    """The bytes of a transfer are not a sequence of AMQP message sections: the sender's delivery is rejected."""

    condition = "amqp:decode-error"
    status = 400


def _sections(buf: bytes) -> Iterator[tuple[int, Data]]:
    """Yield (section code, decoded section), at most MAX_SECTIONS of them.

    Each section is decoded in place from a view of the buffer: copying the
    rest of the message for every section made a message of many small
    sections cost time quadratic in its size.
    """
    view = memoryview(buf)
    pos = 0
    count = 0
    while pos < len(buf):
        count += 1
        if count > MAX_SECTIONS:
            raise MalformedMessage(f"more than {MAX_SECTIONS} sections before the body")
        data = Data()
        try:
            used = data.decode(view[pos:])
        except Exception as exc:  # proton raises DataException subclasses
            raise MalformedMessage(f"undecodable section at byte {pos}: {exc}") from exc
        if used <= 0:
            raise MalformedMessage(f"undecodable section at byte {pos}")
        data.rewind()
        data.next()
        try:
            value = data.get_object()
        except Exception as exc:  # proton decodes what Python cannot hold: a char past U+10FFFF
            raise MalformedMessage(f"undecodable section at byte {pos}: {exc}") from exc
        if not isinstance(value, Described):
            raise MalformedMessage(f"section at byte {pos} has no descriptor")
        yield int(value.descriptor), data
        pos += used


def _section_value(buf: bytes, code: int) -> list | None:
    for found, data in _sections(buf):
        if found == code:
            value = data.get_object().value
            return value if isinstance(value, list) else None
        if found > code:
            return None
    return None


def header_ttl(buf: bytes) -> int | None:
    """The header's ``ttl`` in milliseconds, or None; cheap when there is no header, and when the header is
    proton's usual one with no ttl (an empty list, or a list8 of fewer than three fields)."""
    if not buf.startswith(HEADER_PREFIX):
        return None
    if len(buf) > 5:
        kind = buf[3]
        if kind == _EMPTY_LIST or (kind == 0xC0 and buf[5] < 3):
            return None
    return header_durable_ttl(buf)[1]


def header_durable(buf: bytes) -> bool:
    """The header's ``durable`` flag (False without a header).

    A node with a journal asks this of every message on a durable queue, most
    of them not durable, so proton's usual encodings (an empty list, or a list8
    whose first field is null, false or true) are answered from one byte;
    anything else goes to ``header_durable_ttl``.
    """
    if not buf.startswith(HEADER_PREFIX):
        return False
    if len(buf) > 6:
        kind = buf[3]
        if kind == _EMPTY_LIST:  # the proton C clients' header when every field is the default
            return False
        if kind == 0xC0:
            first = buf[6] if buf[5] else 0x40  # no field: not durable
            if first == 0x41:
                return True
            if first == 0x40 or first == 0x42:
                return False
    return header_durable_ttl(buf)[0]


def header_durable_ttl(buf: bytes) -> tuple[bool, int | None]:
    """The header's ``durable`` flag and ``ttl`` (milliseconds or None) in one read: the journal keeps both."""
    if not buf.startswith(HEADER_PREFIX) or buf[3] == _EMPTY_LIST:
        return False, None
    fast = _read_header(buf)
    if fast is not None:
        return fast
    fields = _section_value(buf, HEADER) or []
    ttl = fields[2] if len(fields) > 2 else None
    return (bool(fields[0]) if fields else False), (int(ttl) if ttl else None)


def _read_header(buf: bytes) -> tuple[bool, int | None] | None:
    """(durable, ttl or None) read straight from the bytes, or None to decode the slow way.

    Every durable message has a header, and decoding it with proton's
    ``Data`` cost 35-48 us, twice per message on every node: over half of a
    node's time with durable messages (benchmarks/durable.py).  The header
    is a list whose first three fields (durable, priority, ttl) come in a
    few encodings (null, true/false, ubyte, uint0/smalluint/uint); those are
    read here, anything else goes to the decoder, which also judges what is
    malformed.
    """
    try:
        kind = buf[3]
        if kind == _EMPTY_LIST:
            return False, None
        if kind == 0xC0:  # list8: size, count
            count, at = buf[5], 6
        elif kind == 0xD0:  # list32: size, count
            count, at = int.from_bytes(buf[8:12], "big"), 12
        else:
            return None
        durable, ttl = False, None
        if count >= 1:
            code = buf[at]
            if code in (0x40, 0x42):  # null, false
                at += 1
            elif code == 0x41:  # true
                durable, at = True, at + 1
            elif code == 0x56:  # boolean with a value byte
                durable, at = buf[at + 1] != 0, at + 2
            else:
                return None
        if count >= 2:
            code = buf[at]
            if code == 0x40:
                at += 1
            elif code == 0x50:  # ubyte
                at += 2
            else:
                return None
        if count >= 3:
            code = buf[at]
            if code == 0x52:  # smalluint
                ttl = buf[at + 1] or None
            elif code == 0x70:  # uint
                if len(buf) < at + 5:
                    return None
                ttl = int.from_bytes(buf[at + 1:at + 5], "big") or None
            elif code not in (0x40, 0x43):  # null, uint0
                return None
        return durable, ttl
    except IndexError:
        return None


DEFAULT_PRIORITY = 4  # AMQP 1.0 part 3.2.1: a message without a priority has priority 4


def header_priority(buf: bytes) -> int:
    """The header's ``priority`` (0-255, a ubyte; 4 without one), read from the bytes; never raises.

    Only a priority queue asks, once per message it takes.  Proton's usual
    encodings (no header, an empty list, a list8 or list32 whose first field
    is null or a boolean and whose second is null or a ubyte) are read here;
    anything else goes to the decoder, and a header it cannot read counts as
    the default priority (every node reads the same bytes the same way, so
    a replica orders such a message exactly as its primary does).
    """
    if not buf.startswith(HEADER_PREFIX):
        return DEFAULT_PRIORITY
    try:
        kind = buf[3]
        if kind == _EMPTY_LIST:
            return DEFAULT_PRIORITY
        if kind == 0xC0:  # list8: size, count
            count, at = buf[5], 6
        elif kind == 0xD0:  # list32: size, count
            count, at = int.from_bytes(buf[8:12], "big"), 12
        else:
            count, at = -1, 0
        if count == 0 or count == 1:
            return DEFAULT_PRIORITY
        if count > 1:
            code = buf[at]
            if code in (0x40, 0x41, 0x42):  # null, true, false
                at += 1
            elif code == 0x56:  # boolean with a value byte
                at += 2
            else:
                at = -1
            if at > 0:
                code = buf[at]
                if code == 0x40:
                    return DEFAULT_PRIORITY
                if code == 0x50:  # ubyte
                    return buf[at + 1]
    except IndexError:
        pass
    try:
        fields = _section_value(buf, HEADER) or []
    except MalformedMessage:
        return DEFAULT_PRIORITY
    priority = fields[1] if len(fields) > 1 else None
    return DEFAULT_PRIORITY if not isinstance(priority, int) else max(0, min(255, int(priority)))


def with_annotations(buf: bytes, annotations: dict[Any, Any]) -> bytes:
    """Return the message with ``annotations`` (symbol keys) added to its message-annotations section.

    For the rare message that leaves its queue for a reason a consumer should
    read (dead-lettering): every other section keeps its bytes; the
    message-annotations section is decoded, updated and encoded again, or
    made and put where AMQP wants it (after the header and the delivery
    annotations).  A message whose sections cannot be read gets none.
    """
    view = memoryview(buf)
    pos = 0
    insert_at = 0
    old: dict[Any, Any] = {}
    end_old = None
    count = 0
    try:
        while pos < len(buf) and count < MAX_SECTIONS:
            count += 1
            data = Data()
            used = data.decode(view[pos:])  # type: ignore[arg-type]  # proton takes any buffer
            if used <= 0:
                return buf
            data.rewind()
            data.next()
            value = data.get_object()
            if not isinstance(value, Described):
                return buf
            code = int(value.descriptor)  # type: ignore[arg-type]  # a section's descriptor: a ulong
            if code in (HEADER, DELIVERY_ANNOTATIONS):
                insert_at = pos + used
            elif code == MESSAGE_ANNOTATIONS:
                old = dict(value.value or {})  # type: ignore[arg-type]  # a map (or null)
                insert_at, end_old = pos, pos + used
                break
            else:
                break
            pos += used
    except Exception:  # noqa: BLE001 - a producer's malformed message: sent on as it came
        return buf
    old.update(annotations)
    out = Data()
    out.put_object(Described(ulong(MESSAGE_ANNOTATIONS), old))
    return bytes(buf[:insert_at]) + bytes(out.encode()) + bytes(buf[end_old if end_old is not None else insert_at:])


def properties(buf: bytes) -> list:
    """The properties section's fields (message-id, user-id, to, subject, ...)."""
    return _section_value(buf, PROPERTIES) or []


def subject(buf: bytes) -> str | None:
    """The message subject, which exchanges route on."""
    fields = properties(buf)
    return str(fields[3]) if len(fields) > 3 and fields[3] is not None else None


def to_address(buf: bytes) -> str | None:
    """The properties' ``to``, which the anonymous relay routes on."""
    fields = properties(buf)
    return str(fields[2]) if len(fields) > 2 and fields[2] is not None else None


def with_delivery_count(buf: bytes, count: int) -> bytes:
    """Return the message with its header's delivery-count set to ``count``.

    Only redelivered messages pay for this; the rest of the bytes are kept
    as they are.  A header the decoder cannot read (accepted by the fast path,
    which reads only its first fields) leaves the message as it came.
    """
    fields: list = [None] * _HEADER_FIELDS
    rest = buf
    if buf.startswith(HEADER_PREFIX):
        try:
            data = Data()
            used = data.decode(bytes(buf))
            data.rewind()
            data.next()
            old = data.get_object().value
            fields[: len(old)] = old
        except Exception:  # noqa: BLE001 - a producer's malformed header: not ours to mend
            return buf
        rest = buf[used:]
    fields[4] = uint(count)
    out = Data()
    out.put_object(Described(ulong(HEADER), fields))
    return bytes(out.encode()) + bytes(rest)


# Section codes in the order AMQP puts them before the properties; each is skipped by its size.
_BEFORE_PROPERTIES = (HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS)


LONG_ID = 256
"""A message-id key longer than this (bytes) is kept as its SHA-256 digest: what a queue remembers, replicates
and journals stays small whatever a producer sends."""


def message_id_key(buf: bytes) -> bytes | None:
    """``_message_id_key``, with a long key replaced by ``#`` and its SHA-256 digest."""
    key = _message_id_key(buf)
    if key is not None and len(key) > LONG_ID:
        return b"#" + hashlib.sha256(key).digest()
    return key


def _message_id_key(buf: bytes) -> bytes | None:
    """The properties' ``message-id`` as a key (its AMQP type and value), or None if the message has none.

    A deduplicating queue asks this of every message it takes, so the common
    encodings are read straight from the bytes: the sections before the
    properties (header, delivery and message annotations, lists and maps) are
    skipped by their encoded sizes, and the id is the first field of the
    properties' list.  Equal ids give equal keys whatever width their
    encoding used (a ulong as smallulong or ulong, a string as str8 or
    str32): the key is a type byte (0x80 ulong, 0x98 uuid, 0xA0 binary, 0xA1
    string) and the value's bytes.  Anything else goes to the decoder; a
    message it cannot read has no key (it is never taken for a duplicate).
    """
    try:
        pos, end = 0, len(buf)
        while pos + 3 < end and buf[pos] == 0 and buf[pos + 1] == 0x53:
            code, kind = buf[pos + 2], buf[pos + 3]
            if code == PROPERTIES:
                key = _fast_id(buf, pos + 3, kind)
                return _slow_id(buf) if key is False or key is True else key
            if code not in _BEFORE_PROPERTIES:
                return None  # past where the properties would be: none
            if kind == 0x40 or kind == _EMPTY_LIST:  # null, list0
                pos += 4
            elif kind in (0xC0, 0xC1):  # list8, map8: size byte
                pos += 5 + buf[pos + 4]
            elif kind in (0xD0, 0xD1):  # list32, map32: four size bytes
                pos += 8 + int.from_bytes(buf[pos + 4:pos + 8], "big")
            else:
                return _slow_id(buf)
        return None if pos >= end or buf[pos] == 0 else _slow_id(buf)
    except IndexError:
        return _slow_id(buf)


def _fast_id(buf: bytes, at: int, kind: int) -> bytes | None | bool:
    """The key of a properties list starting at ``at`` (its constructor ``kind``); False: ask the decoder."""
    if kind == _EMPTY_LIST or kind == 0x40:
        return None
    if kind == 0xC0:
        count, at = buf[at + 2], at + 3
    elif kind == 0xD0:
        count, at = int.from_bytes(buf[at + 5:at + 9], "big"), at + 9
    else:
        return False
    if count == 0:
        return None
    code = buf[at]
    if code == 0x40:  # null
        return None
    if code == 0x44:  # ulong0
        return b"\x80" + bytes(8)
    if code == 0x53:  # smallulong
        return b"\x80" + bytes(7) + buf[at + 1:at + 2]
    if code == 0x80 and len(buf) >= at + 9:  # ulong
        return b"\x80" + buf[at + 1:at + 9]
    if code == 0x98 and len(buf) >= at + 17:  # uuid
        return b"\x98" + buf[at + 1:at + 17]
    if code in (0xA0, 0xA1):  # vbin8, str8
        size = buf[at + 1]
        if len(buf) >= at + 2 + size:
            return bytes((code,)) + buf[at + 2:at + 2 + size]
    elif code in (0xB0, 0xB1):  # vbin32, str32
        size = int.from_bytes(buf[at + 1:at + 5], "big")
        if len(buf) >= at + 5 + size:
            return bytes((code - 0x10,)) + buf[at + 5:at + 5 + size]
    return False


def _slow_id(buf: bytes) -> bytes | None:
    """``message_id_key`` by the decoder, for encodings the fast path does not read."""
    try:
        for code, data in _sections(buf):
            if code == PROPERTIES:
                fields = data.get_object().value  # type: ignore[union-attr]  # _sections yields described values
                value = fields[0] if isinstance(fields, list) and fields else None
                return _id_key(bytes(value) if isinstance(value, memoryview) else value)  # read while data lives
            if code > PROPERTIES:
                return None
    except MalformedMessage:
        return None
    return None


def _id_key(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, uuidlib.UUID):
        return b"\x98" + value.bytes
    if isinstance(value, bool):
        return None
    if isinstance(value, int):  # ulong (proton gives an int subclass)
        return b"\x80" + int(value).to_bytes(8, "big") if 0 <= value < 2**64 else None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"\xa0" + bytes(value)
    if isinstance(value, str):
        return b"\xa1" + value.encode("utf-8", "surrogatepass")
    return None


APPLICATION_PROPERTIES = 0x74
_BEFORE_APPLICATION_PROPERTIES = (HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES)
_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}  # a constructor's high nibble -> value bytes
_SIGNED = frozenset((0x51, 0x54, 0x55, 0x61, 0x71, 0x81))  # byte, smallint, smalllong, short, int, long
_INTEGERS = frozenset((0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x60, 0x61, 0x70, 0x71, 0x80, 0x81))


def _value_end(buf: bytes, at: int) -> int:
    """Where the encoded value whose constructor is at ``at`` ends; -1 for a described value (the decoder's)."""
    code = buf[at]
    high = code >> 4
    width = _FIXED_WIDTH.get(high)
    if width is not None:
        return at + 1 + width
    if high in (0xA, 0xC, 0xE):
        return at + 2 + buf[at + 1]
    if high in (0xB, 0xD, 0xF):
        return at + 5 + int.from_bytes(buf[at + 1:at + 5], "big")
    return -1


def _encoded_value_key(buf: bytes, at: int, end: int) -> bytes:
    """The key of the simple value encoded at ``buf[at:end]``: equal values give equal keys whatever width their
    encoding used (``_property_value_key`` gives the same for a decoded value)."""
    code = buf[at]
    if code in (0xA0, 0xA1, 0xA3):
        return bytes((code,)) + buf[at + 2:end]
    if code in (0xB0, 0xB1, 0xB3):
        return bytes((code - 0x10,)) + buf[at + 5:end]
    if code in _INTEGERS:
        return b"I" + str(int.from_bytes(buf[at + 1:end], "big", signed=code in _SIGNED)).encode()
    if code in (0x43, 0x44):  # uint0, ulong0
        return b"I0"
    if code == 0x41 or (code == 0x56 and buf[at + 1]):
        return b"B1"
    if code == 0x42 or code == 0x56:
        return b"B0"
    return b"=" + buf[at:end]  # a uuid, timestamp, float, char...: one encoding each


def _property_value_key(value: Any) -> bytes | None:
    """``_encoded_value_key`` of a value proton decoded."""
    if value is None:
        return None
    if isinstance(value, bool):
        return b"B1" if value else b"B0"
    if isinstance(value, symbol):
        return b"\xa3" + value.encode("ascii", "surrogateescape")
    if isinstance(value, char):
        pass
    elif isinstance(value, str):
        return b"\xa1" + value.encode("utf-8", "surrogatepass")
    if isinstance(value, int) and not isinstance(value, timestamp):
        return b"I" + str(int(value)).encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"\xa0" + bytes(value)
    data = Data()
    data.put_object(value)
    return b"=" + bytes(data.encode())


def application_property_key(buf: bytes, name: bytes) -> bytes | None:
    """The value of application property ``name`` (its UTF-8 bytes) as a key, or None if the message has none.

    A last-value queue asks this of every message it takes, so the usual
    encodings are read straight from the bytes: the sections before the
    application properties are skipped by their sizes and the map's entries
    scanned (string keys, simple values, skipped by their widths), nothing
    decoded.  Equal values give equal keys whatever width their encoding
    used (the string ``"7"`` and the int 7 differ; a long 7 and a small int 7
    do not); a key longer than ``LONG_ID`` is its SHA-256 digest.  Anything
    the scan cannot read goes to the decoder; a message it cannot read has no
    key.  Never raises.
    """
    key = _application_property_key(buf, name)
    if key is not None and len(key) > LONG_ID:
        return b"#" + hashlib.sha256(key).digest()
    return key


def _application_property_key(buf: bytes, name: bytes) -> bytes | None:
    try:
        pos, end = 0, len(buf)
        while pos + 3 < end and buf[pos] == 0 and buf[pos + 1] == 0x53:
            code, kind = buf[pos + 2], buf[pos + 3]
            if code == APPLICATION_PROPERTIES:
                if kind == 0xC1:
                    count, at = buf[pos + 5], pos + 6
                elif kind == 0xD1:
                    count, at = int.from_bytes(buf[pos + 8:pos + 12], "big"), pos + 12
                elif kind == 0x40:
                    return None
                else:
                    return _slow_property(buf, name)
                size = len(name)
                for _ in range(count // 2):
                    kcode = buf[at]
                    if kcode == 0xA1:
                        kstart, kend = at + 2, at + 2 + buf[at + 1]
                    elif kcode == 0xB1:
                        kstart = at + 5
                        kend = kstart + int.from_bytes(buf[at + 1:at + 5], "big")
                    else:
                        return _slow_property(buf, name)
                    vend = _value_end(buf, kend)
                    if vend < 0 or vend > end:
                        return _slow_property(buf, name)
                    if kend - kstart == size and buf[kstart:kend] == name:
                        return None if buf[kend] == 0x40 else _encoded_value_key(buf, kend, vend)
                    at = vend
                return None
            if code not in _BEFORE_APPLICATION_PROPERTIES:
                return None  # past where the application properties would be: none
            if kind == 0x40 or kind == _EMPTY_LIST:
                pos += 4
            elif kind in (0xC0, 0xC1):
                pos += 5 + buf[pos + 4]
            elif kind in (0xD0, 0xD1):
                pos += 8 + int.from_bytes(buf[pos + 4:pos + 8], "big")
            else:
                return _slow_property(buf, name)
        return None if pos >= end or buf[pos] == 0 else _slow_property(buf, name)
    except IndexError:
        return _slow_property(buf, name)


def _slow_property(buf: bytes, name: bytes) -> bytes | None:
    """``application_property_key`` by the decoder, for encodings the scan does not read."""
    try:
        wanted = name.decode("utf-8", "surrogatepass")
        for code, data in _sections(buf):
            if code == APPLICATION_PROPERTIES:
                found = data.get_object().value  # type: ignore[union-attr]  # _sections yields described values
                if not isinstance(found, dict):
                    return None
                for key, value in found.items():
                    if isinstance(key, str) and key == wanted:
                        return _property_value_key(bytes(value) if isinstance(value, memoryview) else value)
                return None
            if code > APPLICATION_PROPERTIES:
                return None
    except Exception:  # noqa: BLE001 - a producer's malformed message: it has no key
        return None
    return None


# -- scheduled delivery (docs/queues.md "Scheduled delivery") ----------------------------------------

DELIVERY_TIME = symbol("x-opt-delivery-time")  # message annotations, as ActiveMQ Artemis reads them (ms since the epoch)
DELIVERY_DELAY = symbol("x-opt-delivery-delay")  # (ms from when the primary takes the message)
SCHEDULE_MARK = b"x-opt-delivery-"
"""What both annotations' keys start with.  The hot path asks ``may_be_scheduled``: only a message whose
message annotations hold it is decoded."""
MAX_DELIVERY_TIME = 2**63 - 1  # a signed 64-bit number of milliseconds, as Artemis and JMS keep it


class BadSchedule(BrokerError):
    """A delivery time or delay the node cannot honour: the producer's transfer is rejected, nothing enqueued."""

    condition = "amqp:invalid-field"
    status = 400


def _annotations_span(buf: bytes) -> tuple[int, int] | None | bool:
    """Where the message-annotations section lies, (start, end), read from the sizes of the sections before
    it; None if the message has none; False if the encodings ask for the decoder."""
    try:
        pos, end = 0, len(buf)
        while pos + 3 < end and buf[pos] == 0 and buf[pos + 1] == 0x53:
            code, kind = buf[pos + 2], buf[pos + 3]
            if kind == 0x40 or kind == _EMPTY_LIST:  # null, list0
                size = 4
            elif kind in (0xC0, 0xC1):  # list8, map8: a size byte
                size = 5 + buf[pos + 4]
            elif kind in (0xD0, 0xD1):  # list32, map32: four size bytes
                size = 8 + int.from_bytes(buf[pos + 4:pos + 8], "big")
            else:
                return False
            if code == MESSAGE_ANNOTATIONS:
                return pos, min(pos + size, end)
            if code not in (HEADER, DELIVERY_ANNOTATIONS):
                return None  # past where the message annotations would be: none
            pos += size
        return None if pos >= end else False
    except IndexError:
        return False


_EMPTY_HEADER = HEADER_PREFIX + bytes([_EMPTY_LIST])
_LIST8_HEADER = HEADER_PREFIX + b"\xc0"
_PAST_ANNOTATIONS = tuple(b"\x00\x53" + bytes([code]) for code in range(0x73, 0x79))  # properties .. footer
_USUAL_HEADERS = (b"", _EMPTY_HEADER, _LIST8_HEADER + b"\x02\x01\x41", _LIST8_HEADER + b"\x02\x01\x42")
NO_SCHEDULE_PREFIXES = tuple(header + section for header in _USUAL_HEADERS for section in _PAST_ANNOTATIONS)
"""A message that starts with one of these (no header, proton's header with every field the default, or
one saying only durable true or false; then a section after the annotations) has no message annotations:
the hot path's first question, one ``bytes.startswith`` in C, before it calls ``may_be_scheduled``."""


def may_be_scheduled(buf: bytes) -> bool:
    """Could this message ask for a delivery time?  Asked of every message: it reads where the message
    annotations would start (after the header, in its usual encodings) and searches nothing unless they
    are there, so a message without them costs a few byte comparisons whatever its body holds (searching
    the whole message cost more than the rest of an enqueue when the body was full of ``x``).  Never wrong
    the unsafe way: anything unusual goes to ``mentions_schedule``."""
    if buf.startswith(NO_SCHEDULE_PREFIXES):
        return False
    if buf.startswith(_LIST8_HEADER) and len(buf) > 4 and buf.startswith(_PAST_ANNOTATIONS, 5 + buf[4]):
        return False  # a header with fields (durable, priority, ttl), then a section after the annotations
    return mentions_schedule(buf)


def mentions_schedule(buf: bytes) -> bool:
    """Does the message-annotations section hold ``SCHEDULE_MARK``?  Only the annotations are searched,
    not the body.  Never wrong the unsafe way: a message whose sections cannot be measured is searched
    whole."""
    span = _annotations_span(buf)
    if span is None:
        return False
    if span is False or span is True:
        return SCHEDULE_MARK in buf
    return SCHEDULE_MARK in buf[span[0]:span[1]]


def _message_annotations(buf: bytes) -> dict | None:
    """The message annotations decoded (None without any, or unreadable)."""
    span = _annotations_span(buf)
    if span is None:
        return None
    try:
        if span is False or span is True:
            for code, data in _sections(buf):
                if code == MESSAGE_ANNOTATIONS:
                    value = data.get_object().value  # type: ignore[union-attr]  # a described section
                    return value if isinstance(value, dict) else None
                if code > MESSAGE_ANNOTATIONS:
                    return None
            return None
        data = Data()
        if data.decode(memoryview(buf)[span[0]:span[1]]) <= 0:  # type: ignore[arg-type]  # proton takes a buffer
            return None
        data.rewind()
        data.next()
        value = data.get_object()
    except Exception:  # noqa: BLE001 - a producer's malformed section: no annotations we can read
        return None
    found = value.value if isinstance(value, Described) else None
    return found if isinstance(found, dict) else None


def _schedule_values(buf: bytes) -> tuple[Any, Any]:
    """The raw values of ``x-opt-delivery-time`` and ``x-opt-delivery-delay`` (None when absent); symbol keys only."""
    annotations = _message_annotations(buf)
    if not annotations:
        return None, None
    when = delay = None
    for key, value in annotations.items():
        if isinstance(key, symbol):
            if key == DELIVERY_TIME:
                when = value
            elif key == DELIVERY_DELAY:
                delay = value
    return when, delay


def _whole_ms(value: Any) -> int | None:
    """An integer annotation value (any AMQP integer type, a timestamp too), or None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int) or isinstance(value, (decimal32, decimal64)):
        return None
    return int(value)


def schedule_request(buf: bytes) -> tuple[int | None, int | None]:
    """What the producer asked: (delivery time, delay) in milliseconds, each None when absent (or null).

    Raises ``BadSchedule`` for a value that is not a whole number (a string, a float, a boolean...), a
    negative one, or one past a signed 64-bit millisecond count: a producer's mistake is refused, not
    guessed at (docs/queues.md).  The primary asks once per message that mentions the annotations.
    """
    when, delay = _schedule_values(buf)
    found: list[int | None] = []
    for name, value in ((DELIVERY_TIME, when), (DELIVERY_DELAY, delay)):
        if value is None:
            found.append(None)
            continue
        number = _whole_ms(value)
        what = "a time in milliseconds since the epoch" if name == DELIVERY_TIME else "a delay in milliseconds"
        if number is None or not 0 <= number <= MAX_DELIVERY_TIME:
            kind = type(value).__name__
            raise BadSchedule(f"message annotation {name} must be {what}: a whole number from 0 to "
                              f"{MAX_DELIVERY_TIME}, got {value!r} ({kind})")
        found.append(number)
    return found[0], found[1]


_DUE_ENTRY = b"\xa3\x13x-opt-delivery-time\x81"  # the key as a sym8, then a long: what proton encodes


def with_due_time(buf: bytes, when: int) -> bytes:
    """The message with ``x-opt-delivery-time: when`` added to its message annotations (which lack it).

    What every delayed message goes through on the primary, so the entry is appended to the map in its
    bytes (its size and count updated), the bytes ``with_annotations`` would give for the usual map8 and
    map32 encodings; anything else goes to ``with_annotations``."""
    span = _annotations_span(buf)
    if isinstance(span, tuple):
        start, end = span
        kind = buf[start + 3]
        entry = _DUE_ENTRY + when.to_bytes(8, "big", signed=True)
        if kind == 0xD1 and end - start >= 12:
            size = int.from_bytes(buf[start + 4:start + 8], "big")
            count = int.from_bytes(buf[start + 8:start + 12], "big")
            if start + 8 + size == end:
                head = (size + len(entry)).to_bytes(4, "big") + (count + 2).to_bytes(4, "big")
                return _known_due(b"".join((buf[:start + 4], head, buf[start + 12:end], entry, buf[end:])), when)
        elif kind == 0xC1 and end - start >= 6:
            size, count = buf[start + 4], buf[start + 5]
            if start + 5 + size == end and size + len(entry) <= 255 and count + 2 <= 255:
                head = bytes((size + len(entry), count + 2))
                return _known_due(b"".join((buf[:start + 4], head, buf[start + 6:end], entry, buf[end:])), when)
    return with_annotations(buf, {DELIVERY_TIME: when})


def due_time(buf: bytes) -> int | None:
    """The message's ``x-opt-delivery-time`` (ms since the epoch), or None; never raises.

    What a queue holds a message back by, on every node: the primary turned a delay into this absolute
    time (``with_annotations``) before the message reached any queue, so a backup, a DR replica and a
    restarted node read the same time from the same bytes, whenever they get them.
    """
    global _last_due
    last, known = _last_due
    if buf is last:
        return known
    when, _ = _schedule_values(buf)
    number = _whole_ms(when) if when is not None else None
    found = number if number is not None and 0 <= number <= MAX_DELIVERY_TIME else None
    _last_due = (buf, found)
    return found


_last_due: tuple[bytes | None, int | None] = (None, None)


def _known_due(buf: bytes, when: int) -> bytes:
    """``buf``, whose due time ``with_due_time`` just wrote: ``due_time`` answers it without a decode."""
    global _last_due
    _last_due = (buf, when)
    return buf
"""The last message ``due_time`` read, and what it found: the same bytes are asked again on their way to a
queue (the registry's check of the rewritten message, then the queue's keeper), and decoding their
annotations is most of what a scheduled message costs.  Bytes do not change, and the reference keeps the
object alive, so ``is`` cannot match another message."""
