"""The SASL layer's two ends against each other, byte by byte (no sockets)."""

from __future__ import annotations

import pytest

from proton import symbol

from hastandby.security.sasl import (
    AMQP_HEADER,
    AUTH,
    INIT,
    MAX_FRAME,
    OK,
    OUTCOME,
    SASL_HEADER,
    SYS_TEMP,
    Principal,
    SaslClient,
    SaslServer,
    Verification,
    check_password,
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
        passed += side.settle()  # as the node's driver does, off its reactor thread
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


# -- the steps that decide a password login wait for the driver -------------------------------


def plain_init(user: str, password: str) -> bytes:
    return SASL_HEADER + encode_frame(INIT, [symbol("PLAIN"), f"\0{user}\0{password}".encode()])


def outcome_code(side: SaslServer) -> int:
    output = bytearray(side.take_output())
    if output.startswith(SASL_HEADER):
        del output[:len(SASL_HEADER)]
    frames = decode_frames(output)
    assert frames and frames[-1][0] == OUTCOME, frames
    return int(frames[-1][1][0])


def test_plain_waits_for_the_verdict_and_keeps_what_arrives_meanwhile_in_order():
    side = server()
    assert side.receive(plain_init("alice", "wonder") + AMQP_OPEN[:10]) == b""
    assert side.verification == Verification("PLAIN", "alice", "wonder") and not side.done
    assert side.receive(AMQP_OPEN[10:]) == b""  # still waiting: nothing reaches the engine yet
    assert side.resume() == AMQP_OPEN  # the verdict: the password is right
    assert side.done and side.principal == Principal("alice", "PLAIN") and side.verification is None
    assert outcome_code(side) == OK


def test_a_refused_verdict_is_a_failed_login_and_a_busy_one_is_not():
    side = server()
    side.receive(plain_init("alice", "guess"))
    assert side.resume("wrong password for user 'alice'") == b""
    assert side.failed == "wrong password for user 'alice'" and side.login_failed and not side.done
    assert outcome_code(side) == AUTH
    side = server()
    side.receive(plain_init("alice", "wonder"))
    side.resume("password checks busy", busy=True)
    assert side.failed and not side.login_failed and outcome_code(side) == SYS_TEMP


def test_the_password_check_uses_a_decoy_for_unknown_users():
    secret = Users(alice="wonder").secret("alice")
    assert check_password(secret, b"k" * 32, "alice", "wonder") is None
    assert check_password(secret, b"k" * 32, "alice", "nope") == "wrong password for user 'alice'"
    assert check_password(None, b"k" * 32, "bob", "wonder") == "unknown user 'bob'"


def test_scram_waits_before_its_proof_and_checks_it_on_resume():
    for password, ok in (("wonder", True), ("wrong", False)):
        client, side = SaslClient("alice", password), server()
        for _ in range(3):  # header; mechanisms and the client's first (which decides nothing); its final
            assert side.verification is None
            side.receive(client.take_output())
            client.receive(side.take_output())
        assert side.verification == Verification("SCRAM-SHA-256", "alice")
        side.resume()
        assert side.done is ok and side.login_failed is not ok
        client.receive(side.take_output())
        assert client.done is ok


def test_a_peer_that_sends_on_while_waiting_is_bounded_and_resume_needs_a_pause():
    side = server()
    with pytest.raises(RuntimeError):
        side.resume()
    side.receive(plain_init("alice", "wonder"))
    side.receive(b"x" * (MAX_FRAME + 1))
    assert side.failed and "while its credentials were checked" in side.failed and not side.login_failed
