"""The failover benchmark's client processes: a numbered producer, a consumer, an etcd leader watch.

Each runs as a process of its own (``python -m benchmarks.failover_clients
producer|consumer|watch ...``), so that its timestamps are not delayed by the
harness's other threads (one Python interpreter switches threads only every
5 ms).  All three stamp events with ``time.time()``: every process runs on the
same machine, so one wall clock orders them (``docs/failover-traces.md``).

**Producer and consumer** are plain ``Container`` + ``MessagingHandler``
clients given the URL list of every node (``urls=[...]``), the way an
application is told to use a hot-standby cluster, with proton's own reconnect
and a **fixed 0.1 s delay** before every attempt (``FixedBackoff``; proton's
default starts at 0 and doubles up to 10 s, which would measure the client's
patience rather than the cluster's failover).  This is the client of
the peers measured on this machine (RabbitMQ failover: URL list, fixed 0.1 s
backoff, one message every 10 ms).  Three accommodations, all the client's:

- **Heartbeat.**  ``--heartbeat`` (default 1 s) is proton's local idle
  timeout: a primary frozen by SIGSTOP keeps its TCP connection open, so
  without it a client would wait for ever.  A killed node is seen at once.
- **A backup's refusal means "next URL".**  A backup opens and at once closes
  a client connection with ``amqp:connection:forced``.  Plain proton-python
  0.40 treats that as a transport loss but does not drop the socket (which
  the node leaves open), so it waits for its idle timeout; and as the refusing
  node *did* open, proton restarts its URL list at the first URL, so a backup
  listed before the primary is retried for ever (measured, see
  ``docs/failover-benchmark.md``).  These clients close the transport on
  ``forced`` (rhea and qpid-jms move on for that condition too), and move the
  URL of every node that opened a connection to the end of proton's URL list,
  so that after a loss the *next* node is tried, round-robin (qpid-jms's
  order), not the one that just failed.
- **In-doubt sends are not settled locally.**  After a disconnect the producer
  re-sends every number sent and not yet settled (at-least-once), but leaves
  the old deliveries alone: settling them locally makes proton 0.40 transmit
  them on the *new* connection as transfers without payload, which the broker
  stores as empty messages (measured).

The producer sends the integers 1, 2, ... as message bodies, one every
``1/rate`` s (slots that fall while it has no attached link are skipped, not
sent in a burst later), at most ``window`` unsettled; re-sends go before new
numbers.  It records every acceptance (number, time, and the link - hence the
node - it came on) and counts acceptances per 100 ms bucket for the trace's
``acks`` lines, flushed about once a second.  The consumer takes ``prefetch``
credit, accepts every message and records (number, time, link); a message
without payload is counted (and accepted) instead of crashing proton's
decoder.

**The fencing probe** (SIGSTOP rounds) is a second producer pinned to the
primary: one connection, no reconnect, no heartbeat, so it is still connected
when the frozen primary resumes, with its sends of the pause waiting in the
socket.  Whatever that node accepts after SIGCONT would be acknowledged by a
deposed primary.

**The watch** is an etcd watch on the cluster's leader key, the only direct
view of *when* the key was deleted (lease expiry, revoke) and re-created.

**Credentials** come from the environment, ``HASTANDBY_USER`` and
``HASTANDBY_PASSWORD`` (the harness passes the run's ``app`` user): PLAIN, as
python-qpid-proton offers no SCRAM; without them the clients connect
anonymously.  The URLs, which the records and traces show, carry none.

Process protocol (the harness, ``benchmarks/failover.py``, drives it): every
``STATUS_EVERY`` s one JSON status line on stdout; commands on stdin, one per
line: ``stop-sending`` (producer), ``expect FILE`` (consumer: a JSON list of
numbers it should receive; ``missing`` in the status counts those not yet
seen), ``stop`` (or end of input).  On ``stop`` the client closes its
connection, writes everything it recorded to ``--out`` (JSON), prints
``{"done": true}`` and exits.
"""

from __future__ import annotations

import os

# etcd3 0.12 ships protobuf 3 generated code: only the pure-Python runtime loads it.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterable, Iterator  # noqa: E402

from proton import Delivery, Message  # noqa: E402
from proton.handlers import IncomingMessageHandler, MessagingHandler  # noqa: E402
from proton.reactor import Container  # noqa: E402

from spark_analysis import trace_schema as ts  # noqa: E402

RECONNECT_DELAY = 0.1
"""Seconds before every reconnect attempt (each URL in turn)."""
HEARTBEAT = 1.0
"""Local idle timeout in seconds: a silent (SIGSTOPped) node is given up after this long."""
FORCED = "amqp:connection:forced"
TICK = 0.005  # seconds between the producer's send-schedule checks
FLUSH_EVERY = 1.0  # seconds between ``acks`` trace lines
STATUS_EVERY = 0.05  # seconds between status lines to the harness
TIME_LIMIT = 900.0  # a client ends by itself after this long, whatever happens


def environment_credentials() -> dict[str, Any]:
    """proton ``connect`` arguments from ``HASTANDBY_USER``/``HASTANDBY_PASSWORD``, or none."""
    user, password = os.environ.get("HASTANDBY_USER"), os.environ.get("HASTANDBY_PASSWORD")
    if not user or password is None:
        return {}
    return {"user": user, "password": password, "allow_insecure_mechs": True}


class FixedBackoff:
    """proton ``reconnect=``: the same delay before every attempt, for ever.

    proton re-iterates this object whenever a connection opens, so it must be
    an iterable (not a one-shot iterator).
    """

    def __init__(self, delay: float = RECONNECT_DELAY) -> None:
        self.delay = delay

    def __iter__(self) -> Iterator[float]:
        return itertools.repeat(self.delay)


@dataclass(frozen=True)
class LinkUp:
    """The client's link was attached by a node: ``no`` counts them from 0 (0 is the first connect)."""

    no: int
    t: float
    url: str


@dataclass(frozen=True)
class Note:
    """Something that happened to the connection: ``refused`` (forced), ``disconnected``, ``transport_error``, ..."""

    t: float
    kind: str
    url: str
    detail: str = ""


class _Client(MessagingHandler):
    """A client of the cluster on its own container and thread; subclasses do the messaging."""

    role = ""
    tick_interval = 0.05

    def __init__(self, urls: Iterable[str], address: str, heartbeat: float | None,
                 reconnect_delay: float, pinned: bool = False, **handler: Any) -> None:
        super().__init__(**handler)
        self.pinned = pinned  # one connection, no reconnect (the SIGSTOP fencing probe)
        self.urls = list(urls)
        self.address = address
        self.heartbeat = heartbeat
        self.reconnect_delay = reconnect_delay
        self.links: list[LinkUp] = []
        self.notes: list[Note] = []
        self.errors: list[str] = []
        self.connection: Any = None
        self.link: Any = None
        self.attached = False
        self.started = 0.0  # time.time() of on_start
        self._stop = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None

    # -- running ---------------------------------------------------------------------

    def start(self) -> "_Client":
        self._thread = threading.Thread(target=self._run, name=f"failover-{self.role}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            Container(self).run()
        except Exception as error:  # noqa: BLE001 - recorded for the round's report
            where = " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(traceback.extract_tb(error.__traceback__)[-6:]))
            self.errors.append(f"{type(error).__name__}: {error} (at {where})")

    def stop(self) -> None:
        """Close the connection (within one tick) and end the thread."""
        self._stop.set()

    def join(self, timeout: float) -> bool:
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

    def status(self) -> dict[str, Any]:
        return {"running": self.running, "links": len(self.links), "errors": len(self.errors),
                "link_url": self.links[-1].url if self.links else None, "attached": self.attached}

    def record(self) -> dict[str, Any]:
        """Everything recorded, for the harness (JSON-able)."""
        return {"role": self.role, "urls": self.urls, "started": self.started,
                "links": [asdict(link) for link in self.links], "notes": [asdict(note) for note in self.notes],
                "errors": self.errors}

    # -- container events ------------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        self.started = time.time()
        reconnect = False if self.pinned else FixedBackoff(self.reconnect_delay)
        self.connection = event.container.connect(urls=self.urls, reconnect=reconnect, heartbeat=self.heartbeat,
                                                  **environment_credentials())
        self.link = self.open_link(event.container, self.connection)
        event.container.schedule(self.tick_interval, self)

    def open_link(self, container: Any, connection: Any) -> Any:
        raise NotImplementedError

    def on_timer_task(self, event: Any) -> None:
        if self._closing:
            return
        if self._stop.is_set() or time.time() - self.started > TIME_LIMIT:
            self.finish()
            return
        self.tick()
        event.container.schedule(self.tick_interval, self)

    def tick(self) -> None:
        """Called every ``tick_interval`` while running."""

    def finish(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.before_close()
        if self.connection is not None:
            self.connection.close()

    def before_close(self) -> None:
        pass

    def on_link_opened(self, event: Any) -> None:
        self.attached = True
        self.links.append(LinkUp(len(self.links), time.time(), str(event.connection.url)))

    def on_disconnected(self, event: Any) -> None:
        self.attached = False
        self.notes.append(Note(time.time(), "disconnected", str(event.connection.url)))

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        self.notes.append(Note(time.time(), "transport_error", str(event.connection.url) if event.connection else "",
                               f"{condition.name}: {condition.description}" if condition else ""))
        if not self._closing:  # e.g. the idle timeout of a silent node: move on now (see module docstring)
            event.transport.close_head()
            event.transport.close_tail()

    def on_connection_error(self, event: Any) -> None:
        condition = event.connection.remote_condition
        self.errors.append(f"connection closed by {event.connection.url}: {condition}")

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f"link closed by {event.connection.url}: {event.link.remote_condition}")

    def on_connection_opened(self, event: Any) -> None:
        """A node opened the connection: its URL goes to the end of proton's URL list.

        proton restarts its URL list whenever a connection opens, so without
        this the node that just failed (or refused) would be tried first again;
        a SIGSTOPped one costs a whole idle timeout per attempt.  With it, a lost
        connection is followed by the *next* node, round-robin, as qpid-jms
        does.  proton's connector holds the list (``connection._overrides``,
        proton 0.40) and reads it lazily, so this takes effect on the next loss.
        """
        opened = str(event.connection.url)
        connector = getattr(event.connection, "_overrides", None)
        urls = getattr(getattr(connector, "address", None), "values", None)
        if urls:
            index = next((i for i, url in enumerate(urls) if str(url) == opened), None)
            if index is not None:
                connector.address.values = urls[index + 1:] + urls[:index + 1]

    def on_connection_remote_close(self, event: Any) -> None:
        """A backup's (or a stepping-down primary's) ``forced`` close: go on to the next URL.

        The node leaves the socket open, so close the transport here; proton's
        reconnect then tries the next URL after ``reconnect_delay``.
        """
        condition = event.connection.remote_condition
        if condition is None or condition.name != FORCED or self._closing:
            return
        self.notes.append(Note(time.time(), "refused", str(event.connection.url), condition.description or ""))
        self.attached = False
        if event.transport is not None:
            event.transport.close_head()
            event.transport.close_tail()


class Producer(_Client):
    """Numbered messages at a fixed rate; records what was accepted, when, and on which link."""

    role = ts.PRODUCER
    tick_interval = TICK

    def __init__(self, urls: Iterable[str], address: str, rate: float, round_id: str, t0: float,
                 window: int = 100, heartbeat: float | None = HEARTBEAT,
                 reconnect_delay: float = RECONNECT_DELAY, pinned: bool = False) -> None:
        super().__init__(urls, address, heartbeat, reconnect_delay, pinned=pinned, auto_settle=True)
        self.rate = rate
        self.window = window
        self.round_id = round_id
        self.t0 = t0  # round_start's t: bucket k covers [t0 + k*0.1, t0 + (k+1)*0.1)
        self.issued = 0  # numbers 1..issued have been sent at least once
        self.transfers = 0  # every transfer, re-sends included
        self.resent = 0
        self.acks: list[tuple[float, int, int]] = []  # (time.time(), number, link no) per acceptance
        self.accepted: set[int] = set()
        self.rejected: list[int] = []
        self.released = 0
        self.sending = True
        self.trace: list[dict[str, Any]] = []  # the producer's own trace lines (acks)
        self._in_flight: dict[int, str] = {}  # number -> tag of its delivery on the current link
        self._resend: list[int] = []
        self._next_due = 0.0
        self._buckets: dict[int, int] = {}
        self._next_k: int | None = None  # first bucket not yet reported
        self._last_flush = 0.0

    def open_link(self, container: Any, connection: Any) -> Any:
        return container.create_sender(connection, self.address)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight) + len(self._resend)

    def stop_sending(self) -> None:
        """No new numbers from now on; unsettled ones are still re-sent until settled."""
        self.sending = False

    def status(self) -> dict[str, Any]:
        last = self.acks[-1] if self.acks else None
        return {**super().status(), "issued": self.issued, "acks": len(self.acks), "in_flight": self.in_flight,
                "first_ack_t": self.acks[0][0] if self.acks else None,
                "last_ack": [last[0], self.links[last[2]].url] if last else None}

    def record(self) -> dict[str, Any]:
        return {**super().record(), "issued": self.issued, "transfers": self.transfers, "resent": self.resent,
                "released": self.released, "rejected": self.rejected, "in_flight": self.in_flight,
                "acks": self.acks, "trace": self.trace}

    # -- sending ---------------------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        super().on_start(event)
        self._next_due = time.monotonic()
        self._next_k = self._bucket(self.started)
        self._last_flush = time.monotonic()

    def on_link_opened(self, event: Any) -> None:
        super().on_link_opened(event)
        self._send()

    def on_sendable(self, event: Any) -> None:
        self._send()

    def tick(self) -> None:
        self._send()
        if time.monotonic() - self._last_flush >= FLUSH_EVERY:
            self._flush(final=False)

    def _send(self) -> None:
        now = time.monotonic()
        if not self.attached:
            self._next_due = max(self._next_due, now)  # no link: these slots are skipped
            return
        sender = self.link
        while not self._closing and sender.credit > 0 and len(self._in_flight) < self.window:
            if self._resend:
                number = self._resend.pop(0)
                self.resent += 1
            elif self.sending and self._next_due <= now:
                self.issued += 1
                number = self.issued
                self._next_due += 1.0 / self.rate
            else:
                return
            self.transfers += 1
            tag = f"{number}.{self.transfers}"
            sender.send(Message(body=number), tag=tag)
            self._in_flight[number] = tag

    def _settled(self, event: Any) -> int | None:
        tag = str(event.delivery.tag)
        number = int(tag.split(".")[0])
        if self._in_flight.get(number) != tag:
            return None  # a delivery we already gave up on
        del self._in_flight[number]
        return number

    def on_accepted(self, event: Any) -> None:
        number = self._settled(event)
        if number is None:
            return
        now = time.time()
        self.acks.append((now, number, self.link_no))
        self.accepted.add(number)
        k = self._bucket(now)
        self._buckets[k] = self._buckets.get(k, 0) + 1
        self._send()

    def on_rejected(self, event: Any) -> None:
        number = self._settled(event)
        if number is not None:
            self.rejected.append(number)
            self._send()

    def on_released(self, event: Any) -> None:  # released or modified: the broker did not take it
        number = self._settled(event)
        if number is not None:
            self.released += 1
            self._resend = sorted({*self._resend, number})
            self._send()

    def on_disconnected(self, event: Any) -> None:
        super().on_disconnected(event)
        self._requeue_in_flight()

    def on_connection_remote_close(self, event: Any) -> None:
        super().on_connection_remote_close(event)
        if not self.attached:
            self._requeue_in_flight()

    def _requeue_in_flight(self) -> None:
        # Sent and not settled: in doubt (it may or may not be on the new primary).
        # Send it again, in order, before any new number.  The old deliveries are
        # forgotten, not settled (see the module docstring).
        self._resend = sorted({*self._resend, *self._in_flight})
        self._in_flight.clear()

    # -- acks per 100 ms ---------------------------------------------------------------------

    def _bucket(self, t: float) -> int:
        return int((t - self.t0) * 1000 // ts.ACK_BUCKET_MS)

    def _flush(self, final: bool) -> None:
        """One ``acks`` line for every bucket since the last one; the current bucket only at the end."""
        self._last_flush = time.monotonic()
        now = time.time()
        if self._next_k is None:
            return
        end = self._bucket(now) + (1 if final else 0)
        if end <= self._next_k:
            return
        counts = [self._buckets.pop(k, 0) for k in range(self._next_k, end)]
        self.trace.append({ts.ROUND: self.round_id, ts.T: round(now, 6), ts.EVENT: ts.ACKS, ts.SRC: ts.PRODUCER,
                           ts.K: self._next_k, ts.N: counts})
        self._next_k = end

    def before_close(self) -> None:
        self._flush(final=True)


class Consumer(_Client):
    """Receives and accepts; records every number with its time and link."""

    role = ts.CONSUMER

    def __init__(self, urls: Iterable[str], address: str, prefetch: int = 100,
                 heartbeat: float | None = HEARTBEAT, reconnect_delay: float = RECONNECT_DELAY) -> None:
        super().__init__(urls, address, heartbeat, reconnect_delay, prefetch=prefetch, auto_accept=False)
        # Deliveries are decoded here (on_delivery), not by proton's IncomingMessageHandler,
        # which raises TypeError on a transfer without payload and stops the container.
        self.handlers = [h for h in self.handlers if not isinstance(h, IncomingMessageHandler)]
        self.received: list[tuple[float, int, int]] = []  # (time.time(), number, link no)
        self.seen: set[int] = set()
        self.empty: list[tuple[float, int]] = []  # (time, link no) of messages without payload
        self.undecodable: list[tuple[float, int, str]] = []
        self.expected: set[int] | None = None

    def open_link(self, container: Any, connection: Any) -> Any:
        return container.create_receiver(connection, self.address)

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
        if not raw:
            self.empty.append((now, self.link_no))
        else:
            try:
                message = Message()
                message.decode(raw)
                number = int(message.body)
            except Exception as error:  # noqa: BLE001 - counted, the consumer goes on
                self.undecodable.append((now, self.link_no, f"{type(error).__name__}: {error}"))
            else:
                self.received.append((now, number, self.link_no))
                self.seen.add(number)
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()

    def expect(self, numbers: Iterable[int]) -> None:
        self.expected = set(numbers)

    def status(self) -> dict[str, Any]:
        expected = self.expected
        return {**super().status(), "received": len(self.received), "seen": len(self.seen),
                "last_t": self.received[-1][0] if self.received else None, "empty": len(self.empty),
                "missing": None if expected is None else len(expected - self.seen)}

    def record(self) -> dict[str, Any]:
        return {**super().record(), "received": self.received, "empty": self.empty,
                "undecodable": self.undecodable}


# -- the etcd leader-key watch -----------------------------------------------------------------


def watch_leader(etcd_url: str, key: str, emit: Any, stop: threading.Event) -> None:
    """Call ``emit(dict)`` for the watch's creation and every change of ``key``, stamped on arrival.

    ``{"t", "kind": "put", "node", "revision": create revision (the term), "version"}`` or
    ``{"t", "kind": "delete", "revision": the deletion's revision}``.
    """
    import grpc

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        import etcd3
        from etcd3 import etcdrpc

    host, port = etcd_url.split("://", 1)[-1].rsplit(":", 1)
    client = etcd3.client(host=host, port=int(port), timeout=5)
    stub = etcdrpc.WatchStub(client.channel)
    create = etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(key=key.encode()))

    def requests() -> Iterator[Any]:
        yield create
        stop.wait()  # etcd ends a watch stream when the client half-closes it

    call = stub.Watch(requests())
    threading.Thread(target=lambda: (stop.wait(), call.cancel()), daemon=True).start()
    try:
        for response in call:
            now = time.time()
            if response.created:
                emit({"t": now, "kind": "created"})
            for event in response.events:
                if event.type == 1:  # mvccpb DELETE (a lease expiry and a revoke delete too)
                    emit({"t": now, "kind": "delete", "revision": int(event.kv.mod_revision)})
                else:  # PUT
                    try:
                        node = str(json.loads(event.kv.value)["node_id"])
                    except (ValueError, KeyError, TypeError):
                        node = "?"
                    emit({"t": now, "kind": "put", "node": node, "revision": int(event.kv.create_revision),
                          "version": int(event.kv.version)})
    except grpc.RpcError as error:
        if not stop.is_set():
            emit({"t": time.time(), "kind": "error", "error": f"{error.code()}: {error.details()}"})
    finally:
        client.close()


# -- process entry ------------------------------------------------------------------------------


def _emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def _commands(client: _Client, stop: threading.Event) -> None:
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "stop":
            break
        if command == "stop-sending" and isinstance(client, Producer):
            client.stop_sending()
        elif command == "expect" and isinstance(client, Consumer):
            client.expect(int(n) for n in json.loads(Path(argument).read_text()))
    stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover_clients", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("producer", "consumer"):
        p = sub.add_parser(role)
        p.add_argument("--urls", required=True, help="comma-separated node URLs")
        p.add_argument("--address", required=True)
        p.add_argument("--out", type=Path, required=True, help="JSON file for everything recorded")
        p.add_argument("--heartbeat", type=float, default=HEARTBEAT)
        p.add_argument("--reconnect-delay", type=float, default=RECONNECT_DELAY)
        if role == "producer":
            p.add_argument("--rate", type=float, required=True)
            p.add_argument("--round", required=True, help="round id for the acks trace lines")
            p.add_argument("--t0", type=float, required=True, help="round_start's t (bucket 0 starts there)")
            p.add_argument("--window", type=int, default=100)
            p.add_argument("--pin", action="store_true",
                           help="one connection to the first URL, no reconnect (use with --heartbeat 0)")
        else:
            p.add_argument("--prefetch", type=int, default=100)
    w = sub.add_parser("watch", help="etcd watch of one key; a JSON line per change on stdout until stdin ends")
    w.add_argument("--etcd", required=True)
    w.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    if args.role == "watch":
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        watch_leader(args.etcd, args.key, _emit, stop)
        return 0
    urls = [u for u in args.urls.split(",") if u]
    heartbeat = args.heartbeat or None
    client: _Client
    if args.role == "producer":
        client = Producer(urls, args.address, args.rate, args.round, args.t0, window=args.window,
                          heartbeat=heartbeat, reconnect_delay=args.reconnect_delay, pinned=args.pin)
    else:
        client = Consumer(urls, args.address, prefetch=args.prefetch, heartbeat=heartbeat,
                          reconnect_delay=args.reconnect_delay)
    client.start()
    threading.Thread(target=_commands, args=(client, stop), daemon=True).start()
    deadline = time.monotonic() + TIME_LIMIT
    while not stop.wait(STATUS_EVERY) and client.running and time.monotonic() < deadline:
        _emit(client.status())
    client.stop()
    client.join(10)
    args.out.write_text(json.dumps(client.record()))
    _emit({**client.status(), "done": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
