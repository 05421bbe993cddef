"""The SASL layer's two ends against each other, byte by byte (no sockets)."""

from __future__ import annotations

import pytest

from hastandby.security.sasl import (
    AMQP_HEADER,
    SASL_HEADER,
    SaslClient,
    SaslServer,
    decode_frames,
    encode_frame,
)
from hastandby.security.scram import Secret

AMQP_OPEN = AMQP_HEADER + b"...the AMQP frames that follow"


class Users:
    def __init__(self, **passwords: str) -> None:
        self.secrets = {user: Secret.derive(password) for user, password in passwords.items()}
        self.certificate_users = {"backup-1"}

    def secret(self, user: str) -> Secret | None:
        return self.secrets.get(user)

    def __contains__(self, user: object) -> bool:
        return user in self.secrets or user in self.certificate_users


def server(allow_anonymous: bool = False, subject: str | None = None) -> SaslServer:
    return SaslServer(Users(alice="wonder"), b"k" * 32, allow_anonymous, subject)


def handshake(client: SaslClient, side: SaslServer, chunk: int = 1000) -> bytes:
    """Shuttle bytes until both ends are done or one failed; what the server passed on to AMQP."""
    passed = b""
    for _ in range(20):
        outgoing = client.take_output()
        if client.done:
            outgoing += AMQP_OPEN
        for start in range(0, len(outgoing), chunk):
            passed += side.receive(outgoing[start:start + chunk])
        client.receive(side.take_output())
        if (client.done and side.done and passed) or client.failed or side.failed:
            break
    return passed


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_scram_is_preferred_and_both_ends_agree(chunk):
    client, side = SaslClient("alice", "wonder"), server()
    passed = handshake(client, side, chunk)
    assert client.done and side.done and client.mechanism == "SCRAM-SHA-256"
    assert side.principal is not None and side.principal.user == "alice"
    assert passed == AMQP_OPEN  # everything after the handshake reaches the engine unchanged


def test_plain_when_scram_is_not_offered():
    client, side = SaslClient("alice", "wonder"), server()
    side.mechanisms = lambda: ["PLAIN"]  # type: ignore[method-assign]
    handshake(client, side)
    assert client.mechanism == "PLAIN" and side.principal.user == "alice"


@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("bob", "wonder")])
def test_bad_credentials_fail_on_both_ends(user, password):
    client, side = SaslClient(user, password), server()
    handshake(client, side)
    assert side.failed and not side.done and side.principal is None
    assert client.failed == "authentication failed"


def test_anonymous_only_when_allowed():
    client, side = SaslClient(), server()
    handshake(client, side)
    assert client.failed and "no usable mechanism" in client.failed
    client, side = SaslClient(), server(allow_anonymous=True)
    handshake(client, side)
    assert side.principal is not None and side.principal.anonymous


def test_external_names_the_certificate_subject():
    client, side = SaslClient(external=True), server(subject="backup-1")
    handshake(client, side)
    assert side.principal is not None and side.principal.user == "backup-1"
    assert side.principal.mechanism == "EXTERNAL"


def test_external_needs_the_subject_to_be_a_user():
    client, side = SaslClient(external=True), server(subject="stranger")
    handshake(client, side)
    assert side.principal is None and "not a user" in side.failed


def test_a_client_that_skips_sasl_is_refused_unless_anonymous_is_allowed():
    side = server()
    assert side.receive(AMQP_OPEN) == b"" and "skipped SASL" in side.failed
    side = server(allow_anonymous=True)
    assert side.receive(AMQP_OPEN) == AMQP_OPEN and side.principal.anonymous


@pytest.mark.parametrize("opening, reason", [
    (b"\x16\x03\x01\x02\x00\x01\x00\x01", "TLS client"),
    (b"GET / HTTP/1.1\r\n", "not an AMQP client"),
    (b"AMQP\x02\x01\x00\x00", "TLS port"),
])
def test_other_protocols_are_named(opening, reason):
    side = server()
    side.receive(opening)
    assert reason in side.failed


def test_oversized_and_garbage_frames_fail_cleanly():
    side = server()
    side.receive(SASL_HEADER)
    side.receive(b"\x7f\xff\xff\xff\x02\x01\x00\x00")
    assert "larger than the limit" in side.failed
    side = server()
    side.receive(SASL_HEADER + b"\x00\x00\x00\x0c\x02\x01\x00\x00\xff\xff\xff\xff")
    assert side.failed


def test_frames_round_trip_and_split_anywhere():
    frame = encode_frame(0x43, [b"response"])
    buffer = bytearray(frame[:5])
    assert decode_frames(buffer) == []
    buffer += frame[5:] + frame
    frames = decode_frames(buffer)
    assert [code for code, _ in frames] == [0x43, 0x43] and not buffer
