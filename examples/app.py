"""A plain python-qpid-proton application of a cluster: send or receive N messages through a URL list.

    python examples/app.py send orders 10
    python examples/app.py receive orders 10

It knows the cluster only as its list of node addresses (``APP_URLS``,
comma-separated HOST:PORT) and its own user (``APP_USER``, ``APP_PASSWORD``):
it tries each address in turn, each connect bounded, so a node that is down,
a backup (which refuses clients) or an address behind a cut link costs it
seconds, not the length of the outage.  Nothing here knows which node is the
primary, or that a failover happened.
"""

from __future__ import annotations

import os
import sys

from proton import Message
from proton.utils import BlockingConnection

CONNECT_TIMEOUT = 5.0  # seconds one address has to answer


def connect() -> BlockingConnection:
    user, password = os.environ["APP_USER"], os.environ["APP_PASSWORD"]
    errors = []
    for address in os.environ["APP_URLS"].split(","):
        try:
            return BlockingConnection(f"amqp://{user}:{password}@{address.strip()}", timeout=CONNECT_TIMEOUT)
        except Exception as error:  # refused, a backup, no answer: try the next node
            errors.append(f"{address}: {error}")
    sys.exit("no node took the connection:\n  " + "\n  ".join(errors))


def main(action: str, queue: str, count: int) -> None:
    connection = connect()
    try:
        if action == "send":
            sender = connection.create_sender(queue)
            for number in range(count):
                sender.send(Message(body=f"{queue} {number}", durable=True))  # returns once accepted
            print(f"sent {count} to {queue}, each accepted")
        else:
            receiver = connection.create_receiver(queue, credit=count)
            for _ in range(count):
                print(receiver.receive(timeout=10).body)
                receiver.accept()
    finally:
        connection.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
