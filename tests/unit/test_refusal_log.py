"""Logging refusals without letting a flood fill the disk: whole lines first, one summary per source after."""

from __future__ import annotations

from hastandby.security.refusal_log import RefusalLog, Summary


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_source_has_a_few_lines_then_one_summary_per_interval():
    clock = Clock()
    log = RefusalLog(per_source=3, per_node=100, interval=60.0, clock=clock)
    flood = [log.note("10.0.0.1", f"wrong password {n}") for n in range(1000)]
    assert flood[:3] == [True] * 3 and not any(flood[3:])
    assert log.note("10.0.0.2", "unknown user") is True  # another source has lines of its own
    assert log.summaries() == []  # not before the interval ends
    clock.now = 60.0
    assert log.summaries() == [Summary("10.0.0.1", 997, "wrong password 999")]
    assert log.note("10.0.0.1", "again") is True  # a new interval


def test_many_sources_write_a_bounded_number_of_lines():
    clock = Clock()
    log = RefusalLog(per_source=5, per_node=10, interval=60.0, clock=clock)
    whole = sum(log.note(f"10.0.{n // 256}.{n % 256}", "x") for n in range(5000))
    clock.now = 60.0
    summaries = log.summaries()
    assert whole == 10 and len(summaries) == 11  # ten sources named, the rest together
    assert summaries[-1].source is None and sum(s.unlogged for s in summaries) == 4990
