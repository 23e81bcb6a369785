"""Cost of the forecasts stage beside the SPEC 3-6 stages, for one checkout or two side by side.

Usage::

    python -m benchmarks.forecasts_cost [BEFORE_TREE] AFTER_TREE --workers 2000 --requests 50000 --rounds 5

Each turn runs one estimate forecasting every waiting request and one where
99% of the requests are already recorded (``forecast_skip``, as the job asks:
only the 1% new are forecast). Prints one JSON object: per tree the medians of
the forecasts stage (all; 1% new), of SPEC 3-6 (prepare, horde, eligibility,
competition, figures) and of might_stall, and the ratios of the second tree to
the first (docs/forecasts.md, Cost).
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
import json, sys
import vecsched
from vecsched.synthetic import horde

snapshot = horde(workers=int(sys.argv[1]), requests=int(sys.argv[2]), seed=int(sys.argv[3]))
ids = snapshot.requests.id
skip = ids[: int(len(ids) * 0.99)]  # a cycle where 1% of the queue is new
vecsched.estimate(snapshot)  # cold run, not counted
print(json.dumps({"ready": True}), flush=True)
from benchmarks.report import STAGES as spec
for line in sys.stdin:
    full = vecsched.estimate(snapshot).timings
    new = vecsched.estimate(snapshot, forecast_skip=skip).timings
    print(json.dumps({"forecasts_all_s": full["forecasts"], "forecasts_1pct_new_s": new["forecasts"],
                      "spec_3_6_s": sum(full.get(k, 0.0) for k in spec), "stall_s": full.get("stall", 0.0)}),
          flush=True)
"""
FIGURES = ("forecasts_all_s", "forecasts_1pct_new_s", "spec_3_6_s", "stall_s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forecasts_cost", description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="one checkout, or BEFORE and AFTER")
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=50000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    names = ["before", "after"] if len(args.trees) == 2 else ["tree"]
    trees = dict(zip(names, args.trees))
    _, turns = take_turns(trees, _CHILD, [str(args.workers), str(args.requests), str(args.seed)], args.rounds)
    out: dict = {"workers": args.workers, "requests": args.requests, "rounds": args.rounds}
    for name, tree in trees.items():
        out[name] = {"tree": tree, **{f: round(statistics.median(t[f] for t in turns[name]), 4) for f in FIGURES}}
    if len(trees) == 2:
        out["after_over_before"] = {f: round(out["after"][f] / out["before"][f], 3) for f in FIGURES}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
