"""TLS for AMQP connections, as a byte-in/byte-out layer over Python's ``ssl`` (OpenSSL).

Why not proton's own SSL layer: TLS must sit *under* our SASL layer
(``sasl.py``), and proton offers no way in between its TLS and its AMQP
layers.  ``ssl.SSLObject`` with memory BIOs does the same work in OpenSSL,
driven by the node's own socket loop: the socket's bytes go in, plaintext
comes out for SASL and then proton, and proton's output goes back the same
way.  The cost is per chunk of up to 256 KiB, not per message.

``TlsSettings`` is what ``serve`` and the peer links are given; contexts are
built once per listener or peer, and every connection gets a ``TlsLayer``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


class TlsError(Exception):
    """A handshake or record failed; the message says why, for the log."""


@dataclass(frozen=True)
class TlsSettings:
    """Certificates and trust: this node's certificate and key, the CA that signs its peers'."""

    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None
    require_client_cert: bool = False

    def server_context(self) -> ssl.SSLContext:
        if self.cert_file is None or self.key_file is None:
            raise TlsError("a TLS listener needs --ssl-cert-file and --ssl-key-file")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        if self.ca_file is not None:
            context.load_verify_locations(cafile=str(self.ca_file))
            context.verify_mode = ssl.CERT_REQUIRED if self.require_client_cert else ssl.CERT_OPTIONAL
        elif self.require_client_cert:
            raise TlsError("--ssl-require-client-cert needs --ssl-ca-file to verify them with")
        return context

    def client_context(self) -> ssl.SSLContext:
        """For our connections to peers: verify the peer's certificate and host name; present ours if any."""
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context


def subject_name(certificate: dict | None) -> str | None:
    """The commonName of a verified peer certificate (what EXTERNAL authenticates as)."""
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class TlsLayer:
    """One connection's TLS: ``receive`` the socket's bytes, ``send`` plaintext, ``take_output`` for the socket."""

    def __init__(self, context: ssl.SSLContext, server_side: bool, server_hostname: str | None = None) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._object = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                        server_hostname=server_hostname)
        self.handshake_done = False
        self.peer_subject: str | None = None
        if not server_side:
            self._handshake()

    def receive(self, data: bytes) -> bytes:
        """Decrypt what the peer sent; may also queue handshake output.  Raises TlsError."""
        if data:
            self._incoming.write(data)
        if not self.handshake_done and not self._handshake():
            return b""
        plain = bytearray()
        while True:
            try:
                chunk = self._object.read(256 * 1024)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                break
            except ssl.SSLError as error:
                raise TlsError(_describe(error)) from None
            if not chunk:
                break
            plain += chunk
        return bytes(plain)

    def send(self, plain: bytes) -> None:
        view = memoryview(plain)
        while view:
            try:
                written = self._object.write(view)
            except ssl.SSLError as error:
                raise TlsError(_describe(error)) from None
            view = view[written:]

    def take_output(self) -> bytes:
        return self._outgoing.read()

    def _handshake(self) -> bool:
        try:
            self._object.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLCertVerificationError as error:
            raise TlsError(f"certificate not accepted: {error.verify_message or error.reason}") from None
        except ssl.SSLError as error:
            raise TlsError(_describe(error)) from None
        self.handshake_done = True
        self.peer_subject = subject_name(self._object.getpeercert())
        return True


def _describe(error: ssl.SSLError) -> str:
    reason = error.reason or str(error)
    if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"):
        return f"not a TLS client ({reason}): a plain AMQP client on the TLS port?"
    return reason
