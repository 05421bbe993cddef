"""Queue features (docs/queues.md, issue 28) as fuzz input: queue arguments, message fields, replication controls.

What the other kinds draw from when a case touches a queue feature:

- ``queue_arguments(rng)``: the arguments of a queue declaration
  (``qpid.priorities``, ``x-delivery-limit``, ``x-single-active-consumer``,
  ``x-dedup-window``, ``qpid.last_value_queue_key``,
  ``qpid.group_header_key``, ``qpid.shared_msg_group``), each valid, at a
  boundary (0, 1, the highest, one past it), a string of a number (taken),
  a string that only looks like one (``"²"``, ``"+-5"``, 5,000 digits), or
  of a wrong type (a float, a list, a map, binary, a bool for a number);
  combinations the node refuses (groups with priorities or a single active
  consumer, shared groups without a header) included.  Used by the
  ``management`` kind's CREATE and the ``backup`` kind's queue events.
- ``message(rng, ...)``: a message whose sections are built field by field
  (not by proton's ``Message``, which would refuse the wrong types): a
  header ``priority`` of any value (0-255, none, a uint, a negative int, a
  string), message annotations ``x-opt-delivery-time`` and
  ``x-opt-delivery-delay`` (due soon, past, negative, 2**63-1, a ulong past
  the long range, a string, a float, a list; under a symbol key or a string
  key), a ``message-id`` of every allowed type and some disallowed ones
  (empty, 300 bytes, a list), and application properties ``k`` (last-value
  key) and ``g`` (group header) of any type (a map or list too, which AMQP
  does not allow there).  Used by the ``frames`` kind's feature producer,
  sent to the queues ``FEATURE_QUEUES`` that ``prepare`` declares.
- ``producer_script`` / ``consumer_script``: conversations for the
  ``frames`` kind on those queues: a producer of such messages, and
  consumers (one or two links on a queue, for single active consumer and
  groups) that settle what they get accepted, released, modified with
  ``delivery-failed`` (counts toward the delivery limit), modified
  undeliverable-here, or rejected, or detach holding it.
- ``counts_body`` / ``message_ids_body``: the replication controls a primary
  (or a full DR replica's source) sends after a batch: ``c`` (delivery
  counts, ``[id, count, ...]``) and ``u`` (remembered message-ids,
  ``[key, ms, durable, ...]``), valid or with ids zero or past 2**63-2,
  counts past 2**32-1, an odd length, keys empty or 70,000 bytes, times
  negative, durable flags that are not bools, not lists at all.  Used by the
  ``backup`` and ``dr-replica`` kinds.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

from proton import Data, Described, int32, symbol, timestamp, ubyte, uint, ulong

from . import amqp, values

PRIORITIES = "qpid.priorities"
DELIVERY_LIMIT = "x-delivery-limit"
SINGLE_ACTIVE_CONSUMER = "x-single-active-consumer"
DEDUP_WINDOW = "x-dedup-window"
LVQ_KEY = "qpid.last_value_queue_key"
GROUP_HEADER = "qpid.group_header_key"
SHARED_GROUPS = "qpid.shared_msg_group"
DELIVERY_TIME = "x-opt-delivery-time"
DELIVERY_DELAY = "x-opt-delivery-delay"
LVQ_PROPERTY = "k"  # the application property the feature queues key on
GROUP_PROPERTY = "g"

# Queues the frames kind declares (``prepare``) for its feature scripts; valid combinations of the options.
FEATURE_QUEUES: dict[str, dict[str, Any]] = {
    "fz.f.prio": {PRIORITIES: 10, DELIVERY_LIMIT: 2, DEDUP_WINDOW: 60, "qpid.max_count": 5000},
    "fz.f.lvq": {LVQ_KEY: LVQ_PROPERTY, DEDUP_WINDOW: 5, "qpid.max_count": 200, "qpid.policy_type": "ring"},
    "fz.f.grp": {GROUP_HEADER: GROUP_PROPERTY, SHARED_GROUPS: 1, DELIVERY_LIMIT: 3, "qpid.max_count": 5000},
    "fz.f.sac": {SINGLE_ACTIVE_CONSUMER: True, PRIORITIES: 3, DELIVERY_LIMIT: 1, "qpid.max_count": 5000},
}

# Per argument: values the node takes, its boundaries, and values it must refuse with a clear error.
_WHOLE = {PRIORITIES: 10, DELIVERY_LIMIT: 2**31 - 1, DEDUP_WINDOW: 86400}
_LOOKALIKE_NUMBERS = ["\u00b2", "+-5", "-+1", "\u0663", " 7 ", "0x10", "1e3", "9" * 5000, "", "+", "-0", "٣٣"]


def _whole_value(rng: random.Random, highest: int) -> Any:
    roll = rng.random()
    if roll < 0.35:
        return rng.choice([1, highest, rng.randint(1, highest), str(rng.randint(1, highest))])
    if roll < 0.6:
        return rng.choice([0, -1, highest + 1, 2**63 - 1, ulong(2**64 - 1), int32(-(2**31)), ubyte(0), uint(5)])
    if roll < 0.75:
        return rng.choice(_LOOKALIKE_NUMBERS)
    return rng.choice([2.5, 1.0, float("nan"), True, False, [3], {"n": 3}, b"3", symbol("3"), None])


def _switch_value(rng: random.Random) -> Any:
    return rng.choice([True, False, "true", "FALSE", " true ", "yes", 1, 0, 7, None, [True], b"true", 1.0])


def _name_value(rng: random.Random) -> Any:
    return rng.choice(["k", "g", "sym", "x" * 255, "x" * 256, "é" * 128, "", " ", "\x00", "\ud800",
                       symbol("k"), b"k", 5, None, ["k"], {"k": 1}, values.text(rng)])


def queue_arguments(rng: random.Random, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """One to four feature arguments (added to ``base``), each drawn as the module docstring says."""
    arguments = dict(base or {})
    keys = [PRIORITIES, DELIVERY_LIMIT, SINGLE_ACTIVE_CONSUMER, DEDUP_WINDOW, LVQ_KEY, GROUP_HEADER, SHARED_GROUPS]
    for key in rng.sample(keys, rng.choice([1, 1, 2, 3, 4])):
        if key in _WHOLE:
            arguments[key] = _whole_value(rng, _WHOLE[key])
        elif key in (SINGLE_ACTIVE_CONSUMER, SHARED_GROUPS):
            arguments[key] = _switch_value(rng)
        else:
            arguments[key] = _name_value(rng)
    if rng.random() < 0.1:  # the argument's key itself of another type (a symbol, as other clients send)
        key = rng.choice(list(arguments))
        arguments[symbol(key) if isinstance(key, str) else key] = arguments.pop(key)
    return arguments


# -- messages ----------------------------------------------------------------------------------


def _priority(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.6:
        return ubyte(rng.choice([0, 1, 4, 5, 9, 10, 255, rng.randrange(256)]))
    return rng.choice([None, uint(7), uint(2**32 - 1), int32(-1), -5, "high", 9.5, [9], True])


def _due(rng: random.Random, key: str) -> Any:
    now = int(time.time() * 1000)
    roll = rng.random()
    if key == DELIVERY_TIME and roll < 0.35:
        return rng.choice([timestamp(now + 200), now + 300, timestamp(now - 60_000), now - 1, 0, timestamp(0)])
    if key == DELIVERY_DELAY and roll < 0.35:
        return rng.choice([0, 50, 300, int32(100), uint(20)])
    if roll < 0.7:
        return rng.choice([-1, -(2**63), 2**63 - 1, ulong(2**64 - 1), timestamp(-1), timestamp(2**62),
                           now + 10**12, 2**53])
    return rng.choice(["100", 1.5, float("nan"), True, None, [100], {"ms": 100}, b"\x00\x01", symbol("soon")])


def _message_id(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.6:
        return rng.choice([f"fz-id-{rng.randrange(20)}", ulong(rng.randrange(20)), uuid.UUID(int=rng.randrange(20)),
                           b"fz-bin-%d" % rng.randrange(20), "7", ulong(7)])
    return rng.choice([None, "", "x" * 300, b"", b"y" * 70_000, 7, int32(7), [1, 2], {"id": 1}, 1.5, True,
                       symbol("fz-sym")])


def _property(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.6:
        return rng.choice(["a", "b", "c", 1, 2, "qpid.no-group", ""])
    return rng.choice([None, "x" * 300, b"bin", ulong(2**64 - 1), 1.5, [1], {"n": 1}, uuid.UUID(int=1),
                       timestamp(0), True])


def section(code: int, value: Any) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), value))
    return bytes(data.encode())


def message(rng: random.Random, address: str | None = None) -> tuple[bytes, list[str]]:
    """A message whose header priority, annotations, message-id and application properties are drawn
    as the module docstring says; its bytes and what it carries."""
    notes: list[str] = []
    sections: list[bytes] = []
    if rng.random() < 0.8:
        priority = _priority(rng)
        durable = rng.random() < 0.1
        sections.append(section(0x70, [durable, priority]))
        notes.append(f"priority {priority!r}")
    annotations: dict[Any, Any] = {}
    for key in (DELIVERY_TIME, DELIVERY_DELAY):
        if rng.random() < 0.3:
            annotations[symbol(key) if rng.random() < 0.85 else key] = _due(rng, key)
    if rng.random() < 0.05:
        annotations[ulong(7)] = "a numeric key"
    if annotations:
        sections.append(section(0x72, annotations))
        notes.append(f"annotations {annotations!r}"[:120])
    message_id = _message_id(rng) if rng.random() < 0.8 else None
    if message_id is not None or address is not None:
        sections.append(section(0x73, [message_id, None, address]))
        notes.append(f"message-id {message_id!r}"[:80])
    properties: dict[Any, Any] = {}
    for key in (LVQ_PROPERTY, GROUP_PROPERTY):
        if rng.random() < 0.6:
            properties[key] = _property(rng)
    if properties:
        sections.append(section(0x74, properties))
        notes.append(f"properties {properties!r}"[:100])
    sections.append(section(0x77, f"fz-feature-{rng.randrange(1000)}"))
    data = b"".join(sections)
    return data, notes


def valid_message(body: str, priority: int = 4, delay: int | None = None, message_id: str | None = None,
                  key: str | None = None) -> bytes:
    """A well-formed message for the unmutated scripts (a header priority, a short delay, an id, a key)."""
    sections = [section(0x70, [False, ubyte(priority)])]
    if delay is not None:
        sections.append(section(0x72, {symbol(DELIVERY_DELAY): delay}))
    if message_id is not None:
        sections.append(section(0x73, [message_id]))
    if key is not None:
        sections.append(section(0x74, {LVQ_PROPERTY: key, GROUP_PROPERTY: key}))
    sections.append(section(0x77, body))
    return b"".join(sections)


# -- conversations (the frames kind) ----------------------------------------------------------------


def producer_script(rng: random.Random, queue: str) -> tuple[amqp.Script, list[str]]:
    """A producer of ``message(rng)`` to ``queue`` (through the anonymous relay now and then)."""
    relay = rng.random() < 0.2
    frames: amqp.Script = [amqp.open_(), amqp.begin(), amqp.attach("fz-fsender", 0, amqp.SENDER,
                                                                    None if relay else queue), amqp.Wait(amqp.FLOW)]
    notes = [f"feature producer to {queue}" + (" through the relay" if relay else "")]
    for i in range(rng.choice([1, 2, 4, 8])):
        data, said = message(rng, queue if relay else None)
        notes.append(f"message {i}: " + ", ".join(said))
        frames.append(amqp.transfer(0, i, b"f%d" % i, data, settled=rng.random() < 0.1))
    return frames + [amqp.Wait(amqp.DISPOSITION), amqp.detach(0), amqp.end(), amqp.close()], notes


def _settle(rng: random.Random, delivery_id: int) -> tuple[amqp.Frame, str]:
    roll = rng.random()
    if roll < 0.3:
        return amqp.disposition(delivery_id), "accepted"
    if roll < 0.45:
        return amqp.disposition(delivery_id, state=amqp.outcome(amqp.RELEASED)), "released"
    if roll < 0.75:
        return amqp.disposition(delivery_id, state=amqp.outcome(amqp.MODIFIED, [True, False])), "delivery-failed"
    if roll < 0.85:
        return amqp.disposition(delivery_id, state=amqp.outcome(amqp.MODIFIED, [rng.choice([False, True]), True])), \
            "undeliverable-here"
    if roll < 0.92:
        return amqp.disposition(delivery_id, state=amqp.outcome(amqp.REJECTED)), "rejected"
    return amqp.disposition(delivery_id, settled=False, state=amqp.outcome(amqp.RECEIVED, [uint(0), ulong(0)])), \
        "received (not settled)"


def consumer_script(rng: random.Random, queue: str) -> tuple[amqp.Script, list[str]]:
    """One or two consumers on ``queue``, settling what they get in random ways (or not at all)."""
    links = rng.choice([1, 1, 2])
    credit = rng.choice([1, 3, 10])
    frames: amqp.Script = [amqp.open_(), amqp.begin()]
    for handle in range(links):
        frames += [amqp.attach(f"fz-fconsumer{handle}", handle, amqp.RECEIVER, queue),
                   amqp.flow(handle, credit, next_incoming=0)]
    frames.append(amqp.Wait(amqp.TRANSFER))
    notes = [f"feature consumer on {queue}: {links} link(s), credit {credit}"]
    outcomes = []
    for delivery_id in range(rng.choice([0, 1, 3, credit])):
        frame, said = _settle(rng, delivery_id)
        frames.append(frame)
        outcomes.append(said)
    notes.append("settles " + (", ".join(outcomes) or "nothing"))
    if rng.random() < 0.3:  # the first consumer leaves first (the next takes over), holding what it did not settle
        frames.append(amqp.detach(0))
        notes.append("consumer 0 detaches first")
    frames += [amqp.Wait(amqp.TRANSFER)] if links > 1 else []
    return frames + [amqp.end(), amqp.close()], notes


def feature_script(rng: random.Random) -> tuple[amqp.Script, list[str]]:
    queue = rng.choice(sorted(FEATURE_QUEUES))
    if rng.random() < 0.6:
        return producer_script(rng, queue)
    return consumer_script(rng, queue)


# -- replication controls (backup, dr-replica) ---------------------------------------------------------


def counts_body(rng: random.Random, ids: list[int]) -> tuple[Any, str]:
    """A ``c`` control's body: delivery-counts of ``ids`` (held, or not), valid or broken."""
    held = ids or [1]
    roll = rng.random()
    if roll < 0.45:
        flat: list[Any] = []
        for msg_id in sorted(set(rng.sample(held, min(len(held), rng.choice([1, 2, 5]))))):
            flat += [msg_id, rng.choice([0, 1, 2, 3, 2**32 - 1])]
        return flat, "valid"
    if roll < 0.75:
        bad = rng.choice([[0, 1], [2**63 - 1, 1], [ulong(2**64 - 1), 1], [held[0], -1], [held[0], 2**32],
                          [held[0]], [held[0], "2"], ["1", 1], [held[0], 1.5], [held[0], None], [10**9, 1]])
        return bad, "broken"
    return rng.choice([values.like(rng, [held[0], 1]), values.value(rng), {}, 7]), "not a list of pairs"


def message_ids_body(rng: random.Random) -> tuple[Any, str]:
    """A ``u`` control's body: remembered message-ids (type byte + value, ms, durable), valid or broken."""
    now = int(time.time() * 1000)
    roll = rng.random()
    if roll < 0.45:
        flat: list[Any] = []
        for _ in range(rng.choice([1, 2, 10])):
            flat += [b"\xa1" + b"fz-id-%d" % rng.randrange(50), now - rng.choice([0, 1000, 10**7]), rng.random() < 0.3]
        return flat, "valid"
    if roll < 0.8:
        bad = rng.choice([[b"", now, False], [b"x" * 70_000, now, False], [b"k", -1, False], [b"k", 2**63 - 1, True],
                          [b"k", ulong(2**64 - 1), False], [b"k", now, 1], [b"k", now, None], ["k", now, False],
                          [b"k", "now", False], [b"k", now], [b"k", 1.5, True], [b"\x00", 0, False]])
        return bad, "broken"
    return rng.choice([values.like(rng, [b"k", now, False]), values.value(rng), {}, "u"]), "not a list of triples"


def control_bytes(body: Any) -> bytes:
    """``body`` as a control delivery's bytes (an AMQP value message); bytes that proton cannot encode
    become a map, which the node must refuse as well."""
    try:
        return section(0x77, body)
    except Exception:  # noqa: BLE001 - proton refuses some drawn values (any of its errors)
        return section(0x77, {"unencodable": True})
