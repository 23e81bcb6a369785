"""The SPEC 3-6 stages of ``vecsched.estimate`` alone, at sizes where might_stall and the forecasts would dwarf them.

Usage::

    PYTHONPATH=TREE python benchmarks/spec_stages.py --workers 20000 --requests 1000000 [--horde adversarial] [--clock cpu]

Runs, per gentype, what ``vecsched.core.estimate.compute`` runs for sections 3
to 6 (prepare, horde, eligibility with the takeable rows competition reads,
competition, figures), timed the same way, and skips sections 7 and 8. Run it
once per tree with ``PYTHONPATH`` pointing at the tree: at a million requests
one run takes minutes, so the trees are measured one after the other, not
alternated; compare them on a quiet machine, or by the ratio of each to its
own one-pass floor (printed). Prints one JSON object: seconds per stage, their
sum, the floor and the peak RSS of the process (horde included).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from typing import Any, Callable

import numpy as np

import vecsched.core.estimate as stages
from benchmarks.floor import one_pass
from benchmarks.report import STAGES
from vecsched.core.threads import one_blas_thread
from vecsched.snapshot.schema import IMAGE, TEXT
from vecsched.snapshot.snapshot import Snapshot
from vecsched.synthetic import horde


def spec_stages(snapshot: Snapshot, clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per SPEC 3-6 stage of one estimate of ``snapshot`` (image keeps horde-wide waits).

    ``clock``: wall time by default; ``time.process_time`` gives the process's CPU time, the
    steadier figure on a shared machine (the stages run on one BLAS thread).
    """
    seconds = {name: 0.0 for name in STAGES}

    def timed(name: str, call: Callable[[], Any]) -> Any:
        start = clock()
        out = call()
        seconds[name] += clock() - start
        return out

    batch = timed("prepare", lambda: stages._prepare(snapshot))
    columns = stages._empty_columns(batch)
    for gentype in (TEXT, IMAGE):
        mine = np.flatnonzero(batch.queue.gentype == gentype)
        timed("horde", lambda: stages._horde_wide(batch, gentype, mine, columns))
        if len(mine) == 0:
            continue

        def eligibility() -> Any:
            elig = stages._eligibility(batch, gentype, mine, True)
            if gentype == TEXT:
                _ = elig.competition.distinct_takeable  # what competition reads
            return elig

        elig = timed("eligibility", eligibility)
        if gentype == TEXT:
            ahead = timed("competition", lambda: stages._competition(batch, mine, elig, {}, "text"))
            timed("figures", lambda: stages._fill_figures(columns, batch, mine, elig, ahead))
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--horde", choices=("realistic", "adversarial"), default="realistic")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="stage and floor seconds as wall time, or as the process's CPU time")
    args = ap.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    make = horde
    if args.horde == "adversarial":
        from benchmarks.adversarial import adversarial_horde as make
    snapshot = make(args.workers, args.requests, seed=args.seed)
    runs = []
    with one_blas_thread():  # as vecsched.estimate runs
        for _ in range(args.repeats):
            runs.append(spec_stages(snapshot, clock))
    start = clock()
    one_pass(snapshot)
    floor = clock() - start
    best = min(runs, key=lambda r: sum(r.values()))
    total = sum(best.values())
    print(json.dumps({
        "workers": args.workers, "requests": args.requests, "horde": args.horde, "clock": args.clock, "stages_s": best,
        "spec_3_6_s": total, "floor_s": floor, "spec_3_6_over_floor": total / floor,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }, indent=1))


if __name__ == "__main__":
    main()
