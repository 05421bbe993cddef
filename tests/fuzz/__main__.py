"""``python -m tests.fuzz --cases N [--kinds K,...] [--seed S]``: fuzz live nodes, print a summary.

Every kind starts its own nodes (in a temporary directory, removed at the
end unless ``--keep``), runs ``--cases`` cases from ``--seed`` (case ``i``
replays with ``--start i --cases 1``), and is stopped whatever happens.
``--json`` writes the tallies to ``results/fuzz-<time>.json``
(or ``--out FILE``); nothing is written otherwise.  The exit status is 1 if
any case failed (a crash, a hang, a loss, an unhandled error in a log).
See docs/fuzz.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from hastandby.testing.auth import users
from hastandby.testing.paths import results_dir

from .kinds import KINDS
from .runner import Runner, Tally, table

RESULTS = results_dir()  # results/ at the checkout's root (ignored), or $HASTANDBY_RESULTS_DIR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100, help="cases per kind (default 100)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated, from: {', '.join(KINDS)} (default: all)")
    parser.add_argument("--seed", type=int, default=1, help="seed of every case (default 1)")
    parser.add_argument("--start", type=int, default=0, help="index of the first case (to replay one)")
    parser.add_argument("--minutes", type=float, default=None, help="stop each kind after this long")
    parser.add_argument("--json", action="store_true", help="write the tallies under results/")
    parser.add_argument("--out", type=Path, help="write the tallies to this file")
    parser.add_argument("--keep", action="store_true", help="keep the nodes' directory (logs) afterwards")
    parser.add_argument("--quiet", action="store_true", help="no line per failing case")
    parser.add_argument("--progress", type=int, default=0, metavar="N", help="a line every N cases")
    args = parser.parse_args(argv)
    # SIGTERM (and SIGINT, which a shell's background job ignores) end the run through the
    # ``finally`` blocks below, so every node is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    names = [n.strip() for n in args.kinds.split(",") if n.strip()]
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        parser.error(f"unknown kind(s) {', '.join(unknown)}: choose from {', '.join(KINDS)}")
    directory = Path(tempfile.mkdtemp(prefix="hastandby-fuzz-"))
    started = time.time()
    tallies: list[Tally] = []
    try:
        for name in names:
            kind = KINDS[name](directory, users())
            print(f"{name}: {kind.summary}", flush=True)
            try:
                kind.setup()
                runner = Runner(kind, args.seed, verbose=not args.quiet, progress=args.progress)
                deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
                tallies.append(runner.run(args.cases, args.start, deadline))
            finally:
                kind.teardown()
            print(f"{name}: {tallies[-1].cases} cases in {tallies[-1].seconds:.0f} s", flush=True)
    finally:
        if args.keep:
            print(f"logs kept in {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    print()
    print(table(tallies))
    for title, attribute in (("unhandled errors (failures)", "failure_signatures"),
                             ("refusals through a containment path (not failures)", "contained")):
        lines = [f"  {tally.kind}: {count} x {signature}" for tally in tallies
                 for signature, count in getattr(tally, attribute).most_common(12)]
        if lines:
            print(f"\n{title}:")
            print("\n".join(lines))
    if args.json or args.out:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path = args.out or RESULTS / f"fuzz-{stamp}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"seed": args.seed, "cases_per_kind": args.cases, "start": args.start,
                                    "seconds": round(time.time() - started, 1),
                                    "kinds": [t.as_dict() for t in tallies]}, indent=2, default=str))
        print(f"results: {path}")
    failed = any(t.crashes or t.hangs or t.losses or t.failing_cases for t in tallies)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
