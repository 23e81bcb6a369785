"""Two checkouts of vecsched, side by side in one run: each one's estimate time over its one-pass floor.

Usage::

    python -m benchmarks.versus BEFORE_TREE AFTER_TREE --workers 2000 --requests 50000 --rounds 7

A change that must not slow the batch is judged on the ratio batch / floor
(see ``benchmarks/README.md``) measured before and after on the same machine
at the same time: the machine is shared, so absolute times drift. Each tree
runs in its own subprocess (``PYTHONPATH`` = the tree), synthesizes the same
horde, and the two take turns: one estimate and one floor pass per turn, one
cold estimate first (not counted). Prints one JSON object: per tree the
median estimate and floor seconds and their ratio, and the after/before ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

_CHILD = r"""
import json, sys, time
from benchmarks.floor import one_pass
import vecsched
from vecsched.synthetic import horde

snapshot = horde(workers=int(sys.argv[1]), requests=int(sys.argv[2]), seed=int(sys.argv[3]))
vecsched.estimate(snapshot)  # cold run, not counted
print(json.dumps({"ready": True, "waiting": len(vecsched.estimate(snapshot))}), flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    vecsched.estimate(snapshot)
    batch = time.perf_counter() - start
    start = time.perf_counter()
    one_pass(snapshot)
    floor = time.perf_counter() - start
    print(json.dumps({"batch": batch, "floor": floor}), flush=True)
"""


def _start(tree: str, workers: int, requests: int, seed: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(workers), str(requests), str(seed)],
        cwd=os.path.abspath(tree),
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _turn(child: subprocess.Popen[str]) -> dict[str, float]:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    return json.loads(child.stdout.readline())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.versus", description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the checkout measured first in each round")
    parser.add_argument("after")
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=50000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    trees = {"before": args.before, "after": args.after}
    children = {name: _start(tree, args.workers, args.requests, args.seed) for name, tree in trees.items()}
    try:
        ready = {name: json.loads(child.stdout.readline()) for name, child in children.items()}  # type: ignore[union-attr]
        times: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for k in range(args.rounds):
            # Alternate which tree goes first, so neither always follows the other.
            order = list(trees) if k % 2 == 0 else list(reversed(trees))
            for name in order:
                times[name].append(_turn(children[name]))
    finally:
        for child in children.values():
            child.stdin.close()  # type: ignore[union-attr]
            child.wait()
    out: dict[str, Any] = {"workers": args.workers, "requests": args.requests, "rounds": args.rounds}
    for name, tree in trees.items():
        batch = statistics.median(t["batch"] for t in times[name])
        floor = statistics.median(t["floor"] for t in times[name])
        out[name] = {"tree": tree, "waiting": ready[name]["waiting"], "batch_s": batch, "floor_s": floor,
                     "ratio": batch / floor}  # fmt: skip
    out["after_over_before"] = out["after"]["ratio"] / out["before"]["ratio"]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
