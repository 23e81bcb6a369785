"""Study stall rules of dispatch-replay-v1 with further views of the future (issue 13, round 4).

``run`` scores a scenario as ``vecsched.simulate.replay_scoring`` does, with
further replays registered beside dispatch-replay-v1 (same settings and
learned cancellations, one thing changed) and dumps every request's first
forecast of each; ``rules`` reads such dumps and prints precision / recall /
false-positive rate of candidate stall rules per scenario and seed set, and
the best recall any threshold on a view's start reaches at FPR <= 10%.

    PYTHONPATH=$PWD python -m benchmarks.replay_stall_views run image_mix --seed 0 --seed 11 --seed 23 --dump F.pkl
    PYTHONPATH=$PWD python -m benchmarks.replay_stall_views rules F.pkl [G.pkl ...]

Views: ``no-arrivals`` (arrival_window 0), ``no-served`` (no served-at-once
arrivals), ``text-served`` (served-at-once arrivals for text too),
``grace-90`` (every deadline 90 s later). docs/replay.md, "Round 4", has the
figures.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from benchmarks.stall_study import SETS, best_recall, signal, study_parser
from vecsched.core.replay import NAME, DispatchReplayV1
from vecsched.snapshot.schema import IMAGE, TEXT


@dataclass(frozen=True)
class LaterDeadlines(DispatchReplayV1):
    """The replay with every deadline ``grace`` seconds later (a stall: not started by expiry + grace)."""

    grace: float = 90.0

    def compute(self, snapshot: Any, eligibility: Any, calibration: Any) -> Any:
        """As the replay, on inputs whose ``seconds_left`` are ``grace`` longer."""
        later = replace(eligibility, seconds_left=eligibility.seconds_left + self.grace)
        return DispatchReplayV1.compute(self, snapshot, later, calibration)


VIEWS: dict[str, Callable[[Any], Any]] = {
    "no-arrivals": lambda s: DispatchReplayV1(name="no-arrivals", settings=replace(s, arrival_window=0.0)),
    "no-served": lambda s: DispatchReplayV1(name="no-served", settings=replace(s, served_arrivals=())),
    "text-served": lambda s: DispatchReplayV1(name="text-served", settings=replace(s, served_arrivals=(TEXT, IMAGE))),
    "grace-90": lambda s: LaterDeadlines(name="grace-90", settings=s, grace=90.0),
}


def first_forecasts(path: str) -> pd.DataFrame:
    """One row per request with a resolved stall pair: outcome, threads, and each view's stall and start - expiry."""
    d = pickle.load(open(path, "rb"))
    stall = {p.request_id: p for p in d["pairs"] if p.estimator == NAME and p.phase == "stall"}
    rows = []
    for rid, p in stall.items():
        seen = d["sighted"].get(rid)
        if seen is None:
            continue
        row = {"seed": int(rid.split(":")[0]), "gentype": p.gentype, "stalled": p.observed >= 1.0,
               "threads": seen["threads"], "replay": seen["predicted_stall"],
               "replay_slack": _slack(seen["start_p50"], seen["left"])}
        for view, f in seen.get("views", {}).items():
            row[view], row[f"{view}_slack"] = f["predicted_stall"], _slack(f["start_p50"], seen["left"])
        rows.append(row)
    out = pd.DataFrame(rows)
    out["scenario"], out["set"] = d["scenario"], out.seed.map(SETS)
    return out


def _slack(start: float | None, left: float) -> float:
    """Replayed start minus seconds to expiry (>= 0: past expiry; inf: never started)."""
    return np.inf if start is None else start - left


RULES: dict[str, Callable[[pd.DataFrame], pd.Series]] = {
    "replay (as dumped)": lambda f: f.replay,
    "replay & no-served": lambda f: f.replay & f["no-served"],
    "no-served within 100 s": lambda f: f["no-served_slack"] >= -100,
    "replay & grace-90": lambda f: f.replay & f["grace-90"],
    "replay | text-served within 300 s": lambda f: f.replay | (f["text-served"] & (f.replay_slack >= -300)),
    "replay within 450 s": lambda f: f.replay | (f.replay_slack >= -450),
    "replay within 800 / threads s (built)": lambda f: f.replay | (f.replay_slack >= -800 / np.maximum(f.threads, 1)),
}


def rules(paths: Sequence[str]) -> str:
    """The table of :data:`RULES` per gentype, scenario and seed set, then the best recall at FPR <= 10%."""
    f = pd.concat([first_forecasts(p) for p in paths], ignore_index=True)
    lines = []
    for (gentype, scenario, seeds), g in f.groupby(["gentype", "scenario", "set"]):
        stalled = g.stalled.to_numpy(bool)
        lines.append(f"{gentype} {scenario} {seeds}: {len(g)} predictions, {stalled.sum()} stalls")
        for name, rule in RULES.items():
            p, r, fpr = signal(rule(g).to_numpy(bool), stalled)
            lines.append(f"  {name:40} {p:4.0%} / {r:4.0%} / {fpr:4.0%}")
        best = {v: best_recall(g[f"{v}_slack"].to_numpy(np.float64), stalled) for v in ["replay", *VIEWS]}
        lines.append("  best recall at FPR <= 10%: " + ", ".join(f"{v} {b:.0%}" for v, b in best.items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser, _ = study_parser("python -m benchmarks.replay_stall_views", ["rules"])
    args = parser.parse_args(argv)
    if args.command == "run":
        from vecsched.simulate.replay_scoring import score_seeds

        score_seeds(args.scenario, args.minutes, args.seed or [0], dump=args.dump, views=list(VIEWS.values()))
    else:
        print(rules(args.dumps))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
