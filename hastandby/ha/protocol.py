"""The replication protocol between a backup and its primary, over plain AMQP 1.0.

One connection per backup, marked with the connection property
``qpid.ha-backup`` (the backup's node id, URL and state), carries:

- one *wiring* link: a receiver on ``$ha.wiring``; the primary sends a
  ``hello`` (its node id, term and replication default), the wiring snapshot,
  then wiring events and ``members`` updates, in order;
- one *replicating browser* per replicated queue: a receiver on the queue in
  ``copy`` mode whose link properties say ``qpid.ha-replicate`` and carry the
  id set the backup already holds (``qpid.ha-ids``), the lineage of its copy
  (``qpid.ha-lineage``, ``broker/queues/lineage.py``) and the term it expects.  The
  primary answers with its own lineage in its attach: both sides then know
  the divergence point below which ids name the same messages, and the
  backup drops its copy's tail from there before the first batch arrives.

The backup also opens a *status* link, a sender to ``$ha.status``: it tells
the primary its memory alarm (``{"memory_alarm": bool}``) when the link opens
and whenever it changes, and the primary holds its producers while any backup
is in alarm (``broker/admission/memory.py``).

Batches, dequeues, id sets and control maps are the replication codec every
replicating link shares (``replication/codec.py``); this module holds what
only hot standby says: the hello, members, a backup's status and a
replicating browser's request and its reply.  Each is a frozen dataclass that
both sides use, as ``dr/protocol.py``'s are: the sender builds the map with
``to_wire``, the receiver checks it with ``from_wire`` (or the ``decode_*``
function of the same name), which raises ``ProtocolError`` naming the field.

Member states.  A node names its role with ``lifecycle/states.py``'s
``State`` (a module without imports: the vocabulary, not the lifecycle); the
wire keeps Qpid's names, ``"ready"`` for a caught-up backup
(``State.BACKUP``) and ``"catchup"``, ``"primary"``, and ``MEMBER_STATES``
translates between them here only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proton import symbol

from hastandby.broker.queues import lineage
from hastandby.broker.queues.idset import IdSet
from hastandby.lifecycle.states import State
from hastandby.replication.codec import IDS_PROPERTY, ProtocolError, decode_ids, decode_term, short

REPLICATE_PROPERTY = symbol("qpid.ha-replicate")
TERM_PROPERTY = symbol("qpid.ha-term")
LINEAGE_PROPERTY = symbol("qpid.ha-lineage")
WIRING_ADDRESS = "$ha.wiring"
STATUS_ADDRESS = "$ha.status"


@dataclass(frozen=True)
class BackupIdentity:
    """What a backup's connection says of it in its ``qpid.ha-backup`` property (``replication/codec.py``
    ``BACKUP_PROPERTY``): node id, URL and state.  The state goes as ``State``'s own value (``"backup"``, not a
    members list's ``"ready"``); the primary reads the map leniently (``primary.backup_info``)."""

    node_id: str
    url: str
    state: State

    def to_wire(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "url": self.url, "state": str(self.state)}


@dataclass(frozen=True)
class BackupStatus:
    """A backup's message on its status link: its memory alarm (``{"memory_alarm": bool}``)."""

    memory_alarm: bool = False

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> BackupStatus:
        alarm = body.get("memory_alarm", False)
        if not isinstance(alarm, bool):
            raise ProtocolError("status.memory_alarm", f"{short(alarm)} is not a boolean")
        return cls(alarm)

    def to_wire(self) -> dict[str, Any]:
        return {"memory_alarm": self.memory_alarm}


def decode_status(body: dict[str, Any]) -> bool:
    """A backup's status message: its memory alarm (``BackupStatus.from_wire``)."""
    return BackupStatus.from_wire(body).memory_alarm


MEMBER_STATES: dict[State, str] = {State.PRIMARY: "primary", State.BACKUP: "ready", State.CATCHUP: "catchup"}
"""A member's state as a members list names it: Qpid's names, ``"ready"`` for ``State.BACKUP``."""
_STATE_OF: dict[str, State] = {wire: state for state, wire in MEMBER_STATES.items()}


@dataclass(frozen=True)
class PeerMember:
    """One node as a primary describes it: an entry of a members list (hello, ``members`` update, QUERY), or the
    hello's ``primary``.

    On the wire a map; ``node_id`` and ``url`` are always written (absent when read: ``""``), the others only
    when set.  ``state`` is the state's wire name (``MEMBER_STATES``: ``"primary"`` for the primary's own entry,
    ``"catchup"`` or ``"ready"`` for a backup's; ``of`` makes a member from a ``State``), but any string is
    taken: a newer primary may name states this node does not know (``status`` is None for those), and only
    ``"ready"`` means anything here.  ``connected`` and ``expected`` are sent for backups; ``term`` is read if
    present (no primary sends it today).  Other keys are ignored, so a newer primary may add some.
    """

    node_id: str = ""
    url: str = ""
    state: str | None = None
    connected: bool | None = None
    expected: bool | None = None
    term: int | None = None

    @classmethod
    def of(cls, node_id: str, url: str, state: State, connected: bool | None = None,
           expected: bool | None = None) -> PeerMember:
        """The member a primary describes: ``state`` by its wire name (``MEMBER_STATES``)."""
        return cls(node_id, url, MEMBER_STATES[state], connected, expected)

    @property
    def status(self) -> State | None:
        """The state as this node names it (``State.BACKUP`` for ``"ready"``); None if not one it knows."""
        return _STATE_OF.get(self.state) if self.state is not None else None

    @property
    def ready(self) -> bool:
        """The primary counts this backup as holding every replicated queue (it may be elected)."""
        return self.status is State.BACKUP

    @classmethod
    def from_wire(cls, value: Any, field: str) -> PeerMember:
        """A member from a peer's (plain) map; ProtocolError naming ``field`` or ``field.<key>`` if it is not one."""
        if not isinstance(value, dict):
            raise ProtocolError(field, f"a member is a map, got {short(value)}")
        node_id = value.get("node_id", "")
        if not isinstance(node_id, str):
            raise ProtocolError(f"{field}.node_id", f"{short(value.get('node_id'))} is not a string")
        url = value.get("url", "")
        if not isinstance(url, str):
            raise ProtocolError(f"{field}.url", f"{short(value.get('url'))} is not a string")
        state = value.get("state")
        if "state" in value and not isinstance(state, str):
            raise ProtocolError(f"{field}.state", f"{short(value['state'])} is not a string")
        flags: dict[str, bool | None] = {}
        for key in ("connected", "expected"):
            flag = value.get(key)
            if flag is not None and not isinstance(flag, bool):
                raise ProtocolError(f"{field}.{key}", f"{short(flag)} is not a boolean")
            flags[key] = flag
        term = decode_term(value["term"], f"{field}.term") if value.get("term") is not None else None
        return cls(node_id, url, state, flags["connected"], flags["expected"], term)

    def to_wire(self) -> dict[str, Any]:
        """The map a primary sends (and QUERY shows): ``node_id``, ``url``, then whichever others are set."""
        wire: dict[str, Any] = {"node_id": self.node_id, "url": self.url}
        for key in ("state", "connected", "expected", "term"):
            value = getattr(self, key)
            if value is not None:
                wire[key] = value
        return wire


def decode_member(value: Any, field: str) -> PeerMember:
    """One node as a primary describes it (``PeerMember.from_wire``)."""
    return PeerMember.from_wire(value, field)


def decode_members(value: Any, field: str = "members") -> list[PeerMember]:
    """A members list (absent: empty): maps as ``PeerMember.from_wire`` checks them."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError(field, f"a members list is a list, got {short(value)}")
    return [PeerMember.from_wire(m, f"{field}[{i}]") for i, m in enumerate(value)]


HELLO = "hello"
MEMBERS = "members"
"""The ``type`` of the wiring stream's control maps that this module holds (the others: ``config_events.py``)."""


@dataclass(frozen=True)
class Hello:
    """A primary's hello on the wiring link.

    ``primary`` is the primary's own member (node id, URL); a hello without one gives an empty member
    (``node_id`` and ``url`` ``""``), as before, rather than None: the backup keeps it as the primary it follows.
    """

    primary: PeerMember
    term: int
    replicate_default: str | None
    members: list[PeerMember] = field(default_factory=list)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Hello:
        primary = body.get("primary")
        member = PeerMember.from_wire({} if primary is None else primary, "hello.primary")
        term = decode_term(body.get("term"), "hello.term")
        default = body.get("replicate_default")
        if default is not None and not isinstance(default, str):
            raise ProtocolError("hello.replicate_default", f"{short(default)} is not a string")
        members = decode_members(body.get("members"), "hello.members")
        return cls(member, term, default, members)

    def to_wire(self) -> dict[str, Any]:
        """``{"type": "hello", "primary", "term", "replicate_default", "members"}``, every key always written."""
        return {"type": HELLO, "primary": self.primary.to_wire(), "term": self.term,
                "replicate_default": self.replicate_default, "members": [m.to_wire() for m in self.members]}


def decode_hello(body: dict[str, Any]) -> Hello:
    """A primary's hello (``Hello.from_wire``)."""
    return Hello.from_wire(body)


@dataclass(frozen=True)
class MembersUpdate:
    """A primary's ``members`` update on the wiring link: its term and every member, itself first."""

    term: int
    members: list[PeerMember] = field(default_factory=list)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> MembersUpdate:
        return cls(decode_term(body.get("term"), "members.term"), decode_members(body.get("members")))

    def to_wire(self) -> dict[str, Any]:
        return {"type": MEMBERS, "term": self.term, "members": [m.to_wire() for m in self.members]}


def decode_members_update(body: dict[str, Any]) -> tuple[int, list[PeerMember]]:
    """A ``members`` update: (term, members) (``MembersUpdate.from_wire``)."""
    update = MembersUpdate.from_wire(body)
    return update.term, update.members


@dataclass(frozen=True)
class BrowserRequest:
    """What a backup's replicating browser attach says: the term it follows, the ids and lineage it holds."""

    term: int
    ids: IdSet
    lineage: Any

    @classmethod
    def from_wire(cls, properties: dict[str, Any]) -> BrowserRequest:
        """The term, ids and lineage of a replicating browser's (plain) link properties."""
        term = decode_term(properties.get(str(TERM_PROPERTY)), str(TERM_PROPERTY))
        id_set = decode_ids(properties.get(str(IDS_PROPERTY)), str(IDS_PROPERTY))
        try:
            their_lineage = lineage.from_wire(properties.get(str(LINEAGE_PROPERTY)))
        except (TypeError, ValueError) as error:
            raise ProtocolError(str(LINEAGE_PROPERTY), str(error)) from None
        return cls(term, id_set, their_lineage)

    def to_wire(self) -> dict[symbol, Any]:
        """The attach's link properties (symbol keys): ``qpid.ha-replicate``, the ids, the lineage, the term."""
        return {REPLICATE_PROPERTY: True, IDS_PROPERTY: self.ids.to_wire(),
                LINEAGE_PROPERTY: lineage.to_wire(self.lineage), TERM_PROPERTY: self.term}


def decode_browser_request(properties: dict[str, Any]) -> BrowserRequest:
    """The term, ids and lineage of a replicating browser's (plain) link properties (``BrowserRequest.from_wire``)."""
    return BrowserRequest.from_wire(properties)


@dataclass(frozen=True)
class BrowserReply:
    """The primary's answer in its attach of a replicating browser: the lineage of its queue."""

    lineage: Any

    def to_wire(self) -> dict[symbol, Any]:
        return {LINEAGE_PROPERTY: lineage.to_wire(self.lineage)}
