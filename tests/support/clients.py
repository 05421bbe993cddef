"""Small blocking python-qpid-proton clients for tests (real AMQP, no mocks)."""

from __future__ import annotations

from typing import Any

from proton import Described, Message, symbol
from proton.reactor import Copy, Filter
from proton.utils import BlockingConnection

TOPIC_FILTER = symbol("apache.org:legacy-amqp-topic-binding:string")


def connect(address: str, **kwargs: Any) -> BlockingConnection:
    return BlockingConnection(f"amqp://{address}", timeout=10, **kwargs)


def send(address: str, queue: str, messages: list[Message] | int, **kwargs: Any) -> list[Any]:
    """Send and wait for each outcome; returns the remote states (ACCEPTED, REJECTED, ...)."""
    if isinstance(messages, int):
        messages = [Message(body=f"m{i}") for i in range(messages)]
    conn = connect(address, **kwargs)
    try:
        sender = conn.create_sender(queue)
        outcomes = []
        for message in messages:
            try:
                delivery = sender.send(message)
                outcomes.append(delivery.remote_state)
            except Exception as error:  # a rejected send raises in BlockingSender
                outcomes.append(error)
        return outcomes
    finally:
        conn.close()


def receive(address: str, queue: str, count: int, timeout: float = 5.0, accept: bool = True,
            **options: Any) -> list[Message]:
    """Receive ``count`` messages (fewer if none come within ``timeout``)."""
    conn = connect(address)
    try:
        receiver = conn.create_receiver(queue, credit=count or 1, **options)
        got = []
        for _ in range(count):
            try:
                message = receiver.receive(timeout=timeout)
            except Exception:
                break
            got.append(message)
            if accept:
                receiver.accept()
        return got
    finally:
        conn.close()


def browse(address: str, queue: str, count: int, timeout: float = 5.0) -> list[Message]:
    return receive(address, queue, count, timeout, accept=True, options=Copy())


def topic_filter(pattern: str) -> Filter:
    return Filter({symbol("subject-filter"): Described(TOPIC_FILTER, pattern)})

