"""What lies between a connection's socket and its AMQP engine: TLS (optional), then SASL.

The driver gives a ``Pipe`` the socket's bytes (``receive``) and sends what it
has for the socket (``take_output``); once ``done``, the engine's output goes
in through ``send`` and what ``receive`` returns goes to the engine.  A plain
connection's pipe has nothing left to do after SASL (``passthrough``), and
the driver drops it so that the per-message path stays the bare one.

Server side: ``ServerSecurity`` holds what every accepted connection is
checked against (the users, whether anonymous access is allowed) and makes
each connection's pipe.  Client side: ``ClientSecurity`` is what our own
connections to peer nodes present (user and password, or a certificate).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

from hastandby.security.sasl import Principal, SaslClient, SaslServer, Users, Verification
from hastandby.security.tls import TlsError, TlsLayer


class PipeError(Exception):
    """TLS or SASL failed; the message says why (for the log)."""


class Pipe:
    """TLS and SASL of one connection, in the order the wire has them."""

    def __init__(self, tls: TlsLayer | None) -> None:
        self.tls = tls
        self.principal: Principal | None = None
        self._pending = bytearray()  # SASL output produced before the TLS handshake finished

    @property
    def done(self) -> bool:
        raise NotImplementedError

    @property
    def tls_handshaking(self) -> bool:
        """TLS whose handshake is not done yet (its next step may make a private-key operation)."""
        return self.tls is not None and not self.tls.handshake_done

    @property
    def passthrough(self) -> bool:
        """Done, and no TLS: the driver may move bytes between socket and engine itself."""
        return self.done and self.tls is None

    def receive(self, data: bytes) -> bytes:
        """The socket's bytes; returns bytes for the engine.  Raises PipeError when the handshake fails."""
        if self.tls is not None:
            try:
                data = self.tls.receive(data)
            except TlsError as error:
                raise PipeError(f"TLS: {error}") from None
            if not self.tls.handshake_done:
                return b""
        return self._after_tls(data)

    def send(self, data: bytes) -> bytes:
        """The engine's bytes (only once done); returns bytes for the socket."""
        if self.tls is None:
            return data
        try:
            self.tls.send(data)
        except TlsError as error:
            raise PipeError(f"TLS: {error}") from None
        return self.tls.take_output()

    def take_output(self) -> bytes:
        """Handshake bytes (TLS, SASL) waiting for the socket."""
        plain = self._sasl_output()
        if self.tls is None:
            return plain
        self._pending += plain
        if self._pending and self.tls.handshake_done:
            try:
                self.tls.send(bytes(self._pending))
            except TlsError as error:
                raise PipeError(f"TLS: {error}") from None
            self._pending.clear()
        return self.tls.take_output()

    def _after_tls(self, data: bytes) -> bytes:
        raise NotImplementedError

    def _sasl_output(self) -> bytes:
        raise NotImplementedError


@dataclass
class ServerSecurity:
    """What the node checks every accepted connection against."""

    users: Users
    allow_anonymous: bool = False
    decoy_key: bytes = field(default_factory=lambda: os.urandom(32))

    def pipe(self, tls: ssl.SSLContext | None) -> "ServerPipe":
        return ServerPipe(self, TlsLayer(tls, server_side=True) if tls is not None else None)


class ServerPipe(Pipe):
    def __init__(self, security: ServerSecurity, tls: TlsLayer | None) -> None:
        super().__init__(tls)
        self.security = security
        self._sasl: SaslServer | None = None

    @property
    def done(self) -> bool:
        return self._sasl is not None and self._sasl.done

    @property
    def verification(self) -> Verification | None:
        """A SASL step waiting for the driver's verdict (``resume``)."""
        return self._sasl.verification if self._sasl is not None else None

    @property
    def login_failed(self) -> bool:
        """The handshake failed because the credentials were wrong (a failed login)."""
        return self._sasl is not None and self._sasl.login_failed

    def resume(self, refusal: str | None, busy: bool = False) -> bytes:
        """The verdict on ``verification`` (``SaslServer.resume``); returns bytes for the engine, as ``receive``."""
        assert self._sasl is not None
        return self._sasl_result(self._sasl.resume(refusal, busy))

    def _after_tls(self, data: bytes) -> bytes:
        if self._sasl is None:
            subject = self.tls.peer_subject if self.tls is not None else None
            self._sasl = SaslServer(self.security.users, self.security.decoy_key, self.security.allow_anonymous,
                                    subject)
        if self._sasl.done:
            return data
        return self._sasl_result(self._sasl.receive(data))

    def _sasl_result(self, rest: bytes) -> bytes:
        assert self._sasl is not None
        if self._sasl.failed:
            raise PipeError(f"SASL: {self._sasl.failed}")
        if self._sasl.done:
            self.principal = self._sasl.principal
        return rest

    def _sasl_output(self) -> bytes:
        return self._sasl.take_output() if self._sasl is not None else b""


@dataclass(frozen=True)
class ClientSecurity:
    """What our connections to peer nodes present: a user and password, and/or TLS."""

    user: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None

    def pipe(self, hostname: str) -> "ClientPipe":
        tls = TlsLayer(self.tls, server_side=False, server_hostname=hostname) if self.tls is not None else None
        external = self.tls is not None and self.password is None
        return ClientPipe(SaslClient(self.user, self.password, external=external, hostname=hostname), tls)


class ClientPipe(Pipe):
    def __init__(self, sasl: SaslClient, tls: TlsLayer | None) -> None:
        super().__init__(tls)
        self._sasl = sasl

    @property
    def done(self) -> bool:
        return self._sasl.done

    def _after_tls(self, data: bytes) -> bytes:
        rest = self._sasl.receive(data)
        if self._sasl.failed:
            raise PipeError(f"SASL ({self._sasl.mechanism or 'no mechanism'}): {self._sasl.failed}")
        return rest

    def _sasl_output(self) -> bytes:
        return self._sasl.take_output()
