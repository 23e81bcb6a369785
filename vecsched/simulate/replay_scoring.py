"""Score dispatch-replay-v1 with its p90 calibrated on *other* runs' outcomes (cross-fitted split conformal).

In production the p90 is learned from the rolling window's earlier pairs. In
the simulator, each seed's forecasts are recalibrated on the pooled pairs of
the other seeds (never their own), which is the honest equivalent; the p50s
and stall predictions are unchanged. Writes the ``vecsched.promotion/1``
document with the calibrated series beside the plain ones, under the name
``dispatch-replay-v1+conformal``.

    python -m vecsched.simulate.replay_scoring steady --minutes 10 --seed 0 --seed 11 --seed 23 -o DIR
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from vecsched.core.calibration import calibrated_p90, from_pairs
from vecsched.core.replay import NAME, enable
from vecsched.snapshot.schema import IMAGE, TEXT

CALIBRATED = f"{NAME}+conformal"


def cross_calibrated(pairs: Sequence[Any], *, estimator: str = NAME, min_pairs: int = 100) -> list[Any]:
    """``estimator``'s pairs with each seed's p90 recomputed from the other seeds' pairs, renamed.

    Seeds are read from the request ids (``SEED:id``, as the simulator writes them).
    """
    mine = [p for p in pairs if p.estimator == estimator]
    seed_of = np.array([p.request_id.split(":", 1)[0] for p in mine], dtype=object)
    out = []
    for seed in sorted(set(seed_of)):
        others = [p for p, s in zip(mine, seed_of) if s != seed]
        calibration = from_pairs(others, min_pairs=min_pairs)
        own = [p for p, s in zip(mine, seed_of) if s == seed]
        for phase in ("start", "completion"):
            rows = [p for p in own if p.phase == phase and p.p50 is not None]
            if not rows:
                continue
            p50 = np.array([p.p50 for p in rows], dtype=np.float64)
            gentype = np.array([TEXT if p.gentype == "text" else IMAGE for p in rows])
            p90 = calibrated_p90(p50, phase=phase, gentype=gentype, threads=np.zeros(len(rows), dtype=np.int64),
                                 calibration=calibration)
            out += [replace(p, estimator=CALIBRATED, p90=float(v)) for p, v in zip(rows, p90)]
        out += [replace(p, estimator=CALIBRATED) for p in own if p.phase not in ("start", "completion") or p.p50 is None]
    return out


def score(name: str, minutes: float, seeds: Sequence[int]) -> dict[str, Any]:
    """Run ``name`` once per seed; the promotion document with the calibrated replay added."""
    from vecsched.core.forecasts import ESTIMATORS
    from vecsched.core.promotion import promotion_document
    from vecsched.simulate.accuracy import run
    from vecsched.simulate.production import FirstSightings, seeded

    enable()

    pooled: list[Any] = []
    for seed in seeds:
        sightings = FirstSightings()
        result = run(name, minutes, seed, on_snapshot=sightings)
        pooled.extend(seeded(sightings.outcomes(result.sim), seed))
    pooled += cross_calibrated(pooled)
    times = [p.at for p in pooled] or [0.0]
    return promotion_document(pooled, now=max(times), window=max(max(times) - min(times), 1.0), seeds=list(seeds),
                              estimators=[*ESTIMATORS, CALIBRATED, "adr-wait", "horde-wide"])


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    from vecsched.core.promotion import format_table

    parser = argparse.ArgumentParser(prog="python -m vecsched.simulate.replay_scoring")
    parser.add_argument("scenario")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, action="append")
    parser.add_argument("-o", "--output")
    args = parser.parse_args(argv)
    doc = score(args.scenario, args.minutes, args.seed or [0])
    print(format_table(doc))
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        with open(os.path.join(args.output, "promotion.json"), "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
