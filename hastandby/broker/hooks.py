"""What the layers above decide for the broker core: one typed hooks object, ``NodeHooks``.

The core knows nothing of HA.  A node answers five questions through the one
object it is given (``Node.use_hooks``, once, before it runs): its ``state``
(what STATUS shows), whether a connection is admitted (``admit``), the
properties of the Open frame sent to one that is (``open_properties``), and
how a connection is turned away when a producer sent past the fence
(``fenced_refusal``) or the node stops (``shutdown_refusal``).
``StandaloneHooks`` is what a node does without HA; ``ha/admission.py``'s
``ClientAdmission`` is a cluster node's.  The broker makes calls on the hooks,
on its reactor thread, and the hooks never call the broker back from another
thread.

Links are claimed differently: several layers may each claim some (DR's
sources and replicas, the HA role's replication), the first to answer wins,
so they register with ``BrokerHandler.claim_links``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from proton import Condition, Connection, Link


@dataclass(frozen=True)
class Refusal:
    """How a connection is turned away.

    With ``abort`` the transport is dropped without an AMQP open or close (the
    peer sees the connection abort), which is what makes python-qpid-proton
    clients move on to the next URL of their list: after an AMQP close they
    give up, and after an AMQP open they restart at the list's first URL.
    Without it, an AMQP open and a close carrying ``condition``.
    """

    condition: Condition
    abort: bool = False


AttachHook = Callable[[Link], Any]
"""A claim on an incoming attach: the endpoint that serves the link, or None to leave it to the next."""


class NodeHooks(Protocol):
    """What the layers above decide for the broker core; called on the reactor thread only."""

    @property
    def state(self) -> str:
        """The node's role as STATUS shows it (``standalone``, or a cluster member's state)."""
        ...

    def admit(self, connection: Connection) -> Refusal | None:
        """At open: None lets ``connection`` in, a ``Refusal`` turns it away."""
        ...

    def open_properties(self, connection: Connection) -> dict[Any, Any] | None:
        """The connection properties of the Open frame sent to an admitted connection (None: none)."""
        ...

    def fenced_refusal(self) -> Refusal:
        """How a producer that sent past the fence is turned away (``broker/admission/fence.py``)."""
        ...

    def shutdown_refusal(self) -> Refusal:
        """How every connection is closed when the node stops."""
        ...


class StandaloneHooks:
    """A node without HA: every connection is admitted, with no extra Open properties."""

    @property
    def state(self) -> str:
        return "standalone"

    def admit(self, connection: Connection) -> Refusal | None:
        return None

    def open_properties(self, connection: Connection) -> dict[Any, Any] | None:
        return None

    def fenced_refusal(self) -> Refusal:
        return Refusal(Condition("amqp:connection:forced", "this node may not take messages now"))

    def shutdown_refusal(self) -> Refusal:
        return Refusal(Condition("amqp:connection:forced", "node shutting down"))


_standalone: type[NodeHooks] = StandaloneHooks  # mypy checks that the default is a NodeHooks
