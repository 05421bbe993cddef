"""A node's roles as an operator sees them: ``STATUS`` asked every ``POLL`` s by a thread, the changes kept.

``StatusPoller`` is how the failover benchmark and the nemesis suite learn
what each node is (primary, backup, down or frozen), from outside, as
``hastandby status`` would; ``history`` holds one ``Seen`` per change, with
the time the request was sent and the time the answer (or the failure) came.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from hastandby.client import Login, ManagementClient, ManagementError

POLL = 0.05  # seconds between STATUS requests to each node


@dataclass
class Seen:
    """One STATUS observation that differed from the previous one (``status`` None: no answer)."""

    sent: float  # time.time() when the request was sent
    t: float  # when the answer (or the failure) came
    status: dict[str, Any] | None


class StatusPoller:
    """Asks one node for STATUS every POLL seconds over one admin connection; keeps the changes.

    ``login``: the admin user to authenticate as (default: from the environment).
    """

    KEYS = ("state", "detail", "term", "primary", "halted", "queues")

    def __init__(self, node_id: str, address: str, login: Login | None = None) -> None:
        self.node_id = node_id
        self.address = address
        self.login = login
        self.history: list[Seen] = []
        self.latest: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"failover-status-{node_id}", daemon=True)

    def start(self) -> "StatusPoller":
        self._thread.start()
        return self

    def _run(self) -> None:
        client: ManagementClient | None = None
        previous: Any = "none yet"
        while not self._stop.is_set():
            sent = time.time()
            try:
                if client is None:
                    client = ManagementClient(self.address, timeout=1.0, login=self.login)
                reply = client.request("STATUS")
                status: dict[str, Any] | None = {k: reply.get(k) for k in self.KEYS}
            except ManagementError:
                status = None
                if client is not None:
                    client.close()
                    client = None
            self.latest = status
            if status != previous:
                self.history.append(Seen(sent, time.time(), status))
                previous = status
            self._stop.wait(POLL if status is not None else 0.1)
        if client is not None:
            client.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def state(self) -> str | None:
        latest = self.latest
        return latest["state"] if latest else None

    def follows(self, primary_address: str) -> bool:
        """A backup (caught up) replicating from ``primary_address``."""
        latest = self.latest
        return bool(latest and latest["state"] == "backup" and latest.get("primary") == primary_address)

    def first_primary_after(self, t: float) -> Seen | None:
        return next((s for s in self.history if s.t >= t and s.status and s.status["state"] == "primary"), None)
