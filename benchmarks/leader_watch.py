"""An etcd watch on one key as a process of its own: the failover benchmark's view of the leader key.

    python -m benchmarks.leader_watch --etcd URL --key KEY

The only direct view of *when* the cluster's leader key was deleted (lease
expiry, revoke) and created again.  One JSON line per event on stdout,
stamped with ``time.time()`` on arrival (one wall clock for every process of
the run, ``docs/failover-traces.md``), until stdin ends.  Moved out of the
failover benchmark's client processes (``hastandby/testing/numbered_client.py``
is the client now).
"""

from __future__ import annotations

import os

# etcd3 0.12 ships protobuf 3 generated code: only the pure-Python runtime loads it.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any, Iterator  # noqa: E402


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


def _emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.leader_watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--etcd", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    watch_leader(args.etcd, args.key, _emit, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
