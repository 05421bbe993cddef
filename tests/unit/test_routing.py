"""Exchanges, registry validation and message sections, without I/O."""

from __future__ import annotations

import pytest
from proton import Message

from hastandby.broker.message import sections
from hastandby.broker.errors import InvalidArgument, NotAllowed, NotFound, ResourceLimitExceeded
from hastandby.broker.queues.exchange import topic_matches
from hastandby.broker.queues.registry import Registry


@pytest.mark.parametrize(
    "pattern,subject,expected",
    [
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#", "", True),
        ("#.c", "a.b.c", True),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.x.y.c", True),
        ("a.#.c", "a.x.y.d", False),
        ("*.b", "a.b", True),
        ("*", "a.b", False),
        ("a.b", "a.b", True),
        ("a.b", "a.bc", False),
    ],
)
def test_topic_patterns(pattern, subject, expected):
    assert topic_matches(pattern, subject) is expected


def msg(subject=None, ttl=None, to=None, body="x") -> bytes:
    message = Message(subject=subject, address=to, body=body)
    if ttl is not None:
        message.ttl = ttl
    return bytes(message.encode())


def test_sections_read_subject_ttl_to_and_patch_delivery_count():
    data = msg(subject="a.b", ttl=2.5, to="q")
    assert sections.subject(data) == "a.b"
    assert sections.header_ttl(data) == 2500
    assert sections.to_address(data) == "q"
    patched = sections.with_delivery_count(data, 3)
    decoded = Message()
    decoded.decode(patched)
    assert (decoded.delivery_count, decoded.subject, decoded.body) == (3, "a.b", "x")
    assert sections.header_ttl(msg()) is None


def test_malformed_sections_raise_a_clear_error():
    with pytest.raises(sections.MalformedMessage):
        sections.subject(b"\x00\x53\x73\xff\xff")


def test_exchange_types_route_on_subject():
    r = Registry()
    for kind in ("direct", "fanout", "topic"):
        r.declare_exchange(kind, kind)
    for name in ("q1", "q2"):
        r.declare_queue(name)
    r.bind("direct", "q1", "k1")
    r.bind("fanout", "q1")
    r.bind("fanout", "q2")
    r.bind("topic", "q2", "a.*")
    assert [q.name for q in r.route(r.exchanges["direct"], msg("k1"))] == ["q1"]
    assert r.route(r.exchanges["direct"], msg("k2")) == []
    assert [q.name for q in r.route(r.exchanges["fanout"], msg())] == ["q1", "q2"]
    assert [q.name for q in r.route(r.exchanges["topic"], msg("a.z"))] == ["q2"]
    assert r.exchanges["direct"].dropped == 1


def test_unroutable_goes_to_alternate_exchange():
    r = Registry()
    r.declare_exchange("alt", "fanout")
    r.declare_queue("dead")
    r.bind("alt", "dead")
    r.declare_exchange("main", "direct", alternate_exchange="alt")
    assert [q.name for q in r.route(r.exchanges["main"], msg("nobody"))] == ["dead"]


def test_invalid_replicate_values_are_refused_before_anything_changes():
    r = Registry()
    with pytest.raises(InvalidArgument, match="qpid.replicate"):
        r.declare_queue("q", {"qpid.replicate": "bogus"})
    with pytest.raises(InvalidArgument, match="qpid.replicate"):
        r.declare_exchange("e", "topic", {"qpid.replicate": 7})
    with pytest.raises(InvalidArgument):
        Registry(default_replicate="most")
    assert "q" not in r.queues and "e" not in r.exchanges


def test_effective_replication_level_is_recorded_on_the_object():
    r = Registry(default_replicate="all")
    q, _ = r.declare_queue("q")
    assert q.settings.replicate == "all" and q.settings.arguments["qpid.replicate"] == "all"
    n, _ = r.declare_queue("n", {"qpid.replicate": "none"})
    assert n.settings.replicate == "none"


def test_bad_limits_and_unknown_objects():
    r = Registry()
    with pytest.raises(InvalidArgument):
        r.declare_queue("q", {"qpid.max_count": "lots"})
    with pytest.raises(InvalidArgument):
        r.declare_queue("q", {"qpid.policy_type": "drop-everything"})
    with pytest.raises(NotFound):
        r.delete_queue("missing")
    with pytest.raises(NotFound):
        r.bind("amq.direct", "missing")
    with pytest.raises(NotAllowed):
        r.delete_exchange("amq.topic")
    with pytest.raises(NotFound):
        Registry(auto_create=False).resolve("nowhere")


def test_reject_policy_is_checked_on_every_target_before_enqueueing_any():
    r = Registry()
    r.declare_exchange("f", "fanout")
    r.declare_queue("roomy")
    r.declare_queue("full", {"qpid.max_count": 0})
    r.bind("f", "roomy")
    r.bind("f", "full")
    with pytest.raises(ResourceLimitExceeded):
        r.deliver(r.route(r.exchanges["f"], msg()), msg())
    assert r.queues["roomy"].depth == 0


def test_deleting_a_queue_reroutes_to_its_alternate_and_unbinds():
    r = Registry()
    r.declare_exchange("alt", "fanout")
    r.declare_queue("dead")
    r.bind("alt", "dead")
    q, _ = r.declare_queue("q", alternate_exchange="alt")
    r.bind("amq.fanout", "q")
    q.enqueue(msg())
    r.delete_queue("q")
    assert r.queues["dead"].depth == 1
    assert r.exchanges["amq.fanout"].bindings == []
    r.declare_queue("user", alternate_exchange="alt")
    with pytest.raises(NotAllowed, match="alternate exchange"):
        r.delete_exchange("alt")


def test_a_message_of_many_sections_is_refused_after_a_few_and_parses_in_linear_time():
    """A legal-looking 8 MiB message of 64k repeated annotation sections: the old parser copied the
    rest of the buffer per section (quadratic: minutes); now each is decoded in place, and a peer
    that repeats a section more than MAX_SECTIONS times gets a decode error after that many."""
    import time

    from proton import Data, Described, ulong

    from hastandby.broker.message import sections

    one = Data()
    one.put_object(Described(ulong(0x72), {}))  # an empty message-annotations section
    section = bytes(one.encode())
    timings = {}
    for count in (16_384, 65_536):
        message = section * count + bytes(range(100))
        started = time.perf_counter()
        with pytest.raises(sections.MalformedMessage, match="more than 16 sections"):
            sections.subject(message)
        timings[count] = time.perf_counter() - started
    print(f"\nworst-case messages refused in {timings}")
    legal = section * sections.MAX_SECTIONS
    assert sections.subject(legal) is None  # up to the limit they are read
    assert sections.MalformedMessage("x").condition == "amqp:decode-error"


# An AMQP char (0x73, UTF-32) past U+10FFFF: proton decodes it, Python's chr() cannot hold it.
_BAD_CHAR = bytes([0x73, 0x00, 0x11, 0x00, 0x00])
_BODY = bytes(Message(body="b").encode())


def test_a_section_python_cannot_hold_is_a_malformed_message():
    """Seed 5, frames case 2823: the anonymous relay read ``to`` from properties holding such a char,
    and ValueError from proton's get_char closed the producer's link instead of rejecting the message."""
    properties = bytes([0x00, 0x53, 0x73, 0xC0, 1 + len(_BAD_CHAR), 0x01]) + _BAD_CHAR
    with pytest.raises(sections.MalformedMessage, match="undecodable section at byte 0"):
        sections.to_address(properties + _BODY)


def test_redelivery_leaves_a_header_it_cannot_decode_as_it_came():
    """The fast header path reads durable, priority and ttl only, so such a header can be stored;
    setting its delivery-count on redelivery must not fail."""
    header = bytes([0x00, 0x53, 0x70, 0xC0, 4 + len(_BAD_CHAR), 0x04, 0x41, 0x40, 0x40]) + _BAD_CHAR
    assert sections.header_durable(header + _BODY) is True
    assert sections.with_delivery_count(header + _BODY, 3) == header + _BODY
