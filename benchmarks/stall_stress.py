"""The might_stall stage alone at a size where it dwarfs the rest: one estimate, no history.

``PYTHONPATH=TREE python benchmarks/stall_stress.py --workers 20000 --requests 1000000`` builds the
synthetic horde (no dispatches or returns, as the benchmark's stress row runs it), runs
``vecsched.estimate`` until both gentypes' stall stages are done (the forecasts stage is not run) and
prints one JSON line: the stage's wall and CPU seconds (of this process), the estimate's seconds up to
then and the peak RSS. Wrap runs at 20,000 x 1,000,000 in ``flock /tmp/vecsched-big.lock timeout 590``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time


class _StallDone(Exception):
    """Raised after the last gentype's stall stage: the rest of the estimate is not measured."""


def measure(workers: int, requests: int, seed: int = 0) -> dict[str, float]:
    import vecsched
    import vecsched.core.estimate as estimate_module
    from vecsched.synthetic import horde

    started = time.perf_counter()
    snapshot = horde(workers=workers, requests=requests, seed=seed)
    built = time.perf_counter() - started
    stage, spent = estimate_module._stall, {"wall": 0.0, "cpu": 0.0, "calls": 0}

    def timed(*args):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return stage(*args)
        finally:
            spent["wall"] += time.perf_counter() - wall
            spent["cpu"] += time.process_time() - cpu
            spent["calls"] += 1
            if spent["calls"] == 2:  # text and image
                raise _StallDone

    estimate_module._stall = timed
    started = time.perf_counter()
    try:
        vecsched.estimate(snapshot)
    except _StallDone:
        pass
    finally:
        estimate_module._stall = stage
    return {"workers": workers, "requests": requests, "build_s": round(built, 1),
            "stall_wall_s": round(spent["wall"], 1), "stall_cpu_s": round(spent["cpu"], 1),
            "estimate_until_stall_done_s": round(time.perf_counter() - started, 1),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=20000)
    parser.add_argument("--requests", type=int, default=1000000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(measure(args.workers, args.requests, args.seed)), flush=True)


if __name__ == "__main__":
    main()
