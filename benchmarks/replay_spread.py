"""Study the spread of futures of dispatch-replay-v1 (issue 13, round 6), offline on dumped runs.

``run`` scores a scenario as ``vecsched.simulate.replay_scoring`` does and, for
every image request at its first sighting, keeps the start, completion and
stall of each replayed future of two families of perturbations (and of the
calm future without arrivals); ``rules`` reads such dumps and prints, per
scenario and seed set, the stall signal and start p50 accuracy of candidate
ensembles (number of futures, family, stall share, p50 quantile), and the best
recall a threshold on each score reaches at FPR <= 10% (the ROC, not a point);
``roc`` that best recall and the area under the ROC curve, per family.

    PYTHONPATH=$PWD python -m benchmarks.replay_spread run steady --minutes 5 --seed 0 --seed 11 --seed 23 --dump F.pkl
    PYTHONPATH=$PWD python -m benchmarks.replay_spread rules F.pkl [G.pkl ...]
    PYTHONPATH=$PWD python -m benchmarks.replay_spread roc F.pkl [G.pkl ...]

docs/replay.md, "Round 6", has the figures.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np
import pandas as pd

from benchmarks.stall_study import SETS, best_recall, signal, study_parser
from vecsched.core import replay as RP
from vecsched.core.forecasts import Forecast
from vecsched.snapshot.schema import IMAGE

K = 9  # futures per family, the plain one included
FAMILIES = {"A": dict(rate_spread=0.25, churn_scale=1.0, speed_noise=0.1),
            "B": dict(rate_spread=0.5, churn_scale=3.0, speed_noise=0.2),
            "C": dict(rate_spread=0.25, churn_scale=1.0, speed_noise=0.1, burst_per_hour=4.0)}
STUDIES: list["Members"] = []


@dataclass(frozen=True)
class Members(RP.DispatchReplayV1):
    """Replays every future of :data:`FAMILIES` for the image queues and keeps each new request's first ones.

    Forecasts nothing itself (NaN p50s): only its record, ``first``, is read.
    """

    first: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def compute(self, snapshot: Any, eligibility: Any, calibration: Any) -> Any:
        """Record the futures of the image requests first seen now."""
        inp, n = eligibility, len(eligibility)
        snap_rows = RP.waiting_rows(snapshot)
        for queue in inp.queues:
            if queue.gentype != IMAGE or not len(queue.rows):
                continue
            ids = snapshot.requests.id[snap_rows[queue.rows]].astype(str)
            new = np.flatnonzero(~pd.Index(ids).isin(list(self.first)))
            if len(new):
                self._record(snapshot, inp, queue, snap_rows, ids, new)
        return Forecast(np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan),
                        np.ones(n, dtype=bool))

    def _record(self, snapshot: Any, inp: Any, queue: Any, snap_rows: np.ndarray, ids: np.ndarray,
                new: np.ndarray) -> None:
        s = replace(self.settings, served_view=(), calm_view=(), spread=(1, K))
        _, _, threads = RP._worker_columns(snapshot, IMAGE, s.absent_after)
        horizon = RP._horizon(snapshot, inp, queue, snap_rows, s)[0]
        age = snapshot.now - snapshot.requests.created[snap_rows[queue.rows]]
        recent = int((age <= s.arrival_window).sum())
        runs: dict[str, RP.ReplayResult] = {
            "plain": RP.replay_gentype(snapshot, inp, queue, snap_rows, s),
            "calm": RP.replay_gentype(snapshot, inp, queue, snap_rows, s, RP.Future(rate=0.0))}
        for fam, changes in FAMILIES.items():
            fs = replace(s, **changes)
            for j, future in enumerate(RP.futures(snapshot, IMAGE, fs, threads, recent, horizon)[1:], 1):
                runs[f"{fam}{j}"] = RP.replay_gentype(snapshot, inp, queue, snap_rows, fs, future)
        left = inp.seconds_left[queue.rows]
        for k in new.tolist():
            self.first[ids[k]] = {name: (float(r.start[k]), float(r.completion[k]), bool(r.stall[k]))
                                  for name, r in runs.items()} | {"left": float(left[k])}


def run(scenario: str, minutes: float, seeds: Sequence[int], dump: str) -> None:
    """Score ``scenario`` with :class:`Members` beside the replay; pickle the pairs and every first future."""
    from vecsched.simulate.replay_scoring import score_seeds

    def members(settings: Any) -> Any:
        study = Members(name="spread-members", settings=settings)
        STUDIES.append(study)
        return study

    score_seeds(scenario, minutes, seeds, dump=dump, views=[members])
    with open(dump, "rb") as fh:
        d = pickle.load(fh)
    d["members"] = {f"{seed}:{rid}": v for seed, study in zip(seeds, STUDIES) for rid, v in study.first.items()}
    for row in d["sighted"].values():
        row.pop("views", None)
    with open(dump, "wb") as fh:
        pickle.dump(d, fh)


def frame(path: str) -> pd.DataFrame:
    """One row per image request with a first sighting: outcomes (stalled, observed start) and every future."""
    d = pickle.load(open(path, "rb"))
    name = RP.NAME
    stall = {p.request_id: p.observed >= 1.0 for p in d["pairs"] if p.estimator == name and p.phase == "stall"}
    start = {p.request_id: p.observed for p in d["pairs"] if p.estimator == name and p.phase == "start"}
    p50 = {p.request_id: p.p50 for p in d["pairs"] if p.estimator == name and p.phase == "start"}
    rows = []
    for rid, m in d["members"].items():
        row = {"rid": rid, "seed": int(rid.split(":")[0]), "stalled": stall.get(rid), "observed": start.get(rid),
               "today": p50.get(rid), "left": m["left"]}
        for k, v in m.items():
            if k != "left":
                row[f"{k}_s"], row[f"{k}_c"], row[f"{k}_x"] = v
        rows.append(row)
    out = pd.DataFrame(rows)
    out["scenario"], out["set"] = d["scenario"], out.seed.map(SETS)
    return out


def within(p50: np.ndarray, observed: np.ndarray) -> tuple[float, float]:
    """Share within max(60 s, 50% of observed) and the 90th percentile of |error| (the promotion's start series)."""
    ok = ~np.isnan(p50) & ~np.isnan(observed)
    err = np.abs(p50[ok] - observed[ok])
    return float(np.mean(err <= np.maximum(60.0, 0.5 * observed[ok]))), float(np.percentile(err, 90))


def members_of(fam: str, k: int) -> list[str]:
    """The first ``k`` futures of family ``fam``: the plain one, then perturbed ones."""
    return ["plain", *(f"{fam}{j}" for j in range(1, k))]


def rules(paths: Sequence[str], ks: Sequence[int] = (5, 7, 9), shares: Sequence[float] = (0.3, 0.4, 0.5, 0.6)) -> str:
    """Stall signal and start p50 accuracy of the ensembles per scenario and seed set."""
    f = pd.concat([frame(p) for p in paths], ignore_index=True)
    lines = []
    for (scenario, seeds), g in f.groupby(["scenario", "set"]):
        s = g[g.stalled.notna()]
        stalled = s.stalled.to_numpy(bool)
        o = g[g.observed.notna()]
        obs = o.observed.to_numpy(np.float64)
        lines.append(f"{scenario} {seeds}: {len(s)} stall pairs, {stalled.sum()} stalls, {len(o)} start pairs")
        today = within(o.today.to_numpy(np.float64), obs)
        lines.append(f"  today: stall {_psig(s.plain_x.to_numpy(bool), stalled)}, "
                     f"best recall (slack) {best_recall((s.plain_s - s.left).to_numpy(), stalled):.0%}; "
                     f"start within {today[0]:.1%}, p90 err {today[1]:.0f} s")
        for fam in FAMILIES:
            if f"{fam}1_x" not in g:
                continue
            for k in ks:
                names = members_of(fam, k)
                share = s[[f"{n}_x" for n in names]].to_numpy(bool).mean(axis=1)
                slack = np.median((s[[f"{n}_s" for n in names]].to_numpy() - s.left.to_numpy()[:, None]), axis=1)
                score = share + 1e-6 * np.clip(slack, -1e5, 1e5)
                sig = ", ".join(f"{t}: {_psig(share >= t, stalled)}" for t in shares)
                starts = o[[f"{n}_s" for n in names]].to_numpy()
                acc = []
                for q in (0.4, 0.5, 0.6):
                    w = within(np.quantile(starts, q, axis=1, method="inverted_cdf"), obs)
                    acc.append(f"q{q}: {w[0]:.1%} {w[1]:.0f}s")
                calm = 0.75 * np.quantile(starts, 0.5, axis=1, method="inverted_cdf") + 0.25 * o.calm_s.to_numpy()
                wc = within(calm, obs)
                lines.append(f"  {fam} K={k}: best recall {best_recall(score, stalled):.0%}; {sig}; "
                             f"{'; '.join(acc)}; median+calm {wc[0]:.1%} {wc[1]:.0f}s")
    return "\n".join(lines)


def auc(score: np.ndarray, stalled: np.ndarray) -> float:
    """Area under the ROC curve of ``score`` (ties count half): the chance a stall outranks a non-stall."""
    ranks = pd.Series(score).rank(method="average").to_numpy()
    n1, n0 = int(stalled.sum()), int((~stalled).sum())
    return float((ranks[stalled].sum() - n1 * (n1 + 1) / 2) / max(n1 * n0, 1))


def roc(paths: Sequence[str], k: int = K) -> str:
    """Per scenario and seed set: best recall at FPR <= 10% and AUC of the single replay's slack and of each family's score."""
    f = pd.concat([frame(p) for p in paths], ignore_index=True)
    lines = ["| scenario | seeds | stalls / requests | single replay: best recall, AUC | "
             + " | ".join(f"{fam} ({k} futures)" for fam in FAMILIES) + " |", "|---|---|---|---|" + "---|" * len(FAMILIES)]
    for (scenario, seeds), g in f[f.stalled.notna()].groupby(["scenario", "set"]):
        y = g.stalled.to_numpy(bool)
        cells = [_roc((g.plain_s - g.left).to_numpy(), y)]
        for fam in FAMILIES:
            names = members_of(fam, k)
            share = g[[f"{n}_x" for n in names]].to_numpy(bool).mean(axis=1)
            slack = np.median(g[[f"{n}_s" for n in names]].to_numpy() - g.left.to_numpy()[:, None], axis=1)
            cells.append(_roc(share + 1e-6 * np.clip(slack, -1e5, 1e5), y))
        lines.append(f"| {scenario} | {seeds} | {y.sum()} / {len(y)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _roc(score: np.ndarray, y: np.ndarray) -> str:
    return f"{best_recall(score, y):.0%}, {auc(np.nan_to_num(score, posinf=1e9), y):.2f}"


def _psig(pred: np.ndarray, stalled: np.ndarray) -> str:
    p, r, fpr = signal(pred, stalled)
    return f"{p:.0%}/{r:.0%}/{fpr:.0%}"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser, _ = study_parser("python -m benchmarks.replay_spread", ["rules", "roc"])
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.scenario, args.minutes, args.seed or [0], args.dump)
    else:
        print((rules if args.command == "rules" else roc)(args.dumps))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
