"""How the SPEC 3-6 estimate grows in waiting requests at fixed workers (issue 14's growth target).

Usage::

    PYTHONPATH=TREE python benchmarks/spec_growth.py --workers 2000 --requests 25000 50000 100000 200000 400000 --rounds 3
    PYTHONPATH=TREE python benchmarks/spec_growth.py --horde adversarial ...

The issue judges ``vecsched.estimate``'s sections 3 to 6 (prepare, horde, eligibility, competition,
figures: ``benchmarks.spec_stages``), not might_stall or the forecasts, which have targets of their
own. The benchmark tables' request sweep fits the whole estimate with a median of three wall-clock
runs per size, one size after the other, so a busy minute on this shared machine lands on one size
and bends the fit. Here every horde is built first, then each round measures every size in turn
(the order reversed every other round), in CPU seconds of the process (the estimate runs on one BLAS
thread), and each size keeps its best round. The one-pass floor is measured the same way beside it:
it reads each input column once, so its own exponent says how much of the growth the machine's
memory hierarchy adds to any pass over the data.

Prints one JSON object: per size the SPEC 3-6 seconds, its stages and the floor, and the fitted
exponents (``benchmarks.report.fit_exponent``: all points, upper half, last step) of each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __package__ in (None, ""):  # run as a file (python benchmarks/X.py): the checkout is the package root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.report import fit_exponent  # noqa: E402
from benchmarks.floor import one_pass  # noqa: E402
from benchmarks.spec_stages import spec_stages  # noqa: E402
import vecsched.core.estimate as estimate_stages  # noqa: E402
from vecsched.core.threads import one_blas_thread  # noqa: E402
from vecsched.synthetic import horde  # noqa: E402


def _cpu_floor(snapshot) -> float:
    start = time.process_time()
    one_pass(snapshot)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/spec_growth.py", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--requests", type=int, nargs="+", default=[25000, 50000, 100000, 200000, 400000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--horde", choices=("realistic", "adversarial"), default="realistic")
    args = parser.parse_args(argv)
    make = horde
    if args.horde == "adversarial":
        from benchmarks.adversarial import adversarial_horde as make
    snapshots = {n: make(args.workers, n, seed=args.seed) for n in args.requests}
    best: dict[int, dict[str, float]] = {}
    floors: dict[int, float] = {}
    with one_blas_thread():  # as vecsched.estimate runs
        for n, snapshot in snapshots.items():  # cold run, not counted
            spec_stages(snapshot, clock=time.process_time)
        for k in range(args.rounds):
            for n in (args.requests if k % 2 == 0 else list(reversed(args.requests))):
                stages = spec_stages(snapshots[n], clock=time.process_time)
                if n not in best or sum(stages.values()) < sum(best[n].values()):
                    best[n] = stages
                floors[n] = min(floors.get(n, float("inf")), _cpu_floor(snapshots[n]))
    # Fit against the requests the estimate gets (the waiting ones), as the benchmark tables do.
    waiting = [len(estimate_stages._prepare(snapshots[n]).queue.gentype) for n in args.requests]
    totals = [sum(best[n].values()) for n in args.requests]
    series = {"spec_3_6": totals, "floor": [floors[n] for n in args.requests]}
    for stage in best[args.requests[0]]:
        series[stage] = [best[n][stage] for n in args.requests]
    print(json.dumps({
        "workers": args.workers, "horde": args.horde, "rounds": args.rounds, "clock": "process CPU, best round",
        "requests": args.requests, "waiting": waiting,
        "seconds": {name: [round(v, 4) for v in ys] for name, ys in series.items()},
        "spec_3_6_over_floor": [round(t / floors[n], 2) for t, n in zip(totals, args.requests)],
        "exponents": {name: fit_exponent(waiting, ys) for name, ys in series.items()},
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
