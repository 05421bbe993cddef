"""The two client processes of ``benchmarks.auth_flood``: an authenticated producer, and a flood of logins.

Each runs in a process of its own, so that neither waits for the other's
Python (the GIL) and the node's cost is all that links them.

``produce``
    python-qpid-proton's ``BlockingConnection`` as ``app`` (PLAIN), one
    100-byte message at a time (each ``send`` waits for the node's
    ``accepted``).  It connects, prints ``ready``, waits for a line on its
    standard input, sends for ``--duration`` seconds and prints one JSON
    line: messages accepted and the seconds they took.
``flood``
    ``--sockets`` threads, each with one connection at a time, together
    offering ``--rate`` attempts per second: each thread has a slot of
    ``sockets / rate`` seconds per attempt, connects (from its source
    address, ``--source``: ``127.0.0.x`` addresses are all loopback; with
    ``--fresh-sources`` from a new one each time), makes
    the attempt and waits for the node's answer until the slot ends; an
    attempt not answered by then is abandoned (the socket closed), as an
    attacker who wants to cost the node most would.  Kinds:

    - ``bad-plain``: SASL PLAIN as ``app`` with a wrong password (header
      and init in one write, as python-qpid-proton pipelines them);
    - ``unknown-user``: the same with a user the node does not have;
    - ``tls``: a TLS handshake on the TLS port (the node's certificate is
      not checked: the client's own cost is not what is measured), then close.

    Runs until ``--duration`` has passed or its standard input closes, then
    prints one JSON line of counts: attempts, answered (an outcome, or a
    finished TLS handshake), refused (closed by the node before an answer:
    a limit at accept), abandoned, connect errors, and the answers' delay.

Both take their credentials from ``HASTANDBY_USER``/``HASTANDBY_PASSWORD``
(never the command line).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from proton import Message, symbol
from proton.utils import BlockingConnection

from hastandby.security.sasl import INIT, OUTCOME, SASL_HEADER, SaslError, decode_frames, encode_frame
from spark_analysis.phases import nearest_rank

KINDS = ("bad-plain", "unknown-user", "tls")


@dataclass
class Counts:
    """One flood thread's tally (merged at the end)."""

    attempts: int = 0
    answered: int = 0
    refused: int = 0
    abandoned: int = 0
    connect_errors: int = 0
    answer_ms: list[float] = field(default_factory=list)

    def merge(self, other: "Counts") -> None:
        self.attempts += other.attempts
        self.answered += other.answered
        self.refused += other.refused
        self.abandoned += other.abandoned
        self.connect_errors += other.connect_errors
        self.answer_ms += other.answer_ms


class _Abandoned(Exception):
    """The slot ended before the node answered."""


def _recv(sock: socket.socket, deadline: float) -> bytes:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Abandoned
    sock.settimeout(remaining)
    try:
        return sock.recv(4096)
    except TimeoutError:
        raise _Abandoned from None


def _plain_attempt(sock: socket.socket, user: str, deadline: float) -> bool:
    """Header and PLAIN init at once; True once the outcome arrives, False if the node closed first."""
    response = f"\0{user}\0wrong-{secrets.token_hex(4)}".encode()
    sock.sendall(SASL_HEADER + encode_frame(INIT, [symbol("PLAIN"), response, "localhost"]))
    buffer = bytearray()
    header_seen = False
    while True:
        data = _recv(sock, deadline)
        if not data:
            return False
        buffer += data
        if not header_seen:
            if len(buffer) < len(SASL_HEADER):
                continue
            del buffer[:len(SASL_HEADER)]
            header_seen = True
        try:
            frames = decode_frames(buffer)
        except SaslError:
            return False
        if any(code == OUTCOME for code, _ in frames):
            return True


def _tls_attempt(sock: socket.socket, context: ssl.SSLContext, deadline: float) -> bool:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Abandoned
    sock.settimeout(remaining)
    try:
        wrapped = context.wrap_socket(sock, server_hostname="localhost", do_handshake_on_connect=False)
        wrapped.do_handshake()
    except TimeoutError:
        raise _Abandoned from None
    except (ssl.SSLError, ConnectionError):
        return False
    wrapped.close()
    return True


def fresh_sources(thread: int) -> Iterator[str]:
    """Addresses no other thread uses and none used before: ``127.<100 + thread>.x.y`` (all loopback)."""
    for x in range(256):
        for y in range(1, 255):
            yield f"127.{100 + thread}.{x}.{y}"
    raise RuntimeError("out of fresh source addresses")


def _flood_thread(kind: str, host: str, port: int, sources: Iterator[str], slot: float, start: float, end: float,
                  stop: threading.Event, counts: Counts) -> None:
    user = os.environ.get("HASTANDBY_USER", "app")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    due = start
    while not stop.is_set() and due < end:
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        deadline = due + slot
        due = deadline
        counts.attempts += 1
        began = time.monotonic()
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((next(sources), 0))
            sock.settimeout(max(0.001, deadline - began))
            sock.connect((host, port))
        except OSError:
            counts.connect_errors += 1
            sock.close()
            continue
        try:
            if kind == "tls":
                answered = _tls_attempt(sock, context, deadline)
            else:
                name = user if kind == "bad-plain" else f"nobody-{secrets.token_hex(4)}"
                answered = _plain_attempt(sock, name, deadline)
        except _Abandoned:
            counts.abandoned += 1
        except OSError:
            counts.refused += 1  # reset by the node
        else:
            if answered:
                counts.answered += 1
                counts.answer_ms.append((time.monotonic() - began) * 1e3)
            else:
                counts.refused += 1
        finally:
            sock.close()


def flood(kind: str, host: str, port: int, sources: list[str], sockets: int, rate: float,
          duration: float, fresh: bool = False) -> dict[str, Any]:
    slot = sockets / rate
    stop = threading.Event()
    start = time.monotonic() + 0.05
    end = start + duration
    tallies = [Counts() for _ in range(sockets)]
    threads = [threading.Thread(target=_flood_thread, daemon=True,
                                args=(kind, host, port,
                                      fresh_sources(i) if fresh else itertools.repeat(sources[i % len(sources)]),
                                      slot, start + i * slot / sockets, end, stop, tallies[i]))
               for i in range(sockets)]
    for thread in threads:
        thread.start()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    for thread in threads:
        thread.join()
    total = Counts()
    for tally in tallies:
        total.merge(tally)
    seconds = max(1e-9, min(time.monotonic(), end) - start)
    ordered = sorted(total.answer_ms)
    return {"kind": kind, "sockets": sockets, "sources": "fresh for every attempt" if fresh else sorted(set(sources)),
            "offered_per_s": rate,
            "seconds": round(seconds, 3), "attempts": total.attempts,
            "attempts_per_s": round(total.attempts / seconds, 1), "answered": total.answered,
            "answered_per_s": round(total.answered / seconds, 1), "refused": total.refused,
            "abandoned": total.abandoned, "connect_errors": total.connect_errors,
            "answer_p50_ms": nearest_rank(ordered, 50) if ordered else None,
            "answer_p99_ms": nearest_rank(ordered, 99) if ordered else None}


def produce(host: str, port: int, queue: str, duration: float) -> dict[str, Any]:
    connection = BlockingConnection(f"amqp://{host}:{port}", timeout=30, user=os.environ["HASTANDBY_USER"],
                                    password=os.environ["HASTANDBY_PASSWORD"], allow_insecure_mechs=True)
    try:
        sender = connection.create_sender(queue)
        print("ready", flush=True)
        sys.stdin.readline()
        body = b"x" * 100
        accepted = 0
        started = time.monotonic()
        end = started + duration
        while time.monotonic() < end:
            sender.send(Message(body=body))  # waits for the node's outcome; raises unless accepted
            accepted += 1
        seconds = time.monotonic() - started
    finally:
        connection.close()
    return {"accepted": accepted, "seconds": round(seconds, 3), "per_s": round(accepted / seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hastandby.testing.flood_clients", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=["produce", "flood"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--queue", default="flood")
    parser.add_argument("--kind", choices=KINDS, default="bad-plain")
    parser.add_argument("--sockets", type=int, default=8)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--source", action="append", default=[], help="source address (repeat: one per socket)")
    parser.add_argument("--fresh-sources", action="store_true",
                        help="every attempt from an address not used before (a distributed flood)")
    parser.add_argument("--nice", type=int, default=0, help="run at this niceness (the flood: an attacker's CPU "
                        "is not the node's machine's)")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    if args.role == "produce":
        result = produce(args.host, args.port, args.queue, args.duration)
    else:
        result = flood(args.kind, args.host, args.port, args.source or ["127.0.0.1"], args.sockets, args.rate,
                       args.duration, args.fresh_sources)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
