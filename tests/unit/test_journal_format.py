"""Journal records: round trips, and a torn or corrupt tail cut off at the last good record."""

from __future__ import annotations

import pytest

from hastandby.broker import journal_format as jf


def records() -> bytes:
    return b"".join([
        jf.open_record("n1", 7),
        jf.queue_record(1, "u-1", "orders"),
        jf.enqueue_record(1, 41, b"\x00Sp\xc0\x02\x01Ahello"),
        jf.enqueue_record(1, 42, b""),
        jf.enqueue_run_record(1, [43, 44, 46], [b"\x00Sp\xc0\x02\x01Aa", b"", b"ccc"]),
        jf.expiry_record(1, [(43, 2500), (46, 2**32 - 1)]),
        jf.dequeue_record(1, [(41, 41), (100, 2**62)]),
        jf.lineage_record(1, [[7, "n1", 1]]),
        jf.term_record(9),
        jf.close_record(),
    ])


def read(data: bytes) -> tuple[list, jf.Read]:
    result = jf.Read()
    return list(jf.read_records(data, result)), result


def test_every_record_type_round_trips():
    found, result = read(records())
    assert found == [
        (jf.OPEN, {"node": "n1", "term": 7, "format": 2}),
        (jf.QUEUE, (1, {"uuid": "u-1", "name": "orders"})),
        (jf.ENQUEUE, (1, 41, b"\x00Sp\xc0\x02\x01Ahello")),
        (jf.ENQUEUE, (1, 42, b"")),
        (jf.ENQUEUE_RUN, (1, [43, 44, 46], [b"\x00Sp\xc0\x02\x01Aa", b"", b"ccc"])),
        (jf.EXPIRY, (1, [(43, 2500), (46, 2**32 - 1)])),
        (jf.DEQUEUE, (1, [(41, 41), (100, 2**62)])),
        (jf.LINEAGE, (1, [[7, "n1", 1]])),
        (jf.TERM, {"term": 9}),
        (jf.CLOSE, None),
    ]
    assert not result.torn and result.valid_bytes == len(records())


@pytest.mark.parametrize("cut", [1, 5, 9, 19])
def test_a_torn_tail_is_cut_at_the_last_whole_record(cut):
    data = records()
    last = jf.close_record()
    before = len(data) - len(last) - len(jf.term_record(9))
    torn = data[:before] + jf.term_record(9)[:cut]
    found, result = read(torn)
    assert result.torn and result.valid_bytes == before
    assert found[-1][0] == jf.LINEAGE


def test_a_flipped_byte_ends_the_good_part_there():
    data = bytearray(records())
    first_two = len(jf.open_record("n1", 7)) + len(jf.queue_record(1, "u-1", "orders"))
    data[first_two + 15] ^= 0xFF  # inside the first enqueue record's body
    found, result = read(bytes(data))
    assert result.torn and result.valid_bytes == first_two and len(found) == 2


def test_an_absurd_length_is_a_torn_tail_not_a_huge_read():
    found, result = read(jf.open_record("n", 1) + b"\xff\xff\xff\xff" + b"\0" * 5)
    assert result.torn and len(found) == 1


def test_a_run_whose_lengths_do_not_add_up_ends_the_good_part():
    good = jf.open_record("n", 1)
    run = jf.enqueue_run_record(1, [1, 2], [b"ab", b"cd"])
    body = bytearray(run[9:])  # after length, checksum and type: number, count, ids, lengths, bytes
    body[8 + 16] = 3  # the first length says 3: the lengths no longer add up to the bytes
    lying = jf.record(jf.ENQUEUE_RUN, bytes(body))  # a valid checksum over a lying body
    found, result = read(good + lying)
    assert result.torn and result.valid_bytes == len(good) and len(found) == 1
    found, result = read(good + run[:-1])  # cut inside the run
    assert result.torn and result.valid_bytes == len(good)
