"""Control links: low-rate links of control maps between peers, both ends, for hot standby and DR alike.

A control link carries maps with string keys (``codec.encode_control``), one
pre-settled delivery each: a DR replica's acknowledgements to its source, a
backup's status to its primary, a primary's wiring stream to a backup.  The
sender opens a pre-settled link (``open_sender``) and sends each map with
``send``; the receiver is a ``ControlReceiver``, the driver's endpoint for
the link, which hands each map to its owner and refuses a delivery that is
not one.  Everything here runs on the driver's thread.
"""

from __future__ import annotations

from typing import Any, Callable

from proton import Condition, Endpoint, Link, Session

from hastandby.broker.links import send_settled
from hastandby.replication.codec import ProtocolError, encode_control, receive_controls

CREDIT = 10  # the credit a control link's receiver opens with; ``receive_controls`` gives one back per delivery


def open_sender(session: Session, name: str, address: str) -> Link:
    """A pre-settled sending link ``name`` to ``address``, opened: each ``send`` is one control map."""
    link = session.sender(name)
    link.target.address = address
    link.snd_settle_mode = Link.SND_SETTLED
    link.open()
    return link


def send(link: Link, tag: bytes, body: dict[str, Any]) -> None:
    """``body`` as one pre-settled delivery tagged ``tag`` on ``link`` (nobody acknowledges a control map)."""
    send_settled(link._impl, tag, encode_control(body))


class ControlReceiver:
    """The driver's endpoint for the receiving end of a control link.

    Each complete delivery is settled and its map goes to ``handle``, which may
    raise ProtocolError (a ValueError) for a field it cannot take.  A delivery
    that is not a control map, or one ``handle`` refuses, ends the pass and goes
    to ``refuse``: by default the link is detached naming the field, after a
    warning ``refused`` in ``log``.  A subclass may refuse or fail otherwise (a
    backup drops its connection to the primary), or do more on ``close`` (which
    runs when the link is refused or fails, and when its owner lets it go).
    """

    def __init__(self, link: Link, handle: Callable[[dict[str, Any]], None], log: Any, refused: str) -> None:
        self.link = link
        self.handle = handle
        self.log = log
        self.refused = refused
        self.closed = False

    def start(self) -> None:
        self.link.flow(CREDIT)

    def on_delivery(self, impl: Any) -> None:
        try:
            receive_controls(impl, self.handle)
        except ProtocolError as error:  # the delivery is settled already
            self.refuse(error)

    def refuse(self, error: ProtocolError) -> None:
        """The peer sent what is not the protocol: the link goes, its detach naming the field."""
        self.log.warning(self.refused, condition=error.condition, error=str(error))
        self.close()
        if self.link.state & Endpoint.LOCAL_ACTIVE:
            self.link.condition = Condition(error.condition, str(error))
            self.link.close()

    def flow(self) -> None:
        pass

    def fail(self, error: Exception) -> None:
        self.close()
        self.link.close()

    def close(self) -> None:
        self.closed = True
