"""The workload's clients: ordinary python-qpid-proton producers and consumers, and their history.

They run as one process in the clients' namespace (``python -m
benchmarks.nemesis.clients``, driven by ``workload.py``), each client on its
own thread and ``Container``.  They are plain applications given the URL list
of every node, with proton's own reconnect at a fixed 0.1 s delay (proton's
default backoff grows to 10 s) and a 1 s local idle timeout (a frozen node
keeps its socket open; only a heartbeat notices).  They hide nothing: every
send, outcome, delivery and connection change goes to the history, a JSON
line each, which the checker reads.

**The producer and proton's reconnect** (proton 0.40, measured; see
``docs/nemesis.md``).  On a lost connection proton keeps the ``Connection``
object, binds a new transport and attaches the same links again.  A delivery
that was unsettled at the loss is in doubt: the broker may or may not have
it.  Leaving it alone, proton never sends it again; settling it locally (or
updating it) makes proton send it on the new transport as a transfer without
bytes, which the broker rejects; freeing the link and opening a new one
under the same name on the same connection gets ``link name already
attached`` if that happens twice before an attach.  So this producer, on a
loss, records every unsettled message as in doubt, frees the link (its
deliveries go with it, nothing is sent again) and opens a new link with a
name never used before (``p1-3``: the producer and the attach number); when
that link attaches it sends the in-doubt messages again as new deliveries,
same message id, before any new message.  ``released``/``modified`` messages
are sent again too; ``rejected`` ones are not (the broker refused them).

A backup refuses clients by dropping the transport (the default) or with an
``amqp:connection:forced`` close.  proton treats ``forced`` as transient but
keeps the socket the node leaves open, so the client closes the transport
itself and reconnect goes on with the next URL.  proton starts its URL list
again at the first URL whenever a connection opens; the clients move the URL
of every node that opened to the end, so that after a loss the *next* node
is tried first (round robin, as qpid-jms does), not a frozen one that costs
an idle timeout per try.

Every message is durable (header ``durable=true``; the queue is durable and
the nodes keep journals, ``cluster.py``), so an acknowledged message must
survive even a kill -9 of every node (``kill9-all``), and the checker counts
every acknowledged message that never came back as lost.

The clients authenticate as ``HASTANDBY_USER``/``HASTANDBY_PASSWORD`` from the
environment (PLAIN), as the product's own clients do.

Process protocol (stdin commands, one per line; a JSON status line on stdout
every ``STATUS_EVERY`` s): ``producer NAME RATE``, ``pinned NAME URL`` (one
connection to URL, no reconnect and no idle timeout: it stays connected to a
frozen node), ``consumer NAME RATE`` (RATE 0: as fast as messages come),
``send NAME COUNT``, ``rate NAME RATE``, ``pause`` / ``resume``
(producers stop issuing new messages, consumers stop granting credit),
``finish SECONDS`` (no new messages; in-doubt ones are still sent until
settled or SECONDS pass; then every client closes and the process exits).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterable

from proton import Delivery, Message
from proton.handlers import IncomingMessageHandler, MessagingHandler
from proton.reactor import Container

from hastandby.client import Login

from ..failover_clients import FixedBackoff

RECONNECT_DELAY = 0.1  # s before every reconnect attempt
HEARTBEAT = 1.0  # s: local idle timeout
FORCED = "amqp:connection:forced"
WINDOW = 50  # most unsettled messages per producer
CREDIT = 20  # consumer credit (kept small, so that a pause is quiet soon)
TICK = 0.02  # s between a client's checks of commands, rate and credit
STATUS_EVERY = 0.2
TIME_LIMIT = 600.0  # a client ends by itself after this long, whatever happens
CONTAINER_RESTARTS = 3  # fresh containers after proton's reactor itself failed (see _Client._run)


class HistoryWriter:
    """Thread-safe JSON-lines writer: one line per event, stamped with ``time.time()``."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._lock = threading.Lock()

    def record(self, client: str, event: str, **fields: Any) -> None:
        line = json.dumps({"t": round(time.time(), 6), "c": client, "e": event, **fields}, separators=(",", ":"))
        with self._lock:
            self._out.write(line + "\n")

    def flush(self) -> None:
        with self._lock:
            self._out.flush()


class _Client(MessagingHandler):
    """One client on its own thread and container; subclasses open their link and do the messaging."""

    def __init__(self, name: str, urls: list[str], queue: str, history: HistoryWriter, credentials: dict[str, Any],
                 pinned: bool = False, **handler: Any) -> None:
        super().__init__(**handler)
        self.name = name
        self.credentials = credentials  # proton connect arguments (user, password)
        self.urls = urls
        self.queue = queue
        self.history = history
        self.pinned = pinned
        self.connection: Any = None
        self.link: Any = None
        self.attached = False  # the current link is attached on the current connection
        self.url = ""
        self.links_opened = 0
        self.paused = False
        self.finishing = False
        self.closed = False
        self.errors: list[str] = []
        self._started = 0.0
        self._reopen_at = 0.0  # when to open a new connection after the node closed ours with an error
        self._thread: threading.Thread | None = None

    # -- running --------------------------------------------------------------------------------

    def start(self) -> "_Client":
        self._thread = threading.Thread(target=self._run, name=f"nemesis-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        """Run the container; if proton's own reactor fails, start a fresh one, as an application would.

        Seen once in 100 schedules: python-qpid-proton's IOHandler called
        ``capacity()`` on a transport it had already dropped (a reconnect
        racing a forced close) and the container's ``run`` raised.  The
        client's state survives that: the link is lost (its unsettled
        messages are in doubt and sent again first), and a new container
        reconnects through the same URL list.  Only repeated failures give up.
        """
        for attempt in range(1, CONTAINER_RESTARTS + 2):
            try:
                Container(self).run()
                return
            except Exception as error:  # noqa: BLE001 - recorded; the checker then sees what is missing
                failure = f"{type(error).__name__}: {error}"
                if attempt > CONTAINER_RESTARTS or self.closed:
                    self.errors.append(failure)
                    self.history.record(self.name, "error", error=failure)
                    return
                self.history.record(self.name, "container_restarted", error=failure)
                if self.attached:
                    self.attached = False
                    self.forget_link()
                self.connection = self.link = None
                self._reopen_at = 0.0
                time.sleep(RECONNECT_DELAY)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def on_start(self, event: Any) -> None:
        self._started = self._started or time.monotonic()  # a restarted container keeps the time limit
        self._connect(event.container)
        event.container.schedule(TICK, self)

    def _connect(self, container: Any) -> None:
        reconnect = False if self.pinned else FixedBackoff(RECONNECT_DELAY)
        self.connection = container.connect(urls=self.urls, reconnect=reconnect,
                                            heartbeat=None if self.pinned else HEARTBEAT, **self.credentials)
        self.link = self.open_link(container)

    def open_link(self, container: Any) -> Any:
        raise NotImplementedError

    def next_link_name(self) -> str:
        self.links_opened += 1
        return f"{self.name}-{self.links_opened}"

    def on_timer_task(self, event: Any) -> None:
        if self.closed:
            return
        if time.monotonic() - self._started > TIME_LIMIT or self.done():
            self.close()
            return
        if self._reopen_at and time.monotonic() >= self._reopen_at:
            self._reopen_at = 0.0
            self._connect(event.container)
        self.tick(event.container)
        event.container.schedule(TICK, self)

    def tick(self, container: Any) -> None:
        """Every TICK while running."""

    def done(self) -> bool:
        """True once a finishing client has nothing left to do."""
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.history.record(self.name, "closed")
            if self.connection is not None:
                self.connection.close()

    # -- the connection ------------------------------------------------------------------------------

    def on_connection_opened(self, event: Any) -> None:
        """Note the node; move its URL to the end of proton's list (see the module docstring)."""
        self.url = str(event.connection.url)
        self.history.record(self.name, "connected", url=self.url)
        connector = getattr(event.connection, "_overrides", None)
        urls = getattr(getattr(connector, "address", None), "values", None)
        if urls:
            index = next((i for i, url in enumerate(urls) if str(url) == self.url), None)
            if index is not None:
                connector.address.values = urls[index + 1:] + urls[:index + 1]
                self.urls = [str(url) for url in connector.address.values]

    def on_connection_remote_close(self, event: Any) -> None:
        """A ``forced`` close (a backup, a node shutting down): drop the transport so reconnect goes on."""
        condition = event.connection.remote_condition
        if condition is not None and condition.name == FORCED and not self.closed:
            self.history.record(self.name, "refused", url=str(event.connection.url),
                                detail=condition.description or "")
            if event.transport is not None:
                event.transport.close_head()
                event.transport.close_tail()

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        self.history.record(self.name, "transport_error", url=str(event.connection.url) if event.connection else "",
                            detail=f"{condition.name}: {condition.description}" if condition else "")

    def on_connection_error(self, event: Any) -> None:
        """The node closed the connection with an error (e.g. its idle timeout after a freeze).

        proton then closes it for good (no reconnect), so the client opens a
        new connection after the reconnect delay, as an application would;
        a pinned client only records what is now in doubt.
        """
        self.history.record(self.name, "connection_error", url=self.url,
                            detail=str(event.connection.remote_condition))
        if self.attached:
            self.attached = False
            self.forget_link()
        if not self.pinned and not self.closed:
            self._reopen_at = time.monotonic() + RECONNECT_DELAY

    def on_disconnected(self, event: Any) -> None:
        self.history.record(self.name, "disconnected", url=str(event.connection.url))
        if self.attached:
            self.attached = False
            self.link_lost(event.container)

    def _current(self, link: Any) -> bool:
        """``link`` is the current link (proton may hand out a new wrapper for the same link)."""
        return self.link is not None and link.name == self.link.name

    def on_link_opened(self, event: Any) -> None:
        if self._current(event.link):
            self.attached = True
            self.history.record(self.name, "link", link=event.link.name, url=self.url)
            self.link_up()

    def on_link_error(self, event: Any) -> None:
        """The node detached our link with an error: treat it as a loss, on a fresh link."""
        self.history.record(self.name, "link_error", link=event.link.name, detail=str(event.link.remote_condition))
        if self._current(event.link) and self.attached and not self.closed:
            self.attached = False
            self.link_lost(event.container)

    def link_up(self) -> None:
        """The current link attached."""

    def link_lost(self, container: Any) -> None:
        """The current link is gone; the connection will come back: a new link, under a new name."""
        self.forget_link()
        self.link = self.open_link(container)

    def forget_link(self) -> None:
        """Free the current link: proton neither attaches it again nor sends its deliveries again."""
        self.link.free()


class Producer(_Client):
    """Unique ids ``NAME-000001``..., at ``rate`` per second and/or ``send(count)`` more; see the module docstring."""

    def __init__(self, name: str, urls: list[str], queue: str, history: HistoryWriter, credentials: dict[str, Any],
                 rate: float = 0.0, pinned: bool = False) -> None:
        super().__init__(name, urls, queue, history, credentials, pinned=pinned, auto_settle=True)
        self.rate = rate
        self.issued = 0
        self.acked = 0
        self.pending: collections.deque[str] = collections.deque()  # to send: in-doubt re-sends first
        self.unsettled: dict[str, str] = {}  # delivery tag -> message id, on the current link
        self._attempts: dict[str, int] = {}
        self._extra = 0  # `send` requests not yet issued (written by the command thread)
        self._extra_lock = threading.Lock()
        self._tokens = 0.0
        self._last_tick = 0.0
        self._finish_deadline = 0.0

    def open_link(self, container: Any) -> Any:
        return container.create_sender(self.connection, self.queue, name=self.next_link_name())

    def set_rate(self, rate: float) -> None:
        """New messages per second from now on (any thread)."""
        self.rate = rate

    def send_more(self, count: int) -> None:
        """Issue ``count`` more messages (any thread)."""
        with self._extra_lock:
            self._extra += count

    def finish(self, seconds: float) -> None:
        """No new messages; in-doubt ones are sent until settled, for at most ``seconds`` (any thread)."""
        self._finish_deadline = time.monotonic() + seconds
        self.finishing = True

    def done(self) -> bool:
        if not self.finishing:
            return False
        idle = not self.pending and not self.unsettled
        return idle or time.monotonic() >= self._finish_deadline

    def status(self) -> dict[str, Any]:
        return {"issued": self.issued, "acked": self.acked, "unsettled": len(self.unsettled),
                "pending": len(self.pending), "attached": self.attached, "url": self.url, "running": self.running}

    def tick(self, container: Any) -> None:
        now = time.monotonic()
        elapsed, self._last_tick = now - (self._last_tick or now), now
        if not self.finishing:
            with self._extra_lock:
                extra, self._extra = self._extra, 0
            for _ in range(extra):
                self._issue()
            if self.rate and self.attached and not self.paused:  # slots without a link are skipped
                self._tokens = min(self._tokens + self.rate * elapsed, float(WINDOW))
                while self._tokens >= 1.0:
                    self._tokens -= 1.0
                    self._issue()
        self._pump()

    def _issue(self) -> None:
        self.issued += 1
        self.pending.append(f"{self.name}-{self.issued:06d}")

    def link_up(self) -> None:
        self._pump()

    def on_sendable(self, event: Any) -> None:
        self._pump()

    def _pump(self) -> None:
        sender = self.link
        while (self.attached and not self.closed and self.pending and sender.credit > 0
               and len(self.unsettled) < WINDOW):
            message_id = self.pending.popleft()
            attempt = self._attempts.get(message_id, 0) + 1
            self._attempts[message_id] = attempt
            tag = f"{message_id}/{attempt}"
            sender.send(Message(id=message_id, body=message_id, durable=True), tag=tag)
            self.unsettled[tag] = message_id
            self.history.record(self.name, "attempt", id=message_id, n=attempt, url=self.url, link=sender.name)

    def _outcome(self, event: Any) -> str | None:
        if not self._current(event.link):
            return None
        return self.unsettled.pop(str(event.delivery.tag), None)

    def on_accepted(self, event: Any) -> None:
        message_id = self._outcome(event)
        if message_id is not None:
            self.acked += 1
            self.history.record(self.name, "accepted", id=message_id, url=self.url)
            self._pump()

    def on_rejected(self, event: Any) -> None:
        message_id = self._outcome(event)
        if message_id is not None:
            condition = event.delivery.remote.condition
            self.history.record(self.name, "rejected", id=message_id, url=self.url, detail=str(condition))
            self._pump()

    def on_released(self, event: Any) -> None:  # released or modified: the broker did not take it
        message_id = self._outcome(event)
        if message_id is not None:
            self.history.record(self.name, "released", id=message_id, url=self.url)
            self.pending.appendleft(message_id)
            self._pump()

    def forget_link(self) -> None:
        """Every unsettled message is now in doubt: recorded, and sent again first on the next link."""
        in_doubt = list(self.unsettled.values())
        for message_id in in_doubt:
            self.history.record(self.name, "in_doubt", id=message_id, url=self.url)
        self.unsettled.clear()
        if not self.pinned:  # a pinned producer has no next connection to send them on
            self.pending.extendleft(reversed(in_doubt))
        super().forget_link()


class Consumer(_Client):
    """Receives and accepts everything; records each message id (duplicates included)."""

    def __init__(self, name: str, urls: list[str], queue: str, history: HistoryWriter, credentials: dict[str, Any],
                 rate: float = 0.0) -> None:
        super().__init__(name, urls, queue, history, credentials, prefetch=0, auto_accept=False)
        self.rate = rate  # most messages per second (0: as fast as they come)
        self._allowance = 0.0
        self._last_tick = 0.0
        # Deliveries are read here (on_delivery), not by proton's IncomingMessageHandler, which
        # raises on a transfer without bytes and stops the container.
        self.handlers = [h for h in self.handlers if not isinstance(h, IncomingMessageHandler)]
        self.received = 0
        self.last_received = 0.0  # time.monotonic()

    def open_link(self, container: Any) -> Any:
        return container.create_receiver(self.connection, self.queue, name=self.next_link_name())

    def finish(self, seconds: float) -> None:
        self.finishing = True

    def done(self) -> bool:
        return self.finishing

    def status(self) -> dict[str, Any]:
        return {"received": self.received, "idle_s": round(time.monotonic() - self.last_received, 3)
                if self.last_received else None, "attached": self.attached, "url": self.url,
                "running": self.running}

    def tick(self, container: Any) -> None:
        now = time.monotonic()
        elapsed, self._last_tick = now - (self._last_tick or now), now
        if self.rate and self.attached and not self.paused:
            self._allowance = min(self._allowance + self.rate * elapsed, float(CREDIT))
        self._flow()

    def link_up(self) -> None:
        self._flow()

    def _flow(self) -> None:
        """Keep up to CREDIT outstanding; with a rate, grant only what the rate allows so far."""
        if not self.attached or self.paused or self.closed:
            return
        wanted = CREDIT - self.link.credit
        if self.rate:
            wanted = min(wanted, int(self._allowance))
        if wanted > 0 and (self.rate or self.link.credit < CREDIT // 2):
            self.link.flow(wanted)
            if self.rate:
                self._allowance -= wanted

    def on_delivery(self, event: Any) -> None:
        delivery, link = event.delivery, event.link
        if not link.is_receiver:
            return
        if delivery.aborted:
            delivery.settle()
            return
        if not delivery.readable or delivery.partial:
            return
        raw = link.recv(delivery.pending)
        link.advance()
        self.received += 1
        self.last_received = time.monotonic()
        url = str(event.connection.url)
        if not raw:
            self.history.record(self.name, "empty", url=url)
        else:
            try:
                message = Message()
                message.decode(raw)
                message_id = str(message.id if message.id is not None else message.body)
            except Exception as error:  # noqa: BLE001 - recorded; the consumer goes on
                self.history.record(self.name, "undecodable", url=url, detail=f"{type(error).__name__}: {error}")
            else:
                self.history.record(self.name, "received", id=message_id, url=url,
                                    tag=str(delivery.tag))
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()


# -- process entry --------------------------------------------------------------------------------


class _Process:
    """The clients of one workload process and the commands that drive them."""

    def __init__(self, urls: list[str], queue: str, history: HistoryWriter) -> None:
        self.credentials = Login.from_environment().connect_options()  # HASTANDBY_USER, HASTANDBY_PASSWORD
        self.urls = urls
        self.queue = queue
        self.history = history
        self.clients: dict[str, Producer | Consumer] = {}
        self.finished = threading.Event()

    def command(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        verb, args = words[0], words[1:]
        if verb == "producer":
            self._add(Producer(args[0], list(self.urls), self.queue, self.history, self.credentials,
                               rate=float(args[1])))
        elif verb == "pinned":
            self._add(Producer(args[0], [args[1]], self.queue, self.history, self.credentials, pinned=True))
        elif verb == "consumer":
            self._add(Consumer(args[0], list(self.urls), self.queue, self.history, self.credentials,
                               rate=float(args[1])))
        elif verb in ("send", "rate"):
            client = self.clients[args[0]]
            if not isinstance(client, Producer):
                raise ValueError(f"{args[0]} is not a producer")
            if verb == "send":
                client.send_more(int(args[1]))
            else:
                client.set_rate(float(args[1]))
        elif verb in ("pause", "resume"):
            for client in self.clients.values():
                client.paused = verb == "pause"
        elif verb == "finish":
            self.finish(float(args[0]))
        else:
            raise ValueError(f"unknown command {line!r}")

    def _add(self, client: Producer | Consumer) -> None:
        if client.name in self.clients:
            raise ValueError(f"client {client.name!r} exists")
        self.clients[client.name] = client
        client.start()

    def finish(self, seconds: float) -> None:
        """Producers first (bounded), so that consumers still take what they settle; then consumers."""
        producers = [c for c in self.clients.values() if isinstance(c, Producer)]
        for producer in producers:
            producer.finish(seconds)
        for producer in producers:
            producer.join(seconds + 5)
        for client in self.clients.values():
            client.finish(0)
            client.join(5)
        self.finished.set()

    def status(self) -> dict[str, Any]:
        return {name: client.status() for name, client in self.clients.items()}


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nemesis.clients",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", required=True, help="comma-separated node URLs")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--history", type=Path, required=True, help="JSON-lines file of every client event")
    args = parser.parse_args(None if argv is None else list(argv))
    with open(args.history, "a", encoding="utf-8") as out:
        history = HistoryWriter(out)
        process = _Process([u for u in args.urls.split(",") if u], args.queue, history)

        def read_commands() -> None:
            for line in sys.stdin:
                try:
                    process.command(line)
                except Exception as error:  # noqa: BLE001 - reported to the harness, which fails the schedule
                    print(json.dumps({"error": f"{line.strip()!r}: {type(error).__name__}: {error}"}), flush=True)
                if process.finished.is_set():
                    return
            process.finish(0)  # end of input: the harness is gone

        threading.Thread(target=read_commands, name="nemesis-commands", daemon=True).start()
        deadline = time.monotonic() + TIME_LIMIT
        while not process.finished.wait(STATUS_EVERY) and time.monotonic() < deadline:
            history.flush()
            print(json.dumps({"status": process.status()}), flush=True)
        history.flush()
        print(json.dumps({"status": process.status(), "done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
