"""Where do dispatch-replay-v1's errors come from? First-sighting forecasts against outcomes, by band.

Runs one scenario (replay on), keeps each request's forecast at its first
sighting with what the cycle knew (eligible threads, the ADR wait), and
breaks the start error down by observed-wait band, p50 band, eligible-thread
band and outcome: share within max(60 s, 50%), median signed error
(p50 - observed: negative = too early), 90th percentile of |error|.

    PYTHONPATH=$PWD python -m benchmarks.replay_where steady --minutes 5 --seed 0 [--gentype image] [--csv F]
        [--set measured_timing=True ...]
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

import numpy as np
import pandas as pd

BANDS = [0, 60, 300, 900, np.inf]
THREAD_BANDS = [-1, 0, 4, 20, np.inf]


def settings_from(pairs: Sequence[str]) -> Any:
    """ReplaySettings with ``key=value`` overrides (values as Python literals)."""
    import ast
    from dataclasses import replace

    from vecsched.core.replay import ReplaySettings

    return replace(ReplaySettings(), **{k: ast.literal_eval(v) for k, v in (p.split("=", 1) for p in pairs)})


def first_sightings(name: str, minutes: float, seed: int, settings: Any = None) -> pd.DataFrame:
    """One row per request at its first sighting, with its replay forecast and what then happened."""
    from vecsched.core.forecasts import register
    from vecsched.core.replay import NAME, DispatchReplayV1, ReplaySettings
    from vecsched.simulate.accuracy import run
    from vecsched.snapshot.schema import GENTYPES

    register(DispatchReplayV1(settings=settings or ReplaySettings()))
    rows: list[pd.DataFrame] = []
    seen: set[str] = set()

    def keep(snapshot: Any, est: Any) -> None:
        ids = np.asarray(est.request_id, dtype=object)
        new = ~pd.Index(ids).isin(list(seen))
        if not new.any():
            return
        f = est.forecasts[NAME]
        cols = est.columns
        frame = pd.DataFrame({
            "id": ids[new], "t": float(snapshot.now),
            "gentype": np.asarray(GENTYPES, dtype=object)[cols["gentype"][new].astype(np.int64)],
            "p50": f.start_p50[new], "c50": f.completion_p50[new], "stall": f.predicted_stall[new],
            "threads": cols["eligible_worker_threads"][new], "adr": cols["wait_time"][new],
            "position": cols["queue_position"][new],
            "age": snapshot.now - snapshot.requests.created[est.request_index[new]],
            "priority": snapshot.requests.extra_priority[est.request_index[new]],
            "n": cols["n"][new] if "n" in cols else np.nan,
        })
        seen.update(frame["id"].tolist())
        rows.append(frame)

    result = run(name, minutes, seed, on_snapshot=keep)
    df = pd.concat(rows, ignore_index=True)
    sim = result.sim
    req = [sim.requests[i] for i in df["id"]]
    df["started"] = [np.nan if r.started_at is None else r.started_at for r in req]
    df["completed"] = [r.completed_at if r.status == "done" else np.nan for r in req]
    df["status"] = [r.status for r in req]
    df["expired_unstarted"] = [r.status == "expired" and r.started_at is None for r in req]
    df["obs"] = df["started"] - df["t"]
    df["obs_c"] = df["completed"] - df["t"]
    return df


def _summary(group: pd.DataFrame, p50: str = "p50", obs: str = "obs") -> pd.Series:
    err = group[p50] - group[obs]
    ok = np.abs(err) <= np.maximum(60.0, 0.5 * group[obs])
    return pd.Series({"n": len(group), "within": ok.mean(), "median_err": err.median(),
                      "p90_abs": np.nanquantile(np.abs(err), 0.9) if len(group) else np.nan})


def report(df: pd.DataFrame, gentype: str) -> str:
    d = df[(df["gentype"] == gentype)]
    started = d[np.isfinite(d["obs"]) & np.isfinite(d["p50"])].copy()
    started["obs_band"] = pd.cut(started["obs"], BANDS, right=False)
    started["p50_band"] = pd.cut(started["p50"], BANDS, right=False)
    started["thread_band"] = pd.cut(started["threads"], THREAD_BANDS)
    out = [f"## {gentype}: {len(d)} first sightings, {len(started)} started with a p50"]
    out.append("overall\n" + _summary(started).to_string())
    for key in ("obs_band", "p50_band", "thread_band"):
        table = started.groupby(key, observed=True).apply(_summary, include_groups=False)
        out.append(f"by {key}\n{table.to_string(float_format=lambda v: f'{v:.2f}')}")
    done = d[np.isfinite(d["obs_c"]) & np.isfinite(d["c50"])]
    out.append("completion overall\n" + _summary(done, "c50", "obs_c").to_string())
    stall = d[d["status"] != "cancelled"]
    st, obs = stall["stall"].astype(bool), stall["expired_unstarted"].astype(bool)
    out.append(f"stall: predicted {int(st.sum())}, observed {int(obs.sum())}, hit {int((st & obs).sum())}, "
               f"false {int((st & ~obs).sum())}, missed {int((~st & obs).sum())}")
    missed = stall[~st & obs]
    if len(missed):
        out.append("missed stalls: p50 quantiles " + str(np.nanquantile(missed["p50"], [0.1, 0.5, 0.9]).round(0))
                   + ", threads median " + str(missed["threads"].median()))
    return "\n\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay_where")
    parser.add_argument("scenario")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gentype", action="append")
    parser.add_argument("--csv")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a ReplaySettings field")
    args = parser.parse_args(argv)
    df = first_sightings(args.scenario, args.minutes, args.seed, settings_from(args.set))
    if args.csv:
        df.to_csv(args.csv, index=False)
    for g in args.gentype or sorted(df["gentype"].unique()):
        print(report(df, g) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
