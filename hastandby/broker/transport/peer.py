"""Reading what a peer sent, at the boundary, without trusting it.

proton's decoder accepts AMQP that its Python binding cannot turn into
Python values: a string that is not UTF-8 raises ``UnicodeDecodeError`` when
read (an address, a reply-to), and a map with a binary, list or map key
(legal AMQP) raises ``ValueError``/``TypeError`` inside ``get_dict``
(``remote_properties``).  A properties field may also hold anything at all,
not only a map.  These helpers read such fields and turn a bad one into
``InvalidArgument`` (``amqp:invalid-field``) naming it, which the caller
refuses the link, connection or delivery with.
"""

from __future__ import annotations

from typing import Any, Callable

from hastandby.broker.errors import InvalidArgument

UNDECODABLE = (ValueError, TypeError, KeyError)  # UnicodeDecodeError is a ValueError


def field(read: Callable[[], Any], what: str) -> Any:
    """``read()``, a peer's field; InvalidArgument naming ``what`` if it cannot be decoded."""
    try:
        return read()
    except UNDECODABLE as error:
        raise InvalidArgument(f"undecodable {what}: {type(error).__name__}: {error}") from None


def properties(endpoint: Any, what: str) -> dict[Any, Any]:
    """A connection's or link's ``remote_properties``: a map ({} if absent), or InvalidArgument."""
    value = field(lambda: endpoint.remote_properties, what)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a map, not {type(value).__name__}")
    return value


def address(terminus: Any, what: str) -> str | None:
    """A source's or target's address, or InvalidArgument if it is not valid UTF-8."""
    return field(lambda: terminus.address, what)  # type: ignore[no-any-return]
