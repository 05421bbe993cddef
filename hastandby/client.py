"""A blocking management client: one request, one reply, over AMQP.

The CLI and the tests use it.  It declares itself an admin connection
(``qpid.ha-admin``), which HA backups admit so they can be inspected.
"""

from __future__ import annotations

from typing import Any

from proton import ConnectionException, Message, ProtonException, Timeout, symbol
from proton.utils import BlockingConnection, SyncRequestResponse

from .broker.management import ADDRESS

ADMIN_PROPERTY = symbol("qpid.ha-admin")


class ManagementError(Exception):
    """A request failed; the message says why, in words for a person."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def broker_url(broker: str) -> str:
    return broker if "://" in broker else f"amqp://{broker}"


class ManagementClient:
    """A connection to one node's ``$management`` address."""

    def __init__(self, broker: str, timeout: float = 10.0, admin: bool = True) -> None:
        self.broker = broker
        properties = {ADMIN_PROPERTY: True} if admin else None
        try:
            self._connection = BlockingConnection(broker_url(broker), timeout=timeout, properties=properties)
            self._rpc = SyncRequestResponse(self._connection, ADDRESS)
        except ConnectionException as error:
            raise ManagementError(f"{broker}: {_condition(error)}") from None
        except Timeout:
            raise ManagementError(f"{broker}: no answer within {timeout:g} s") from None
        except (ProtonException, OSError) as error:
            raise ManagementError(f"{broker}: cannot connect: {error}") from None

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
            raise ManagementError(str(properties.get("statusDescription", "request failed")), status)
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


def _condition(error: Exception) -> str:
    """The peer's own words: proton wraps them in 'Connection X disconnected: Condition(...)'."""
    text = str(error) or type(error).__name__
    if "Connection refused to all addresses" in text:
        return "cannot connect (nothing listening?)"
    if "Condition(" in text:
        inner = text[text.index("Condition(") + len("Condition("):].rstrip(")")
        name, _, description = inner.partition(", ")
        return f"{name.strip(chr(39))}: {description.strip(chr(39))}" if description else name.strip(chr(39))
    return text
