"""Errors the broker turns into AMQP error conditions for the offending peer only."""

from __future__ import annotations


class BrokerError(Exception):
    """An error reported to one client; ``condition`` is its AMQP error symbol."""

    condition = "amqp:internal-error"
    status = 500
    body: object = None  # a reply body with details a client can act on (a primary's address ...)


class NotFound(BrokerError):
    condition = "amqp:not-found"
    status = 404


class InvalidArgument(BrokerError):
    condition = "amqp:invalid-field"
    status = 400


class ResourceLimitExceeded(BrokerError):
    condition = "amqp:resource-limit-exceeded"
    status = 403


class ResourceLocked(BrokerError):
    condition = "amqp:resource-locked"
    status = 423


class AlreadyExists(BrokerError):
    condition = "amqp:invalid-field"
    status = 409


class NotAllowed(BrokerError):
    condition = "amqp:unauthorized-access"
    status = 403


class NotPrimary(BrokerError):
    """Cluster state (users, ACL) changes on the primary: the body names it, so a client can go there."""

    condition = "amqp:not-allowed"
    status = 421  # HTTP's "misdirected request"

    def __init__(self, message: str, primary: str | None) -> None:
        super().__init__(message)
        self.body = {"primary": primary}
