"""A connection's backlog pauses its consumers past a limit and resumes them once under half of both."""

from hastandby.broker.admission.backlog import UNSETTLED_LIMIT, UNWRITTEN_LIMIT, Backlog


class Link:
    def __init__(self) -> None:
        self.resumed = 0

    def resume(self) -> None:
        self.resumed += 1


def test_unwritten_bytes_over_the_limit_pause_and_a_write_below_half_resumes_every_paused_link():
    later: list = []
    backlog, links = Backlog(later.append), [Link(), Link()]
    assert not backlog.sent(UNWRITTEN_LIMIT, settled=True)
    assert backlog.sent(1, settled=True)
    backlog.paused.extend(links)
    backlog.written(UNWRITTEN_LIMIT // 2)
    assert later == []
    backlog.written(0)
    assert backlog.paused == [] and len(later) == 1
    later[0]()
    assert [link.resumed for link in links] == [1, 1]


def test_unsettled_bytes_hold_the_pause_until_settlements_bring_them_under_half():
    backlog, link = Backlog(), Link()
    assert backlog.sent(UNSETTLED_LIMIT + 1, settled=False)
    backlog.paused.append(link)
    backlog.written(0)  # written, but the peer has not settled
    assert link.resumed == 0
    backlog.settled(UNSETTLED_LIMIT // 2)
    assert link.resumed == 0
    backlog.settled(2)
    assert link.resumed == 1 and backlog.unsettled == UNSETTLED_LIMIT // 2 - 1
