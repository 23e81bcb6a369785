"""Does a scenario's queue settle? Waiting queue and flows of one long simulated run, per gentype.

    PYTHONPATH=TREE python benchmarks/queue_equilibrium.py steady --minutes 40 --seed 0

Builds the scenario of the checkout on ``PYTHONPATH`` (no warm-up, no tail:
minute 0 is the first arrival stream's start), runs it minute by minute and
prints one JSON object: per gentype the waiting queue (requests with jobs not
yet handed out) and the serving threads online at the marks, per ten-minute window the requests arrived,
finished, expired and cancelled per minute, and the share of the serving
threads busy, sampled every 10 s while more than ``DEEP`` requests wait. A
queue in equilibrium holds about level and finishes about what arrives, less
what users give up.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

MARKS = (2, 10, 20, 30, 40)
DEEP = 200  # a queue deeper than this keeps every thread that may serve it busy, unless eligibility forbids


def measure(name: str, minutes: int, seed: int, *, window: int = 10) -> dict[str, Any]:
    """The queue at :data:`MARKS` (within ``minutes``), per-window flows and busy share, per gentype name."""
    from vecsched.simulate.scenarios import build, scenario
    from vecsched.snapshot.schema import GENTYPES

    sim, _ = build(scenario(name), seed, minutes, warmup=0.0)
    t0 = sim.now
    queue: dict[str, dict[int, int]] = {}
    threads: dict[str, dict[int, int]] = {}  # serving threads online at the marks
    busy = {g: [0, 0] for g in GENTYPES}  # busy and serving threads, summed over deep samples
    for tick in range(1, 6 * minutes + 1):
        sim.run_until(t0 + 10.0 * tick)
        waiting = [0] * len(GENTYPES)
        for r in sim.requests.values():
            waiting[r.gentype] += r.queued
        for code, g in enumerate(GENTYPES):
            serving = [w for w in sim.workers.values()
                       if w.online and w.gentype == code and not w.paused and not w.maintenance]
            if tick % 6 == 0 and tick // 6 in MARKS:
                queue.setdefault(g, {})[tick // 6] = waiting[code]
                threads.setdefault(g, {})[tick // 6] = sum(w.threads for w in serving)
            if waiting[code] > DEEP:
                busy[g][0] += sum(min(w.busy, w.threads) for w in serving)
                busy[g][1] += sum(w.threads for w in serving)
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
            "threads": {g: t for g, t in threads.items() if g in flows},
            "busy_when_deep": {g: round(b / t, 3) for g, (b, t) in busy.items() if t},
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
