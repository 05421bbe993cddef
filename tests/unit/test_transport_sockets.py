"""The one socket read and buffered write the driver's connections and handshakes share (transport/sockets.py)."""

from __future__ import annotations

import socket

from hastandby.broker.transport.sockets import receive, send_out


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def test_receive_says_none_now_bytes_or_gone() -> None:
    a, b = _pair()
    try:
        assert receive(a, 1024) is None  # nothing sent yet
        b.sendall(b"hello")
        assert receive(a, 3) == b"hel" and receive(a, 1024) == b"lo"
        b.close()
        assert receive(a, 1024) == b""  # the peer left
        a.close()
        assert receive(a, 1024) == b""  # a failed socket reads as a peer gone
    finally:
        a.close()
        b.close()


def test_send_out_cuts_what_was_sent_and_keeps_the_rest() -> None:
    a, b = _pair()
    try:
        outbound = bytearray(b"x" * (8 << 20))  # more than the socket takes at once
        assert send_out(a, outbound) and 0 < len(outbound) < 8 << 20
        left = len(outbound)
        got = bytearray()
        while (data := receive(b, 1 << 20)) is not None:
            got += data
        assert len(got) == (8 << 20) - left
        b.close()
        while send_out(a, outbound) and outbound:  # the peer is gone: sooner or later the write fails
            pass
        assert outbound  # what was not sent is left
    finally:
        a.close()
        b.close()


def test_send_out_with_nothing_to_send_is_true() -> None:
    a, b = _pair()
    try:
        assert send_out(a, bytearray())
    finally:
        a.close()
        b.close()
