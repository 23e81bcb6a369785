"""Does a scenario's queue settle? Waiting queue and flows of one long simulated run, per gentype.

    PYTHONPATH=TREE python benchmarks/queue_equilibrium.py steady --minutes 40 --seed 0

Builds the scenario of the checkout on ``PYTHONPATH`` (no warm-up, no tail:
minute 0 is the first arrival stream's start), runs it minute by minute and
prints one JSON object: per gentype the waiting queue (requests with jobs not
yet handed out) at the marks, and per ten-minute window the requests arrived,
finished, expired and cancelled per minute. A queue in equilibrium holds
about level and finishes about what arrives, less what users give up.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

MARKS = (2, 10, 20, 30, 40)


def measure(name: str, minutes: int, seed: int, *, window: int = 10) -> dict[str, Any]:
    """The queue at :data:`MARKS` (within ``minutes``) and per-window flows, per gentype name."""
    from vecsched.simulate.scenarios import build, scenario
    from vecsched.snapshot.schema import GENTYPES

    sim, _ = build(scenario(name), seed, minutes, warmup=0.0)
    t0 = sim.now
    queue: dict[str, dict[int, int]] = {}
    for minute in range(1, minutes + 1):
        sim.run_until(t0 + 60.0 * minute)
        if minute in MARKS:
            for g in GENTYPES:
                queue.setdefault(g, {})[minute] = 0
            for r in sim.requests.values():
                if r.queued:
                    queue[GENTYPES[r.gentype]][minute] += 1
    flows: dict[str, dict[str, dict[str, float]]] = {}
    for r in sim.requests.values():
        g = flows.setdefault(GENTYPES[r.gentype], {})
        for kind, at in (("arrived", r.created), ("finished", r.completed_at), ("expired", r.expired_at),
                         ("cancelled", r.cancelled_at)):
            if at is None or at >= t0 + 60.0 * minutes:
                continue
            k = int((at - t0) // (60.0 * window)) * window
            span = g.setdefault(f"{k}-{k + window}", {"arrived": 0.0, "finished": 0.0, "expired": 0.0,
                                                        "cancelled": 0.0})
            span[kind] += 1.0 / window
    return {"scenario": name, "seed": seed, "minutes": minutes,
            "queue": {g: q for g, q in queue.items() if g in flows},
            "per_minute": {g: dict(sorted(f.items(), key=lambda kv: int(kv[0].split("-")[0])))
                           for g, f in flows.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("--minutes", type=int, default=40)
    parser.add_argument("--seed", type=int, action="append")
    args = parser.parse_args()
    for seed in args.seed or [0]:
        print(json.dumps(measure(args.scenario, args.minutes, seed)), flush=True)


if __name__ == "__main__":
    main()
