"""A damaged journal, with real files and real bit flips: damage is told from a torn tail, nothing intact is
cut, the damaged file is kept aside, and the node says it lacks data until it is repaired.

Each case writes a journal through a real ``Journal`` (writer thread, fsync, checkpoint), stops it cleanly
or as a crash would, flips bytes of the real file (or the checkpoint) at a chosen offset, and recovers it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hastandby.broker.store import journal_files as files
from hastandby.broker.store import journal_format as jf
from hastandby.broker.store.journal import Journal
from hastandby.broker.queues.registry import Registry

from .test_journal import bodies, crash, node, produce


def fill(directory: Path, passes: int, per_pass: int = 3) -> tuple[Registry, Journal]:
    """A journal of ``passes`` records of ``per_pass`` durable messages each (one pass of events, one record)."""
    registry, journal, loop = node(directory)
    for index in range(passes):
        outcomes = [produce(registry, "orders", f"m{index}.{each}") for each in range(per_pass)]
        loop.settle(until=lambda: all(outcomes))
    return registry, journal


def runs(path: Path) -> list[tuple[int, int]]:
    """[start, end) of each enqueue-run record of the journal file."""
    data, found, offset = path.read_bytes(), [], 0
    while offset < len(data):
        length = int.from_bytes(data[offset:offset + 4], "little")
        stop = offset + 9 + length - 1
        if data[offset + 8] == jf.ENQUEUE_RUN:
            found.append((offset, stop))
        offset = stop
    return found


def flip(path: Path, offset: int, count: int = 3) -> None:
    data = bytearray(path.read_bytes())
    for at in range(offset, offset + count):
        data[at] ^= 0xA5
    path.write_bytes(bytes(data))


def all_bodies(count: int, per_pass: int = 3) -> list[str]:
    return [f"m{index}.{each}" for index in range(count) for each in range(per_pass)]


def test_bit_rot_in_the_middle_keeps_every_intact_record_after_it_and_says_what_was_lost(tmp_path):
    _, journal = fill(tmp_path, 10)
    journal.close()
    path = tmp_path / "journal"
    start, stop = runs(path)[4]  # the fifth pass: m4.*
    flip(path, (start + stop) // 2)
    registry, again, _ = node(tmp_path)
    expected = [b for b in all_bodies(10) if not b.startswith("m4.")]
    assert [b for _, b in bodies(registry, "orders")] == expected, "every intact record is read, none cut"
    assert again.damage and len(again.damage) == 1
    incident = again.damage[0]
    assert incident["ranges"] == [{"offset": start, "bytes": stop - start,
                                   "what": f"one enqueue run record of {stop - start} bytes, queue number 1, "
                                           "3 entries (if intact)"}]
    quarantined = Path(incident["file"])
    assert quarantined.name.startswith(files.QUARANTINE_PREFIX)
    assert quarantined.stat().st_size == incident["journal_bytes"], "the damaged file kept as it was found"
    assert json.loads((tmp_path / files.DAMAGE).read_text()) == again.damage
    again.close()


def test_the_clean_shutdown_is_known_though_damage_took_the_close_record(tmp_path):
    _, journal = fill(tmp_path, 4)
    journal.close()
    path = tmp_path / "journal"
    flip(path, path.stat().st_size - 4)  # inside the CLOSE record: nothing intact follows it
    registry, again, _ = node(tmp_path)
    assert again.damage, "the checkpoint says those bytes were on disk: damage, not a torn write"
    assert [b for _, b in bodies(registry, "orders")] == all_bodies(4)
    again.close()


def test_a_clean_stop_is_reported_from_the_checkpoint_even_with_damage_in_the_file(tmp_path):
    _, journal = fill(tmp_path, 6)
    journal.close()
    path = tmp_path / "journal"
    start, stop = runs(path)[2]
    flip(path, start + 30)
    registry = Registry("none", True)
    registry.declare_queue("orders", durable=True, object_uuid="6f8c1a52-0000-4000-8000-000000000001")
    recovering = Journal(tmp_path, "n1", registry, "batch", lambda fn: None, lambda fn: None, lambda d, fn: None)
    report = recovering.recover()
    assert report.clean and report.damaged is not None and report.torn_bytes == 0


def test_damage_to_the_last_records_after_a_crash_is_damage_below_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr("hastandby.broker.store.journal.CHECKPOINT_INTERVAL", 0.0)  # every fsync checkpointed
    _, journal = fill(tmp_path, 5)
    crash(journal)
    path = tmp_path / "journal"
    start, stop = runs(path)[-1]
    assert stop == path.stat().st_size, "the last pass is the file's last record"
    flip(path, start + 20)
    registry, again, _ = node(tmp_path)
    assert again.damage, "acknowledged (fsynced, checkpointed) records are not a torn tail"
    assert [b for _, b in bodies(registry, "orders")] == all_bodies(4)
    again.close()


def test_a_torn_write_past_the_checkpoint_is_cut_and_is_not_damage(tmp_path, monkeypatch):
    monkeypatch.setattr("hastandby.broker.store.journal.CHECKPOINT_INTERVAL", 3600.0)  # only the start's checkpoint
    _, journal = fill(tmp_path, 5)
    crash(journal)
    path = tmp_path / "journal"
    path.write_bytes(path.read_bytes()[:-7])  # the last pass's record torn, as by a crash in its write
    registry, again, _ = node(tmp_path)
    assert not again.damage and not (tmp_path / files.DAMAGE).exists()
    assert [b for _, b in bodies(registry, "orders")] == all_bodies(4)
    again.close()


def test_a_file_cut_short_after_a_clean_stop_is_damage(tmp_path):
    _, journal = fill(tmp_path, 5)
    journal.close()
    path = tmp_path / "journal"
    start, _ = runs(path)[-1]
    path.write_bytes(path.read_bytes()[:start])  # the last pass and the CLOSE record gone, on a whole record
    _, again, _ = node(tmp_path)
    (lost,) = again.damage[0]["ranges"]
    assert lost["offset"] == start and lost["what"] == f"the file ends {lost['bytes']} bytes short of what was on disk"
    again.close()


def test_damage_to_the_file_header_is_skipped_and_reported(tmp_path):
    _, journal = fill(tmp_path, 4)
    journal.close()
    path = tmp_path / "journal"
    flip(path, 12)  # inside the first OPEN record (the file's header and token)
    registry, again, _ = node(tmp_path)
    assert again.damage and again.damage[0]["ranges"][0]["offset"] == 0
    assert [b for _, b in bodies(registry, "orders")] == all_bodies(4)
    again.close()


@pytest.mark.parametrize("offset", [2, 20, -5])
def test_a_damaged_checkpoint_is_ignored_and_the_journal_read_as_after_a_crash(tmp_path, offset):
    _, journal = fill(tmp_path, 4)
    journal.close()
    checkpoint = tmp_path / files.CHECKPOINT
    flip(checkpoint, offset % checkpoint.stat().st_size, count=1)
    assert files.read_checkpoint(tmp_path) is None
    registry, again, _ = node(tmp_path)
    assert not again.damage, "an intact journal with a damaged checkpoint is not damaged"
    assert [b for _, b in bodies(registry, "orders")] == all_bodies(4)
    again.close()


def test_a_node_lacks_data_across_restarts_until_it_is_repaired(tmp_path):
    _, journal = fill(tmp_path, 6)
    journal.close()
    path = tmp_path / "journal"
    start, stop = runs(path)[1]
    flip(path, start + 40)
    _, again, _ = node(tmp_path)
    assert again.damage
    again.close()
    registry, third, loop = node(tmp_path)  # the file was rewritten from what was intact: no new damage
    assert len(third.damage) == 1, "still lacking what the damage took, not damaged twice"
    assert len(list(tmp_path.glob(files.QUARANTINE_PREFIX + "*"))) == 1
    third.repaired("caught up from n0")
    assert third.damage == [] and not (tmp_path / files.DAMAGE).exists()
    outcome = produce(registry, "orders", "after")
    loop.settle(until=lambda: outcome)
    third.close()
    registry, fourth, _ = node(tmp_path)
    assert not fourth.damage
    assert [b for _, b in bodies(registry, "orders")][-1] == "after"
    fourth.close()


def test_an_unreadable_damage_record_still_says_the_node_lacks_data(tmp_path):
    (tmp_path / files.DAMAGE).write_bytes(b"{not json")
    assert files.read_damage(tmp_path) and "unreadable" in files.read_damage(tmp_path)[0]["what"]


def test_rot_in_the_last_record_right_after_a_crash_is_damage_though_no_checkpoint_covers_it(tmp_path, monkeypatch):
    """The nemesis' find (schedule damaged-tail-sync-member-first): kill -9 less than a second after the last
    acknowledged write, then rot in it.  Its bytes are all there, so a crash did not tear it: damage, and
    the node lacks data (it would otherwise start the cluster and the others drop their copies of it)."""
    monkeypatch.setattr("hastandby.broker.store.journal.CHECKPOINT_INTERVAL", 3600.0)  # only the start's checkpoint
    _, journal = fill(tmp_path, 5)
    crash(journal)
    path = tmp_path / "journal"
    start, stop = runs(path)[-1]
    flip(path, stop - 6)
    registry, again, _ = node(tmp_path)
    assert again.damage and again.damage[0]["ranges"][0]["offset"] == start
    assert [b for _, b in bodies(registry, "orders")] == all_bodies(4)
    again.close()
