"""AMQP 1.0 frames built with proton's codec, and read back: what the frame fuzzer starts from.

A ``Frame`` is one frame as fields (channel, performative code, its field
list, a payload for transfers), so a mutation can change one field and
encode again, or encode first and change bytes.  ``SCRIPTS`` are valid
conversations a client has with a node after SASL (a producer, a consumer,
a management request, a browser, a dynamic receiver, everything on two
sessions): each was checked against a live node to do what it says (the
``frames`` kind's self-test sends them unmutated first).

Field layouts are those of the AMQP 1.0 specification, part 2.7 (performatives)
and 3.5 (source, target, outcomes); ``SASL_*`` are part 5.3.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from proton import Data, Described, Message, symbol, ubyte, uint, ulong, ushort

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
PERFORMATIVES = {OPEN: "open", BEGIN: "begin", ATTACH: "attach", FLOW: "flow", TRANSFER: "transfer",
                 DISPOSITION: "disposition", DETACH: "detach", END: "end", CLOSE: "close"}
SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)
ERROR = 0x1D
RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED = 0x23, 0x24, 0x25, 0x26, 0x27
SOURCE, TARGET = 0x28, 0x29
DELETE_ON_CLOSE = 0x2B
SENDER, RECEIVER = False, True


@dataclass
class Frame:
    """One frame: ``code`` None is an empty (heartbeat) frame; ``kind`` 1 is a SASL frame."""

    code: int | None
    fields: list[Any] = field(default_factory=list)
    channel: int = 0
    payload: bytes = b""
    kind: int = 0
    doff: int = 2

    def encode(self) -> bytes:
        body = b""
        if self.code is not None:
            data = Data()
            data.put_object(Described(ulong(self.code), self.fields))
            body = bytes(data.encode())
        extended = b"\x00" * (self.doff * 4 - 8) if self.doff >= 2 else b""
        size = 8 + len(extended) + len(body) + len(self.payload)
        return struct.pack(">IBBH", size, self.doff, self.kind, self.channel) + extended + body + self.payload

    @property
    def name(self) -> str:
        if self.code is None:
            return "empty"
        return PERFORMATIVES.get(self.code) or f"0x{self.code:x}"


@dataclass(frozen=True)
class Wait:
    """In a script: read until the node sends this performative (a real client waits for its begin,
    attach and flow before it transfers; proton refuses transfers beyond a window it has not opened)."""

    code: int

    @property
    def name(self) -> str:
        return f"wait for {PERFORMATIVES.get(self.code, hex(self.code))}"


def encode_value(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def split_frames(data: bytes) -> tuple[list[bytes], bytes]:
    """Whole frames off the front of ``data`` (by their size field) and what is left."""
    frames, pos = [], 0
    while len(data) - pos >= 8:
        (size,) = struct.unpack_from(">I", data, pos)
        if size < 8 or len(data) - pos < size:
            break
        frames.append(data[pos:pos + size])
        pos += size
    return frames, data[pos:]


def decode_frame(frame: bytes) -> tuple[int | None, Any]:
    """(performative code, its fields) of one encoded frame; (None, None) when empty or undecodable."""
    if len(frame) < 8:
        return None, None
    doff = frame[4]
    body = frame[doff * 4:]
    if not body:
        return None, None
    data = Data()
    try:
        data.decode(body)
        value = data.get_object()
    except Exception:  # noqa: BLE001 - proton's decoder raises its own and Python's errors on a mutated frame
        return None, None
    if isinstance(value, Described):
        try:
            return int(value.descriptor), value.value
        except (TypeError, ValueError):
            return None, value
    return None, value


def error(condition: str, description: str = "") -> Described:
    return Described(ulong(ERROR), [symbol(condition), description, None])


def condition_of(code: int | None, fields: Any) -> str | None:
    """The error condition a detach, end or close (or a rejected disposition) carries, if any."""
    if not isinstance(fields, list):
        return None
    candidates: list[Any] = []
    if code == DETACH and len(fields) > 2:
        candidates.append(fields[2])
    elif code in (END, CLOSE) and fields:
        candidates.append(fields[0])
    elif code == DISPOSITION and len(fields) > 4:
        state = fields[4]
        if isinstance(state, Described) and isinstance(state.value, list) and state.value:
            candidates.append(state.value[0])
    for candidate in candidates:
        if isinstance(candidate, Described) and isinstance(candidate.value, list) and candidate.value:
            return str(candidate.value[0])
    return None


# -- performatives -------------------------------------------------------------------------


def open_(container: str = "fuzz", hostname: str | None = "127.0.0.1", max_frame: int = 65536,
          properties: dict | None = None) -> Frame:
    return Frame(OPEN, [container, hostname, uint(max_frame), ushort(32767), None, None, None, None, None,
                        properties])


def begin(channel: int = 0) -> Frame:
    return Frame(BEGIN, [None, uint(0), uint(2**31 - 1), uint(2**31 - 1), uint(1023)], channel=channel)


def source(address: str | None, dynamic: bool = False, copy: bool = False) -> Described:
    fields: list[Any] = [address, uint(0), symbol("session-end"), uint(0), dynamic]
    if copy:
        fields += [None, symbol("copy")]
    return Described(ulong(SOURCE), fields)


def target(address: str | None) -> Described:
    return Described(ulong(TARGET), [address, uint(0), symbol("session-end"), uint(0), False])


def attach(name: str, handle: int, role: bool, address: str | None, channel: int = 0, dynamic: bool = False,
           copy: bool = False, properties: dict | None = None) -> Frame:
    src = source(None if role == SENDER else address, dynamic=dynamic, copy=copy)
    tgt = target(address if role == SENDER else None)
    return Frame(ATTACH, [name, uint(handle), role, ubyte(2), ubyte(0), src, tgt, None, False,
                          uint(0) if role == SENDER else None, None, None, None, properties], channel=channel)


def flow(handle: int | None, credit: int, next_incoming: int = 0, channel: int = 0, drain: bool = False) -> Frame:
    fields: list[Any] = [uint(next_incoming), uint(2**31 - 1), uint(0), uint(2**31 - 1)]
    if handle is not None:
        fields += [uint(handle), uint(0), uint(credit), None, drain]
    return Frame(FLOW, fields, channel=channel)


def transfer(handle: int, delivery_id: int, tag: bytes, payload: bytes, settled: bool = False, more: bool = False,
             channel: int = 0) -> Frame:
    return Frame(TRANSFER, [uint(handle), uint(delivery_id), tag, uint(0), settled, more], channel=channel,
                 payload=payload)


def outcome(code: int = ACCEPTED, fields: list | None = None) -> Described:
    return Described(ulong(code), fields or [])


def disposition(first: int, last: int | None = None, role: bool = RECEIVER, settled: bool = True,
                state: Described | None = None, channel: int = 0) -> Frame:
    return Frame(DISPOSITION, [role, uint(first), uint(last if last is not None else first), settled,
                               state if state is not None else outcome()], channel=channel)


def detach(handle: int, closed: bool = True, channel: int = 0, err: Described | None = None) -> Frame:
    return Frame(DETACH, [uint(handle), closed, err], channel=channel)


def end(channel: int = 0) -> Frame:
    return Frame(END, [], channel=channel)


def close() -> Frame:
    return Frame(CLOSE, [])


def message(body: Any = "fuzz", address: str | None = None, reply_to: str | None = None,
            properties: dict | None = None, message_id: Any = None, durable: bool = False) -> bytes:
    msg = Message(body=body, address=address, reply_to=reply_to, properties=properties, id=message_id,
                  durable=durable)
    return bytes(msg.encode())


# -- SASL ---------------------------------------------------------------------------------------


def sasl_init(mechanism: str, response: bytes | None, hostname: str | None = "127.0.0.1") -> Frame:
    return Frame(SASL_INIT, [symbol(mechanism), response, hostname], kind=1)


def sasl_response(response: bytes) -> Frame:
    return Frame(SASL_RESPONSE, [response], kind=1)


def plain(user: str, password: str) -> bytes:
    return f"\0{user}\0{password}".encode()


# -- scripts: valid conversations after SASL -----------------------------------------------------

Script = list[Any]  # Frame, raw bytes, or Wait


def producer(queue: str, count: int = 3) -> Script:
    frames = [open_(), begin(), attach("fz-sender", 0, SENDER, queue), Wait(FLOW)]
    frames += [transfer(0, i, b"%d" % i, message(f"fz-{i}")) for i in range(count)]
    return frames + [Wait(DISPOSITION), detach(0), end(), close()]


def consumer(queue: str, count: int = 3) -> Script:
    frames = [open_(), begin(), attach("fz-receiver", 0, RECEIVER, queue), flow(0, count), Wait(TRANSFER)]
    frames += [disposition(i) for i in range(count)]
    return frames + [detach(0), end(), close()]


def browser(queue: str) -> Script:
    return [open_(), begin(), attach("fz-browser", 0, RECEIVER, queue, copy=True), flow(0, 100, drain=True),
            detach(0), end(), close()]


def management(reply_to: str, operation: str = "QUERY") -> Script:
    request = message({}, address="$management", reply_to=reply_to, message_id="fz-1",
                      properties={"operation": operation, "type": "", "name": ""})
    return [open_(), begin(), attach("fz-mgmt", 0, SENDER, "$management"), Wait(FLOW), transfer(0, 0, b"m", request),
            Wait(DISPOSITION), detach(0), end(), close()]


def dynamic(count: int = 1) -> Script:
    return [open_(), begin(), attach("fz-dynamic", 0, RECEIVER, None, dynamic=True), flow(0, count),
            detach(0), end(), close()]


def two_sessions(queue: str) -> Script:
    return [open_(), begin(0), begin(1), attach("fz-s0", 0, SENDER, queue, channel=0),
            attach("fz-s1", 0, RECEIVER, queue, channel=1), flow(0, 5, channel=1), Wait(FLOW),
            transfer(0, 0, b"a", message("fz-a"), channel=0), transfer(0, 1, b"b", message("fz-b"), settled=True),
            disposition(0, channel=1), detach(0, channel=0), detach(0, channel=1), end(0), end(1), close()]


def relay(queue: str) -> Script:
    """The anonymous relay: a sender without a target address, each message naming its queue."""
    frames = [open_(), begin(), attach("fz-relay", 0, SENDER, None), Wait(FLOW)]
    frames += [transfer(0, i, b"r%d" % i, message(f"fz-r{i}", address=queue)) for i in range(2)]
    return frames + [Wait(DISPOSITION), detach(0), end(), close()]


def multi_frame(queue: str) -> Script:
    """One message in several transfer frames (``more``), then an aborted one."""
    payload = message("x" * 3000)
    parts = [payload[i:i + 1000] for i in range(0, len(payload), 1000)]
    frames = [open_(), begin(), attach("fz-multi", 0, SENDER, queue), Wait(FLOW)]
    frames.append(transfer(0, 0, b"m0", parts[0], more=True))
    frames += [Frame(TRANSFER, [uint(0), None, None, None, None, i < len(parts) - 1], payload=part)
               for i, part in enumerate(parts[1:], start=1)]
    frames.append(transfer(0, 1, b"m1", parts[0], more=True))
    frames.append(Frame(TRANSFER, [uint(0), None, None, None, None, False, None, None, None, True]))
    return frames + [Wait(DISPOSITION), detach(0), end(), close()]


def scripts(queue: str, reply_to: str) -> dict[str, Callable[[], Script]]:
    return {
        "producer": lambda: producer(queue),
        "consumer": lambda: consumer(queue),
        "browser": lambda: browser(queue),
        "management": lambda: management(reply_to),
        "dynamic": dynamic,
        "two_sessions": lambda: two_sessions(queue),
        "relay": lambda: relay(queue),
        "multi_frame": lambda: multi_frame(queue),
    }


def copy_frame(frame: Any) -> Any:
    return replace(frame, fields=list(frame.fields)) if isinstance(frame, Frame) else frame
