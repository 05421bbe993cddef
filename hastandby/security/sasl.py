"""The AMQP 1.0 SASL layer (spec part 5.3), both ends, as byte-in/byte-out state machines.

Why our own: the python-qpid-proton wheel is built without Cyrus SASL, so its
server side offers only ANONYMOUS and EXTERNAL, and Cyrus's sasldb would keep
passwords in clear anyway.  The node's driver puts this layer between the
socket (or TLS) and a proton transport that is told nothing of SASL: the
layer answers the SASL header and frames itself and, once the outcome is
``ok``, hands every following byte (the AMQP header onwards) to proton
unchanged.  Our outgoing connections (a backup to its primary, a DR replica
to its source) use ``SaslClient`` the same way.

Mechanisms offered by the server: SCRAM-SHA-256 and PLAIN against the
node's users (``credentials.py``), EXTERNAL when the TLS peer presented a
verified certificate, and ANONYMOUS only when anonymous access is allowed.
No I/O, no clock and no threads here: the driver bounds the time a
handshake may take, and finishes the steps that decide a password login.

Those steps pause the server (``verification``): checking a PLAIN password
derives PBKDF2 (milliseconds), which must not run on the node's one reactor
thread (``logins.py`` has it done on other threads).  The driver calls
``resume`` with the verdict and the handshake goes on; bytes that arrive
meanwhile wait, in order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Protocol

from proton import UNDESCRIBED, Array, Data, Described, symbol, ubyte, ulong

from hastandby.security.scram import MECHANISM as SCRAM, ScramClient, ScramError, ScramServer, Secret, decoy_secret

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
MAX_FRAME = 64 * 1024  # a SASL frame carries a few hundred bytes; this bounds a misbehaving peer

MECHANISMS, INIT, CHALLENGE, RESPONSE, OUTCOME = 0x40, 0x41, 0x42, 0x43, 0x44
OK, AUTH, SYS = 0, 1, 2
SYS_TEMP = 4  # a transient failure: the client may try again later


class SaslError(Exception):
    """The handshake failed; the message says why, for the log (the peer gets an outcome code)."""


@dataclass(frozen=True)
class Principal:
    """Who a connection authenticated as, and how."""

    user: str
    mechanism: str

    @property
    def anonymous(self) -> bool:
        return self.mechanism == "ANONYMOUS"


ANONYMOUS = Principal("anonymous", "ANONYMOUS")


class Users(Protocol):
    """What the SASL server needs of the credentials store."""

    def secret(self, user: str) -> Secret | None: ...

    def __contains__(self, user: object) -> bool: ...


# -- frames -------------------------------------------------------------------------------


def encode_frame(code: int, fields: list[Any]) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), fields))
    body = bytes(data.encode())
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


def decode_frame(buffer: bytearray) -> tuple[int, list[Any]] | None:
    """Take the first complete SASL frame off the front of ``buffer`` (None: none complete yet).

    One at a time: what follows the frame that ends the handshake is AMQP,
    not SASL, and stays in ``buffer`` for the engine.
    """
    while len(buffer) >= 8:
        size, doff, kind, _ = struct.unpack_from(">IBBH", buffer)
        if kind != 1 or doff < 2 or size < doff * 4:
            raise SaslError("not a SASL frame (a client speaking something else?)")
        if size > MAX_FRAME:
            raise SaslError(f"a SASL frame of {size} bytes is larger than the limit of {MAX_FRAME}")
        if len(buffer) < size:
            return None
        body = bytes(buffer[doff * 4:size])
        del buffer[:size]
        if not body:
            continue  # an empty frame: a heartbeat
        data = Data()
        try:
            data.decode(body)
            value = data.get_object()
        except Exception as error:  # proton raises its own DataException types
            raise SaslError(f"undecodable SASL frame: {error}") from None
        if not isinstance(value, Described) or not isinstance(value.value, list):
            raise SaslError("a SASL frame must hold a described list")
        # proton hands binaries out as views into its own buffer: copy them while it lives.
        return int(value.descriptor), [bytes(v) if isinstance(v, memoryview) else v for v in value.value]
    return None


def decode_frames(buffer: bytearray) -> list[tuple[int, list[Any]]]:
    """Take every complete SASL frame off the front of ``buffer``."""
    frames = []
    while (frame := decode_frame(buffer)) is not None:
        frames.append(frame)
    return frames


def _field(fields: list[Any], index: int) -> Any:
    return fields[index] if index < len(fields) else None


def _binary(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise SaslError(f"expected binary, got {type(value).__name__}")


# -- both ends ------------------------------------------------------------------------------


class _End:
    """What both ends of a handshake do with the peer's bytes: buffer them, take the SASL frames off the front
    one at a time while the handshake reads them, and once it is over hand back what follows (AMQP, for the
    engine).  A failure is caught here, once: ``_fail`` says what the peer is told."""

    _reading: ClassVar[tuple[str, ...]]  # the states in which the peer's frames are read
    _errors: ClassVar[tuple[type[Exception], ...]] = (SaslError,)  # what ``_advance`` may raise for a failure

    def __init__(self, output: bytes = b"") -> None:
        self._buffer = bytearray()
        self._output = bytearray(output)
        self._state = "header"
        self.failed: str | None = None

    @property
    def done(self) -> bool:
        return self._state == "done"

    def take_output(self) -> bytes:
        output, self._output = bytes(self._output), bytearray()
        return output

    def receive(self, data: bytes) -> bytes:
        """The peer's bytes; returns what follows a finished handshake (else nothing)."""
        if self._state == "done":
            return data
        if self._state == "failed":
            return b""
        self._buffer += data
        return self._go(self._advance)

    def _go(self, advance: Callable[[], None]) -> bytes:
        try:
            advance()
        except self._errors as error:
            self._fail(str(error))
            return b""
        if self._state == "done":
            rest, self._buffer = bytes(self._buffer), bytearray()
            return rest
        return b""

    def _frames(self) -> Iterator[tuple[int, list[Any]]]:
        """The peer's complete SASL frames, one at a time while the state reads them: what follows the frame
        that ends the handshake is AMQP, and stays in the buffer."""
        while self._state in self._reading and (frame := decode_frame(self._buffer)) is not None:
            yield frame

    def _advance(self) -> None:
        raise NotImplementedError

    def _fail(self, reason: str) -> None:
        raise NotImplementedError


# -- the server -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Verification:
    """A step that decides a password login, paused for the driver (``SaslServer.verification``).

    ``password`` is PLAIN's, to be checked against the user's secret off the
    reactor thread (``check_password``); SCRAM's proof (``password`` None)
    costs nothing to check and is checked by ``resume`` itself.
    """

    mechanism: str
    user: str
    password: str | None = field(default=None, repr=False)


def check_password(secret: Secret | None, decoy_key: bytes, user: str, password: str) -> str | None:
    """PLAIN's verdict on ``password`` against ``user``'s ``secret``: None if right, else why not (for the log).

    Derives PBKDF2 (milliseconds; hashlib lets other threads run meanwhile),
    against a decoy secret for an unknown user (``secret`` None), so that an
    unknown user costs and takes what a wrong password does.
    """
    candidate = secret if secret is not None else decoy_secret(decoy_key, user)
    if candidate.check(password) and secret is not None:
        return None
    return f"wrong password for user {user!r}" if secret is not None else f"unknown user {user!r}"


class _Plain:
    def __init__(self) -> None:
        self.user: str | None = None

    def verification(self, response: bytes) -> Verification:
        try:
            authzid, user, password = response.decode().split("\0")
        except ValueError:
            raise SaslError("a PLAIN response is authzid NUL user NUL password") from None
        if authzid and authzid != user:
            raise SaslError(f"user {user!r} may not act as {authzid!r}")
        self.user = user
        return Verification("PLAIN", user, password)

    def step(self, response: bytes) -> tuple[bytes | None, bool]:
        return None, True  # reached only once the driver found the password right


class _Scram:
    def __init__(self, users: Users, decoy_key: bytes) -> None:
        self.exchange = ScramServer(users.secret, decoy_key)

    @property
    def user(self) -> str | None:
        return self.exchange.user

    def verification(self, response: bytes) -> Verification | None:
        """The client's final message holds the proof: the step that decides."""
        return Verification(SCRAM, self.user) if self.user is not None else None

    def step(self, response: bytes) -> tuple[bytes | None, bool]:
        try:
            return self.exchange.step(response)
        except ScramError as error:
            raise SaslError(str(error)) from None


class _External:
    """A verified TLS client certificate names a user, who must be in the users file (RabbitMQ does the same)."""

    def __init__(self, subject: str, users: Users) -> None:
        self.subject = subject
        self.users = users
        self.user: str | None = None

    def verification(self, response: bytes) -> None:
        return None

    def step(self, response: bytes) -> tuple[bytes | None, bool]:
        authzid = response.decode(errors="replace")
        if authzid and authzid != self.subject:
            raise SaslError(f"certificate {self.subject!r} may not act as {authzid!r}")
        if self.subject not in self.users:
            raise SaslError(f"certificate subject {self.subject!r} is not a user of this node")
        self.user = self.subject
        return None, True


class _Anonymous:
    user = ANONYMOUS.user

    def verification(self, response: bytes) -> None:
        return None

    def step(self, response: bytes) -> tuple[bytes | None, bool]:
        return None, True


class SaslServer(_End):
    """The server's side of one connection's SASL handshake.

    Feed it the peer's bytes with ``receive``; send ``take_output()``; once
    ``done``, ``receive`` returns the bytes that follow the handshake (for
    the AMQP engine) and ``principal`` says who the peer is.  ``failed``
    holds the reason when it did not work (the peer was sent an outcome,
    where a frame could be sent; close after flushing), and
    ``login_failed`` says whether it was the credentials that were wrong
    (rather than the protocol, or the node too busy to check them).

    While ``verification`` is set the server waits for ``resume``: bytes
    received meanwhile are kept, in order, up to a frame's worth.
    """

    _reading = ("init", "response")

    def __init__(self, users: Users, decoy_key: bytes, allow_anonymous: bool,
                 certificate_subject: str | None = None) -> None:
        super().__init__()
        self._users = users
        self._decoy_key = decoy_key
        self._allow_anonymous = allow_anonymous
        self._subject = certificate_subject
        self._mechanism: Any = None
        self._mechanism_name = ""
        self._paused: bytes = b""  # the response whose step waits for ``resume``
        self.verification: Verification | None = None
        self.principal: Principal | None = None
        self.login_failed = False

    def mechanisms(self) -> list[str]:
        offered = [SCRAM, "PLAIN"]
        if self._subject:
            offered.append("EXTERNAL")
        if self._allow_anonymous:
            offered.append("ANONYMOUS")
        return offered

    def resume(self, refusal: str | None = None, busy: bool = False) -> bytes:
        """The driver's verdict on ``verification``: None to go on (SCRAM's proof is checked now), else why not.

        ``busy``: refused because the node could not check it now (the peer
        is told to try again later: outcome sys-temp), not for the
        credentials.  Returns what follows a finished handshake, as ``receive``.
        """
        if self._state != "verifying":
            raise RuntimeError(f"nothing to resume in state {self._state}")
        response, self._paused, self.verification = self._paused, b"", None
        if refusal is not None:
            self.login_failed = not busy
            self._fail(refusal, SYS_TEMP if busy else AUTH)
            return b""

        def step() -> None:
            try:
                self._finish(response)
            except SaslError:
                self.login_failed = True
                raise
            self._advance()
        return self._go(step)

    def settle(self) -> bytes:
        """Finish a paused step here and now (tests, tools: the node does it off its reactor thread)."""
        verification = self.verification
        if verification is None or verification.password is None:
            return self.resume() if verification is not None else b""
        user, password = verification.user, verification.password
        return self.resume(check_password(self._users.secret(user), self._decoy_key, user, password))

    def _advance(self) -> None:
        if self._state == "verifying":  # bytes kept, in order, for after ``resume``
            if len(self._buffer) > MAX_FRAME:
                raise SaslError(f"more than {MAX_FRAME} bytes sent while its credentials were checked")
            return
        if self._state == "header":
            if len(self._buffer) < 8:
                if not SASL_HEADER.startswith(bytes(self._buffer[:8])) and not AMQP_HEADER.startswith(
                        bytes(self._buffer[:8])):
                    self._refuse_header()
                return
            header = bytes(self._buffer[:8])
            if header == AMQP_HEADER and self._allow_anonymous:
                self.principal = ANONYMOUS  # no SASL layer at all: anonymous by definition
                self._state = "done"
                return
            if header != SASL_HEADER:
                self._refuse_header()
            del self._buffer[:8]
            self._output += SASL_HEADER
            mechanisms = [symbol(m) for m in self.mechanisms()]
            self._output += encode_frame(MECHANISMS, [Array(UNDESCRIBED, Data.SYMBOL, *mechanisms)])
            self._state = "init"
        for code, fields in self._frames():
            if self._state == "init" and code == INIT:
                self._init(fields)
            elif self._state == "response" and code == RESPONSE:
                self._step(_binary(_field(fields, 0)))
            else:
                raise SaslError(f"unexpected SASL frame 0x{code:x} in state {self._state}")

    def _refuse_header(self) -> None:
        head = bytes(self._buffer[:8])
        if head.startswith(b"\x16\x03"):
            raise SaslError("a TLS client on a port without TLS")
        if head == TLS_HEADER:
            raise SaslError("the client asks for AMQP's TLS upgrade; connect to the TLS port instead")
        if head == AMQP_HEADER:
            raise SaslError("the client skipped SASL, and anonymous access is not allowed")
        raise SaslError(f"not an AMQP client (it began with {head!r})")

    def _init(self, fields: list[Any]) -> None:
        name = str(_field(fields, 0) or "")
        if name not in self.mechanisms():
            raise SaslError(f"mechanism {name!r} is not offered (offered: {', '.join(self.mechanisms())})")
        self._mechanism_name = name
        if name == SCRAM:
            self._mechanism = _Scram(self._users, self._decoy_key)
        elif name == "PLAIN":
            self._mechanism = _Plain()
        elif name == "EXTERNAL":
            self._mechanism = _External(self._subject or "", self._users)
        else:
            self._mechanism = _Anonymous()
        self._step(_binary(_field(fields, 1)))

    def _step(self, response: bytes) -> None:
        verification = self._mechanism.verification(response)
        if verification is not None:
            self.verification, self._paused, self._state = verification, response, "verifying"
            return
        self._finish(response)

    def _finish(self, response: bytes) -> None:
        challenge, finished = self._mechanism.step(response)
        if not finished:
            self._output += encode_frame(CHALLENGE, [challenge or b""])
            self._state = "response"
            return
        self.principal = Principal(str(self._mechanism.user), self._mechanism_name)
        self._output += encode_frame(OUTCOME, [ubyte(OK), challenge] if challenge else [ubyte(OK)])
        self._state = "done"

    def _fail(self, reason: str, code: int = AUTH) -> None:
        if self._state == "header":
            self._output += SASL_HEADER  # the protocol spoken here, as AMQP asks of a bad header
        else:
            self._output += encode_frame(OUTCOME, [ubyte(code)])
        self._state = "failed"
        self.failed = reason


# -- the client -------------------------------------------------------------------------------


class SaslClient(_End):
    """Our side of a SASL handshake with a peer node (backup -> primary, replica -> source).

    Prefers SCRAM-SHA-256 when it has a password, then PLAIN; EXTERNAL when
    it has a client certificate and no password; ANONYMOUS otherwise.  Its
    first output is the SASL header; once ``done``, ``receive`` returns the
    bytes that follow and the caller sends the AMQP engine's output.
    """

    _reading = ("mechanisms", "running")
    _errors = (SaslError, ScramError, UnicodeDecodeError)

    def __init__(self, user: str | None = None, password: str | None = None, external: bool = False,
                 hostname: str | None = None) -> None:
        super().__init__(SASL_HEADER)
        self._user, self._password, self._external, self._hostname = user, password, external, hostname
        self._scram: ScramClient | None = None
        self.mechanism = ""

    def _fail(self, reason: str) -> None:
        self._state, self.failed = "failed", reason  # the peer is told nothing: we close

    def _advance(self) -> None:
        if self._state == "header":
            if len(self._buffer) < 8:
                return
            if bytes(self._buffer[:8]) != SASL_HEADER:
                raise SaslError(f"the peer answered {bytes(self._buffer[:8])!r}, not the SASL header")
            del self._buffer[:8]
            self._state = "mechanisms"
        for code, fields in self._frames():
            if self._state == "mechanisms" and code == MECHANISMS:
                self._choose(_field(fields, 0))
            elif self._state == "running" and code == CHALLENGE:
                assert self._scram is not None
                self._output += encode_frame(RESPONSE, [self._scram.final(_binary(_field(fields, 0)))])
            elif self._state == "running" and code == OUTCOME:
                self._outcome(fields)
            else:
                raise SaslError(f"unexpected SASL frame 0x{code:x} in state {self._state}")

    def _choose(self, offered: Any) -> None:
        if isinstance(offered, Array):
            offered = offered.elements
        names = [str(m) for m in (offered if isinstance(offered, (list, tuple)) else [offered]) if m]
        if self._password is not None and SCRAM in names:
            self.mechanism = SCRAM
            self._scram = ScramClient(self._user or "", self._password)
            initial = self._scram.first()
        elif self._password is not None and "PLAIN" in names:
            self.mechanism, initial = "PLAIN", f"\0{self._user}\0{self._password}".encode()
        elif self._external and "EXTERNAL" in names:
            self.mechanism, initial = "EXTERNAL", b""
        elif self._password is None and "ANONYMOUS" in names:
            self.mechanism, initial = "ANONYMOUS", b""
        else:
            raise SaslError(f"no usable mechanism among those offered: {', '.join(names) or 'none'}")
        self._output += encode_frame(INIT, [symbol(self.mechanism), initial, self._hostname])
        self._state = "running"

    def _outcome(self, fields: list[Any]) -> None:
        code = int(_field(fields, 0) or 0)
        if code != OK:
            raise SaslError("authentication failed" if code == AUTH else f"SASL outcome code {code}")
        if self._scram is not None:
            self._scram.verify(_binary(_field(fields, 1)))
        self._state = "done"

