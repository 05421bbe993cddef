"""The ``--min-sync`` round trip (election/sync_request.py): the primary wants a set on the reactor thread, the
election thread writes it and says so, and the primary of that term hears it back on the reactor thread."""

from __future__ import annotations

from collections.abc import Callable

from hastandby.election.sync_request import SyncRequest


def request() -> tuple[SyncRequest, list[Callable[[], None]], list[frozenset[str]]]:
    reactor: list[Callable[[], None]] = []
    return SyncRequest(reactor.append), reactor, []


def run(reactor: list[Callable[[], None]]) -> None:
    while reactor:
        reactor.pop(0)()


def test_the_wanted_set_is_what_the_primary_last_wanted() -> None:
    sync, _, heard = request()
    assert sync.wanted is None
    sync.want(7, frozenset({"p", "b"}), heard.append)
    sync.want(7, frozenset({"p"}), heard.append)
    assert sync.wanted == frozenset({"p"})


def test_a_write_is_heard_on_the_reactor_by_the_primary_of_its_term_only() -> None:
    sync, reactor, heard = request()
    sync.want(7, frozenset({"p"}), heard.append)
    sync.written(7, frozenset({"p"}))
    assert heard == []  # the election thread only hands it over
    run(reactor)
    assert heard == [frozenset({"p"})]
    sync.written(6, frozenset({"p", "old"}))  # an older leader's write
    run(reactor)
    assert heard == [frozenset({"p"})]


def test_a_primary_that_stepped_down_wants_nothing_and_hears_nothing() -> None:
    sync, reactor, heard = request()
    sync.want(7, frozenset({"p"}), heard.append)
    sync.written(7, frozenset({"p"}))  # on its way to the reactor when the primary steps down
    sync.withdraw()
    run(reactor)
    assert sync.wanted is None and heard == []


def test_the_next_primary_does_not_hear_the_last_ones_write() -> None:
    sync, reactor, heard = request()
    sync.want(7, frozenset({"p"}), lambda members: None)
    sync.written(7, frozenset({"p"}))
    sync.withdraw()
    sync.want(9, frozenset({"p", "b"}), heard.append)
    run(reactor)
    assert heard == []
