"""Journal records: round trips; a torn tail cut off at the last good record; damage skipped, never cut."""

from __future__ import annotations

import pytest

from hastandby.broker.store import journal_format as jf


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
        (jf.OPEN, {"node": "n1", "term": 7, "format": jf.FORMAT}),
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


def test_a_flipped_byte_in_a_body_is_damage_to_that_record_alone():
    data = bytearray(records())
    first_two = len(jf.open_record("n1", 7)) + len(jf.queue_record(1, "u-1", "orders"))
    first_enqueue = len(jf.enqueue_record(1, 41, b"\x00Sp\xc0\x02\x01Ahello"))
    data[first_two + 15] ^= 0xFF  # inside the first enqueue record's body
    found, result = read(bytes(data))
    assert not result.torn and result.damaged == [(first_two, first_two + first_enqueue)]
    assert [kind for kind, _ in found] == [jf.OPEN, jf.QUEUE, *[k for k, _ in read(records())[0][3:]]]
    assert result.valid_bytes == len(data), "every intact record after the damage is read, none cut"
    assert jf.describe(bytes(data), *result.damaged[0]) == f"one enqueue record of {first_enqueue} bytes, " \
        "queue number 1 (if intact)"


def test_a_flipped_length_is_found_past_by_a_scan_for_the_next_intact_record():
    head = jf.open_record("n1", 7) + jf.queue_record(1, "u-1", "orders")
    run = jf.enqueue_run_record(1, list(range(1, 201)), [b"\x00Sp\xc0\x02\x01A" + bytes([i]) * 50
                                                         for i in range(200)])
    tail = jf.dequeue_record(1, [(1, 5)]) + jf.term_record(9) + jf.close_record()
    data = bytearray(head + run + tail)
    data[len(head) + 2] ^= 0x5A  # the run's length: where the next record starts is unknown
    found, result = read(bytes(data))
    assert result.damaged == [(len(head), len(head) + len(run))] and not result.torn
    assert [kind for kind, _ in found] == [jf.OPEN, jf.QUEUE, jf.DEQUEUE, jf.TERM, jf.CLOSE]
    assert "heads damaged" in jf.describe(bytes(data), *result.damaged[0])


def test_one_record_inside_a_payload_does_not_pass_for_where_records_start_again():
    head = jf.open_record("n1", 7)
    embedded = jf.dequeue_record(1, [(1, 10**6)])  # a producer's bytes that look like one record
    run = jf.enqueue_run_record(1, [1, 2], [b"\x00" * 40 + embedded + b"\xff" * 40, b"\x01" * 30])
    tail = jf.term_record(9) + jf.close_record()
    data = bytearray(head + run + tail)
    data[len(head)] ^= 0x40  # the run's length
    found, result = read(bytes(data))
    assert result.damaged == [(len(head), len(head) + len(run))]
    assert [kind for kind, _ in found] == [jf.OPEN, jf.TERM, jf.CLOSE], "no dequeue made up of a payload"


def test_several_damaged_stretches_are_each_skipped():
    parts = [jf.open_record("n1", 7)] + [jf.enqueue_record(1, i, b"m%d" % i * 20) for i in range(1, 11)]
    data = bytearray(b"".join(parts))
    starts = [sum(map(len, parts[:i])) for i in range(len(parts) + 1)]
    for index in (2, 3, 7):
        data[starts[index] + 12] ^= 0x01  # bodies of the second, third and seventh enqueues
    found, result = read(bytes(data))
    assert result.damaged == [(starts[2], starts[4]), (starts[7], starts[8])]
    assert [body[1] for kind, body in found if kind == jf.ENQUEUE] == [1, 4, 5, 6, 8, 9, 10]


def test_a_whole_last_record_that_fails_its_checksum_is_damage_and_one_cut_short_is_torn():
    """A crash leaves the last record of an interrupted append short; rot leaves all its bytes there."""
    data = bytearray(records())
    data[-len(jf.close_record()) - 3] ^= 0xFF  # the term record, the last but one: the close record follows
    _, result = read(bytes(data))
    assert result.damaged and not result.torn
    data = bytearray(records())
    data[-1 - len(jf.close_record()) + 5] ^= 0xFF  # the close record's checksum: whole, nothing follows it
    _, result = read(bytes(data))
    assert result.damaged == [(len(data) - len(jf.close_record()), len(data))] and not result.torn
    _, result = read(records()[:-3])  # the close record cut short
    assert result.torn and not result.damaged


def test_damage_to_the_last_records_length_looks_like_a_torn_tail_to_the_reader():
    data = bytearray(records())
    data[-len(jf.close_record())] ^= 0x40  # the close record's length now runs past the end of the file
    _, result = read(bytes(data))
    assert result.torn and not result.damaged  # journal.py's checkpoint tells this one from a torn write


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
    assert result.damaged == [(len(good), len(good + lying))] and not result.torn, "whole, yet not a record"
    assert result.valid_bytes == len(good) and len(found) == 1
    found, result = read(good + run[:-1])  # cut inside the run
    assert result.torn and result.valid_bytes == len(good)
