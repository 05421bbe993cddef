"""``Outbound.redirect`` leaves a peer that accepted the TCP connection but never answers SASL at once.

A frozen primary (SIGSTOP) still completes TCP handshakes in its kernel; a
backup told by etcd of the next primary must try that one now, not after the
handshake bound with the old one.  The node redirects first and names the new
address after (``HaNode.follow``), so the attempt must wait for the caller.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from hastandby.broker.transport.driver import Driver
from hastandby.broker.transport.address import Address
from hastandby.broker.transport.outbound import Outbound
from hastandby.security.pipe import ClientSecurity


class Owner:
    def opened(self, connection: object) -> None:
        pass

    def lost(self, reason: str) -> None:
        pass


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


@pytest.mark.parametrize("when", ["retry-pending", "connecting", "sasl-sent"])
def test_a_redirect_tries_the_new_address_at_once_whatever_the_old_attempt_was_doing(when: str) -> None:
    frozen, new = listener(), listener()  # frozen: TCP accepted by the kernel, never read
    target: list[Address] = []
    driver = Driver(handler=None)
    outbound = Outbound(driver, lambda: list(target), Owner(), security=ClientSecurity("u", "p"))
    thread = threading.Thread(target=driver.run, daemon=True)
    thread.start()

    def follow_new() -> None:  # HaNode.follow's order: the role redirects, then the node records the leader
        outbound.redirect()
        target[:] = [new.getsockname()]

    def start_then_follow_new() -> None:
        outbound.start()
        if when == "retry-pending":  # no address yet: a retry is due; the stale leader is named first
            target[:] = [frozen.getsockname()]
        follow_new()

    try:
        started = time.monotonic()
        if when == "sasl-sent":
            target[:] = [frozen.getsockname()]
            driver.call_soon_threadsafe(outbound.start)
            frozen.settimeout(5)
            frozen.accept()  # the attempt reached the frozen peer's kernel
            time.sleep(0.2)  # its SASL header is out; no answer comes
            started = time.monotonic()
            driver.call_soon_threadsafe(follow_new)
        else:
            if when == "connecting":  # etcd names the next primary before the connect to the old one completed
                target[:] = [frozen.getsockname()]
            driver.call_soon_threadsafe(start_then_follow_new)
        new.settimeout(5)
        new.accept()
        assert time.monotonic() - started < 1.0
    finally:
        driver.call_soon_threadsafe(outbound.stop)
        driver.call_soon_threadsafe(driver.stop)
        thread.join(5)
        frozen.close()
        new.close()
