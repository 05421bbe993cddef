"""Kind ``frames``: raw TCP, mutated SASL and AMQP frames, before and after authentication.

Each case opens a socket to a node and writes one of:

- **before authentication** (a quarter of the cases): the SASL header and
  frames (an init for PLAIN, SCRAM-SHA-256, ANONYMOUS or EXTERNAL, with its
  response), or the AMQP, TLS or no header at all, mutated (bytes, fields,
  frame order, sizes);
- **after authentication** (PLAIN or SCRAM-SHA-256 as ``app``, ``admin`` or
  ``peer``, done properly by our SASL client): the AMQP header and one of
  the valid conversations of ``amqp.SCRIPTS`` (producer, consumer, browser,
  management request, dynamic receiver, two sessions, the anonymous relay,
  a multi-frame and an aborted transfer; and what python-qpid-proton itself
  sends for a producer and a consumer, recorded through a proxy at start,
  ``capture.py``); or, a fifth of the time, a producer or consumer on the
  queue-feature queues ``features.FEATURE_QUEUES`` (header priorities,
  ``x-opt-delivery-time``/``-delay`` annotations, message-ids, last-value
  keys and group headers of every type; settlements that count toward a
  delivery limit), sent as it is half of the time; mutated: a field changed to a
  neighbour or to any AMQP value, a frame's channel, performative code, type,
  data offset or size field broken, frames dropped, repeated up to 3000
  times, swapped, moved out of order, empty frames, payload bytes broken;
- on a second node started with ``--allow-anonymous`` (a fifth of the
  cases): the AMQP header straight away (no SASL), then a mutated
  conversation.

The bytes go out in one write, in random pieces or byte by byte; what the
node sends back is read (bounded) and its error conditions noted.
"""

from __future__ import annotations

import random
from typing import Any

from . import amqp, capture, features, mutate
from .amqp import Frame
from .base import (
    FUZZ_QUEUE,
    REPLY_QUEUE,
    CaseRecord,
    Kind,
    conditions,
    converse,
    sasl_login,
)
from .checks import admin_request
from .node import FuzzNode
from .wire import Raw

MECHANISMS = ["PLAIN", "SCRAM-SHA-256"]
FEATURE_SHARE = 0.2  # of the scripts after authentication: a feature producer or consumer (features.py)


class Frames(Kind):
    name = "frames"
    summary = "raw SASL and AMQP frames, mutated, before and after authentication (and on an anonymous node)"

    def setup(self) -> None:
        self.node = self.start_node("frames")
        self.anonymous: FuzzNode = self.start_node("frames-anonymous", anonymous=True)
        for node in self.nodes.nodes:
            self.prepare(node)
        self.templates = amqp.scripts(FUZZ_QUEUE, REPLY_QUEUE)
        # What python-qpid-proton itself sends, recorded through a proxy (capture.py).
        assert self.node is not None
        captured = capture.script(capture.record(self.node.host, self.node.port, "app", self.users.passwords["app"],
                                                 FUZZ_QUEUE))
        self.templates["captured"] = lambda: [amqp.copy_frame(f) for f in captured]

    def prepare(self, node: FuzzNode) -> None:
        super().prepare(node)
        for queue, arguments in features.FEATURE_QUEUES.items():  # what the feature scripts send to and take from
            admin_request(node, "CREATE", "queue", queue, {"arguments": arguments})

    def run_case(self, rng: random.Random, index: int) -> CaseRecord:
        record = CaseRecord()
        roll = rng.random()
        if roll < 0.2:
            record.target = self.anonymous
            self._anonymous(rng, record)
        elif roll < 0.45:
            record.target = self.node
            self._before_auth(rng, record)
        else:
            record.target = self.node
            self._after_auth(rng, record)
        return record

    # -- the three shapes of a case ------------------------------------------------------

    def _script(self, rng: random.Random, record: CaseRecord) -> list[Any]:
        if rng.random() < FEATURE_SHARE:  # queue features: priorities, scheduled delivery, ids, keys, settlements
            script, notes = features.feature_script(rng)
            record.description.extend(notes)
            if rng.random() < 0.5:
                return script
            frames, notes = mutate.mutate_script(rng, script)
            record.description.extend(notes)
            return frames
        name = rng.choice(sorted(self.templates))
        record.note(f"script {name}")
        frames, notes = mutate.mutate_script(rng, self.templates[name]())
        record.description.extend(notes)
        return frames

    def _encode(self, rng: random.Random, parts: list[Any], record: CaseRecord) -> list[Any]:
        try:
            return mutate.serialise(parts)
        except Exception as error:  # noqa: BLE001 - a mutated field proton cannot encode: break bytes instead
            record.note(f"unencodable mutation ({type(error).__name__}); bytes mutated instead")
            valid = [p if not isinstance(p, Frame) else _safe_encode(p) for p in parts]
            segments = mutate.serialise(valid)
            index = rng.choice([i for i, seg in enumerate(segments) if isinstance(seg, bytes)] or [0])
            if segments and isinstance(segments[index], bytes):
                segments[index], notes = mutate.mutate_bytes(rng, segments[index])
                record.description.extend(notes)
            return segments

    def _send(self, rng: random.Random, node: FuzzNode, segments: list[Any], record: CaseRecord,
              login: tuple[str, str] | None = None) -> None:
        how = rng.random()
        record.note({0: "one write per segment", 1: "random pieces", 2: "byte by byte"}[
            0 if how < 0.6 else 1 if how < 0.9 else 2])
        record.segments = segments
        raw = Raw(node.host, node.port)
        try:
            if login is not None:
                user, mechanism = login
                failure = sasl_login(raw, user, self.users.passwords[user], mechanism)
                if failure is not None:
                    record.conditions.append(f"login refused: {failure}")
                    return
            piece_rng = random.Random(rng.random())
            pieces = None if how < 0.6 else (lambda data: mutate.chunks(piece_rng, data, bytewise=how >= 0.9))
            replies = converse(raw, segments, pieces, read_for=rng.choice([0.05, 0.2, 0.4]))
            record.conditions.extend(conditions(replies))
            if raw.send_failed:
                record.conditions.append(f"write: {raw.send_failed}")
        finally:
            raw.close()

    def _after_auth(self, rng: random.Random, record: CaseRecord) -> None:
        user = rng.choice(["app", "app", "admin", "peer"])
        mechanism = rng.choice(MECHANISMS)
        record.note(f"authenticated as {user} ({mechanism})")
        header = amqp.AMQP_HEADER
        if rng.random() < 0.05:
            header, notes = mutate.mutate_bytes(rng, header)
            record.note("AMQP header: " + "; ".join(notes))
        segments = self._encode(rng, [header] + self._script(rng, record), record)
        self._send(rng, self.node, segments, record, login=(user, mechanism))

    def _anonymous(self, rng: random.Random, record: CaseRecord) -> None:
        record.note("anonymous node, no SASL")
        header = amqp.AMQP_HEADER
        if rng.random() < 0.1:
            header, notes = mutate.mutate_bytes(rng, header)
            record.note("AMQP header: " + "; ".join(notes))
        segments = self._encode(rng, [header] + self._script(rng, record), record)
        self._send(rng, self.anonymous, segments, record)

    def _before_auth(self, rng: random.Random, record: CaseRecord) -> None:
        user = rng.choice(["app", "admin", "peer", "nobody"])
        password = self.users.passwords.get(user, "wrong")
        mechanism = rng.choice(["PLAIN", "PLAIN", "SCRAM-SHA-256", "ANONYMOUS", "EXTERNAL", "CRAM-MD5", ""])
        if mechanism == "PLAIN":
            response: bytes | None = amqp.plain(user, password if rng.random() < 0.7 else "wrong")
        elif mechanism == "SCRAM-SHA-256":
            response = b"n,,n=" + user.encode() + b",r=" + rng.randbytes(12).hex().encode()
        else:
            response = rng.choice([None, b"", b"x" * rng.choice([1, 100, 70000])])
        header = rng.choice([amqp.SASL_HEADER] * 8 + [amqp.AMQP_HEADER, amqp.TLS_HEADER, b"\x16\x03\x01\x00", b""])
        frames: list[Any] = [amqp.sasl_init(mechanism, response)]
        if mechanism == "SCRAM-SHA-256" or rng.random() < 0.2:
            frames += [amqp.Wait(amqp.SASL_CHALLENGE),
                       amqp.sasl_response(rng.choice([b"c=biws,r=x,p=eA==", b"", rng.randbytes(40)]))]
        if rng.random() < 0.3:  # what a pipelining client sends next
            frames += [amqp.AMQP_HEADER, amqp.open_(), amqp.begin()]
        record.note(f"before authentication: mechanism {mechanism!r} as {user}, header {header!r}")
        if rng.random() < 0.5:
            frames, notes = mutate.mutate_script(rng, frames)
            record.description.extend(notes)
            segments = self._encode(rng, [header] + frames, record)
        else:
            segments = self._encode(rng, [header] + frames, record)
            index = rng.choice([i for i, seg in enumerate(segments) if isinstance(seg, bytes)])
            segments[index], notes = mutate.mutate_bytes(rng, segments[index])
            record.description.extend(notes)
        self._send(rng, self.node, segments, record)


def _safe_encode(frame: Frame) -> bytes:
    try:
        return frame.encode()
    except Exception:  # noqa: BLE001 - a mutated field proton cannot encode (any of its errors)
        return Frame(frame.code if isinstance(frame.code, int) else None, [], frame.channel).encode()
