"""Python calls per message a standalone node makes, counted by cProfile: what a change adds to the hot path.

CPU time on this shared two-core machine spreads too much round to round to
show a few per cent; the number of Python calls a node makes per message does
not.  Each round starts a standalone node under ``python -m cProfile``, sends
messages to one queue with the proton C ``send-bench`` client, takes them all
with ``receive-bench``, stops the node (SIGTERM: it returns normally, and
cProfile writes its profile) and counts the calls.  Two rounds per tree, with
``--small`` and ``--small + --messages`` messages, and the difference divided
by ``--messages`` is the cost of one message sent and consumed: start-up and
shutdown cancel out.

    python -m benchmarks.call_counts [--baseline-tree DIR] [--messages 20000] [--small 2000]
        [--queue-args '{"qpid.priorities": 10}'] [--top 15]

``--queue-args`` declares the queue with those arguments first (e.g. a
priority queue, to see what it costs); without it the queue is a plain one
made by the sender's attach.  ``--baseline-tree`` (an older checkout, e.g.
``git archive HEAD hastandby | tar -x -C DIR``) is measured the same way in
the same invocation.  Prints one JSON document: per tree, the calls per
message and the functions whose call counts per message differ the most.
"""

from __future__ import annotations

import argparse
import json
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any
from hastandby.testing import cexamples, request, wait_answering
from hastandby.testing.processes import LOOPBACK, Service, free_port

from .trees import CURRENT, Tree, baseline_tree


def _profile_round(tree: Tree, messages: int, queue_args: dict[str, Any] | None, scratch: Path,
                   tag: str) -> pstats.Stats:
    """One node under cProfile: ``messages`` sent then consumed; the node's profile."""
    port = free_port()
    profile = scratch / f"{tag}.prof"
    argv = tree.serve_argv()
    argv = [argv[0], "-m", "cProfile", "-o", str(profile), *argv[1:], "--listen", f"{LOOPBACK}:{port}"]
    service = Service(tag, argv, scratch / f"{tag}.log", cwd=tree.root, env=tree.env())
    try:
        login = tree.login()
        wait_answering(service, port, login=login)
        if queue_args is not None:
            request(port, "CREATE", "queue", "calls", {"arguments": queue_args}, login=login)
        env = tree.client_environment()
        sent = cexamples.start_send(LOOPBACK, port, "calls", messages, env=env).wait(300)
        if cexamples.sent_count(sent) != messages:
            raise RuntimeError(f"send-bench: {sent.stdout[-300:]}")
        got = cexamples.start_receive(LOOPBACK, port, "calls", messages, env=env).wait(300)
        if cexamples.received_count(got) != messages:
            raise RuntimeError(f"receive-bench: {got.stdout[-300:]}")
    finally:
        code = service.stop(timeout=30)
    if code != 0 or not profile.exists():
        raise RuntimeError(f"the node exited with {code} and {'a' if profile.exists() else 'no'} profile: "
                           f"{service.log_tail()}")
    return pstats.Stats(str(profile))


def _per_function(stats: pstats.Stats) -> dict[str, int]:
    counts: dict[str, int] = {}
    for (filename, line, name), (_, ncalls, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        counts[f"{Path(filename).name}:{line}({name})"] = ncalls
    return counts


def measure(tree: Tree, messages: int, small: int, queue_args: dict[str, Any] | None, scratch: Path,
            top: int) -> dict[str, Any]:
    low = _profile_round(tree, small, queue_args, scratch, f"{tree.name}-{small}")
    high = _profile_round(tree, small + messages, queue_args, scratch, f"{tree.name}-{small + messages}")
    per_low, per_high = _per_function(low), _per_function(high)
    added = {name: (per_high.get(name, 0) - per_low.get(name, 0)) / messages for name in set(per_low) | set(per_high)}
    busiest = sorted(added.items(), key=lambda item: -item[1])[:top]
    return {
        "tree": tree.describe(),
        "calls_per_message": round((high.total_calls - low.total_calls) / messages, 2),  # type: ignore[attr-defined]
        "top": [[name, round(count, 3)] for name, count in busiest],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--small", type=int, default=2_000)
    parser.add_argument("--queue-args", type=json.loads, default=None, help="JSON map: declare the queue with these")
    parser.add_argument("--baseline-tree", type=Path)
    parser.add_argument("--top", type=int, default=15)
    options = parser.parse_args(argv)
    trees = [CURRENT] + ([baseline_tree(options.baseline_tree)] if options.baseline_tree else [])
    with tempfile.TemporaryDirectory(prefix="call-counts-") as scratch:
        results = [measure(tree, options.messages, options.small, options.queue_args, Path(scratch), options.top)
                   for tree in trees]
    json.dump({"messages": options.messages, "queue_args": options.queue_args, "results": results},
              sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
