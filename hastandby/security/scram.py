"""SCRAM-SHA-256 (RFC 5802, RFC 7677) without channel binding: both ends, as state machines.

The node verifies passwords without ever holding them: a user's entry keeps
a random salt, an iteration count and two derived keys (``StoredKey``,
``ServerKey``).  A SCRAM client proves it knows the password without sending
it; a PLAIN client sends it (over TLS, one hopes) and ``Secret.check``
derives the same keys to compare.

No I/O here: ``ScramServer.step`` takes the client's bytes and returns the
server's answer, so the SASL layer can drive it and tests can drive both
ends against each other and against the RFC 7677 test vector.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import unicodedata
from dataclasses import dataclass
from typing import Callable

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096  # RFC 7677's minimum; PBKDF2-SHA-256 of 4096 rounds costs a few ms here
NONCE_BYTES = 18


class ScramError(Exception):
    """The exchange failed; the message says why (for the log, never sent to the peer)."""


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b))


def normalize(text: str) -> bytes:
    """The bytes a password or name is hashed as (NFKC, a close stand-in for SASLprep)."""
    return unicodedata.normalize("NFKC", text).encode()


@dataclass(frozen=True)
class Secret:
    """What a node keeps of a password: salt, iterations, StoredKey, ServerKey."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(cls, password: str, salt: bytes | None = None, iterations: int = ITERATIONS) -> "Secret":
        salt = salt if salt is not None else os.urandom(16)
        salted = hashlib.pbkdf2_hmac("sha256", normalize(password), salt, iterations)
        return cls(salt, iterations, _h(_hmac(salted, b"Client Key")), _hmac(salted, b"Server Key"))

    def check(self, password: str) -> bool:
        """A PLAIN password against this secret, in constant time."""
        candidate = Secret.derive(password, self.salt, self.iterations)
        return hmac.compare_digest(candidate.stored_key, self.stored_key)

    def to_dict(self) -> dict[str, object]:
        encode = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
        return {"salt": encode(self.salt), "iterations": self.iterations,
                "stored_key": encode(self.stored_key), "server_key": encode(self.server_key)}

    @classmethod
    def from_dict(cls, fields: object) -> "Secret":
        if not isinstance(fields, dict):
            raise ValueError("a SCRAM secret is an object with salt, iterations, stored_key, server_key")
        try:
            iterations = fields["iterations"]
            if type(iterations) is not int or iterations < ITERATIONS:
                raise ValueError(f"iterations must be a whole number >= {ITERATIONS}")
            return cls(base64.b64decode(fields["salt"], validate=True), iterations,
                       base64.b64decode(fields["stored_key"], validate=True),
                       base64.b64decode(fields["server_key"], validate=True))
        except KeyError as missing:
            raise ValueError(f"a SCRAM secret lacks {missing}") from None
        except (TypeError, ValueError) as error:
            raise ValueError(f"a SCRAM secret is malformed: {error}") from None


def decoy_secret(decoy_key: bytes, user: str) -> Secret:
    """What an unknown user is checked against: made up from the name with ``decoy_key``, the same every time.

    Both mechanisms use it, so that a name that does not exist costs what a
    wrong password costs and fails at the same point (SCRAM: the proof;
    PLAIN: after deriving the key), and the exchange does not tell which
    names exist.
    """
    decoy = _hmac(decoy_key, normalize(user))
    return Secret(decoy[:16], ITERATIONS, decoy, decoy)


def _attributes(message: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError(f"malformed SCRAM attribute {part!r}")
        fields.setdefault(part[0], part[2:])
    return fields


def _unescape(name: str) -> str:
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise ScramError("malformed user name escape")
    return name.replace("=2C", ",").replace("=3D", "=")


def _escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramServer:
    """The server's side of one exchange.

    ``lookup(user)`` returns the user's ``Secret`` or None.  An unknown user
    gets a made-up salt (derived from the name with ``decoy_key``, so it is
    the same every time) and fails only at the proof, like a wrong password:
    the exchange does not tell which names exist.
    """

    def __init__(self, lookup: Callable[[str], Secret | None], decoy_key: bytes, nonce: str | None = None) -> None:
        self._lookup = lookup
        self._decoy_key = decoy_key
        self._nonce = nonce or base64.b64encode(os.urandom(NONCE_BYTES)).decode()
        self._state = "first"
        self._secret: Secret | None = None
        self._known = False
        self._client_first_bare = ""
        self._server_first = ""
        self.user: str | None = None

    def step(self, response: bytes) -> tuple[bytes, bool]:
        """Take the client's message; return (the server's answer, whether the exchange is over).

        Raises ``ScramError`` when authentication fails.
        """
        try:
            text = response.decode()
        except UnicodeDecodeError:
            raise ScramError("SCRAM messages are UTF-8") from None
        if self._state == "first":
            return self._first(text), False
        if self._state == "final":
            return self._final(text), True
        raise ScramError("the SCRAM exchange is already over")

    def _first(self, text: str) -> bytes:
        gs2, _, bare = text.partition(",")
        authzid, _, bare = bare.partition(",")
        if gs2 not in ("n", "y"):
            raise ScramError("channel binding is not supported (use SCRAM-SHA-256, not -PLUS)")
        if authzid:
            raise ScramError("an authorization identity different from the user is not supported")
        fields = _attributes(bare)
        if "m" in fields or "n" not in fields or "r" not in fields:
            raise ScramError("the client's first SCRAM message needs n= and r=")
        self.user = _unescape(fields["n"])
        secret = self._lookup(self.user)
        self._known = secret is not None
        self._secret = secret = secret if secret is not None else decoy_secret(self._decoy_key, self.user)
        self._client_first_bare = bare
        salt = base64.b64encode(secret.salt).decode()
        self._server_first = f"r={fields['r']}{self._nonce},s={salt},i={secret.iterations}"
        self._state = "final"
        return self._server_first.encode()

    def _final(self, text: str) -> bytes:
        self._state = "done"
        without_proof, _, proof_part = text.rpartition(",p=")
        if not without_proof:
            raise ScramError("the client's final SCRAM message has no proof")
        fields = _attributes(without_proof)
        expected_nonce = self._server_first.split(",", 1)[0][2:]
        if fields.get("r") != expected_nonce:
            raise ScramError("the client's final SCRAM message has the wrong nonce")
        if fields.get("c") not in ("biws", "eSws"):  # base64 of "n,," and "y,,"
            raise ScramError("unexpected SCRAM channel binding data")
        secret = self._secret
        assert secret is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise ScramError("the SCRAM proof is not base64") from None
        client_key = _xor(proof, _hmac(secret.stored_key, auth_message))
        if len(proof) != len(secret.stored_key) or not hmac.compare_digest(_h(client_key), secret.stored_key) \
                or not self._known:
            raise ScramError(f"wrong password for user {self.user!r}" if self._known else
                             f"unknown user {self.user!r}")
        signature = _hmac(secret.server_key, auth_message)
        return b"v=" + base64.b64encode(signature)


class ScramClient:
    """The client's side: ``first()``, then ``final(server_first)``, then ``verify(server_final)``."""

    def __init__(self, user: str, password: str, nonce: str | None = None) -> None:
        self.user = user
        self._password = password
        self._nonce = nonce or base64.b64encode(os.urandom(NONCE_BYTES)).decode()
        self._bare = f"n={_escape(user)},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        fields = _attributes(text)
        nonce, salt, iterations = fields.get("r", ""), fields.get("s"), fields.get("i", "")
        if not nonce.startswith(self._nonce) or salt is None or not iterations.isdigit():
            raise ScramError("the server's first SCRAM message is malformed")
        salted = hashlib.pbkdf2_hmac("sha256", normalize(self._password), base64.b64decode(salt), int(iterations))
        client_key = _hmac(salted, b"Client Key")
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        proof = _xor(client_key, _hmac(_h(client_key), auth_message))
        self._server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """The server proves it knows the secret too (a fake server cannot)."""
        fields = _attributes(server_final.decode())
        if "e" in fields:
            raise ScramError(f"the server refused: {fields['e']}")
        if not hmac.compare_digest(base64.b64decode(fields.get("v", "")), self._server_signature):
            raise ScramError("the server's SCRAM signature is wrong")
