"""Publishing side by side: :mod:`benchmarks.publish` run against two source trees, alternated.

Usage::

    python -m benchmarks.publish_versus /work/main /work/wt/publish --requests 300000 --pairs 3

Each pair runs this tree's ``benchmarks/publish.py`` (same fake figures, same
measurements) once with each tree's ``vecsched`` first on ``PYTHONPATH``, in
turn, so both see the same load. Prints one JSON document: every run's
default-layout figures and, per figure, the median over runs and the ratio
of the first tree's median to the second's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

FIGURES = ("publish_s", "encode_s", "write_s", "client_cpu_s", "redis_s", "redis_cpu_s", "build_s")
READS = ("read_p50_ms", "read_redis_us")  # a status read of the default layout: latency, Redis's own time


def _run(tree: str, requests: int, rounds: int, reads: int) -> dict:
    script = Path(__file__).with_name("publish.py")
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, str(script), "--requests", str(requests), "--rounds", str(rounds),
                          "--reads", str(reads)], env=env, check=True, capture_output=True, text=True).stdout
    got = json.loads(out)
    default = {k: got[k]["bucketed"] if isinstance(got[k], dict) else got[k] for k in FIGURES}
    read = got["status_read_ms"]["bucketed"]
    return {**default, "status_read_ms": read, "read_p50_ms": read["p50"], "read_redis_us": read.get("redis_us", 0.0),
            "load_average": got["load_average"][0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--requests", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {args.before: [], args.after: []}
    for _ in range(args.pairs):
        for tree in runs:
            runs[tree].append(_run(tree, args.requests, args.rounds, args.reads))
    medians = {tree: {k: round(statistics.median(r[k] for r in got), 4) for k in (*FIGURES, *READS)}
               for tree, got in runs.items()}
    ratios = {k: round(medians[args.before][k] / medians[args.after][k], 2) for k in FIGURES if medians[args.after][k]}
    out = {"requests": args.requests, "runs": runs, "medians": medians, "before_over_after": ratios}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
