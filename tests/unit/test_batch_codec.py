"""The message-batch wire form of replication links (replication/codec.py): exact round trips,
and a clear ValueError for anything that is not a whole batch."""

import struct

import pytest

from hastandby.replication.codec import decode_batch, encode_batch


def test_round_trip_keeps_ids_payloads_and_order():
    ids = [1, 2, 7, 2**40 + 3]
    payloads = [b"\x00Sp\xc0\x01\x00", b"", b"x" * 70_000, bytes(range(256))]
    decoded_ids, decoded_payloads = decode_batch(encode_batch(ids, payloads))
    assert list(decoded_ids) == ids
    assert decoded_payloads == payloads


def test_layout_is_little_endian_count_ids_sizes_payloads():
    data = encode_batch([5, 6], [b"ab", b"c"])
    assert data == struct.pack("<IQQII", 2, 5, 6, 2, 1) + b"abc"


def test_empty_batch_round_trips():
    ids, payloads = decode_batch(encode_batch([], []))
    assert list(ids) == [] and payloads == []


@pytest.mark.parametrize(
    "data, words",
    [
        (b"", "shorter than its header"),
        (b"\x01\x00", "shorter than its header"),
        (struct.pack("<I", 3) + b"\x00" * 20, "cut short"),
        (struct.pack("<IQI", 1, 9, 5) + b"abcd", "do not add up"),
        (struct.pack("<IQI", 1, 9, 2) + b"abcd", "do not add up"),
    ],
)
def test_malformed_batches_raise_value_error(data, words):
    with pytest.raises(ValueError, match=words):
        decode_batch(data)
