"""How good is might_stall? Score it against what happened in a simulated run (SPEC section 8's stall bars).

An observed stall is an expiry before the request's first assignment;
cancelled requests, and pairs whose outcome the run did not reach, are left
out. Each (snapshot, request) pair where might_stall was defined (work
waiting, nothing processing) is one prediction. Per gentype: precision,
recall and false-positive rate, beside the bars (precision >= 60 %, recall >=
80 %, FPR <= 10 %).

Run ``python -m vecsched.simulate.stall_signal --minutes 10 --seed 0`` for the
table of every scenario.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import pandas as pd

from vecsched.snapshot.schema import GENTYPES

BARS = {"precision": 0.60, "recall": 0.80, "false_positive_rate": 0.10}


def stall_signal(pairs: pd.DataFrame) -> pd.DataFrame:
    """Precision, recall and false-positive rate of might_stall per gentype, from the harness's pairs.

    Parameters
    ----------
    pairs : DataFrame
        :attr:`vecsched.simulate.accuracy.Run.pairs` (``gentype``,
        ``might_stall``, ``stall_evidence``, ``outcome``, ``expired_unstarted``).

    Returns
    -------
    DataFrame
        Indexed by gentype: ``predictions``, ``observed_stalls``, ``flagged``,
        ``precision``, ``recall``, ``false_positive_rate`` (NaN where undefined).

    Examples
    --------
    >>> pairs = pd.DataFrame({"gentype": ["text"] * 4, "might_stall": [True, True, False, False],
    ...     "stall_evidence": ["arrival_outpaces_drain"] * 2 + ["insufficient_window"] * 2,
    ...     "outcome": ["expired", "completed", "expired", "cancelled"],
    ...     "expired_unstarted": [True, False, True, False]})
    >>> t = stall_signal(pairs).loc["text"]
    >>> int(t.predictions), float(t.precision), float(t.recall), float(t.false_positive_rate)
    (3, 0.5, 0.5, 1.0)
    """
    rows = []
    if pairs.empty or "might_stall" not in pairs:
        return pd.DataFrame(columns=["predictions"]).rename_axis("gentype")
    scored = pairs[pairs["stall_evidence"].notna() & pairs["outcome"].isin(["completed", "expired"])]
    for g in GENTYPES:
        p = scored[scored["gentype"] == g]
        predicted = p["might_stall"].astype(bool).to_numpy()
        stalled = (p["outcome"].eq("expired") & p["expired_unstarted"].astype(bool)).to_numpy()
        tp, fp = int((predicted & stalled).sum()), int((predicted & ~stalled).sum())
        fn, tn = int((~predicted & stalled).sum()), int((~predicted & ~stalled).sum())
        rows.append({
            "gentype": g,
            "predictions": len(p),
            "observed_stalls": int(stalled.sum()),
            "flagged": int(predicted.sum()),
            "precision": tp / (tp + fp) if tp + fp else np.nan,
            "recall": tp / (tp + fn) if tp + fn else np.nan,
            "false_positive_rate": fp / (fp + tn) if fp + tn else np.nan,
        })
    return pd.DataFrame(rows).set_index("gentype")


def evidence_counts(pairs: pd.DataFrame) -> pd.DataFrame:
    """How often each evidence value was given, per gentype (columns), over the defined predictions."""
    defined = pairs[pairs["stall_evidence"].notna()]
    return pd.crosstab(defined["stall_evidence"].astype(str), defined["gentype"].astype(str))


def markdown(table: pd.DataFrame) -> str:
    """The stall-signal table as Markdown, beside the bars."""
    head = ("| scenario | gentype | predictions | observed stalls | flagged | precision (>= 60%) "
            "| recall (>= 80%) | FPR (<= 10%) |\n|---|---|---|---|---|---|---|---|")

    def pct(v: float) -> str:
        return "n/a" if v != v else f"{v:.0%}"

    lines = [head]
    for (scenario, g), r in table.iterrows():
        lines.append(f"| {scenario} | {g} | {int(r.predictions)} | {int(r.observed_stalls)} | {int(r.flagged)} "
                     f"| {pct(r.precision)} | {pct(r.recall)} | {pct(r.false_positive_rate)} |")
    return "\n".join(lines)


def run_suite(minutes: float = 10.0, seed: int = 0, names: list[str] | None = None, **kwargs: Any) -> pd.DataFrame:
    """might_stall's signal table for every scenario (or ``names``), stacked."""
    from vecsched.simulate.accuracy import run
    from vecsched.simulate.scenarios import SCENARIOS

    tables = {}
    for name in names or list(SCENARIOS):
        tables[name] = stall_signal(run(name, minutes, seed, **kwargs).pairs)
    return pd.concat(tables, names=["scenario"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vecsched.simulate.stall_signal", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stall-refresh", type=float, default=0.0,
                        help="score might_stall as the job publishes it: each request's sums computed again each "
                             "SECONDS of its age (the job's default is 60; default here 0: every snapshot)")
    parser.add_argument("scenarios", nargs="*")
    args = parser.parse_args(argv)
    print(markdown(run_suite(args.minutes, args.seed, args.scenarios or None, stall_refresh=args.stall_refresh)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
