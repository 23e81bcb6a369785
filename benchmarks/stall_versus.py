"""might_stall's cost in two checkouts of vecsched, side by side in one run.

Usage::

    python -m benchmarks.stall_versus BEFORE_TREE AFTER_TREE --workers 2000 --requests 50000 --rounds 4
    python -m benchmarks.stall_versus BEFORE_TREE AFTER_TREE --horde adversarial --requests 100000

Each tree runs in its own long-lived subprocess (``PYTHONPATH`` = the tree) on the same synthetic
horde with five minutes of history (``vecsched.synthetic_history``); they take turns, one estimate
per turn (one cold estimate first, not counted), so both see the machine's load of the same minute.
Prints one JSON object: per tree the median ``stall`` stage and SPEC 3-6 seconds (prepare, horde,
eligibility, competition, figures) and the median of their per-estimate ratio (the issue's target:
at most 0.30), and the median over rounds of after's stall seconds over before's. ``--profile``
adds, per tree, the median seconds of each function the stall stage calls (cProfile, cumulative),
which slows both trees alike.
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
from benchmarks.sidebyside import take_turns  # noqa: E402

_CHILD = r"""
import cProfile, json, pstats, sys
import vecsched
import vecsched.core.estimate as estimate_module
from vecsched.synthetic import horde
from vecsched.synthetic_history import with_history

workers, requests, seed, profile = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
if sys.argv[5] == "adversarial":
    from benchmarks.adversarial import adversarial_horde
    base = adversarial_horde(workers, requests, seed)
else:
    base = horde(workers=workers, requests=requests, seed=seed)
snapshot = with_history(base, seed=seed)
vecsched.estimate(snapshot)  # cold run, not counted
print(json.dumps({"ready": True}), flush=True)
stage = estimate_module._stall
for line in sys.stdin:
    profiler = cProfile.Profile()
    def profiled(*args):
        profiler.enable()
        try:
            return stage(*args)
        finally:
            profiler.disable()
    estimate_module._stall = profiled if profile else stage
    timings = vecsched.estimate(snapshot).timings
    parts = {}
    if profile:
        for (path, _, name), (_, _, _, cumulative, callers) in pstats.Stats(profiler).stats.items():
            if path.endswith("core/stall.py") and any(caller[2] == "stall" for caller in callers):
                parts[name] = cumulative
    core = sum(v for k, v in timings.items() if k not in ("stall", "forecasts"))
    print(json.dumps({"stall": timings["stall"], "core": core, "parts": parts}), flush=True)
"""


def _summary(tree: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"tree": tree, "stall_s": statistics.median(r["stall"] for r in runs),
                           "estimate_3_6_s": statistics.median(r["core"] for r in runs),
                           "ratio": statistics.median(r["stall"] / r["core"] for r in runs),
                           "ratios": [round(r["stall"] / r["core"], 3) for r in runs]}
    names = sorted({name for r in runs for name in r["parts"]})
    if names:
        out["parts_s"] = {name: round(statistics.median(r["parts"].get(name, 0.0) for r in runs), 3) for name in names}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stall_versus", description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the checkout measured first in the first round")
    parser.add_argument("after")
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=50000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help="also time each function the stall stage calls")
    parser.add_argument("--horde", choices=("realistic", "adversarial"), default="realistic",
                        help="adversarial: every request names 2 to 5 random models (benchmarks/adversarial.py)")
    args = parser.parse_args(argv)
    trees = {"before": args.before, "after": args.after}
    child_args = [str(args.workers), str(args.requests), str(args.seed), str(int(args.profile)), args.horde]
    _, runs = take_turns(trees, _CHILD, child_args, args.rounds)
    out: dict[str, Any] = {"workers": args.workers, "requests": args.requests, "rounds": args.rounds, "horde": args.horde}
    out.update({name: _summary(trees[name], runs[name]) for name in trees})
    out["after_stall_over_before"] = statistics.median(
        a["stall"] / b["stall"] for b, a in zip(runs["before"], runs["after"], strict=True))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
