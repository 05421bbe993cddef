"""The node's resource limits: what one client, or many, may take at most (docs/limits.md).

Every refusal is ``amqp:resource-limit-exceeded`` with a description that
names the limit and its value, on the connection, session or link (or in the
management response) that went over it, and the node goes on serving
everyone else.  Limits apply to what clients ask for; the node's own objects
(a backup's replicas, DR backlogs) are not counted against them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hastandby.broker.errors import ResourceLimitExceeded


@dataclass(frozen=True)
class Limits:
    """Per-node ceilings; 0 means no limit."""

    connections: int = 10_000  # authenticated connections on the node
    connections_per_user: int = 1_000
    sessions_per_connection: int = 64
    links_per_connection: int = 1_000
    queues: int = 10_000  # queues on the node, counting only clients' creations against it
    auto_created_queues: int = 1_000  # queues made by attaching to an unknown address
    management_request: int = 1 << 20  # bytes of one management request
    max_frame_size: int = 1 << 20  # bytes of one AMQP frame, both ways
    handshakes: int = 1_000  # sockets still in TLS/SASL at once (each is bounded in time too)
    handshakes_per_source: int = 100  # of them from one source address
    failed_logins_per_source: int = 5  # failed logins from one address before its next attempts wait
    failed_login_delay_ms: int = 5_000  # the longest such a wait (it doubles from 100 ms)
    tls_handshakes_per_source_per_s: int = 100  # TLS handshakes begun per second from one address; more wait
    login_checks: int = 256  # PLAIN password checks and TLS handshake steps on the login pool or waiting for it
    refusals_per_connection: int = 100  # refused sessions and links the peer has not ended or detached

    def check(self, what: str, count: int, limit: int) -> None:
        """Raise ResourceLimitExceeded if ``count`` more would pass ``limit`` (0: none)."""
        if limit and count >= limit:
            raise ResourceLimitExceeded(f"{what} limit reached: {limit}")
