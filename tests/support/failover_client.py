"""Numbered failover clients on python-qpid-proton (Qpid's NumberedSender / NumberedReceiver).

Both are plain ``Container`` + ``MessagingHandler`` clients given the URL list
of every node, the way an application is told to use a hot-standby cluster
(the URLs carry the ``app`` user's credentials: ``NodeProcess.url``,
``HaCluster.url_list``): a dead node refuses the TCP connection, a backup
closes it with ``amqp:connection:forced``, and proton moves on.  The reconnect delay is
explicit and short (``RECONNECT_DELAYS``: 0.1 s steps) because proton's
default grows to 10 s, which would measure the client's patience rather than
the cluster's failover.

``NumberedSender`` sends the integers 1..count as message bodies and records
each number the broker *accepted*, with the time.  Like every at-least-once
producer it re-sends, after a reconnect, every number sent but not yet
accepted, in order and before new ones (so a queue may hold duplicates, never
gaps).

``NumberedReceiver`` consumes (accepting each message) and records every
number in arrival order; it notes a *gap* when a number arrives more than one
above the highest seen so far.  With one sender per queue that is Qpid's check
that nothing acknowledged went missing; duplicates are fine.

Each client runs on its own thread (``start()``, then ``stop()`` / ``join()``)
or blocking with ``run()``, and every run is bounded by ``time_limit``.  The
recorded lists may be read from other threads while it runs::

    sender = NumberedSender(urls, "q", count=5000).start()
    ... kill the primary, promote a backup ...
    assert sender.join(timeout=30) and sender.done
    receiver = drain(new_primary_urls, "q", sender.accepted_set)
    assert not receiver.missing(sender.accepted_set)

What plain proton (0.40) reconnect does, measured against this cluster:

- after a backup's ``amqp:connection:forced`` refusal it waits for its own
  idle timeout before it reconnects (for ever with no heartbeat), and since
  the backup did send an AMQP open it then starts again at the *first* URL:
  a live backup listed before the primary is retried for ever.  Hence the
  ``heartbeat`` option, and ``skip_refusing`` (see ``on_connection_remote_close``).
- it re-attaches the sender's link and transmits the deliveries that were
  unsettled when the connection died again, as transfers with no bytes;
  brokers take them as empty messages.  The sender therefore frees its link
  on a disconnect and sends again on a new one; the receiver rejects such
  transfers and lists them in ``empty``.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Iterable

from proton import Delivery, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

RECONNECT_DELAYS = [0.1] * 10_000
"""proton ``reconnect=``: the next URL every 0.1 s (a list restarts on every successful open)."""

POLL = 0.05  # seconds between checks of stop requests, the time limit and the send rate
FORCED = "amqp:connection:forced"


class _Client(MessagingHandler):
    """A bounded client on its own container; subclasses do the messaging."""

    def __init__(self, urls: Iterable[str], address: str, time_limit: float, heartbeat: float | None,
                 skip_refusing: bool, **handler: Any) -> None:
        super().__init__(**handler)
        self.urls = list(urls)
        self.address = address
        self.time_limit = time_limit
        self.heartbeat = heartbeat
        self.skip_refusing = skip_refusing
        self.connections: list[tuple[float, str]] = []  # (time, url) of every connection opened
        self.disconnects: list[float] = []
        self.refusals = 0  # amqp:connection:forced closes (a backup refused us)
        self.errors: list[str] = []
        self.started_at = 0.0
        self.finished_at = 0.0
        self.timed_out = False
        self.done = False
        self.connection: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closing = False

    # -- running -------------------------------------------------------------------

    def run(self) -> "_Client":
        """Run to completion, ``stop()`` or the time limit, on this thread."""
        self.started_at = time.monotonic()
        try:
            Container(self).run()
        except Exception as error:  # recorded, so the test can report it
            self.errors.append(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        finally:
            self.finished_at = time.monotonic()
        return self

    def start(self) -> "_Client":
        """Run on a daemon thread; returns at once."""
        self.started_at = time.monotonic()
        self._thread = threading.Thread(target=self.run, name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the client to finish: it closes its connection within about ``POLL`` seconds."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the client's thread to end; True if it has."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- container events ---------------------------------------------------------

    def on_start(self, event: Any) -> None:
        self.connection = event.container.connect(urls=self.urls, reconnect=RECONNECT_DELAYS,
                                                  heartbeat=self.heartbeat)
        self.open_link(event.container, self.connection)
        event.container.schedule(POLL, self)

    def open_link(self, container: Any, connection: Any) -> None:
        raise NotImplementedError

    def on_timer_task(self, event: Any) -> None:
        if self._closing:
            return
        if time.monotonic() - self.started_at > self.time_limit:
            self.timed_out = True
            self.finish()
        elif self._stop.is_set():
            self.finish()
        else:
            self.tick()
            event.container.schedule(POLL, self)

    def tick(self) -> None:
        """Called every ``POLL`` seconds while running."""

    def finish(self) -> None:
        """Close the connection; the container then ends."""
        if self._closing:
            return
        self._closing = True
        if self.connection is not None:
            self.connection.close()

    def on_connection_opened(self, event: Any) -> None:
        self.connections.append((time.monotonic(), str(event.connection.url)))

    def on_disconnected(self, event: Any) -> None:
        if not self.disconnects or self.disconnects[-1] < (self.connections[-1][0] if self.connections else 0):
            self.disconnects.append(time.monotonic())

    def on_connection_remote_close(self, event: Any) -> None:
        """Count backups' refusals; with ``skip_refusing`` go on to the next URL at once.

        ``skip_refusing`` works around the plain proton behaviour described in
        the module docstring: it moves the refusing URL to the end of the list
        and drops the transport, so the next node is tried after the usual
        reconnect delay, as a client that treats ``forced`` as "try the next
        URL" would.  Without it the client is plain proton.
        """
        condition = event.connection.remote_condition
        if condition is None or condition.name != FORCED:
            return
        self.refusals += 1
        if not self.skip_refusing or self._closing:
            return
        connector = getattr(event.connection, "_overrides", None)
        urls = getattr(getattr(connector, "address", None), "values", None)
        if urls:
            refused = str(event.connection.url)
            index = next((i for i, url in enumerate(urls) if str(url) == refused), None)
            if index is not None:
                connector.address.values = urls[index + 1:] + urls[:index + 1]
        if event.transport is not None:
            event.transport.close_head()

    def on_connection_error(self, event: Any) -> None:
        self.errors.append(f"connection: {event.connection.remote_condition}")

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f"link {event.link.name}: {event.link.remote_condition}")
        self.finish()

    def on_transport_error(self, event: Any) -> None:
        pass  # a dead node: proton reconnects to the next URL


class NumberedSender(_Client):
    """Sends 1..count; re-sends what was not accepted after a reconnect; records what was accepted."""

    def __init__(self, urls: Iterable[str], address: str, count: int, time_limit: float = 60.0,
                 window: int = 100, rate: float | None = None, heartbeat: float | None = None,
                 skip_refusing: bool = False, durable: bool = False) -> None:
        super().__init__(urls, address, time_limit, heartbeat, skip_refusing, auto_settle=True)
        self.count = count
        self.durable = durable  # the messages' header says durable=true (the nodes' journals keep them)
        self.window = window  # most messages sent and not yet accepted
        self.rate = rate  # most new messages per second (None: as fast as accepted)
        self.accepted: list[int] = []  # in acceptance order
        self.accepted_at: list[float] = []  # monotonic time of each acceptance
        self.accepted_set: set[int] = set()
        self.rejected: list[int] = []
        self.sent = 0  # transfers, re-sends included
        self.resent = 0
        self._next = 1
        self._in_flight: dict[int, Delivery] = {}  # number -> its delivery on the current link
        self._resend: list[int] = []
        self._sender: Any = None
        self._attached = False  # the link is attached on the current connection

    def open_link(self, container: Any, connection: Any) -> None:
        self._sender = container.create_sender(connection, self.address)

    @property
    def accepted_count(self) -> int:
        """How many distinct numbers were accepted."""
        return len(self.accepted_set)

    def missing(self) -> list[int]:
        """Numbers 1..count never accepted."""
        return [n for n in range(1, self.count + 1) if n not in self.accepted_set]

    def max_gap(self, since: float = 0.0) -> float:
        """The longest time without an acceptance, from the start or ``since`` (what a producer sees of failover)."""
        times = [max(self.started_at, since)] + [t for t in self.accepted_at if t > since]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)

    def wait_accepted(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` distinct numbers were accepted."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running and self.accepted_count < count:
            time.sleep(0.02)
        return self.accepted_count >= count

    def on_link_opened(self, event: Any) -> None:
        self._attached = True

    def on_sendable(self, event: Any) -> None:
        self._send(event.sender)

    def tick(self) -> None:
        if self.rate and self._sender is not None:
            self._send(self._sender)

    def _allowed_new(self) -> bool:
        if self._next > self.count:
            return False
        if not self.rate:
            return True
        return self._next - 1 < self.rate * (time.monotonic() - self.started_at)

    def _send(self, sender: Any) -> None:
        # Not between a disconnect and the next attach: proton would keep the
        # transfers for a link that is gone.
        while self._attached and not self._closing and sender.credit > 0 and len(self._in_flight) < self.window:
            if self._resend:
                number = self._resend.pop(0)
                self.resent += 1
            elif self._allowed_new():
                number = self._next
                self._next += 1
            else:
                return
            self._in_flight[number] = sender.send(Message(body=number, durable=self.durable), tag=str(number))
            self.sent += 1

    def _outcome(self, event: Any) -> int | None:
        number = int(event.delivery.tag)
        if self._in_flight.get(number) != event.delivery:
            return None  # a delivery of a link we already gave up on
        del self._in_flight[number]
        return number

    def on_accepted(self, event: Any) -> None:
        number = self._outcome(event)
        if number is None:
            return
        self.accepted.append(number)
        self.accepted_at.append(time.monotonic())
        self.accepted_set.add(number)
        if len(self.accepted_set) >= self.count and not self._in_flight:
            self.done = True
            self.finish()
        else:
            self._send(event.sender)

    def on_rejected(self, event: Any) -> None:
        number = self._outcome(event)
        if number is not None:
            self.rejected.append(number)
            self._send(event.sender)

    def on_released(self, event: Any) -> None:
        number = self._outcome(event)  # released or modified: the broker did not take it
        if number is not None:
            self._resend = sorted({*self._resend, number})
            self._send(event.sender)

    def on_disconnected(self, event: Any) -> None:
        super().on_disconnected(event)
        self._attached = False
        # Whatever was sent and not accepted is in doubt: it may or may not be
        # on the new primary.  Send it again, in order, before new numbers.
        self._resend = sorted({*self._resend, *self._in_flight})
        self._in_flight.clear()
        # ... on a new link.  proton would re-attach this one on reconnect and
        # transmit its unsettled deliveries again as transfers with no bytes
        # (their payload went to the old transport): brokers then hold empty
        # "messages".  A freed link is neither re-attached nor re-sent.
        if self._sender is not None and not self._closing:
            self._sender.free()
            self._sender = event.container.create_sender(self.connection, self.address)


class NumberedReceiver(_Client):
    """Consumes numbers (accepting each); records them and any gap."""

    def __init__(self, urls: Iterable[str], address: str, count: int | None = None, time_limit: float = 60.0,
                 credit: int = 100, heartbeat: float | None = None, skip_refusing: bool = False) -> None:
        super().__init__(urls, address, time_limit, heartbeat, skip_refusing, prefetch=credit)
        self.count = count  # finish once every number 1..count was received
        self.received: list[int] = []  # in arrival order, duplicates included
        self.received_at: list[float] = []
        self.seen: set[int] = set()
        self.gaps: list[tuple[int, int]] = []  # (highest so far, number received) where numbers were skipped
        self.empty: list[str] = []  # delivery tags of transfers with no message at all
        self.highest = 0

    def open_link(self, container: Any, connection: Any) -> None:
        container.create_receiver(connection, self.address)

    def missing(self, numbers: Iterable[int]) -> list[int]:
        """Those of ``numbers`` never received, sorted."""
        return sorted(n for n in numbers if n not in self.seen)

    @property
    def duplicates(self) -> int:
        return len(self.received) - len(self.seen)

    def on_delivery(self, event: Any) -> None:
        """Reject a transfer with no bytes at all (not an AMQP message), and note it in ``empty``.

        Runs before MessagingHandler decodes the message, which would raise
        on it and stop the container.
        """
        delivery = event.delivery
        if (delivery.link.is_receiver and delivery.readable and not delivery.partial and not delivery.aborted
                and delivery.pending == 0):
            self.empty.append(str(delivery.tag))
            delivery.link.advance()
            delivery.update(Delivery.REJECTED)
            delivery.settle()

    def on_message(self, event: Any) -> None:
        number = int(event.message.body)
        self.received.append(number)
        self.received_at.append(time.monotonic())
        self.seen.add(number)
        if number > self.highest + 1:
            self.gaps.append((self.highest, number))
        self.highest = max(self.highest, number)
        if self.count is not None and self.highest >= self.count and len(self.seen) >= self.count:
            self.done = True
            self.finish()

    def wait_highest(self, number: int, timeout: float) -> bool:
        """Wait until a number >= ``number`` has been received."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running and self.highest < number:
            time.sleep(0.02)
        return self.highest >= number


def drain(urls: Iterable[str], address: str, expected: Iterable[int], time_limit: float = 30.0,
          quiet: float = 0.3, **options: Any) -> NumberedReceiver:
    """Consume ``address`` until every number of ``expected`` arrived and nothing more came for ``quiet`` s.

    Bounded by ``time_limit``: the caller checks ``receiver.missing(expected)``.
    """
    wanted = set(expected)
    receiver = NumberedReceiver(urls, address, time_limit=time_limit, **options).start()
    deadline = time.monotonic() + time_limit
    while receiver.running and time.monotonic() < deadline and not wanted <= receiver.seen:
        time.sleep(0.02)
    count, quiet_until = len(receiver.received), time.monotonic() + quiet
    while receiver.running and time.monotonic() < min(quiet_until, deadline):
        time.sleep(0.02)
        if len(receiver.received) != count:
            count, quiet_until = len(receiver.received), time.monotonic() + quiet
    receiver.stop()
    receiver.join(10)
    return receiver
