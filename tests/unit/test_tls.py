"""The TLS layer, both ends in memory, with certificates this test makes (no sockets)."""

from __future__ import annotations

import pytest

from hastandby.security.tls import TlsError, TlsLayer, TlsSettings
from hastandby.testing.certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), clients=("alice",))


def pair(pki: Pki, client_cert: str | None = None, ca: str = "ca", require: bool = False,
         hostname: str = "localhost") -> tuple[TlsLayer, TlsLayer]:
    server = TlsSettings(pki.cert("server"), pki.key("server"), pki.ca, require_client_cert=require)
    client = TlsSettings(pki.cert(client_cert) if client_cert else None,
                         pki.key(client_cert) if client_cert else None, pki.path(f"{ca}.pem"))
    return (TlsLayer(client.client_context(), server_side=False, server_hostname=hostname),
            TlsLayer(server.server_context(), server_side=True))


def shuttle(client: TlsLayer, server: TlsLayer, rounds: int = 6) -> tuple[bytes, bytes]:
    """Move bytes both ways a few times; what each side decrypted."""
    to_server = to_client = b""
    for _ in range(rounds):
        to_server += server.receive(client.take_output())
        to_client += client.receive(server.take_output())
    return to_server, to_client


def test_plaintext_crosses_both_ways_and_the_client_certificate_names_the_peer(pki):
    client, server = pair(pki, client_cert="alice")
    shuttle(client, server)
    assert client.handshake_done and server.handshake_done
    assert server.peer_subject == "alice"
    client.send(b"AMQP\x03\x01\x00\x00" * 1000)
    server.send(b"hello back")
    to_server, to_client = shuttle(client, server, rounds=2)
    assert to_server == b"AMQP\x03\x01\x00\x00" * 1000 and to_client == b"hello back"


def test_without_a_client_certificate_the_subject_is_unknown(pki):
    client, server = pair(pki)
    shuttle(client, server)
    assert server.handshake_done and server.peer_subject is None


@pytest.mark.parametrize("cert, ca, hostname, failing_side, words", [
    (None, "rogue-ca", "localhost", "client", "certificate not accepted"),  # the server's CA is unknown
    (None, "ca", "elsewhere.example", "client", "certificate not accepted"),  # wrong host name
    ("expired", "ca", "localhost", "server", "CERTIFICATE|certificate"),
    ("rogue", "ca", "localhost", "server", "CERTIFICATE|certificate"),
])
def test_untrusted_expired_or_misnamed_certificates_fail_the_handshake(pki, cert, ca, hostname, failing_side, words):
    client, server = pair(pki, client_cert=cert, ca=ca, require=True, hostname=hostname)
    with pytest.raises(TlsError, match=words):
        shuttle(client, server)


def test_a_plain_amqp_client_on_the_tls_port_is_named(pki):
    _, server = pair(pki)
    with pytest.raises(TlsError, match="not a TLS client"):
        server.receive(b"AMQP\x03\x01\x00\x00")
