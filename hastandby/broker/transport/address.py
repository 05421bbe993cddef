"""Where a node is: a ``(host, port)`` pair, and the one parser of the ``host:port`` text users and peers give."""

from __future__ import annotations

Address = tuple[str, int]


def split_hostport(text: str, default_port: int = 5672) -> tuple[str, int]:
    """'host:port' (or 'amqp://host:port', or 'host') -> (host, port); ValueError if the port is not one."""
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.rstrip("/")
    host, _, port = text.rpartition(":")
    if not host:
        return text, default_port
    number = int(port)
    if not 0 <= number < 65536:
        raise ValueError(f"port {number} is out of range (0..65535)")
    return host, number
