"""SCRAM-SHA-256 both ways, against RFC 7677's example exchange."""

from __future__ import annotations

import base64

import pytest

from hastandby.security.scram import ScramClient, ScramError, ScramServer, Secret

# RFC 7677, section 3.
CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

SECRET = Secret.derive("pencil", SALT, 4096)


def server(users: dict[str, Secret] | None = None) -> ScramServer:
    users = {"user": SECRET} if users is None else users
    return ScramServer(users.get, decoy_key=b"k" * 32, nonce=SERVER_NONCE)


def test_the_rfc_7677_exchange_from_both_ends():
    client = ScramClient("user", "pencil", nonce=CLIENT_NONCE)
    assert client.first() == CLIENT_FIRST
    assert client.final(SERVER_FIRST) == CLIENT_FINAL
    client.verify(SERVER_FINAL)
    side = server()
    assert side.step(CLIENT_FIRST) == (SERVER_FIRST, False)
    assert side.step(CLIENT_FINAL) == (SERVER_FINAL, True)
    assert side.user == "user"


def test_a_wrong_password_fails_at_the_proof():
    client = ScramClient("user", "pen", nonce=CLIENT_NONCE)
    side = server()
    challenge, _ = side.step(client.first())
    with pytest.raises(ScramError, match="wrong password"):
        side.step(client.final(challenge))


def test_an_unknown_user_looks_like_a_known_one_until_the_proof():
    side = server()
    challenge, _ = side.step(b"n,,n=nobody,r=abc")
    again, _ = server().step(b"n,,n=nobody,r=abc")
    assert challenge == again and b"s=" in challenge and b"i=4096" in challenge  # a stable decoy salt
    client = ScramClient("nobody", "x", nonce="abc")
    with pytest.raises(ScramError, match="unknown user"):
        side.step(client.final(challenge))


def test_the_client_refuses_a_server_that_does_not_know_the_secret():
    client = ScramClient("user", "pencil", nonce=CLIENT_NONCE)
    client.final(SERVER_FIRST)
    with pytest.raises(ScramError, match="signature"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))


@pytest.mark.parametrize("first", [b"p=tls-unique,,n=user,r=x", b"n,a=admin,n=user,r=x", b"n,,r=x", b"n,,n=a=b,r=x",
                                   b"\xff\xfe", b"n,,n"])
def test_malformed_or_unsupported_first_messages_are_refused(first):
    with pytest.raises(ScramError):
        server().step(first)


def test_a_tampered_nonce_is_refused():
    side = server()
    side.step(CLIENT_FIRST)
    with pytest.raises(ScramError, match="nonce"):
        side.step(CLIENT_FINAL.replace(b"k0,", b"k1,"))


def test_secrets_round_trip_and_check_plain_passwords():
    secret = Secret.derive("s3cret")
    assert secret.check("s3cret") and not secret.check("s3cret!")
    assert Secret.from_dict(secret.to_dict()) == secret
    assert "s3cret" not in str(secret.to_dict())
    with pytest.raises(ValueError, match="iterations"):
        Secret.from_dict({**secret.to_dict(), "iterations": 10})
    with pytest.raises(ValueError, match="lacks"):
        Secret.from_dict({"salt": "AA=="})
