"""Re-judge dispatch-replay-v1's text ``stall_margin`` offline (issue 13, equilibrium scenarios).

The stall flag is the plain replay's own stall (expired in the replay, or no
eligible thread) or a start within ``stall_margin / eligible threads``
seconds of expiry. The published start p50 of text is blended with the
served view, so the dumps of ``replay_scoring`` cannot give the plain start.
``run`` scores a scenario with one view registered beside the replay: the
plain replay (no served or calm view) with no margin. Any margin's flag is
then ``view stall | view start - seconds left >= -margin / threads``,
checked against the replay's own flag at the default margin (``check``).
``curve`` prints precision / recall / FPR per margin, scenario and seed set.

    PYTHONPATH=$PWD python -m benchmarks.replay_stall_margin run steady --seed 0 --seed 11 --seed 23 --dump F.pkl
    PYTHONPATH=$PWD python -m benchmarks.replay_stall_margin curve F.pkl [G.pkl ...] [--margin 800 ...]
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any, Sequence

import numpy as np
import pandas as pd

from benchmarks.stall_study import signal, study_parser
from vecsched.core.replay import NAME, DispatchReplayV1, ReplaySettings

VIEW = "plain-no-margin"
MARGINS = (0, 200, 400, 500, 600, 700, 800, 1000, 1200)


def plain_view(settings: ReplaySettings) -> DispatchReplayV1:
    """The replay alone: no served or calm view in its p50s, no stall margin."""
    return DispatchReplayV1(name=VIEW, settings=replace(settings, served_view=(0.0, 0.0), calm_view=(0.0, 0.0),
                                                        stall_margin=(0.0, 0.0)))


def first_forecasts(path: str) -> pd.DataFrame:
    """One row per request with a resolved stall pair: seed set, outcome, threads, the view's stall and slack."""
    d = pickle.load(open(path, "rb"))
    stall = {p.request_id: p for p in d["pairs"] if p.estimator == NAME and p.phase == "stall"}
    rows = []
    for rid, p in stall.items():
        seen = d["sighted"].get(rid)
        if seen is None:
            continue
        view = seen["views"][VIEW]
        start = view["start_p50"]
        rows.append({"gentype": p.gentype, "stalled": p.observed >= 1.0, "threads": seen["threads"],
                     "replay": seen["predicted_stall"], "plain": view["predicted_stall"],
                     "slack": np.inf if start is None else start - seen["left"]})
    out = pd.DataFrame(rows)
    out["scenario"], out["set"] = d["scenario"], "/".join(map(str, d["seeds"]))
    return out


def flag(f: pd.DataFrame, margin: float) -> np.ndarray:
    """The stall flag at ``margin`` thread-seconds, from the plain view."""
    near = f.slack.to_numpy(np.float64) >= -margin / np.maximum(f.threads.to_numpy(np.float64), 1.0)
    return f.plain.to_numpy(bool) | near


def distance(p: float, r: float, fpr: float) -> float:
    """Worst margin to the issue's bars (precision 60%, recall 80%, FPR 10%), in points; >= 0 passes."""
    return 100 * min(p - 0.6, r - 0.8, 0.1 - fpr)


def curve(paths: Sequence[str], margins: Sequence[float], default: float = 800.0) -> str:
    """Per gentype, scenario and seed set: the flag at each margin, and the check against the dumped flag."""
    f = pd.concat([first_forecasts(p) for p in paths], ignore_index=True)
    lines = []
    for (gentype, scenario, seeds), g in f.groupby(["gentype", "scenario", "set"]):
        stalled = g.stalled.to_numpy(bool)
        same = bool((flag(g, default if gentype == "text" else 0.0) == g.replay.to_numpy(bool)).all())
        lines.append(f"{gentype} {scenario} {seeds}: {len(g)} predictions, {stalled.sum()} stalls; "
                     f"view reproduces the replay's flag: {same}")
        for m in margins:
            p, r, fpr = signal(flag(g, m), stalled)
            lines.append(f"  margin {m:6.0f}: {p:4.0%} / {r:4.0%} / {fpr:4.0%}  worst {distance(p, r, fpr):+5.1f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser, studies = study_parser("python -m benchmarks.replay_stall_margin", ["curve"])
    study = studies["curve"]
    study.add_argument("--margin", type=float, action="append")
    study.add_argument("--default", type=float, default=800.0, help="the margin the dumped replay ran with")
    args = parser.parse_args(argv)
    if args.command == "run":
        from vecsched.simulate.replay_scoring import score_seeds

        score_seeds(args.scenario, args.minutes, args.seed or [0], dump=args.dump, views=[plain_view])
    else:
        print(curve(args.dumps, args.margin or MARGINS, args.default))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
