"""Two checkouts of vecsched, side by side in one run: each one's estimate time over its one-pass floor.

Usage::

    python -m benchmarks.versus BEFORE_TREE AFTER_TREE --workers 2000 --requests 50000 --rounds 7

A change that must not slow the batch is judged on the ratio batch / floor
(see ``benchmarks/README.md``) measured before and after on the same machine
at the same time: the machine is shared, so absolute times drift. Each tree
runs in its own subprocess (``PYTHONPATH`` = the tree), synthesizes the same
horde, and the two take turns: one estimate and one floor pass per turn, one
cold estimate first (not counted). Prints one JSON object: per tree the
median estimate and floor seconds and their ratio, the median of each stage
(``Estimates.timings``) and of the SPEC 3-6 stages together, each over the
floor, and the after/before ratios. ``--horde adversarial`` gives every request
2-5 random models (``benchmarks/adversarial.py``).
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
from benchmarks.report import STAGES as SPEC_STAGES  # noqa: E402
from benchmarks.sidebyside import take_turns  # noqa: E402

_CHILD = r"""
import json, sys, time
from benchmarks.floor import one_pass
import vecsched
from vecsched.synthetic import horde

if sys.argv[4] == "adversarial":
    from benchmarks.adversarial import adversarial_horde as horde
snapshot = horde(int(sys.argv[1]), int(sys.argv[2]), seed=int(sys.argv[3]))
vecsched.estimate(snapshot)  # cold run, not counted
print(json.dumps({"ready": True, "waiting": len(vecsched.estimate(snapshot))}), flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    est = vecsched.estimate(snapshot)
    batch = time.perf_counter() - start
    start = time.perf_counter()
    one_pass(snapshot)
    floor = time.perf_counter() - start
    print(json.dumps({"batch": batch, "floor": floor, "stages": est.timings}), flush=True)
"""




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.versus", description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the checkout measured first in the first round")
    parser.add_argument("after")
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=50000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--horde", choices=("realistic", "adversarial"), default="realistic",
                        help="adversarial: every request names 2-5 random models (benchmarks/adversarial.py)")
    args = parser.parse_args(argv)
    trees = {"before": args.before, "after": args.after}
    ready, times = take_turns(trees, _CHILD, [str(args.workers), str(args.requests), str(args.seed), args.horde],
                              args.rounds)
    out: dict[str, Any] = {"workers": args.workers, "requests": args.requests, "rounds": args.rounds,
                           "horde": args.horde}  # fmt: skip
    for name, tree in trees.items():
        batch = statistics.median(t["batch"] for t in times[name])
        floor = statistics.median(t["floor"] for t in times[name])
        stages = {stage: statistics.median(t["stages"].get(stage, 0.0) for t in times[name])
                  for stage in sorted({s for t in times[name] for s in t["stages"]})}  # fmt: skip
        spec = statistics.median(sum(t["stages"].get(s, 0.0) for s in SPEC_STAGES) for t in times[name])
        out[name] = {"tree": tree, "waiting": ready[name]["waiting"], "batch_s": batch, "floor_s": floor,
                     "ratio": batch / floor, "stages_s": stages, "spec_3_6_s": spec,
                     "spec_3_6_over_floor": spec / floor,
                     "stage_over_floor": {stage: value / floor for stage, value in stages.items()}}  # fmt: skip
    out["after_over_before"] = out["after"]["ratio"] / out["before"]["ratio"]
    out["spec_3_6_after_over_before"] = out["after"]["spec_3_6_over_floor"] / out["before"]["spec_3_6_over_floor"]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
