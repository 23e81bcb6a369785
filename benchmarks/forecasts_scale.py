"""The forecasts stage alone over a sweep of requests, for one checkout or two side by side.

Usage::

    python -m benchmarks.forecasts_scale [BEFORE_TREE] AFTER_TREE --workers 2000 \\
        --requests 50000,100000,200000,400000 --rounds 3

Per size, each tree's subprocess synthesizes the horde and runs what the
estimate runs before its forecasts stage except might_stall and competition
(prepare, horde-wide figures, eligibility), which the stage does not read and
which dominate at 20,000 x 1,000,000. Each turn then runs the stage as the
estimate does (fresh queues, so the eligible sets are built inside it, under
the estimate's BLAS threads rule) and reports its wall and CPU seconds (CPU:
every thread of the process, so BLAS threads waiting on each other show) and
a checksum of eligible-share-v1's columns. Prints one JSON object: per tree and
size the medians, the fitted growth exponents of the CPU time over waiting
requests (all points, upper half), and the largest relative difference of the
checksums between the trees. ``--no-cold`` skips the uncounted first run
(for the largest sizes, run one tree at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

if __package__ in (None, ""):  # run as a file (python benchmarks/X.py): the checkout is the package root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.sidebyside import take_turns  # noqa: E402

_CHILD = r"""
import json, sys, time
import numpy as np
from vecsched.synthetic import horde
from vecsched.core import estimate as E, forecasts as F
from vecsched.core.threads import one_blas_thread
from vecsched.snapshot.schema import IMAGE, TEXT

workers, requests, seed, cold = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
snap = horde(workers=workers, requests=requests, seed=seed)
threads_rule = one_blas_thread()  # as vecsched.estimate runs
threads_rule.__enter__()
batch = E._prepare(snap)
columns = E._empty_columns(batch)
throughput = np.zeros(len(batch.queue.index))
found = []
for gentype in (TEXT, IMAGE):
    mine = np.flatnonzero(batch.queue.gentype == gentype)
    figures = E._horde_wide(batch, gentype, mine, columns)
    if len(mine) == 0:
        continue
    elig = E._eligibility(batch, gentype, mine, True)
    columns["eligible_worker_threads"][mine] = elig.threads
    throughput[mine] = elig.throughput
    found.append((gentype, elig, mine, figures["mean_speed"]))
expiry = snap.requests.expiry[batch.queue.index]

def stage():
    queues = [F.gentype_queue(batch.workers, g, elig, mine, speed) for g, elig, mine, speed in found]
    inputs = F.forecast_inputs(snap.now, batch.queue, expiry, batch.position, batch.work, batch.in_flight,
                               columns, throughput, queues, None)
    return F.forecast_all(snap, inputs, None)

if cold:
    stage()
print(json.dumps({"ready": True, "waiting": int(len(batch.queue.index))}), flush=True)
for line in sys.stdin:
    wall, cpu = time.perf_counter(), time.process_time()
    out = stage()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    share = out["eligible-share-v1"]
    sums = [float(np.nansum(getattr(share, f))) for f in ("start_p50", "completion_p50")]
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "checksum": sums}), flush=True)
"""


def exponents(sizes: list[int], seconds: list[float]) -> dict[str, float]:
    """Least-squares slopes of log time over log size: all points and the upper half."""
    x, y = np.log(sizes), np.log(seconds)
    half = len(x) // 2
    out = {"all": round(float(np.polyfit(x, y, 1)[0]), 3)}
    if len(x) - half >= 2:
        out["upper_half"] = round(float(np.polyfit(x[half:], y[half:], 1)[0]), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forecasts_scale", description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="one checkout, or BEFORE and AFTER")
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--requests", default="50000,100000,200000,400000")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-cold", action="store_true", help="skip the uncounted first run")
    args = parser.parse_args(argv)
    names = ["before", "after"] if len(args.trees) == 2 else ["tree"]
    trees = dict(zip(names, args.trees))
    out: dict = {"workers": args.workers, "rounds": args.rounds, "sizes": []}
    for requests in (int(r) for r in args.requests.split(",")):
        child_args = [str(args.workers), str(requests), str(args.seed), "0" if args.no_cold else "1"]
        ready, turns = take_turns(trees, _CHILD, child_args, args.rounds)
        size: dict = {"requests": requests, "waiting": ready[names[0]]["waiting"]}
        for name in names:
            size[name] = {f: round(statistics.median(t[f] for t in turns[name]), 4) for f in ("wall_s", "cpu_s")}
        if len(names) == 2:
            pairs = zip(turns["before"][0]["checksum"], turns["after"][0]["checksum"])
            size["checksum_rel_diff"] = max(abs(a - b) / max(abs(a), 1e-300) for a, b in pairs)
            size["cpu_after_over_before"] = round(size["after"]["cpu_s"] / size["before"]["cpu_s"], 3)
        out["sizes"].append(size)
        print(json.dumps(size), file=sys.stderr, flush=True)
    if len(out["sizes"]) >= 2:
        waiting = [s["waiting"] for s in out["sizes"]]
        out["cpu_exponent"] = {name: exponents(waiting, [s[name]["cpu_s"] for s in out["sizes"]]) for name in names}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
