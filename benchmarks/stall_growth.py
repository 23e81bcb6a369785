"""How the might_stall stage grows in requests, in two checkouts side by side.

Usage::

    python -m benchmarks.stall_growth BEFORE_TREE AFTER_TREE --workers 2000 --requests 50000 100000 200000 400000
    python -m benchmarks.stall_growth BEFORE_TREE AFTER_TREE --no-history ...

For each request count, each tree runs in its own subprocess (``PYTHONPATH`` = the tree) on the same
synthetic horde, with five minutes of history (``vecsched.synthetic_history``) or, with
``--no-history``, none (as ``vecsched.estimate(horde(...))`` and the benchmark's stress row run it);
they take turns, one estimate per turn after one cold estimate. Prints one JSON object: per tree and
request count the median ``stall`` stage in wall seconds and in CPU seconds of the process (the
machine is shared: CPU time is the steadier of the two), and per tree the exponents of log(stall) on
log(requests) for both (``benchmarks.report.fit_exponent``: all points, upper half, last step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

if __package__ in (None, ""):  # run as a file (python benchmarks/X.py): the checkout is the package root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.report import fit_exponent  # noqa: E402
from benchmarks.sidebyside import take_turns  # noqa: E402

_CHILD = r"""
import json, sys, time
import vecsched
import vecsched.core.estimate as estimate_module
from vecsched.synthetic import horde
from vecsched.synthetic_history import with_history

workers, requests, seed, history = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
snapshot = horde(workers=workers, requests=requests, seed=seed)
if history:
    snapshot = with_history(snapshot, seed=seed)
stage, cpu = estimate_module._stall, [0.0]
def timed(*args):
    started = time.process_time()
    try:
        return stage(*args)
    finally:
        cpu[0] += time.process_time() - started
estimate_module._stall = timed
vecsched.estimate(snapshot)  # cold run, not counted
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cpu[0] = 0.0
    timings = vecsched.estimate(snapshot).timings
    print(json.dumps({"stall": timings["stall"], "stall_cpu": cpu[0]}), flush=True)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stall_growth", description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--requests", type=int, nargs="+", default=[50000, 100000, 200000, 400000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-history", action="store_true")
    args = parser.parse_args(argv)
    trees = {"before": args.before, "after": args.after}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for requests in args.requests:
        child_args = [str(args.workers), str(requests), str(args.seed), str(int(not args.no_history))]
        _, runs = take_turns(trees, _CHILD, child_args, args.rounds)
        for name in trees:
            rows[name].append({"requests": requests,
                               "stall_s": round(statistics.median(r["stall"] for r in runs[name]), 3),
                               "stall_cpu_s": round(statistics.median(r["stall_cpu"] for r in runs[name]), 3)})
        print(json.dumps({"requests": requests, **{name: rows[name][-1] for name in trees}}), file=sys.stderr, flush=True)
    out: dict[str, Any] = {"workers": args.workers, "history": not args.no_history, "rounds": args.rounds}
    for name, tree in trees.items():
        counts = [r["requests"] for r in rows[name]]
        out[name] = {"tree": tree, "rows": rows[name],
                     "growth_wall": fit_exponent(counts, [r["stall_s"] for r in rows[name]]),
                     "growth_cpu": fit_exponent(counts, [r["stall_cpu_s"] for r in rows[name]])}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
