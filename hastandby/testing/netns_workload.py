"""A workload of numbered clients in a namespace (``netns_cluster``), and what it recorded.

``Workload`` starts ``python -m hastandby.testing.numbered_client`` (the numbered
failover client every harness uses) inside the clients' namespace (so
partitions can cut the clients off a node), sends it commands and reads its
status lines.  Every message is durable (the queue is durable and the nodes
keep journals, ``netns_cluster.py``), so an acknowledged message must survive even
a kill -9 of every node (``kill9-all``).  ``History`` reads the JSON-lines
history back and gives the checker its three multisets.  The final drain
runs in the harness itself (``drain``), with the same client.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hastandby.testing.netns import Host
from hastandby.testing.numbered_client import HEARTBEAT, HistoryWriter, NumberedReceiver
from hastandby.testing.numbered_client import drain as drain_queue
from hastandby.testing.processes import JsonLinesProcess, python_env

PRODUCER_RATE = 25.0  # messages/s per background producer
PRODUCERS = ("p1", "p2", "p3")
VIRTUAL_IP_PRODUCER = "v1"  # a background producer whose only address is the virtual IP (when there is one)
CONSUMER_RATE = 30.0  # messages/s: slower than the producers, so a backlog builds that a bad replica would lose
CONSUMERS = ("c1",)
QUIET = 0.3  # s without a delivery before the load counts as quiet
FINISH_TIMEOUT = 10.0  # s for producers to settle what is in doubt at the end
DRAIN_QUIET = 1.5  # s without a delivery before the drain stops
DRAIN_TIMEOUT = 20.0
WINDOW = 50  # most unsettled messages per producer
CREDIT = 20  # consumer credit (kept small, so that a pause is quiet soon)


class WorkloadError(RuntimeError):
    """The clients process failed or refused a command."""


class Workload(JsonLinesProcess):
    """One clients process; ``stop()`` (in a ``finally``) ends it by PID if ``finish()`` did not."""

    def __init__(self, host: Host, urls: list[str], queue: str, workdir: Path, credentials: dict[str, str],
                 options: tuple[str, ...] = ()) -> None:
        """``credentials``: the clients' ``HASTANDBY_USER``/``HASTANDBY_PASSWORD`` environment; ``options``: more
        ``numbered_client`` arguments (its heartbeat, connect timeout, reconnect, ...)."""
        self.history_path = workdir / "clients-history.jsonl"
        self.status: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.background: list[str] = []  # the background producers started (start_background)
        command = host.command(sys.executable, "-m", "hastandby.testing.numbered_client", "--urls", ",".join(urls),
                               "--queue", queue, "--history", str(self.history_path), "--window", str(WINDOW),
                               "--credit", str(CREDIT), "--time-limit", "600", *options)
        super().__init__(command, workdir / "clients.log", {**python_env(), **credentials}, "nemesis-workload-status")

    def on_line(self, line: dict[str, Any]) -> None:
        if "error" in line:
            self.errors.append(str(line["error"]))
        if isinstance(line.get("status"), dict):
            self.status = line["status"]

    def command(self, text: str) -> None:
        if not self.running:
            raise WorkloadError(f"the clients process exited ({self.popen.returncode}): {self.log_tail()}")
        self.write_line(text)

    def start_background(self, virtual_ip_url: str | None = None) -> None:
        """The steady load: producers at PRODUCER_RATE each, a consumer at CONSUMER_RATE; a backlog builds.

        With ``virtual_ip_url`` one more producer, VIRTUAL_IP_PRODUCER, knows
        only that address, as an application given the virtual IP does; its
        messages go to the same queue, so the consumers and the checker take
        them with the others.
        """
        for name in PRODUCERS:
            self.command(f"producer {name} {PRODUCER_RATE:g}")
            self.background.append(name)
        if virtual_ip_url is not None:
            self.command(f"producer {VIRTUAL_IP_PRODUCER} {PRODUCER_RATE:g} {virtual_ip_url}")
            self.background.append(VIRTUAL_IP_PRODUCER)
        for name in CONSUMERS:
            self.command(f"consumer {name} {CONSUMER_RATE:g}")

    @property
    def offered_rate(self) -> float:
        return PRODUCER_RATE * len(self.background)

    def client(self, name: str) -> dict[str, Any]:
        return self.status.get(name) or {}

    def wait(self, check: Callable[[], bool], timeout: float) -> bool:
        """Poll ``check`` until true or ``timeout``; False if the process died."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            if check():
                return True
            time.sleep(0.05)
        return check()

    def quiet(self, timeout: float) -> bool:
        """Nothing queued to send, and no client's figures changed for QUIET s (paused load has settled).

        Unchanged rather than zero: a producer pinned to a deposed node may
        keep messages unsettled for ever, and that must not hold up a check.
        """
        def figures() -> dict[str, Any]:
            return {name: {k: v for k, v in status.items() if k != "idle_s"} for name, status in self.status.items()}

        seen = [figures(), time.monotonic()]

        def still() -> bool:
            now = figures()
            if now != seen[0] or any(s.get("pending") for s in now.values()):
                seen[:] = [now, time.monotonic()]
                return False
            return time.monotonic() - seen[1] >= QUIET

        return self.wait(still, timeout)

    def finish(self) -> None:
        """Producers stop and settle (bounded), consumers close, the process exits; SIGKILL if it does not."""
        if self.running:
            self.command(f"finish {FINISH_TIMEOUT:g}")
            if not self.wait_or_kill(FINISH_TIMEOUT + 15):
                self.errors.append("the clients process did not finish in time; killed")
        self.stop()

    def stop(self) -> None:
        self.wait_or_kill(0)


def drain(urls: list[str], queue: str, history_path: Path, credentials: dict[str, Any]) -> dict[str, Any]:
    """Consume ``queue`` through ``urls`` until nothing came for DRAIN_QUIET s (at most DRAIN_TIMEOUT s).

    ``credentials``: proton ``connect`` arguments (user, password).
    """
    started = time.monotonic()
    with open(history_path, "a", encoding="utf-8") as out:
        consumer: NumberedReceiver = drain_queue(urls, queue, time_limit=DRAIN_TIMEOUT, quiet=DRAIN_QUIET,
                                                 name="drain", credit=CREDIT, heartbeat=HEARTBEAT,
                                                 credentials=credentials, history=HistoryWriter(out))
    return {"received": len(consumer.received), "complete": consumer.complete, "url": consumer.url,
            "seconds": round(time.monotonic() - started, 3)}


@dataclass
class History:
    """Every client event of a schedule, read back from the JSON-lines files."""

    events: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, *paths: Path) -> "History":
        events = []
        for path in paths:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for raw in text.splitlines():
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue  # a line cut off by a killed process
                if isinstance(line, dict) and "e" in line:
                    events.append(line)
        events.sort(key=lambda e: e["t"])
        return cls(events)

    def ids(self, event: str) -> list[str]:
        return [e["id"] for e in self.events if e["e"] == event and "id" in e]

    @property
    def attempted(self) -> list[str]:
        return self.ids("attempt")

    @property
    def acknowledged(self) -> list[str]:
        return self.ids("accepted")

    @property
    def received(self) -> list[str]:
        return self.ids("received")

    def count(self, event: str) -> int:
        return sum(1 for e in self.events if e["e"] == event)
