"""What every input kind has in common: its nodes, one case, the checks after it, the tally.

A kind (``frames``, ``management``, ...) starts the nodes it needs in
``setup``, runs one case from a seeded ``random.Random`` in ``run_case``
(returning what it did and what the node said back), and names the checks
that must hold afterwards in ``check``.  ``Runner`` (``runner.py``) does the
rest, the same way for every kind: after each case the nodes must be alive,
the checks must pass within their bound, and the logs must hold no failure
(``node.classify``); a crash or a hang restarts the nodes so the run goes on.
"""

from __future__ import annotations

import random
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hastandby.testing.auth import Users

from . import amqp
from .checks import CheckResult, admin_request, operations_answered, reference
from .node import FuzzNode, NodeSet
from .wire import Raw

REFERENCE_QUEUE = "fuzz.ref"
FUZZ_QUEUE = "fz.q"
REPLY_QUEUE = "fz.reply"
CHECK_TIMEOUT = 5.0  # seconds the node has to answer the checks after a case
REFERENCE_MESSAGES = 10


@dataclass
class CaseRecord:
    """What one case did (to replay or report it) and what the node answered."""

    description: list[str] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)  # error conditions the node sent back
    target: FuzzNode | None = None  # the node the case was aimed at (its checks run against it)
    segments: list[Any] | None = None  # what was written (bytes, and amqp.Wait between them): for a regression
    hang: str | None = None  # the node stopped doing its part within the case's bound (e.g. never reconnected)
    lost: int = 0  # messages the node acknowledged (settled accepted) that it does not hold
    verified: int = 0  # messages the node acknowledged and was then shown to hold (a replica's IDS)
    loss: str = ""

    def note(self, text: str) -> None:
        self.description.append(text)


class Kind:
    """One input kind; subclasses fill in ``setup`` and ``run_case`` (and ``check`` when not the default)."""

    name = ""
    summary = ""

    def __init__(self, directory: Path, users: Users) -> None:
        self.directory = directory / self.name
        self.users = users
        self.nodes = NodeSet()
        self.node: FuzzNode | None = None  # the main node under fuzz

    # -- life cycle ------------------------------------------------------------------

    def setup(self) -> None:
        raise NotImplementedError

    def prepare(self, node: FuzzNode) -> None:
        """Objects the cases and checks use, made again after a restart."""
        for queue in (REFERENCE_QUEUE, FUZZ_QUEUE, REPLY_QUEUE):
            admin_request(node, "CREATE", "queue", queue)

    def recover(self) -> None:
        """A crash or a hang: start every node again (a fresh process), so the run can go on."""
        for node in self.nodes.nodes:
            node.restart()
            self.prepare(node)

    def teardown(self) -> None:
        self.nodes.stop()

    # -- one case --------------------------------------------------------------------------

    def run_case(self, rng: random.Random, index: int) -> CaseRecord:
        raise NotImplementedError

    def check(self, record: CaseRecord) -> CheckResult:
        """The reference producer and consumer with a PING, then STATUS and QUERY answered (as admin)."""
        node = record.target or self.node
        assert node is not None
        result = reference(node, REFERENCE_QUEUE, REFERENCE_MESSAGES, CHECK_TIMEOUT)
        return operations_answered(node, result, ("STATUS", "QUERY"))

    def start_node(self, name: str, *extra: str, anonymous: bool = False) -> FuzzNode:
        node = self.nodes.add(FuzzNode(self.directory, self.users, name, *extra, anonymous=anonymous))
        node.start()
        return node


# -- helpers the kinds share ----------------------------------------------------------------------


def responses(data: bytes) -> tuple[list[tuple[int | None, Any]], bool]:
    """The performatives in what a node sent back (protocol headers skipped); True if it sent a SASL outcome."""
    out: list[tuple[int | None, Any]] = []
    outcome, pos = False, 0
    while len(data) - pos >= 8:
        if data[pos:pos + 4] == b"AMQP":
            pos += 8
            continue
        (size,) = struct.unpack_from(">I", data, pos)
        if size < 8 or len(data) - pos < size:
            break
        code, fields = amqp.decode_frame(data[pos:pos + size])
        outcome = outcome or code == amqp.SASL_OUTCOME
        out.append((code, fields))
        pos += size
    return out, outcome


def conditions(replies: list[tuple[int | None, Any]]) -> list[str]:
    found = []
    for code, fields in replies:
        condition = amqp.condition_of(code, fields)
        if condition:
            found.append(f"{amqp.PERFORMATIVES.get(code or 0, hex(code or 0))}: {condition}")
        if code == amqp.SASL_OUTCOME and isinstance(fields, list) and fields:
            found.append(f"sasl-outcome: {int(fields[0]) if fields[0] is not None else None}")
    return found


def sasl_login(raw: Raw, user: str, password: str, mechanism: str, timeout: float = 3.0) -> str | None:
    """Log in on a raw socket with our SASL client; None when done, else why not."""
    from .wire import _Preferring

    client = _Preferring(mechanism, user, password, "127.0.0.1")
    deadline = time.monotonic() + timeout
    consumed = 0
    while not client.done:
        if not raw.send(client.take_output()):
            return f"write failed: {raw.send_failed}"
        if client.failed:
            return client.failed
        before = len(raw.received)
        raw.read(max(0.0, deadline - time.monotonic()), until=lambda got, before=before: len(got) > before)
        fresh = bytes(raw.received[consumed:])
        consumed = len(raw.received)
        rest = client.receive(fresh)
        if client.failed:
            return client.failed
        if client.done:
            raw.received = bytearray(rest)
            return None
        if raw.peer_closed or time.monotonic() > deadline:
            return "no SASL outcome within the bound" if not raw.peer_closed else "closed during SASL"
    return None


def has_performative(data: bytes, code: int) -> bool:
    replies, _ = responses(data)
    return any(found == code for found, _ in replies)


def converse(raw: Raw, segments: list[Any], pieces: Any = None, read_for: float = 0.4,
             wait_for: float = 0.3) -> list[tuple[int | None, Any]]:
    """Write ``segments`` (waiting, bounded, where an ``amqp.Wait`` says), then read what comes back
    until the node closes, sends a close, or ``read_for`` passes."""
    for segment in segments:
        if isinstance(segment, amqp.Wait):
            raw.read(wait_for, until=lambda got, code=segment.code: has_performative(got, code))
            continue
        for piece in (pieces(segment) if pieces is not None else [segment]):
            if not raw.send(piece):
                break
        if raw.send_failed:
            break
    data = raw.read(read_for, until=lambda got: has_performative(got, amqp.CLOSE))
    replies, _ = responses(data)
    return replies


def segments_hex(segments: list[Any]) -> list[str]:
    """A case's writes as text for its record: hex for bytes, ``wait:0xNN`` for a wait."""
    return [f"wait:{s.code:#x}" if isinstance(s, amqp.Wait) else s.hex() for s in segments]


def segments_from_hex(items: list[str]) -> list[Any]:
    return [amqp.Wait(int(i[5:], 16)) if i.startswith("wait:") else bytes.fromhex(i) for i in items]
