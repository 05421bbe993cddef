"""The header's durable flag and ttl read from the bytes equal what proton's decoder says, for every encoding."""

import itertools

import pytest
from proton import Data, Described, Message, ubyte, uint, ulong

from hastandby.broker.message import sections


def decoded(buf: bytes) -> tuple[bool, int | None]:
    fields = sections._section_value(buf, sections.HEADER) or []
    ttl = fields[2] if len(fields) > 2 else None
    return (bool(fields[0]) if fields else False), (int(ttl) if ttl else None)


@pytest.mark.parametrize("durable,ttl,priority", list(itertools.product(
    [False, True], [0, 1, 255, 256, 2500, 2**32 - 1], [None, 4, 9])))
def test_proton_encoded_headers(durable, ttl, priority):
    message = Message(body="x", durable=durable, ttl=ttl / 1000)
    if priority is not None:
        message.priority = priority
    buf = message.encode()
    if not buf.startswith(sections.HEADER_PREFIX):
        return  # proton left the header out (every field at its default)
    assert sections._read_header(buf) is not None
    assert (sections.header_durable(buf), sections.header_ttl(buf)) == decoded(buf)
    assert sections.header_durable_ttl(buf) == decoded(buf)


@pytest.mark.parametrize("fields", [
    [None], [True], [False, None, None], [True, ubyte(7), uint(7)], [None, None, uint(300), None, uint(3)],
])
def test_hand_built_headers_in_list8_and_list32(fields):
    data = Data()
    data.put_object(Described(ulong(sections.HEADER), fields))
    small = bytes(data.encode())
    assert sections._read_header(small) is not None
    assert (sections.header_durable(small), sections.header_ttl(small)) == decoded(small)
    # The same list in the 32-bit encoding (0xd0, 4-byte size and count).
    count, body = small[5], small[6:]
    large = small[:3] + b"\xd0" + (len(body) + 4).to_bytes(4, "big") + count.to_bytes(4, "big") + body
    assert sections._read_header(large) is not None
    assert (sections.header_durable(large), sections.header_ttl(large)) == decoded(large)


def test_an_unusual_encoding_goes_to_the_decoder():
    data = Data()
    data.put_object(Described(ulong(sections.HEADER), [True, None, ulong(5000)]))  # ttl as a ulong: not ours
    buf = bytes(data.encode())
    assert sections._read_header(buf) is None
    assert sections.header_durable(buf) is True and sections.header_ttl(buf) == 5000


def test_an_empty_header_list_is_answered_without_the_decoder(monkeypatch):
    """The proton C clients send a header with every field at its default as an empty list (0x45)."""
    buf = sections.HEADER_PREFIX + b"\x45" + bytes(Message(body="x").encode())
    assert decoded(buf) == (False, None)

    def no_decoder(data: bytes) -> None:
        raise AssertionError("decoded the slow way")

    monkeypatch.setattr(sections, "header_durable_ttl", no_decoder)
    assert sections.header_durable(buf) is False
    assert sections.header_ttl(buf) is None
