"""A control link, both ends (replication/control.py): on two in-memory engines (``Pair``), no sockets."""

from __future__ import annotations

from typing import Any

from proton import Endpoint, Link, Message

from hastandby.replication import control
from hastandby.replication.codec import INVALID_FIELD, ProtocolError

from .test_take_deliveries import Pair


class Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))


class Ends(Pair):
    """A sender opened with ``control.open_sender`` on ``near``, its receiver on ``far`` under a ControlReceiver."""

    def __init__(self, handle: Any = None) -> None:
        super().__init__()
        session = self.near.session()
        session.open()
        self.sender = control.open_sender(session, "ctl", "$ctl")
        self.pump()
        far_session = self.far.session_head(Endpoint.LOCAL_UNINIT)
        far_session.open()
        link = self.far.link_head(Endpoint.LOCAL_UNINIT)
        assert link is not None and link.is_receiver and link.remote_target.address == "$ctl"
        link.target.address = link.remote_target.address
        link.open()
        self.link: Link = link
        self.got: list[dict[str, Any]] = []
        self.log = Log()
        self.receiver = control.ControlReceiver(link, handle or self.got.append, self.log, "control refused")
        self.receiver.start()
        self.pump()

    def deliver(self) -> None:
        """What the driver does on a delivery event (naming the link's current delivery)."""
        self.pump()
        current = self.link.current
        assert current is not None
        self.receiver.on_delivery(current._impl)
        self.pump()


def test_maps_arrive_in_order_settled_and_the_credit_comes_back() -> None:
    ends = Ends()
    assert ends.sender.snd_settle_mode == Link.SND_SETTLED and ends.sender.credit == control.CREDIT
    control.send(ends.sender, b"a1", {"through": 1})
    control.send(ends.sender, b"a2", {"through": 2, "note": "x"})
    ends.deliver()
    assert ends.got == [{"through": 1}, {"through": 2, "note": "x"}]
    assert ends.link.current is None and ends.link.credit == control.CREDIT
    assert ends.sender.unsettled == 0 and ends.log.warnings == []


def test_a_delivery_that_is_not_a_map_detaches_the_link_naming_why() -> None:
    ends = Ends()
    ends.sender.delivery(b"x")
    ends.sender.send(Message(body="not a map").encode())
    ends.sender.advance()
    ends.deliver()
    assert ends.got == [] and ends.receiver.closed
    assert ends.link.state & Endpoint.LOCAL_CLOSED and ends.link.condition.name == INVALID_FIELD
    assert [event for event, _ in ends.log.warnings] == ["control refused"]
    assert ends.sender.state & Endpoint.REMOTE_CLOSED


def test_a_map_its_owner_refuses_detaches_the_link_too() -> None:
    def refuse(body: dict[str, Any]) -> None:
        raise ProtocolError("through", "not a number")

    ends = Ends(refuse)
    control.send(ends.sender, b"a1", {"through": "x"})
    ends.deliver()
    assert ends.receiver.closed and ends.link.condition.name == INVALID_FIELD
    assert "through: not a number" in ends.link.condition.description
