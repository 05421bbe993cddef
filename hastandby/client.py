"""A blocking management client: one request, one reply, over AMQP.

The CLI and the tests use it.  It declares itself an admin connection
(``qpid.ha-admin``), which HA backups admit, so that they can be inspected,
when the user is in the ``admin`` group.

Credentials (``Login``) come from the broker address
(``amqp://user:password@host:port``, ``amqps://`` for TLS), from the CLI's
``--user`` and ``--password-file``, or from the environment
(``HASTANDBY_USER``, ``HASTANDBY_PASSWORD`` or ``HASTANDBY_PASSWORD_FILE``,
``HASTANDBY_SSL_CA_FILE``, ``HASTANDBY_SSL_CERT_FILE``,
``HASTANDBY_SSL_KEY_FILE``), never only from a command line others can read.
With a user and password the client uses PLAIN (python-qpid-proton's wheel
has no SCRAM; use TLS on a network); with a certificate and no password,
EXTERNAL.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from proton import ConnectionException, Message, ProtonException, SSLDomain, Timeout
from proton.utils import BlockingConnection, SyncRequestResponse

from hastandby.broker.vocabulary import ADMIN_PROPERTY, MANAGEMENT_ADDRESS
from hastandby.connect_timeout import CONNECT_TIMEOUT

NOTHING_LISTENING = "cannot connect (nothing listening?)"


@dataclass(frozen=True)
class Login:
    """How a client authenticates to a node, and the TLS it uses."""

    user: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls: bool = False

    @classmethod
    def from_environment(cls) -> "Login":
        env = os.environ.get
        password = env("HASTANDBY_PASSWORD")
        if password is None and env("HASTANDBY_PASSWORD_FILE"):
            password = read_password(Path(env("HASTANDBY_PASSWORD_FILE", "")))
        return cls(env("HASTANDBY_USER") or None, password, env("HASTANDBY_SSL_CA_FILE") or None,
                   env("HASTANDBY_SSL_CERT_FILE") or None, env("HASTANDBY_SSL_KEY_FILE") or None)

    def for_broker(self, broker: str) -> tuple[str, "Login"]:
        """``amqp[s]://host:port`` and this login with what the address itself says (user, password, TLS)."""
        parts = urlsplit(broker if "://" in broker else f"amqp://{broker}")
        login = self
        if parts.username:
            login = replace(login, user=unquote(parts.username),
                            password=unquote(parts.password) if parts.password is not None else login.password)
        tls = parts.scheme == "amqps" or login.tls
        host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
        return f"{'amqps' if tls else 'amqp'}://{host}:{parts.port or (5671 if tls else 5672)}", \
            replace(login, tls=tls)

    def connect_options(self, host: str = "") -> dict[str, Any]:
        """Keyword arguments for python-qpid-proton's connect / BlockingConnection.

        python-qpid-proton cannot match a certificate against an IP address, so
        a node named by its address has its certificate checked against the CA
        but not its name; name nodes by host name for the full check.
        """
        options: dict[str, Any] = {}
        if self.user is not None:
            options["user"] = self.user
            if self.password is not None:
                options["password"] = self.password
                options["allow_insecure_mechs"] = True  # PLAIN on a plain port: the operator chose it
        if self.tls:
            domain = SSLDomain(SSLDomain.MODE_CLIENT)
            if self.ca_file:
                domain.set_trusted_ca_db(self.ca_file)
            by_address = _is_ip_address(host)
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER if by_address else SSLDomain.VERIFY_PEER_NAME,
                                           self.ca_file)
            if self.cert_file and self.key_file:
                domain.set_credentials(self.cert_file, self.key_file, None)
            options["ssl_domain"] = domain
        return options


def redirected(broker: str, primary: str) -> str:
    """``primary`` (``host:port`` or ``amqps://host:port``) with the credentials ``broker`` carried."""
    parts = urlsplit(broker if "://" in broker else f"amqp://{broker}")
    target = urlsplit(primary if "://" in primary else f"{parts.scheme}://{primary}")
    userinfo = broker.split("://", 1)[-1].rpartition("@")[0] if parts.username else ""
    return f"{target.scheme}://{userinfo + '@' if userinfo else ''}{target.netloc}"


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def read_password(path: Path) -> str:
    """A password file's first line (a trailing newline is not part of it)."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ManagementError(f"cannot read password file {path}: {error.strerror}") from None
    return text.splitlines()[0] if text else ""


class ManagementError(Exception):
    """A request failed; the message says why, in words for a person."""

    def __init__(self, message: str, status: int | None = None, unreachable: bool = False,
                 primary: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.unreachable = unreachable  # nothing listens there: the node is down, not merely refusing
        self.primary = primary  # a backup that sends this request to its primary names it here


class ManagementClient:
    """A connection to one node's ``$management`` address.

    ``connect_timeout`` bounds the connect (to the node's AMQP open), which a
    node behind a cut link never answers, and ``timeout`` each request after
    it; the connect waits at most the smaller of the two, so a caller's short
    ``timeout`` holds for the whole exchange.
    """

    def __init__(self, broker: str, timeout: float = 10.0, admin: bool = True, login: Login | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.broker = broker
        properties = {ADMIN_PROPERTY: True} if admin else None
        url, login = (login or Login.from_environment()).for_broker(broker)
        connect_bound = min(timeout, connect_timeout)
        try:
            self._connection = BlockingConnection(url, timeout=connect_bound, properties=properties,
                                                  **login.connect_options(urlsplit(url).hostname or ""))
        except Timeout:
            raise ManagementError(f"{broker}: no answer to connect within {connect_bound:g} s") from None
        except (ProtonException, OSError) as error:
            raise _connect_error(broker, error) from None
        self._connection.timeout = timeout  # every wait from here on: the link attaches, each request
        try:
            self._rpc = SyncRequestResponse(self._connection, MANAGEMENT_ADDRESS)
        except Timeout:
            self.close()
            raise ManagementError(f"{broker}: no answer within {timeout:g} s") from None
        except (ProtonException, OSError) as error:
            self.close()
            raise _connect_error(broker, error) from None

    def request(self, operation: str, type: str = "", name: str = "", body: dict[str, Any] | None = None) -> Any:
        """Send one request; return the reply body or raise ManagementError."""
        message = Message(properties={"operation": operation, "type": type, "name": name}, body=body or {})
        try:
            reply = self._rpc.call(message)
        except Timeout:
            raise ManagementError(f"{self.broker}: no reply to {operation}") from None
        except (ProtonException, OSError) as error:
            raise ManagementError(f"{self.broker}: {operation} failed: {_condition(error)}") from None
        properties = reply.properties or {}
        status = int(properties.get("statusCode", 500))
        if status >= 400:
            description = str(properties.get("statusDescription", "request failed"))
            condition = properties.get("condition")
            primary = reply.body.get("primary") if isinstance(reply.body, dict) else None
            raise ManagementError(f"{condition}: {description}" if condition else description, status,
                                  primary=str(primary) if primary else None)
        return reply.body

    def close(self) -> None:
        try:
            self._connection.close()
        except (ProtonException, OSError):
            pass

    def __enter__(self) -> "ManagementClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect_error(broker: str, error: Exception) -> ManagementError:
    if isinstance(error, ConnectionException):
        reason = _condition(error)
        return ManagementError(f"{broker}: {reason}", unreachable=reason == NOTHING_LISTENING)
    return ManagementError(f"{broker}: cannot connect: {error}")


def _condition(error: Exception) -> str:
    """The peer's own words: proton wraps them in 'Connection X disconnected: Condition(...)'."""
    text = str(error) or type(error).__name__
    if "Connection refused to all addresses" in text:
        return NOTHING_LISTENING
    if "Condition(" in text:
        inner = text[text.index("Condition(") + len("Condition("):].rstrip(")")
        name, _, description = inner.partition(", ")
        return f"{name.strip(chr(39))}: {description.strip(chr(39))}" if description else name.strip(chr(39))
    return text
