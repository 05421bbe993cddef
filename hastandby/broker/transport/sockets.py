"""A non-blocking socket's reads and buffered writes, as the driver's connections and the handshakes before
them both do them: one call per readiness, never per message."""

from __future__ import annotations

import socket


def receive(sock: socket.socket, size: int) -> bytes | None:
    """Up to ``size`` bytes from ``sock``: None if it has none now, b"" if the peer left or the socket failed."""
    try:
        return sock.recv(size)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def send_out(sock: socket.socket, outbound: bytearray) -> bool:
    """Write as much of ``outbound`` as ``sock`` takes now, cutting it from ``outbound``; False if the socket
    failed (what was not sent is left in ``outbound``)."""
    while outbound:
        try:
            sent = sock.send(outbound)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        del outbound[:sent]
    return True
