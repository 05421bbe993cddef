"""The numbered failover client: a plain python-qpid-proton producer and consumer, for tests and benchmarks.

One client for every harness that proves nothing acknowledged was lost
through failovers: the integration tests (in process, on threads), the
failover benchmark (``benchmarks/failover.py``) and the nemesis suite
(``tests/nemesis/``), both of which run it as a process of its own
(``python -m hastandby.testing.numbered_client``, see ``main``) so that its
timestamps are not delayed by the harness's other threads.  Every time is
``time.time()``: the processes run on one machine, so one wall clock orders
them (``docs/failover-traces.md``).

**A plain client.**  Each client has its own ``Container`` and thread and is
given the URL list of every node, the way an application is told to use a
hot-standby cluster, with proton's own reconnect at a **fixed delay before
every attempt** (``FixedBackoff``, 0.1 s: proton's default starts at 0 and
doubles up to 10 s, which would measure the client's patience rather than
the cluster's failover).  Optional ``heartbeat`` is proton's local idle
timeout: a frozen (SIGSTOPped) node keeps its socket open, only a heartbeat
notices.  ``connect_timeout`` bounds each attempt at one URL
(``hastandby.connect_timeout``): proton has no connect timeout, and a
connect to a node behind a cut link waits minutes for the kernel instead of
going on to the next URL.  A client hides nothing: every send, outcome, delivery and
connection change is recorded, in memory and, given a ``HistoryWriter``, as
a JSON line each (``{"t", "c": client name, "e": event, ...}``), which the
nemesis checker reads.

What plain proton 0.40 does, measured against this cluster
(``docs/nemesis.md``), and what the client does about it:

- A backup refuses clients by dropping the transport or with an
  ``amqp:connection:forced`` close.  proton treats ``forced`` as transient
  but keeps the socket the node leaves open (so it waits for its idle
  timeout, for ever without a heartbeat); the client closes the transport
  itself and reconnect goes on with the next URL (rhea and qpid-jms move on
  for that condition too).  Likewise after a transport error (a silent
  node's idle timeout): otherwise proton lingers another idle timeout.
- proton starts its URL list again at the first URL whenever a connection
  opens, so a backup listed before the primary would be retried for ever;
  the client moves the URL of every node that opened to the end, so that
  after a loss the *next* node is tried first (round robin, qpid-jms's
  order), not a frozen one that costs an idle timeout per try.
- On a lost connection proton keeps the ``Connection``, binds a new
  transport and attaches the same links again.  An unsettled delivery is in
  doubt: the broker may or may not have it.  Left alone, proton never sends
  it again; settled or updated locally, proton sends it on the new transport
  as a transfer without bytes (brokers store or reject an empty message);
  a link freed and opened again under the *same* name gets ``link name
  already attached`` when that happens twice before an attach.  So the
  producer, on a loss, records every unsettled number as in doubt, frees the
  link (its deliveries go with it, nothing is sent again) and opens a new
  one under a name never used before (``p1-3``: client name and attach
  number).  When that link attaches it sends the in-doubt numbers again as
  new deliveries, same number and message id, before any new number, as
  every at-least-once producer does (a queue may hold duplicates, never
  gaps).  ``released``/``modified`` numbers are sent again too; ``rejected``
  ones are not (the broker refused them).
- A node that closes the connection with an error (its idle timeout after a
  freeze) makes proton close it for good: the client opens a new connection
  after the reconnect delay, as an application would.  If proton's reactor
  itself fails (seen once in 100 nemesis schedules: a reconnect racing a
  forced close), the client starts a fresh container (``_Client._run``).

**The producer** (``NumberedSender``) sends the integers 1, 2, ... as message
bodies (message id ``NAME-000001``), at most ``window`` unsettled: as fast
as that allows up to ``count``, or one every ``1/rate`` s (slots that fall
while it has no attached link are skipped, not sent in a burst later), plus
``send_more(n)`` extra at once.  An acknowledgement is the broker's
``accepted`` outcome; each is recorded with its time and the link (hence the
node) it came on.  A ``pinned`` producer has one connection to one URL, no
reconnect and no idle timeout: it stays connected to a frozen node, and
whatever that node accepts after it resumes is acknowledged by a deposed
primary (the fencing probe).

**The consumer** (``NumberedReceiver``) grants credit itself (at most
``credit`` outstanding, at ``rate`` per second if given), accepts every
delivery and records every number in arrival order (duplicates included);
it notes a *gap* when a number arrives more than one above the highest seen
so far (with one producer per queue that is Qpid's check that nothing
acknowledged went missing).  A transfer without bytes is recorded as
``empty`` (and accepted) instead of crashing proton's decoder.

In process::

    sender = NumberedSender(urls, "q", count=5000).start()
    ... kill the primary, promote a backup ...
    assert sender.join(timeout=30) and sender.done
    receiver = drain(new_primary_urls, "q", sender.accepted_set)
    assert not receiver.missing(sender.accepted_set)
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from proton import Delivery, Message
from proton.handlers import IncomingMessageHandler, MessagingHandler
from proton.reactor import Container

from hastandby.client import Login
from hastandby.connect_timeout import ConnectTimeout

RECONNECT_DELAY = 0.1  # s before every reconnect attempt (each URL in turn)
HEARTBEAT = 1.0  # s: the processes' local idle timeout (a silent, SIGSTOPped node is given up after this long)
CONNECT_TIMEOUT = 2.0  # s an attempt at one URL may take to the node's open before the next URL is tried
FORCED = "amqp:connection:forced"
WINDOW = 100  # most unsettled messages per producer
CREDIT = 100  # most outstanding consumer credit
TICK = 0.02  # s between a client's checks of stop requests, time limit, rate and credit
STATUS_EVERY = 0.05  # s between the process's status lines
TIME_LIMIT = 900.0  # s: a client process ends by itself after this long, whatever happens
CONTAINER_RESTARTS = 3  # fresh containers after proton's reactor itself failed (see _Client._run)


class FixedBackoff:
    """proton ``reconnect=``: the same delay before every attempt, for ever.

    proton re-iterates this object whenever a connection opens, so it must be
    an iterable (not a one-shot iterator).
    """

    def __init__(self, delay: float = RECONNECT_DELAY) -> None:
        self.delay = delay

    def __iter__(self) -> Iterator[float]:
        return itertools.repeat(self.delay)


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


@dataclass(frozen=True)
class LinkUp:
    """The client's link was attached by a node: ``no`` counts them from 0 (0 is the first connect)."""

    no: int
    t: float
    url: str
    name: str


@dataclass(frozen=True)
class Note:
    """Something that happened to the connection: ``connected``, ``refused`` (forced), ``disconnected``, ..."""

    t: float
    kind: str
    url: str
    detail: str = ""


class _Client(MessagingHandler):
    """One client on its own thread and container; subclasses open their link and do the messaging."""

    role = ""

    def __init__(self, urls: Iterable[str], address: str, name: str, heartbeat: float | None = None,
                 reconnect_delay: float = RECONNECT_DELAY, pinned: bool = False, time_limit: float = 60.0,
                 credentials: dict[str, Any] | None = None, history: HistoryWriter | None = None,
                 tick: float = TICK, connect_timeout: float = CONNECT_TIMEOUT, proton_backoff: bool = False,
                 keep_order: bool = False, **handler: Any) -> None:
        """``connect_timeout``: seconds per attempt at one URL (0: none; a pinned client has none).

        ``proton_backoff`` and ``keep_order`` make it a plain proton application
        (``benchmarks/client_cut.py`` compares them): proton's own reconnect
        delays instead of the fixed one, and the URL list left in its order.
        """
        super().__init__(**handler)
        if not pinned and connect_timeout > 0:
            self.handlers.append(ConnectTimeout(connect_timeout))
        self.urls = list(urls)
        self.address = address
        self.name = name
        self.heartbeat = heartbeat
        self.reconnect_delay = reconnect_delay
        self.proton_backoff = proton_backoff
        self.keep_order = keep_order
        self.pinned = pinned  # one connection to the first URL, no reconnect, no idle timeout
        self.time_limit = time_limit
        self.credentials = credentials or {}  # proton connect arguments (user, password, ...)
        self.history = history
        self.tick_interval = tick
        self.links: list[LinkUp] = []
        self.notes: list[Note] = []
        self.errors: list[str] = []
        self.connection: Any = None
        self.link: Any = None
        self.attached = False  # the current link is attached on the current connection
        self.attached_at = 0.0  # time.monotonic() of the current link's attach
        self.url = ""
        self.links_opened = 0
        self.paused = False
        self.finishing = False
        self.closed = False
        self.timed_out = False
        self.done = False
        self.started = 0.0  # time.time() of the first start
        self.finished = 0.0  # time.time() of the close
        self._started = 0.0  # time.monotonic(), for the time limit (a restarted container keeps it)
        self._stop = threading.Event()
        self._reopen_at = 0.0  # when to open a new connection after the node closed ours with an error
        self._thread: threading.Thread | None = None

    # -- running -------------------------------------------------------------------------------------

    def start(self) -> "_Client":
        """Run on a daemon thread; returns at once."""
        self._thread = threading.Thread(target=self._run, name=f"numbered-{self.name}", daemon=True)
        self._thread.start()
        return self

    def run(self) -> "_Client":
        """Run to completion, ``stop()`` or the time limit, on this thread."""
        self._run()
        return self

    def _run(self) -> None:
        """Run the container; if proton's own reactor fails, start a fresh one, as an application would.

        Seen once in 100 nemesis schedules: python-qpid-proton's IOHandler
        called ``capacity()`` on a transport it had already dropped (a
        reconnect racing a forced close) and the container's ``run`` raised.
        The client's state survives that: the link is lost (its unsettled
        messages are in doubt and sent again first), and a new container
        reconnects through the same URL list.  Only repeated failures give up.
        """
        for attempt in range(1, CONTAINER_RESTARTS + 2):
            try:
                Container(self).run()
                return
            except Exception as error:  # noqa: BLE001 - recorded; the caller then sees what is missing
                failure = f"{type(error).__name__}: {error}"
                if attempt > CONTAINER_RESTARTS or self.closed:
                    self.errors.append(failure)
                    self._event("error", error=failure)
                    return
                self._event("container_restarted", error=failure)
                if self.attached:
                    self.attached = False
                    self.forget_link()
                self.connection = self.link = None
                self._reopen_at = 0.0
                time.sleep(self.reconnect_delay)
            finally:
                self.finished = time.time()

    def stop(self) -> None:
        """Close the connection (within one tick) and end the thread (any thread)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the client's thread to end; True if it has."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def link_no(self) -> int:
        """Index into ``links`` of the current (or last) attached link."""
        return len(self.links) - 1

    @property
    def refusals(self) -> int:
        """``amqp:connection:forced`` closes (a backup refused us)."""
        return sum(1 for note in self.notes if note.kind == "refused")

    @property
    def connections(self) -> list[tuple[float, str]]:
        """(time, url) of every connection a node opened."""
        return [(note.t, note.url) for note in self.notes if note.kind == "connected"]

    def _event(self, event: str, **fields: Any) -> None:
        if self.history is not None:
            self.history.record(self.name, event, **fields)

    def _note(self, kind: str, url: str, detail: str = "") -> None:
        self.notes.append(Note(time.time(), kind, url, detail))
        self._event(kind, url=url, **({"detail": detail} if detail else {}))

    def status(self) -> dict[str, Any]:
        return {"running": self.running, "attached": self.attached, "url": self.url, "links": len(self.links),
                "errors": len(self.errors)}

    def record(self) -> dict[str, Any]:
        """Everything recorded (JSON-able)."""
        return {"role": self.role, "name": self.name, "urls": self.urls, "started": self.started,
                "finished": self.finished, "links": [asdict(link) for link in self.links],
                "notes": [asdict(note) for note in self.notes], "errors": self.errors}

    # -- container events --------------------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        if not self._started:  # a restarted container keeps the time limit
            self._started, self.started = time.monotonic(), time.time()
        self._connect(event.container)
        event.container.schedule(self.tick_interval, self)

    def _connect(self, container: Any) -> None:
        # reconnect=None is proton's default: delays 0, 0.1, 0.2, ... 10 s per turn of the URL list, started
        # afresh whenever a connection opens (an explicit proton Backoff object would never start afresh).
        reconnect: Any = False if self.pinned else None if self.proton_backoff else FixedBackoff(self.reconnect_delay)
        self.connection = container.connect(urls=self.urls, reconnect=reconnect,
                                            heartbeat=None if self.pinned else self.heartbeat, **self.credentials)
        self.link = self.open_link(container)

    def open_link(self, container: Any) -> Any:
        raise NotImplementedError

    def next_link_name(self) -> str:
        self.links_opened += 1
        return f"{self.name}-{self.links_opened}"

    def on_timer_task(self, event: Any) -> None:
        if self.closed:
            return
        if time.monotonic() - self._started > self.time_limit:
            self.timed_out = True
            self.close()
            return
        if self._stop.is_set() or self.finished_work():
            self.close()
            return
        if self._reopen_at and time.monotonic() >= self._reopen_at:
            self._reopen_at = 0.0
            self._connect(event.container)
        self.tick()
        event.container.schedule(self.tick_interval, self)

    def tick(self) -> None:
        """Every tick while running."""

    def finished_work(self) -> bool:
        """True once the client has nothing left to do."""
        return False

    def close(self) -> None:
        """Close the connection; the container then ends."""
        if not self.closed:
            self.closed = True
            self._event("closed")
            if self.connection is not None:
                self.connection.close()

    def on_connection_opened(self, event: Any) -> None:
        """Note the node; move its URL to the end of proton's list (see the module docstring), unless
        ``keep_order``.

        proton's connector holds the list (``connection._overrides``, proton
        0.40) and reads it lazily, so this takes effect on the next loss.
        """
        self.url = str(event.connection.url)
        self._note("connected", self.url)
        connector = getattr(event.connection, "_overrides", None)
        urls = getattr(getattr(connector, "address", None), "values", None)
        if urls and not self.keep_order:
            index = next((i for i, url in enumerate(urls) if str(url) == self.url), None)
            if index is not None:
                connector.address.values = urls[index + 1:] + urls[:index + 1]
                self.urls = [str(url) for url in connector.address.values]

    def on_connection_remote_close(self, event: Any) -> None:
        """A ``forced`` close (a backup, a node shutting down): drop the transport so reconnect goes on."""
        condition = event.connection.remote_condition
        if condition is not None and condition.name == FORCED and not self.closed:
            self._note("refused", str(event.connection.url), condition.description or "")
            if event.transport is not None:
                event.transport.close_head()
                event.transport.close_tail()

    def on_transport_error(self, event: Any) -> None:
        """E.g. the idle timeout of a silent node: close the transport now, or proton lingers another idle
        timeout on a SIGSTOPped node (measured, ``docs/failover-benchmark.md``)."""
        condition = event.transport.condition
        self._note("transport_error", str(event.connection.url) if event.connection else "",
                   f"{condition.name}: {condition.description}" if condition else "")
        if not self.closed:
            event.transport.close_head()
            event.transport.close_tail()

    def on_connection_error(self, event: Any) -> None:
        """The node closed the connection with an error (e.g. its idle timeout after a freeze).

        proton then closes it for good (no reconnect), so the client opens a
        new connection after the reconnect delay, as an application would;
        a pinned client only records what is now in doubt.
        """
        detail = str(event.connection.remote_condition)
        self.errors.append(f"connection closed by {self.url}: {detail}")
        self._note("connection_error", self.url, detail)
        if self.attached:
            self.attached = False
            self.forget_link()
        if not self.pinned and not self.closed:
            self._reopen_at = time.monotonic() + self.reconnect_delay

    def on_disconnected(self, event: Any) -> None:
        self._note("disconnected", str(event.connection.url))
        if self.attached:
            self.attached = False
            self.link_lost(event.container)

    def _current(self, link: Any) -> bool:
        """``link`` is the current link (proton may hand out a new wrapper for the same link)."""
        return self.link is not None and link.name == self.link.name

    def on_link_opened(self, event: Any) -> None:
        if self._current(event.link):
            self.attached = True
            self.attached_at = time.monotonic()
            self.links.append(LinkUp(len(self.links), time.time(), self.url, event.link.name))
            self._event("link", link=event.link.name, url=self.url)
            self.link_up()

    def on_link_error(self, event: Any) -> None:
        """The node detached our link with an error: treat it as a loss, on a fresh link."""
        detail = str(event.link.remote_condition)
        self.errors.append(f"link {event.link.name} closed by {self.url}: {detail}")
        self._event("link_error", link=event.link.name, detail=detail)
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


class NumberedSender(_Client):
    """Sends 1, 2, ...; sends again what is in doubt after a loss; records what was accepted, when, on which link."""

    role = "producer"

    def __init__(self, urls: Iterable[str], address: str, count: int | None = None, rate: float | None = None,
                 window: int = WINDOW, durable: bool = False, name: str = "p", **options: Any) -> None:
        """``count``: numbers to send (None: no end); ``rate``: new numbers per second (None: as fast as
        ``window`` allows; 0: none but ``send_more``); ``durable``: the header says durable=true."""
        super().__init__(urls, address, name, auto_settle=True, **options)
        self.count = count
        self.rate = rate
        self.window = window
        self.durable = durable
        self.issued = 0  # numbers 1..issued have been sent at least once
        self.sent = 0  # transfers, re-sends included
        self.resent = 0
        self.released = 0
        self.acks: list[tuple[float, int, int]] = []  # (time.time(), number, link no) per acceptance
        self.accepted_set: set[int] = set()
        self.rejected: list[int] = []
        self.pending: collections.deque[int] = collections.deque()  # in doubt or released: sent again first
        self.unsettled: dict[str, int] = {}  # delivery tag -> number, on the current link
        self._attempts: dict[int, int] = {}
        self._extra = 0  # `send_more` numbers not yet issued (written by other threads)
        self._extra_lock = threading.Lock()
        self._next_due = 0.0  # time.monotonic() of the next rate slot
        self._finish_deadline = 0.0

    def open_link(self, container: Any) -> Any:
        return container.create_sender(self.connection, self.address, name=self.next_link_name())

    # -- what the caller reads -------------------------------------------------------------------

    @property
    def accepted_count(self) -> int:
        """How many distinct numbers were accepted."""
        return len(self.accepted_set)

    @property
    def accepted_at(self) -> list[float]:
        """time.time() of every acceptance, in order."""
        return [t for t, _, _ in self.acks]

    @property
    def in_flight(self) -> int:
        """Sent and not settled, or waiting to be sent again."""
        return len(self.unsettled) + len(self.pending)

    def missing(self) -> list[int]:
        """Numbers 1..count never accepted."""
        return [n for n in range(1, (self.count or self.issued) + 1) if n not in self.accepted_set]

    def max_gap(self, since: float = 0.0) -> float:
        """The longest time without an acceptance, from the start or ``since`` (time.time()): what a producer
        sees of a failover."""
        times = [max(self.started, since)] + [t for t in self.accepted_at if t > since]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)

    def wait_accepted(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` distinct numbers were accepted."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running and self.accepted_count < count:
            time.sleep(0.02)
        return self.accepted_count >= count

    def status(self) -> dict[str, Any]:
        last = self.acks[-1] if self.acks else None
        return {**super().status(), "issued": self.issued, "acked": len(self.acks), "unsettled": len(self.unsettled),
                "pending": len(self.pending), "in_flight": self.in_flight,
                "first_ack_t": self.acks[0][0] if self.acks else None,
                "last_ack": [last[0], self.links[last[2]].url] if last else None}

    def record(self) -> dict[str, Any]:
        return {**super().record(), "issued": self.issued, "transfers": self.sent, "resent": self.resent,
                "released": self.released, "rejected": self.rejected, "in_flight": self.in_flight,
                "acks": self.acks}

    # -- what the caller asks (any thread) ---------------------------------------------------------

    def set_rate(self, rate: float) -> None:
        """New numbers per second from now on; 0 stops new numbers (in-doubt ones are still sent again)."""
        self.rate = rate

    def send_more(self, count: int) -> None:
        """Issue ``count`` more numbers at once, whatever the rate."""
        with self._extra_lock:
            self._extra += count

    def finish(self, seconds: float) -> None:
        """No new numbers; in-doubt ones are sent until settled, for at most ``seconds``; then close."""
        self._finish_deadline = time.monotonic() + seconds
        self.finishing = True

    def finished_work(self) -> bool:
        if self.finishing:
            return (not self.pending and not self.unsettled) or time.monotonic() >= self._finish_deadline
        return self.done

    # -- sending -------------------------------------------------------------------------------------

    def tick(self) -> None:
        self._pump()

    def link_up(self) -> None:
        self._pump()

    def on_sendable(self, event: Any) -> None:
        self._pump()

    def _new_number(self, now: float) -> bool:
        """May a new number go now?  Rate slots without an attached link (or while paused) are skipped."""
        if self.finishing:
            return False
        with self._extra_lock:
            if self._extra > 0:
                self._extra -= 1
                return True
        if self.count is not None and self.issued >= self.count:
            return False
        if self.rate is None:
            return not self.paused
        if not self.rate or self.paused:
            self._next_due = now
            return False
        self._next_due = max(self._next_due, now - self.window / self.rate)
        if self._next_due > now:
            return False
        self._next_due += 1.0 / self.rate
        return True

    def _pump(self) -> None:
        now = time.monotonic()
        if not self.attached or self.closed:
            self._next_due = max(self._next_due, now)
            return
        sender = self.link
        while sender.credit > 0 and len(self.unsettled) < self.window:
            if self.pending:
                number = self.pending.popleft()
                self.resent += 1
            elif self._new_number(now):
                self.issued += 1
                number = self.issued
            else:
                return
            attempt = self._attempts.get(number, 0) + 1
            self._attempts[number] = attempt
            message_id = f"{self.name}-{number:06d}"
            tag = f"{message_id}/{attempt}"
            sender.send(Message(id=message_id, body=number, durable=self.durable), tag=tag)
            self.unsettled[tag] = number
            self.sent += 1
            self._event("attempt", id=message_id, n=attempt, url=self.url, link=sender.name)

    def _outcome(self, event: Any) -> int | None:
        if not self._current(event.link):
            return None  # a delivery of a link we already gave up on
        return self.unsettled.pop(str(event.delivery.tag), None)

    def on_accepted(self, event: Any) -> None:
        number = self._outcome(event)
        if number is None:
            return
        self.acks.append((time.time(), number, self.link_no))
        self.accepted_set.add(number)
        self._event("accepted", id=f"{self.name}-{number:06d}", url=self.url)
        if self.count is not None and len(self.accepted_set) >= self.count and not self.unsettled:
            self.done = True
            self.close()
        else:
            self._pump()

    def on_rejected(self, event: Any) -> None:
        number = self._outcome(event)
        if number is not None:
            self.rejected.append(number)
            self._event("rejected", id=f"{self.name}-{number:06d}", url=self.url,
                        detail=str(event.delivery.remote.condition))
            self._pump()

    def on_released(self, event: Any) -> None:  # released or modified: the broker did not take it
        number = self._outcome(event)
        if number is not None:
            self.released += 1
            self._event("released", id=f"{self.name}-{number:06d}", url=self.url)
            self.pending.appendleft(number)
            self._pump()

    def forget_link(self) -> None:
        """Every unsettled number is now in doubt: recorded, and sent again first on the next link."""
        in_doubt = sorted(self.unsettled.values())
        for number in in_doubt:
            self._event("in_doubt", id=f"{self.name}-{number:06d}", url=self.url)
        self.unsettled.clear()
        if not self.pinned:  # a pinned producer has no next connection to send them on
            self.pending.extendleft(reversed(in_doubt))
        super().forget_link()


class NumberedReceiver(_Client):
    """Consumes and accepts everything; records every number (duplicates included), time and link, and any gap."""

    role = "consumer"

    def __init__(self, urls: Iterable[str], address: str, count: int | None = None, credit: int = CREDIT,
                 rate: float | None = None, name: str = "c", **options: Any) -> None:
        """``count``: finish once every number 1..count arrived; ``rate``: most messages per second."""
        super().__init__(urls, address, name, prefetch=0, auto_accept=False, **options)
        # Deliveries are read here (on_delivery), not by proton's IncomingMessageHandler, which
        # raises on a transfer without bytes and stops the container.
        self.handlers = [h for h in self.handlers if not isinstance(h, IncomingMessageHandler)]
        self.count = count
        self.credit = credit
        self.rate = rate
        self.received: list[tuple[float, int, int]] = []  # (time.time(), number, link no), arrival order
        self.seen: set[int] = set()
        self.highest = 0
        self.gaps: list[tuple[int, int]] = []  # (highest so far, number received) where numbers were skipped
        self.empty: list[tuple[float, int]] = []  # (time, link no) of transfers without bytes
        self.undecodable: list[tuple[float, int, str]] = []
        self.last_received = 0.0  # time.monotonic()
        self.expected: set[int] | None = None
        self.complete = False  # drain: ended quiet rather than at its time limit
        self._allowance = 0.0
        self._last_tick = 0.0

    def open_link(self, container: Any) -> Any:
        return container.create_receiver(self.connection, self.address, name=self.next_link_name())

    def missing(self, numbers: Iterable[int]) -> list[int]:
        """Those of ``numbers`` never received, sorted."""
        return sorted(n for n in numbers if n not in self.seen)

    @property
    def duplicates(self) -> int:
        return len(self.received) - len(self.seen)

    def wait_highest(self, number: int, timeout: float) -> bool:
        """Wait until a number >= ``number`` has been received."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running and self.highest < number:
            time.sleep(0.02)
        return self.highest >= number

    def expect(self, numbers: Iterable[int]) -> None:
        """``missing`` in the status counts those of ``numbers`` not yet received."""
        self.expected = set(numbers)

    def finish(self, seconds: float) -> None:
        self.finishing = True

    def finished_work(self) -> bool:
        return self.finishing or self.done

    def status(self) -> dict[str, Any]:
        expected = self.expected
        return {**super().status(), "received": len(self.received), "seen": len(self.seen),
                "last_t": self.received[-1][0] if self.received else None, "empty": len(self.empty),
                "idle_s": round(time.monotonic() - self.last_received, 3) if self.last_received else None,
                "missing": None if expected is None else len(expected - self.seen)}

    def record(self) -> dict[str, Any]:
        return {**super().record(), "received": self.received, "empty": self.empty,
                "undecodable": self.undecodable}

    # -- credit ---------------------------------------------------------------------------------------

    def tick(self) -> None:
        now = time.monotonic()
        elapsed, self._last_tick = now - (self._last_tick or now), now
        if self.rate and self.attached and not self.paused:
            self._allowance = min(self._allowance + self.rate * elapsed, float(self.credit))
        self._flow()

    def link_up(self) -> None:
        self._flow()

    def _flow(self) -> None:
        """Keep up to ``credit`` outstanding; with a rate, grant only what the rate allows so far."""
        if not self.attached or self.paused or self.closed:
            return
        wanted = self.credit - self.link.credit
        if self.rate:
            wanted = min(wanted, int(self._allowance))
        if wanted > 0 and (self.rate or self.link.credit <= self.credit // 2):
            self.link.flow(wanted)
            if self.rate:
                self._allowance -= wanted

    # -- receiving -----------------------------------------------------------------------------------

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
        now = time.time()
        self.last_received = time.monotonic()
        url = str(event.connection.url)
        if not raw:
            self.empty.append((now, self.link_no))
            self._event("empty", url=url)
        else:
            try:
                message = Message()
                message.decode(raw)
                number = int(message.body)
            except Exception as error:  # noqa: BLE001 - recorded; the consumer goes on
                detail = f"{type(error).__name__}: {error}"
                self.undecodable.append((now, self.link_no, detail))
                self._event("undecodable", url=url, detail=detail)
            else:
                self._received(now, number)
                self._event("received", id=str(message.id if message.id is not None else number), url=url,
                            tag=str(delivery.tag))
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        if not self.rate:
            self._flow()

    def _received(self, now: float, number: int) -> None:
        self.received.append((now, number, self.link_no))
        self.seen.add(number)
        if number > self.highest + 1:
            self.gaps.append((self.highest, number))
        self.highest = max(self.highest, number)
        if self.count is not None and self.highest >= self.count and len(self.seen) >= self.count:
            self.done = True


def drain(urls: Iterable[str], address: str, expected: Iterable[int] = (), time_limit: float = 30.0,
          quiet: float = 0.3, **options: Any) -> NumberedReceiver:
    """Consume ``address`` until every number of ``expected`` arrived and nothing more came for ``quiet`` s.

    Bounded by ``time_limit``: the caller checks ``receiver.missing(expected)``;
    ``receiver.complete`` says whether it ended quiet (attached, nothing more
    coming) rather than at the time limit.
    """
    wanted = set(expected)
    receiver = NumberedReceiver(urls, address, time_limit=time_limit, **options).start()
    deadline = time.monotonic() + time_limit
    while receiver.running and time.monotonic() < deadline:
        since = max(receiver.last_received, receiver.attached_at)
        if receiver.attached and wanted <= receiver.seen and time.monotonic() - since >= quiet:
            receiver.complete = True
            break
        time.sleep(0.02)
    receiver.stop()
    receiver.join(10)
    return receiver


# -- process entry --------------------------------------------------------------------------------


class _Process:
    """The clients of one process and the commands that drive them."""

    def __init__(self, args: argparse.Namespace, history: HistoryWriter | None) -> None:
        self.urls = [u for u in args.urls.split(",") if u]
        self.queue = args.queue
        self.options = dict(credentials=Login.from_environment().connect_options(), history=history,
                            heartbeat=args.heartbeat or None, reconnect_delay=args.reconnect_delay,
                            time_limit=args.time_limit, tick=args.tick, connect_timeout=args.connect_timeout,
                            proton_backoff=args.proton_backoff, keep_order=args.keep_order)
        self.window, self.credit = args.window, args.credit
        self.clients: dict[str, NumberedSender | NumberedReceiver] = {}
        self.finished = threading.Event()

    def command(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        verb, args = words[0], words[1:]
        if verb == "producer":  # URLS: its own comma-separated list instead of --urls (e.g. a virtual IP alone)
            urls = args[2].split(",") if len(args) > 2 else self.urls
            self._add(NumberedSender(urls, self.queue, rate=float(args[1]), window=self.window,
                                     durable=True, name=args[0], **self.options))
        elif verb == "pinned":
            self._add(NumberedSender([args[1]], self.queue, rate=float(args[2]) if len(args) > 2 else 0.0,
                                     window=self.window, durable=True, name=args[0], pinned=True, **self.options))
        elif verb == "consumer":
            self._add(NumberedReceiver(self.urls, self.queue, credit=self.credit, rate=float(args[1]) or None,
                                       name=args[0], **self.options))
        elif verb in ("send", "rate"):
            client = self.clients[args[0]]
            if not isinstance(client, NumberedSender):
                raise ValueError(f"{args[0]} is not a producer")
            if verb == "send":
                client.send_more(int(args[1]))
            else:
                client.set_rate(float(args[1]))
        elif verb == "expect":
            client = self.clients[args[0]]
            if not isinstance(client, NumberedReceiver):
                raise ValueError(f"{args[0]} is not a consumer")
            client.expect(int(n) for n in json.loads(Path(args[1]).read_text()))
        elif verb in ("pause", "resume"):
            for client in self.clients.values():
                client.paused = verb == "pause"
        elif verb == "finish":
            self.finish(float(args[0]))
        else:
            raise ValueError(f"unknown command {line!r}")

    def _add(self, client: NumberedSender | NumberedReceiver) -> None:
        if client.name in self.clients:
            raise ValueError(f"client {client.name!r} exists")
        self.clients[client.name] = client
        client.start()

    def finish(self, seconds: float) -> None:
        """Producers first (bounded), so that consumers still take what they settle; then consumers."""
        producers = [c for c in self.clients.values() if isinstance(c, NumberedSender)]
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
    """Clients in a process of their own, driven by commands on stdin, one per line.

    ``producer NAME RATE [URLS]`` (URLS: its own comma-separated list instead
    of ``--urls``), ``pinned NAME URL [RATE]`` (one connection to URL,
    no reconnect and no idle timeout: it stays connected to a frozen node),
    ``consumer NAME RATE`` (RATE 0: as fast as messages come), ``send NAME
    COUNT``, ``rate NAME RATE`` (``rate NAME 0``: no new numbers, in-doubt
    ones are still sent), ``expect NAME FILE`` (a consumer: the JSON list of
    numbers it should receive; its status counts those ``missing``),
    ``pause`` / ``resume`` (producers stop issuing new numbers, consumers stop
    granting credit), ``finish SECONDS`` (no new numbers; in-doubt ones are
    still sent until settled or SECONDS pass; then every client closes and
    the process exits; end of input is ``finish 0``).  Every
    ``STATUS_EVERY`` s one line ``{"status": {NAME: {...}}}`` on stdout, the
    last with ``"done": true``; ``--out`` gets every client's record (JSON)
    at the end, ``--history`` every client event (JSON lines) as it happens.
    Credentials come from the environment (``HASTANDBY_USER``,
    ``HASTANDBY_PASSWORD``, ``HASTANDBY_SSL_*``: ``hastandby.client.Login``);
    the URLs, which the records show, carry none.
    """
    parser = argparse.ArgumentParser(prog="python -m hastandby.testing.numbered_client",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", required=True, help="comma-separated node URLs")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--history", type=Path, help="JSON-lines file of every client event")
    parser.add_argument("--out", type=Path, help="JSON file of every client's record, written at the end")
    parser.add_argument("--heartbeat", type=float, default=HEARTBEAT, help="local idle timeout, s (0: none)")
    parser.add_argument("--reconnect-delay", type=float, default=RECONNECT_DELAY)
    parser.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT,
                        help="s an attempt at one URL may take to the node's open (0: none)")
    parser.add_argument("--proton-backoff", action="store_true",
                        help="proton's default reconnect delays instead of --reconnect-delay before every attempt")
    parser.add_argument("--keep-order", action="store_true",
                        help="leave the URL list in its order (proton starts it again at its first URL after every "
                             "open), as a plain application does, instead of moving the node that opened to its end")
    parser.add_argument("--window", type=int, default=WINDOW, help="most unsettled messages per producer")
    parser.add_argument("--credit", type=int, default=CREDIT, help="most outstanding credit per consumer")
    parser.add_argument("--tick", type=float, default=TICK, help="s between a client's rate and credit checks")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT)
    args = parser.parse_args(None if argv is None else list(argv))
    out = open(args.history, "a", encoding="utf-8") if args.history else None
    try:
        history = HistoryWriter(out) if out is not None else None
        process = _Process(args, history)

        def read_commands() -> None:
            for line in sys.stdin:
                try:
                    process.command(line)
                except Exception as error:  # noqa: BLE001 - reported to the harness, which fails the run
                    print(json.dumps({"error": f"{line.strip()!r}: {type(error).__name__}: {error}"}), flush=True)
                if process.finished.is_set():
                    return
            process.finish(0)  # end of input: the harness is gone

        threading.Thread(target=read_commands, name="numbered-commands", daemon=True).start()
        deadline = time.monotonic() + args.time_limit
        while not process.finished.wait(STATUS_EVERY) and time.monotonic() < deadline:
            if history is not None:
                history.flush()
            print(json.dumps({"status": process.status()}), flush=True)
        if history is not None:
            history.flush()
        if args.out is not None:
            args.out.write_text(json.dumps({name: c.record() for name, c in process.clients.items()}))
        print(json.dumps({"status": process.status(), "done": True}), flush=True)
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
