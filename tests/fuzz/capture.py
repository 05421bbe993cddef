"""Conversations of a real python-qpid-proton client, recorded through a small TCP proxy.

The ``frames`` kind mutates these as well as the ones ``amqp.py`` builds:
they carry what the library itself puts in its frames (its open's
capabilities and properties, its attach fields, its flow and disposition
habits).  A ``BlockingConnection`` as ``app`` (PLAIN) sends three messages
and receives them back, through a proxy that records both directions.

What is kept is the client's side after SASL (the SASL frames hold the
password, and the fuzzer logs in itself), split at every point where the
client waited for the node: each client segment becomes its frames,
followed by an ``amqp.Wait`` for the last performative the node had sent
before the client went on.  Names that proton makes up (container id,
link names) are replaced by fixed ones, so the same library gives the same
conversation, and a case replays the same.
"""

from __future__ import annotations

import select
import socket
import threading
from typing import Any

from proton import Described, Message
from proton.utils import BlockingConnection

from . import amqp
from .amqp import Frame

TIMEOUT = 10.0


class _Proxy(threading.Thread):
    """Forwards one connection to ``target`` and records (direction, bytes) in arrival order."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.chunks: list[tuple[str, bytes]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        ready, _, _ = select.select([self.listener], [], [], TIMEOUT)
        if not ready:
            return
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target, timeout=TIMEOUT)
        peers = {client: (server, "client"), server: (client, "server")}
        try:
            while not self.stop.is_set():
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    other, side = peers[sock]
                    self.chunks.append((side, data))
                    other.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            server.close()
            self.listener.close()


def record(host: str, port: int, user: str, password: str, queue: str, count: int = 3) -> list[tuple[str, bytes]]:
    """The bytes of one producer-then-consumer session of python-qpid-proton, by direction."""
    proxy = _Proxy((host, port))
    proxy.start()
    try:
        connection = BlockingConnection(f"amqp://127.0.0.1:{proxy.port}", timeout=TIMEOUT, user=user,
                                        password=password, allow_insecure_mechs=True)
        try:
            sender = connection.create_sender(queue)
            for number in range(count):
                sender.send(Message(body=f"captured-{number}"))
            receiver = connection.create_receiver(queue, credit=count)
            for _ in range(count):
                receiver.receive(TIMEOUT)
                receiver.accept()
            sender.close()
            receiver.close()
        finally:
            connection.close()
    finally:
        proxy.stop.set()
        proxy.join(TIMEOUT)
    return proxy.chunks


def script(chunks: list[tuple[str, bytes]]) -> list[Any]:
    """The client's AMQP frames as a script (``amqp.Frame`` and ``amqp.Wait``), names made fixed."""
    client = b"".join(data for side, data in chunks if side == "client")
    start = client.find(amqp.AMQP_HEADER)
    if start < 0:
        raise ValueError("no AMQP header in the recorded client bytes")
    out: list[Any] = []
    seen_client = 0
    last_server_code: int | None = None
    for side, data in chunks:
        if side == "server":
            replies = [code for code, _ in _frames(data) if code is not None]
            if replies:
                last_server_code = replies[-1]
            continue
        begin, seen_client = seen_client, seen_client + len(data)
        if seen_client <= start:
            continue
        data = data[max(0, start - begin):]
        if last_server_code is not None and out and last_server_code in amqp.PERFORMATIVES:
            out.append(amqp.Wait(last_server_code))
        last_server_code = None
        if data.startswith(amqp.AMQP_HEADER):
            data = data[8:]  # the fuzzer sends its own header first
        for code, fields, channel, payload in _frames(data, with_rest=True):
            if code is None:
                out.append(Frame(None, channel=channel))
            else:
                out.append(Frame(code, _fixed(code, fields), channel=channel, payload=payload))
    return out


def _frames(data: bytes, with_rest: bool = False) -> list[Any]:
    found = []
    while data[:4] == b"AMQP":
        data = data[8:]
    frames, _ = amqp.split_frames(data)
    for frame in frames:
        code, fields = amqp.decode_frame(frame)
        if not with_rest:
            found.append((code, fields))
            continue
        doff, channel = frame[4], int.from_bytes(frame[6:8], "big")
        body = frame[doff * 4:]
        payload = b""
        if code == amqp.TRANSFER:
            from proton import Data

            decoder = Data()
            used = decoder.decode(body)
            payload = body[used:]
        found.append((code, [_owned(f) for f in fields] if isinstance(fields, list) else [], channel, payload))
    return found


def _owned(value: Any) -> Any:
    """``value`` with every binary copied out of proton's buffer (it hands out views into it)."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [_owned(v) for v in value]
    if isinstance(value, dict):
        return {_owned(k): _owned(v) for k, v in value.items()}
    if isinstance(value, Described):
        return Described(value.descriptor, _owned(value.value))
    return value


def _fixed(code: int, fields: list[Any]) -> list[Any]:
    """Names proton makes up at random, made fixed (the container id, link names)."""
    fields = list(fields)
    if code == amqp.OPEN and fields:
        fields[0] = "captured-client"
    elif code == amqp.ATTACH and fields:
        handle = fields[1] if len(fields) > 1 else 0
        fields[0] = f"captured-link-{int(handle) if isinstance(handle, int) else 0}"
        for index in (5, 6):  # source, target: a dynamic address would be random too
            if len(fields) > index and isinstance(fields[index], Described) and isinstance(fields[index].value, list):
                inner = list(fields[index].value)
                if inner and isinstance(inner[0], str) and inner[0].startswith(("temp.", "dynamic")):
                    inner[0] = None
                fields[index] = type(fields[index])(fields[index].descriptor, inner)
    return fields
