"""The per-source bounds on logins, as pure logic over an injected clock: failed logins and TLS handshakes."""

from __future__ import annotations

import pytest

from hastandby.security.login_throttle import LoginThrottle
from hastandby.security.source_rate import SourceRate


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_few_failures_cost_nothing_then_the_delay_doubles_up_to_its_bound():
    clock = Clock()
    throttle = LoginThrottle(failures=5, max_delay=5.0, first_delay=0.1, clock=clock)
    became = [throttle.failed("10.0.0.1") for _ in range(4)]
    assert throttle.delay("10.0.0.1") == 0 and not any(became) and throttle.throttled() == 0
    assert throttle.failed("10.0.0.1")  # the fifth: throttled from now on
    delays = []
    for _ in range(8):
        delays.append(throttle.delay("10.0.0.1"))
        throttle.failed("10.0.0.1")
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert throttle.throttled() == 1


def test_other_sources_are_not_throttled():
    throttle = LoginThrottle(failures=5, clock=Clock())
    for _ in range(20):
        throttle.failed("10.0.0.1")
    assert throttle.delay("10.0.0.2") == 0 and throttle.delay("127.0.0.3") == 0


def test_failures_are_forgotten_a_window_after_the_last_and_not_by_a_success():
    clock = Clock()
    throttle = LoginThrottle(failures=5, window=60.0, clock=clock)
    for _ in range(6):
        clock.now += 10  # failures keep the record alive while they come
        throttle.failed("10.0.0.1")
    clock.now += 59
    assert throttle.delay("10.0.0.1") > 0  # nothing but time forgets them
    clock.now += 2
    assert throttle.delay("10.0.0.1") == 0 and throttle.throttled() == 0
    assert not throttle.failed("10.0.0.1")  # counting from one again


def test_the_sources_tracked_are_bounded_and_zero_turns_it_off():
    throttle = LoginThrottle(failures=1, max_sources=3, clock=Clock())
    for number in range(10):
        throttle.failed(f"10.0.0.{number}")
    assert throttle.throttled() == 3 and throttle.delay("10.0.0.0") == 0 and throttle.delay("10.0.0.9") > 0
    off = LoginThrottle(failures=0, clock=Clock())
    for _ in range(10):
        assert not off.failed("10.0.0.1")
    assert off.delay("10.0.0.1") == 0 and off.throttled() == 0


def test_tls_handshakes_per_source_come_a_second_at_once_then_at_the_rate():
    clock = Clock()
    rate = SourceRate(10, clock=clock)
    assert [rate.wait("10.0.0.1") for _ in range(10)] == [0.0] * 10
    assert [rate.wait("10.0.0.1") for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert rate.wait("10.0.0.2") == 0  # another source has its own bucket
    clock.now += 1.0  # refills at 10 a second: 10 - 13 + 10 = 7 left
    assert [rate.wait("10.0.0.1") for _ in range(7)] == [0.0] * 7 and rate.wait("10.0.0.1") > 0


def test_full_buckets_are_forgotten_and_zero_means_no_bound():
    clock = Clock()
    rate = SourceRate(10, clock=clock)
    rate.wait("10.0.0.1")
    clock.now += 1.0
    rate.forget_full()
    assert not rate._sources
    assert all(SourceRate(0, clock=clock).wait("10.0.0.1") == 0 for _ in range(100))
