"""Where the tail of dispatch-replay-v1's p50 error comes from, from ``replay_scoring --dump`` files.

Usage::

    python benchmarks/replay_tail.py DUMP [DUMP ...] [--gentype image] [--phase start] [--estimator NAME]

Per dump (one scenario on one seed set), the tail of a series is its pairs whose |p50 - observed| is at
or above the series' own 90th percentile (nearest rank, as ``p90_abs_error``; a null p50 is an infinite
error). The tails of every dump given are pooled and split by the forecast's sign, the observed wait,
the p50, the request's eligible threads at first sighting and its priority: per split, the pairs, the
pairs in the tail, the tail's share of them, and the median signed error (p50 - observed, seconds).
A split where the tail's share is far above a tenth is where the misses come from. Priority, threads
and workers are in the dumps written since 2026-12-07 (older ones lack them: those splits are left out).
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from typing import Any, Sequence

import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a file: the checkout is the package root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vecsched.core.promotion import nearest_rank  # noqa: E402
from vecsched.core.replay import NAME  # noqa: E402

# (column, edges, labels): the bands of each split; one table, every split cut the same way.
SPLITS: tuple[tuple[str, tuple[float, ...], tuple[str, ...]], ...] = (
    ("observed", (0, 120, 300, 600, np.inf), ("< 120 s", "120-300 s", "300-600 s", ">= 600 s")),
    ("p50", (0, 60, 300, 600, np.inf), ("< 60 s", "60-300 s", "300-600 s", ">= 600 s")),
    ("threads", (0, 3, 6, 12, np.inf), ("1-2", "3-5", "6-11", ">= 12")),
    # The snapshot's priority at first sighting: kudos plus the aging of the seconds since creation (+50 per
    # 10 s), a few hundred at most for an anonymous request first seen within a cycle or two.
    ("priority", (-np.inf, 1_000, 10_000, np.inf), ("< 1,000", "1,000-10,000", ">= 10,000")),
)


def tail_pairs(dump: dict[str, Any], *, gentype: str, phase: str, estimator: str = NAME) -> pd.DataFrame:
    """One dump's pairs of a series, with the first sighting's threads and priority and ``tail`` marked."""
    rows = []
    for p in dump["pairs"]:
        if p.estimator != estimator or p.gentype != gentype or p.phase != phase or p.observed is None:
            continue
        seen = dump["sighted"].get(p.request_id, {})
        rows.append({"p50": np.nan if p.p50 is None else p.p50, "observed": p.observed,
                     "threads": seen.get("threads", np.nan), "priority": seen.get("priority", np.nan)})
    frame = pd.DataFrame(rows, columns=["p50", "observed", "threads", "priority"])
    error = np.where(frame["p50"].isna(), np.inf, (frame["p50"] - frame["observed"]).abs())
    bar = nearest_rank(error, 0.9)
    frame["error"] = frame["p50"] - frame["observed"]
    frame["tail"] = error >= (np.inf if bar is None else bar)
    return frame


def split_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per split and band (in the bands' order): pairs, pairs in the tail, the tail's share, the median signed error."""
    sign = np.where(frame["p50"].isna(), "null p50", np.where(frame["error"] < 0, "too early", "too late"))
    splits = [("sign", pd.Categorical(sign, categories=["too early", "too late", "null p50"]))]
    for column, edges, labels in SPLITS:
        if frame[column].notna().any():
            splits.append((column, pd.cut(frame[column], edges, labels=labels, right=False)))
    tables = []
    for name, band in splits:
        grouped = frame.groupby(band, observed=False)
        table = pd.DataFrame({"pairs": grouped.size(), "tail": grouped["tail"].sum().astype(int),
                              "median_error": grouped["error"].median()})
        tables.append(table.assign(split=name).rename_axis("band").reset_index())
    table = pd.concat(tables, ignore_index=True)
    table["tail_share"] = table["tail"] / table["pairs"].where(table["pairs"] > 0)
    return table[table["pairs"] > 0].set_index(["split", "band"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/replay_tail.py")
    parser.add_argument("dumps", nargs="+")
    parser.add_argument("--gentype", default="image", choices=("text", "image"))
    parser.add_argument("--phase", default="start", choices=("start", "completion"))
    parser.add_argument("--estimator", default=NAME)
    args = parser.parse_args(argv)
    frames = []
    for path in args.dumps:
        with open(path, "rb") as fh:
            frames.append(tail_pairs(pickle.load(fh), gentype=args.gentype, phase=args.phase, estimator=args.estimator))
    frame = pd.concat(frames, ignore_index=True)
    print(f"{args.estimator} {args.gentype} {args.phase}: {len(frame)} pairs, {int(frame['tail'].sum())} in the tails "
          f"of {len(frames)} series")
    print("| split | band | pairs | in the tail | tail share | median p50 - observed |")
    print("|---|---|---|---|---|---|")
    for (split, band), row in split_table(frame).iterrows():
        median = "-" if np.isnan(row["median_error"]) else f"{row['median_error']:+.0f} s"
        print(f"| {split} | {band} | {int(row['pairs'])} | {int(row['tail'])} | {row['tail_share']:.0%} | {median} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
