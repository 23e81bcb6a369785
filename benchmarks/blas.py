"""BLAS threads on a shared machine: the estimate with default threading against one thread.

Usage::

    python -m benchmarks.blas [--sizes 150x3000,2000x50000] [--repeats 9] [--no-busy]

Starts a busy loop in another process (holding one core, as another job on
the machine would), then times ``vecsched.estimate`` alternately with BLAS at
its default thread count and capped to one thread, on the same snapshot, and
prints the medians as JSON. The busy process is stopped by its pid at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext

import vecsched
from vecsched.core import estimate as estimate_module
from vecsched.synthetic import horde


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="150x3000,2000x50000")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--no-busy", action="store_true", help="do not hold a core")
    args = ap.parse_args()
    from threadpoolctl import ThreadpoolController, threadpool_info

    controller = ThreadpoolController()
    busy = None if args.no_busy else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    out = {"busy_core": busy is not None, "blas": [(i["internal_api"], i["num_threads"]) for i in threadpool_info()],
           "sizes": []}
    saved = estimate_module.one_blas_thread
    try:
        estimate_module.one_blas_thread = nullcontext  # estimate() leaves BLAS alone; each run sets it below
        for size in args.sizes.split(","):
            workers, requests = map(int, size.split("x"))
            snap = horde(workers=workers, requests=requests, seed=0)
            vecsched.estimate(snap)
            runs: dict[str, list[float]] = {"default": [], "one thread": []}
            for _ in range(args.repeats):
                t = time.perf_counter()
                vecsched.estimate(snap)
                runs["default"].append(time.perf_counter() - t)
                with controller.limit(limits=1, user_api="blas"):
                    t = time.perf_counter()
                    vecsched.estimate(snap)
                    runs["one thread"].append(time.perf_counter() - t)
            med = {k: statistics.median(v) for k, v in runs.items()}
            out["sizes"].append({"workers": workers, "requests": requests,
                                 **{f"{k}_s": round(v, 4) for k, v in med.items()},
                                 "default_over_one_thread": round(med["default"] / med["one thread"], 2)})
    finally:
        estimate_module.one_blas_thread = saved
        if busy is not None:
            busy.kill()
            busy.wait()
    out["load_average"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
