"""A TCP proxy that delays each direction by a fixed time: a WAN link on loopback.

This kernel has no ``netem`` qdisc, so WAN latency comes from here: every
chunk read from one side is written to the other ``delay`` seconds after it
arrived, in order, with no bandwidth limit.  ``cut()`` drops every current
connection (a broken link); ``refuse(True)`` also turns new ones away until
``refuse(False)`` (an outage).

In a test or benchmark: ``DelayProxy(target, delay).start()`` runs it on a
thread.  Inside a network namespace: ``python -m hastandby.testing.delay_proxy
--listen HOST:PORT --target HOST:PORT --delay-ms 25``.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any


class DelayProxy:
    """Forwards ``listen`` to ``target`` with ``delay`` seconds each way."""

    def __init__(self, target: tuple[str, int], delay: float, listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.target = target
        self.delay = delay
        self.listen = listen
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._refusing = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delay-proxy", daemon=True)

    @property
    def address(self) -> str:
        return f"{self.listen[0]}:{self.port}"

    def start(self) -> "DelayProxy":
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("delay proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def cut(self) -> None:
        """Drop every open connection, as a broken link does."""
        self._call(self._close_all)

    def refuse(self, refusing: bool) -> None:
        """While refusing, new connections are closed at once (and open ones are cut)."""
        self._refusing = refusing
        if refusing:
            self.cut()

    def _call(self, fn: Any) -> None:
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(5)

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    # -- the loop thread -----------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, *self.listen))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._close_all()
            self._server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            client_writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers |= {client_writer, server_writer}
        pumps = [asyncio.ensure_future(self._pump(client_reader, server_writer)),
                 asyncio.ensure_future(self._pump(server_reader, client_writer))]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for writer in (client_writer, server_writer):
            writer.transport.abort()
            self._writers.discard(writer)
        for pump in pumps:
            pump.cancel()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read chunks as they come; write each one ``delay`` after it arrived."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def forward() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        forwarder = asyncio.ensure_future(forward())
        try:
            while True:
                data = await reader.read(65536)
                queue.put_nowait((time.monotonic() + self.delay, data))
                if not data:
                    break
            await forwarder
        except (ConnectionError, OSError):
            pass
        finally:
            forwarder.cancel()


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept on")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, default=25.0, help="delay each way, milliseconds")
    args = parser.parse_args()
    proxy = DelayProxy(_hostport(args.target), args.delay_ms / 1000.0, _hostport(args.listen)).start()
    print(f"delay proxy {proxy.address} -> {args.target}, {args.delay_ms:g} ms each way", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.stop()


if __name__ == "__main__":
    main()
