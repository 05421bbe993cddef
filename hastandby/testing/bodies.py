"""Numbered durable messages whose bodies are checked byte for byte: what a disk fault must not change.

``BodySender`` sends numbers with a body no other message has (``body``) and
records each outcome, with the condition of a refusal; ``drain_bodies`` takes
every message of a queue back; ``check_every_body`` says which acknowledged
ones are missing or changed.  A plain python-qpid-proton client, as an
application's.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection


def body(number: int, size: int = 300) -> bytes:
    """Message ``number``'s body: ``size`` bytes no other message has, so a wrong or damaged one shows."""
    seed = hashlib.sha256(b"%d" % number).digest()
    return (b"%06d:" % number + seed * (size // len(seed) + 1))[:size]


class BodySender(MessagingHandler):
    """Sends durable messages 1..count (id and body from the number), up to ``window`` at a time; records
    which were accepted and which rejected (with the condition)."""

    def __init__(self, url: str, queue: str, numbers: range, window: int = 100, size: int = 300) -> None:
        super().__init__(auto_settle=True)
        self.url, self.queue, self.numbers, self.window, self.size = url, queue, numbers, window, size
        self.next = iter(numbers)
        self.outstanding = 0
        self.accepted: set[int] = set()
        self.accepted_at: list[float] = []
        self.rejected: dict[int, str] = {}
        self.errors: list[str] = []
        self.done = threading.Event()
        self._exhausted = False

    def on_start(self, event: Any) -> None:
        connection = event.container.connect(self.url, allow_insecure_mechs=True, heartbeat=1)
        event.container.create_sender(connection, self.queue)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.outstanding < self.window and not self._exhausted:
            number = next(self.next, None)
            if number is None:
                self._exhausted = True
                break
            event.sender.send(Message(id=number, body=body(number, self.size), durable=True), tag=str(number))
            self.outstanding += 1
        if self._exhausted and self.outstanding == 0 and not self.done.is_set():
            self.done.set()
            event.connection.close()

    def _settled(self, event: Any) -> None:
        self.outstanding -= 1
        self.on_sendable(event)

    def on_accepted(self, event: Any) -> None:
        self.accepted.add(int(event.delivery.tag))
        self.accepted_at.append(time.time())
        self._settled(event)

    def on_rejected(self, event: Any) -> None:
        condition = event.delivery.remote.condition
        self.rejected[int(event.delivery.tag)] = f"{condition.name}: {condition.description}" if condition else "?"
        self._settled(event)

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(str(event.transport.condition))
        self.done.set()


def send_bodies(url: str, queue: str, numbers: range, timeout: float = 120.0, **options: Any) -> BodySender:
    sender = BodySender(url, queue, numbers, **options)
    thread = threading.Thread(target=Container(sender).run, daemon=True)
    thread.start()
    assert sender.done.wait(timeout), f"sender stuck: {len(sender.accepted)} accepted, {len(sender.rejected)} rejected"
    thread.join(10)
    assert not sender.errors, sender.errors
    return sender


def drain_bodies(url: str, queue: str, timeout: float = 60.0) -> dict[int, bytes]:
    """Every message on ``queue``: number -> body (each number once: a second copy fails the test)."""
    connection = BlockingConnection(url, timeout=10, allow_insecure_mechs=True)
    found: dict[int, bytes] = {}
    try:
        receiver = connection.create_receiver(queue, credit=500)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                message = receiver.receive(timeout=2)
            except Exception:  # noqa: BLE001 - proton's Timeout: the queue is drained
                break
            number = int(message.id)
            assert number not in found, f"message {number} delivered twice"
            found[number] = bytes(message.body)
            receiver.accept()
    finally:
        connection.close()
    return found


def check_every_body(found: dict[int, bytes], acknowledged: set[int], size: int = 300) -> None:
    missing = sorted(acknowledged - found.keys())
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:10]}"
    wrong = [n for n, data in found.items() if data != body(n, size)]
    assert not wrong, f"{len(wrong)} messages with a wrong body, e.g. {wrong[:10]}"
