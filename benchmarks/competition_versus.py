"""Text competition (SPEC section 5) in two checkouts of vecsched, side by side in one run.

Usage::

    python -m benchmarks.competition_versus BEFORE_TREE AFTER_TREE --workers 2000 --requests 400000 --rounds 3
    python -m benchmarks.competition_versus BEFORE_TREE AFTER_TREE --horde adversarial --requests 100000

``--horde adversarial`` gives every request 2 to 5 random models (``benchmarks/adversarial.py``, read
from each tree). Each tree runs in its own long-lived subprocess (``PYTHONPATH`` = the tree) on the
same synthetic horde: prepare and text eligibility once, then one call of the competition stage per
turn (one cold call first, not counted), the trees taking turns. Prints one JSON object: per tree
the best and median CPU seconds of the stage (the process's CPU time: the stage runs on one BLAS
thread, and CPU time is the steadier figure on a shared machine), a digest of its answers (the two
must agree), and after's best over before's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

if __package__ in (None, ""):  # run as a file (python benchmarks/X.py): the checkout is the package root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.sidebyside import take_turns  # noqa: E402

_CHILD = r"""
import hashlib, json, sys, time
import numpy as np
import vecsched.core.estimate as stages
from vecsched.core.threads import one_blas_thread
from vecsched.snapshot.schema import TEXT
from vecsched.synthetic import horde

workers, requests, seed, shape = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if shape == "adversarial":
    from benchmarks.adversarial import adversarial_horde
    snapshot = adversarial_horde(workers, requests, seed)
else:
    snapshot = horde(workers=workers, requests=requests, seed=seed)
batch = stages._prepare(snapshot)
mine = np.flatnonzero(batch.queue.gentype == TEXT)
with one_blas_thread():
    elig = stages._eligibility(batch, TEXT, mine, True)
    _ = elig.competition.distinct_takeable  # formed by the eligibility stage, not timed here
    ahead = stages._competition(batch, mine, elig, {}, "text")  # cold call
digest = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes()
                                 for a in (ahead.eligible, ahead.count, ahead.jobs, ahead.work))).hexdigest()[:16]
print(json.dumps({"ready": True, "digest": digest}), flush=True)
for line in sys.stdin:
    with one_blas_thread():
        start = time.process_time()
        stages._competition(batch, mine, elig, {}, "text")
        seconds = time.process_time() - start
    print(json.dumps({"cpu_s": seconds}), flush=True)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.competition_versus", description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=400000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--horde", choices=("realistic", "adversarial"), default="realistic")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    ready, turns = take_turns({"before": args.before, "after": args.after}, _CHILD,
                              [str(args.workers), str(args.requests), str(args.seed), args.horde], args.rounds)
    out = {name: {"tree": tree, "digest": ready[name]["digest"],
                  "best_cpu_s": min(t["cpu_s"] for t in turns[name]),
                  "median_cpu_s": statistics.median(t["cpu_s"] for t in turns[name])}
           for name, tree in (("before", args.before), ("after", args.after))}
    out["answers_agree"] = ready["before"]["digest"] == ready["after"]["digest"]
    out["after_over_before"] = out["after"]["best_cpu_s"] / out["before"]["best_cpu_s"]
    out["workers"], out["requests"], out["horde"] = args.workers, args.requests, args.horde
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
