"""The journal with a real registry, real queues and a real file: what survives a restart.

The event loop is played by the test: ``after_events`` and the writer
thread's hand-backs are collected and run by ``settle()``; the writer thread
and the file are real.
"""

from __future__ import annotations

import errno
import queue as queues
import time
from pathlib import Path

import pytest
from proton import Message

from hastandby.broker.queues.completion import Completion
from hastandby.broker.errors import ResourceLimitExceeded
from hastandby.broker.store.journal import Journal
from hastandby.broker.queues.lineage import Epoch
from hastandby.broker.queues.registry import Registry

UUID = "6f8c1a52-0000-4000-8000-000000000001"
OTHER_UUID = "6f8c1a52-0000-4000-8000-000000000002"


class Loop:
    """The reactor, by hand."""

    def __init__(self) -> None:
        self.after: list = []
        self.calls: queues.SimpleQueue = queues.SimpleQueue()
        self.timers: list = []

    def settle(self, timeout: float = 5.0, until=lambda: True) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while self.after:
                self.after.pop(0)()
            try:
                self.calls.get(timeout=0.02)()
            except queues.Empty:
                if until():
                    return
        assert until(), "not settled"


def node(directory: Path, sync: str = "batch", also: tuple[str, str] | None = None,
         ) -> tuple[Registry, Journal, Loop]:
    """A node's registry and journal, recovered from ``directory``; ``also``: one more durable queue (name, uuid)."""
    registry = Registry("none", True)
    registry.declare_queue("orders", durable=True, object_uuid=UUID)
    registry.declare_queue("scratch")
    if also is not None:
        registry.declare_queue(also[0], durable=True, object_uuid=also[1])
    return registry, *_journal(directory, registry, sync)


def journaled(directory: Path, queue: str, arguments: dict, object_uuid: str) -> tuple[Registry, Journal, Loop]:
    """A node with one durable queue declared with ``arguments``, and its journal recovered from ``directory``."""
    registry = Registry("none", True)
    registry.declare_queue(queue, arguments, durable=True, object_uuid=object_uuid)
    return registry, *_journal(directory, registry, "batch")


def _journal(directory: Path, registry: Registry, sync: str) -> tuple[Journal, Loop]:
    loop = Loop()
    journal = Journal(directory, "n1", registry, sync, loop.after.append, loop.calls.put,
                      lambda delay, fn: loop.timers.append(fn))
    journal.recover()
    journal.start()
    return journal, loop


def encoded(body: str, durable: bool) -> bytes:
    return bytes(Message(body=body, durable=durable).encode())


def produce(registry: Registry, queue: str, body: str, durable: bool = True) -> list[str]:
    outcome: list[str] = []
    completion = Completion(lambda token: outcome.append("accepted"), on_fail=lambda token, error: outcome.append(
        str(error)))
    data = encoded(body, durable)
    registry.deliver([registry.queues[queue]], data, completion)
    completion.release()
    return outcome


def bodies(registry: Registry, queue: str) -> list[tuple[int, str]]:
    found = []
    for msg_id, data in registry.queues[queue].messages():
        message = Message()
        message.decode(data)
        found.append((msg_id, message.body))
    return found


def test_a_durable_message_is_acknowledged_only_once_it_is_on_disk(tmp_path):
    registry, journal, loop = node(tmp_path)
    outcome = produce(registry, "orders", "a")
    assert outcome == []  # held until the writer thread has written and fsynced it
    loop.settle(until=lambda: outcome == ["accepted"])
    assert produce(registry, "orders", "b", durable=False) == ["accepted"]  # not durable: not held
    assert produce(registry, "scratch", "c") == ["accepted"]  # not a durable queue: not held
    journal.close()


def test_a_restart_brings_back_the_durable_messages_their_ids_and_lineage(tmp_path):
    registry, journal, loop = node(tmp_path)
    registry.queues["orders"].lineage = (Epoch(7, "n1", 1),)
    for body in ("a", "b", "c", "d"):
        produce(registry, "orders", body)
    produce(registry, "orders", "transient", durable=False)
    registry.queues["orders"].dequeue(2, "consumed")
    loop.settle(until=lambda: not journal._jobs.qsize())
    journal.close()
    again, journal_again, _ = node(tmp_path)
    assert bodies(again, "orders") == [(1, "a"), (3, "c"), (4, "d")]
    lineage = again.queues["orders"].lineage
    assert lineage[0] == Epoch(7, "n1", 1)
    # Id 5 went to the transient message, lost with the restart, and is given out again: under an epoch of
    # this run, so that no copy holding the old message 5 takes the new one for it (lineage.divergence).
    assert again.queues["orders"].next_id == 5
    assert len(lineage) == 2 and lineage[1].first_id == 5 and lineage[1].node.startswith("n1/restart-")
    journal_again.close()
    third, journal_third, _ = node(tmp_path)
    assert third.queues["orders"].lineage[1].key != lineage[1].key, "each run has an epoch of its own"
    journal_third.close()


def crash(journal: Journal) -> None:
    """Stop the writer as a kill -9 would leave the file: no CLOSE record, no clean checkpoint."""
    journal._jobs.put(None)
    assert journal._thread is not None
    journal._thread.join(10)
    journal._thread = None


def test_a_torn_tail_is_cut_off_and_the_rest_recovered(tmp_path, monkeypatch):
    monkeypatch.setattr("hastandby.broker.store.journal.CHECKPOINT_INTERVAL", 3600.0)  # the last write not checkpointed
    registry, journal, loop = node(tmp_path)
    for body in ("a", "b", "c"):  # a pass each: a record each (one pass's messages share a record)
        outcome = produce(registry, "orders", body)
        loop.settle(until=lambda: outcome)
    crash(journal)
    path = tmp_path / "journal"
    path.write_bytes(path.read_bytes()[:-5])  # part of the last message's record, as a crash in its write leaves it
    again, journal_again, _ = node(tmp_path)
    assert bodies(again, "orders") == [(1, "a"), (2, "b")]
    assert not journal_again.damage, "a torn write is not damage"
    journal_again.close()


def test_compaction_keeps_the_live_messages_and_what_comes_after(tmp_path, monkeypatch):
    monkeypatch.setattr("hastandby.broker.store.journal.COMPACT_MIN", 2000)
    registry, journal, loop = node(tmp_path)
    for index in range(60):
        produce(registry, "orders", f"m{index}")
        registry.queues["orders"].dequeue(index + 1, "consumed") if index < 55 else None
        loop.settle(until=lambda: not journal._jobs.qsize())
    loop.settle(until=lambda: not journal._compacting)
    produce(registry, "orders", "after")
    loop.settle(until=lambda: not journal._jobs.qsize())
    journal.close()
    # Never compacted, 60 enqueues and 55 dequeues would be about 4.5 KB; the file stays near its 2 KB trigger.
    assert (tmp_path / "journal").stat().st_size < 2600
    again, journal_again, _ = node(tmp_path)
    assert [body for _, body in bodies(again, "orders")] == ["m55", "m56", "m57", "m58", "m59", "after"]
    journal_again.close()


def test_a_start_appends_to_a_file_near_its_live_data_and_compacts_one_past_the_rule(tmp_path, monkeypatch):
    monkeypatch.setattr("hastandby.broker.store.journal.COMPACT_MIN", 1 << 30)  # no compaction until the last start
    registry, journal, loop = node(tmp_path)
    outcomes = [produce(registry, "orders", f"m{index}") for index in range(10)]
    loop.settle(until=lambda: all(outcomes))
    journal.close()
    path = tmp_path / "journal"
    first = path.read_bytes()
    again, journal_again, loop_again = node(tmp_path)
    assert path.read_bytes().startswith(first), "appended to, not rewritten"
    again.declare_queue("invoices", durable=True, object_uuid=OTHER_UUID)  # new to the file: a number of its own
    outcomes = [produce(again, "invoices", "i1")] + [produce(again, "orders", f"n{index}") for index in range(60)]
    loop_again.settle(until=lambda: all(outcomes))
    for msg_id in range(1, 69):
        again.queues["orders"].dequeue(msg_id, "consumed")
    loop_again.settle(until=lambda: not journal_again._jobs.qsize())
    journal_again.close()
    third, journal_third, _ = node(tmp_path, also=("invoices", OTHER_UUID))
    assert bodies(third, "orders") == [(69, "n58"), (70, "n59")]
    assert bodies(third, "invoices") == [(1, "i1")]
    journal_third.close()
    size = path.stat().st_size
    monkeypatch.setattr("hastandby.broker.store.journal.COMPACT_MIN", 2000)
    assert size > 2000, "the test needs a file past COMPACT_MIN"
    fourth, journal_fourth, _ = node(tmp_path, also=("invoices", OTHER_UUID))
    assert path.stat().st_size < size // 3, "past the rule: rewritten with the live messages only"
    assert bodies(fourth, "orders") == [(69, "n58"), (70, "n59")]
    assert bodies(fourth, "invoices") == [(1, "i1")]
    journal_fourth.close()


def test_a_failed_write_rejects_the_waiting_producers_and_refuses_more(tmp_path, monkeypatch):
    registry, journal, loop = node(tmp_path)

    def disk_full(data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    assert registry.admission_checks == []  # a journal that writes costs routing nothing
    monkeypatch.setattr(journal, "_append", disk_full)
    outcome = produce(registry, "orders", "a")
    loop.settle(until=lambda: bool(outcome))
    assert "No space left on device" in outcome[0] and journal.full
    assert registry.admission_checks == [journal.admit]
    assert registry.queues["orders"].depth == 0  # not on disk: not taken
    with pytest.raises(ResourceLimitExceeded, match="durable messages are refused"):
        produce(registry, "orders", "b")
    assert produce(registry, "orders", "c", durable=False) == ["accepted"]
    monkeypatch.undo()
    journal.full and loop.timers.pop(0)()  # the probe: a write works again
    loop.settle(until=lambda: journal.full is None)
    assert registry.admission_checks == []
    assert produce(registry, "orders", "d") == [] and journal.close() is None


def produce_ttl(registry: Registry, queue: str, body: str, ttl: float | None) -> list[str]:
    outcome: list[str] = []
    completion = Completion(lambda token: outcome.append("accepted"))
    message = Message(body=body, durable=True)
    if ttl is not None:
        message.ttl = ttl
    registry.deliver([registry.queues[queue]], bytes(message.encode()), completion)
    completion.release()
    return outcome


def remaining(registry: Registry) -> dict[int, float]:
    now = time.monotonic()
    return {msg_id: round(deadline - now) for msg_id, deadline in registry.queues["orders"].deadlines().items()}


def test_ttls_come_back_from_their_records_after_a_restart_and_a_compaction(tmp_path, monkeypatch):
    registry, journal, loop = node(tmp_path)
    outcomes = [produce_ttl(registry, "orders", "a", 60.0), produce_ttl(registry, "orders", "b", None),
                produce_ttl(registry, "orders", "c", 30.0)]
    loop.settle(until=lambda: all(outcomes))
    journal.close()
    again, journal_again, _ = node(tmp_path)
    assert remaining(again) == {1: 60, 3: 30}, "each ttl counts again from the restart"
    journal_again.close()
    monkeypatch.setattr("hastandby.broker.store.journal.COMPACT_MIN", 0)
    monkeypatch.setattr("hastandby.broker.store.journal.COMPACT_FACTOR", 0)  # every start rewrites the file
    third, journal_third, _ = node(tmp_path)
    journal_third.close()
    fourth, journal_fourth, _ = node(tmp_path)
    assert [body for _, body in bodies(fourth, "orders")] == ["a", "b", "c"]
    assert remaining(fourth) == {1: 60, 3: 30}, "a compaction keeps what was left of each ttl"
    journal_fourth.close()


def test_an_earlier_writers_runs_get_their_ttls_from_the_headers(tmp_path):
    from hastandby.broker.store import journal_format as jf

    payloads = [bytes(Message(body="a", durable=True, ttl=45.0).encode()), encoded("b", True)]
    (tmp_path / "journal").write_bytes(
        jf.record(jf.OPEN, b'{"node": "n1", "term": 3}')  # no "format": no EXPIRY records follow its runs
        + jf.queue_record(1, UUID, "orders") + jf.enqueue_run_record(1, [1, 2], payloads))
    registry, journal, _ = node(tmp_path)
    assert [body for _, body in bodies(registry, "orders")] == ["a", "b"]
    assert remaining(registry) == {1: 45}
    journal.close()
