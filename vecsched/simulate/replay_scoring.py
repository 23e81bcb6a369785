"""Score dispatch-replay-v1 with its p90 calibrated on *other* runs' outcomes (cross-fitted split conformal).

In production the p90 is learned from the rolling window's earlier pairs. In
the simulator, each seed's forecasts are recalibrated on the pooled pairs of
the other seeds (never their own), which is the honest equivalent; the p50s
and stall predictions are unchanged. Three seeds are a thin stand-in for a
rolling day of one horde: when one seed holds most of a set's pairs, the two
others cannot teach its tail. ``--calibrate-with DUMP`` adds the pairs of
earlier runs of the same scenario (their ``--dump`` files) to every seed's
calibration, never the seed's own; ``--rescore DUMP`` scores a dump's pairs
again without simulating. Writes the ``vecsched.promotion/1``
document with the calibrated series beside the plain ones, under the name
``dispatch-replay-v1+conformal``; with ``-o DIR`` also one document per seed
(``DIR/seed-N/promotion.json``). The replay's cancellation hazard, which the
job learns from its pairs (:func:`vecsched.core.calibration.cancel_hazards`),
is likewise taken from the other seeds' runs (seed + 1 for a single seed).

    python -m vecsched.simulate.replay_scoring steady --minutes 10 --seed 0 --seed 11 --seed 23 -o DIR [--set spread=1,9]
    python -m vecsched.simulate.replay_scoring steady --rescore A.pkl --calibrate-with B.pkl --calibrate-with C.pkl -o DIR
    python -m vecsched.simulate.replay_scoring image_mix --seed 5 --world no-kudos   # one mechanism switched off
"""

from __future__ import annotations

import argparse
import ast
import json
import os
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from vecsched.core.calibration import calibrated_p90, from_pairs, no_capacity_forecast
from vecsched.core.replay import NAME, enable
from vecsched.simulate.scenarios import WORLDS
from vecsched.snapshot.schema import IMAGE, TEXT

CALIBRATED = f"{NAME}+conformal"


def _seed(pair: Any) -> str:
    return pair.request_id.split(":", 1)[0]


def cross_calibrated(pairs: Sequence[Any], *, estimator: str = NAME, min_pairs: int = 100,
                     pool: Sequence[Any] = ()) -> list[Any]:
    """``estimator``'s pairs with each seed's p90 recomputed from the other seeds' pairs, renamed.

    Seeds are read from the request ids (``SEED:id``, as the simulator writes them).
    ``pool``: pairs of other runs that every seed also learns from, except its
    own seed's (a seed of ``pairs`` found in ``pool`` too is taken from ``pairs``).

    Examples
    --------
    >>> from vecsched.core.pairing import Pair
    >>> def pairs(seed, error):
    ...     return [Pair(NAME, "text", "start", f"{seed}:r{i}", 0.0, 100.0, 160.0, 100.0 + error * i / 200, False)
    ...             for i in range(200)]

    Seeds 1 and 3 wait at most 10 s past their p50s, the pool's seed 2 up to
    400 s; the pool's own copy of seed 1 is not learned from.

    >>> scored = pairs(1, 10.0) + pairs(3, 10.0)
    >>> alone, with_pool = cross_calibrated(scored), cross_calibrated(scored, pool=pairs(2, 400.0) + pairs(1, 0.0))
    >>> [round(next(p.p90 for p in out if p.request_id == "1:r0")) for out in (alone, with_pool)]
    [109, 444]
    """
    mine = [p for p in pairs if p.estimator == estimator]
    scored = {_seed(p) for p in mine}
    mine_pool = [p for p in pool if p.estimator == estimator and _seed(p) not in scored]
    # Every estimator's pairs, from which from_pairs takes the outcomes of requests no capacity could serve.
    every = [*pairs, *(q for q in pool if _seed(q) not in scored)]
    seed_of = np.array([_seed(p) for p in mine], dtype=object)
    out = []
    for seed in sorted(set(seed_of)):
        others = [p for p, s in zip(mine, seed_of) if s != seed] + mine_pool
        calibration = from_pairs(others, min_pairs=min_pairs, no_capacity=[p for p in every if _seed(p) != seed])
        own = [p for p, s in zip(mine, seed_of) if s == seed]
        for phase in ("start", "completion"):
            rows = [p for p in own if p.phase == phase]
            if not rows:
                continue
            late = np.array([p.late for p in rows], dtype=np.float64)  # p90s on the making's clock, as learned
            p50 = np.array([np.nan if p.p50 is None else p.p50 for p in rows], dtype=np.float64) - late
            gentype = np.array([TEXT if p.gentype == "text" else IMAGE for p in rows])
            p90 = calibrated_p90(p50, phase=phase, gentype=gentype, calibration=calibration)
            # The job fills a null p50 when it makes the forecast: an outcome before a late forecast
            # was made is a miss (null on purpose: lateness never flatters), and stays one here.
            made_in_time = np.array([p.observed >= p.late for p in rows], dtype=bool)
            filled, filled_p90 = no_capacity_forecast(p50, p90, phase=phase, gentype=gentype, calibration=calibration)
            filled, p90 = np.where(made_in_time, filled, p50), np.where(made_in_time, filled_p90, p90)
            out += [replace(p, estimator=CALIBRATED, p50=p.p50 if p.p50 is not None or np.isnan(c) else float(c + d),
                            p90=None if np.isnan(v) else float(v + d))
                    for p, c, v, d in zip(rows, filled, p90, late)]
        out += [replace(p, estimator=CALIBRATED) for p in own if p.phase not in ("start", "completion")]
    return out


class _Sightings:
    """:class:`FirstSightings` that also keeps each first forecast of the replay with its eligible threads and workers and its
    request's priority.

    The first forecasts of the estimators named in ``views`` go under the row's ``views`` key (as
    computed at the first sighting, whatever ``replay_every`` is). ``replay_every``: seconds between
    the replay's forecasts, as off the main cycle (:class:`FirstSightings`' ``late``); None, every cycle.
    """

    def __init__(self, views: Sequence[str] = (), replay_every: float | None = None) -> None:
        from vecsched.simulate.production import FirstSightings

        self.inner = FirstSightings() if replay_every is None else FirstSightings(late=(NAME,), every=replay_every)
        self.rows: dict[str, dict[str, Any]] = {}
        self.views = tuple(views)

    def __call__(self, snapshot: Any, estimates: Any) -> None:
        import pandas as pd

        ids = estimates.request_id
        new = np.flatnonzero(~pd.Index(ids).isin(list(self.inner.seen)))
        f = estimates.forecasts.get(NAME)
        if f is not None and len(new):
            threads, workers = (estimates.columns[c] for c in ("eligible_worker_threads", "eligible_workers"))
            rows = estimates.request_index[new]
            expiry, priority = snapshot.requests.expiry[rows], snapshot.requests.extra_priority[rows]
            for k, e, prio in zip(new.tolist(), expiry.tolist(), priority.tolist()):
                # What the tail study splits the errors by (benchmarks/replay_tail.py).
                self.rows[str(ids[k])] = dict(f.row(k), threads=int(threads[k]), workers=int(workers[k]),
                                              priority=int(prio), left=float(e - snapshot.now), at=float(snapshot.now))
                if self.views:
                    self.rows[str(ids[k])]["views"] = {v: estimates.forecasts[v].row(k) for v in self.views}
        self.inner(snapshot, estimates)

    def outcomes(self, sim: Any) -> list[Any]:
        return self.inner.outcomes(sim)

    def replay_rows(self) -> dict[str, dict[str, Any]]:
        return self.rows


def _plain_run(name: Any, minutes: float, seed: int) -> Any:
    """The simulation of :func:`vecsched.simulate.run` (same seed, same events), without estimates."""
    from vecsched.simulate.engine import EXPIRY_SECONDS
    from vecsched.simulate.scenarios import build, scenario

    warmup = 180.0
    sim, _ = build(scenario(name) if isinstance(name, str) else name, seed, minutes, warmup=warmup,
                   tail=EXPIRY_SECONDS)
    sim.run_until(sim.now + warmup + minutes * 60.0 + EXPIRY_SECONDS)
    return sim


def cancel_hazards(sim: Any) -> tuple[float, ...]:
    """Per gentype code, cancellations of unstarted requests per second of waiting unstarted, over a whole run.

    :func:`vecsched.core.calibration.cancel_hazards` (the job's rule), fed
    the run's requests as pairs: each forecast at its creation, its start,
    expiry or cancellation, and the run's end; no minimum count.
    """
    from types import SimpleNamespace as Pair

    from vecsched.core.calibration import cancel_hazards as from_pairs_of
    from vecsched.snapshot.schema import GENTYPES

    pairs = [Pair(request_id="", gentype="", phase="end", at=sim.now)]  # the window's end: no forecast of its own
    for r in sim.requests.values():
        name = GENTYPES[r.gentype]
        pairs.append(Pair(request_id=r.id, gentype=name, phase="forecast", at=r.created))
        for phase, at in (("start", r.started_at), ("cancelled", r.cancelled_at),
                          ("stall", getattr(r, "expired_at", None))):
            if at is not None:
                pairs.append(Pair(request_id=r.id, gentype=name, phase=phase, at=at))
    return tuple(from_pairs_of(pairs, min_cancelled=0))


def score(name: str, minutes: float, seeds: Sequence[int]) -> dict[str, Any]:
    """Run ``name`` once per seed; the promotion document with the calibrated replay added."""
    return score_seeds(name, minutes, seeds)[0]


def score_seeds(name: str, minutes: float, seeds: Sequence[int], *, dump: str | None = None,
                views: Sequence[Callable[[Any], Any]] = (),
                changes: Mapping[str, Any] | None = None,
                replay_every: float | None = None,
                pool: Sequence[Any] = (),
                world: str = "as-is") -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """As :func:`score`, and one document per seed (its p90s still calibrated on the other seeds).

    ``dump``: a pickle file to keep the plain pairs and each request's
    first-sighting forecast (with its eligible threads and seconds to expiry),
    to study calibrations and stall rules offline on the same runs.
    ``views``: functions making, from each seed's replay settings, a further
    estimator registered beside the replay for that run (another view of the
    future); their first forecasts go into the dump (``views`` of each row).
    ``changes``: ``ReplaySettings`` fields to set (the command line's ``--set``).
    ``replay_every``: the replay's forecasts made off the main cycle, at most once per that many
    seconds (``vecsched run --replay-every``): late ones scored from the first sighting, their share
    in each series' ``late_share``. None: every cycle (the default).
    ``pool``: pairs of other runs the calibrated p90s also learn from (:func:`cross_calibrated`).
    ``world``: the scenario with one mechanism switched off (:data:`vecsched.simulate.scenarios.WORLDS`).
    """
    from vecsched.simulate.accuracy import run
    from vecsched.simulate.production import seeded
    from vecsched.simulate.scenarios import counterfactual, scenario

    from vecsched.core.forecasts import ESTIMATORS, register
    from vecsched.core.replay import DispatchReplayV1, ReplaySettings

    horde = counterfactual(scenario(name) if isinstance(name, str) else name, world)
    hazards = {seed: cancel_hazards(_plain_run(horde, minutes, seed)) for seed in {*seeds, *(s + 1 for s in seeds)}}
    seeds = list(dict.fromkeys(seeds))  # a seed named twice would count its pairs twice
    pooled: list[Any] = []
    sighted: dict[str, dict[str, Any]] = {}
    extra: list[Any] = []
    try:
        for seed in seeds:
            # Cancellations as the job learns them from its pairs, here from other seeds' runs.
            others = [hazards[s] for s in seeds if s != seed] or [hazards[seed + 1]]
            learned = tuple(float(np.mean(h)) for h in zip(*others))
            # A --set cancel_hazard=... is the setting to study: it wins over the learned one.
            settings = replace(ReplaySettings(), **{"cancel_hazard": learned, **(changes or {})})
            register(DispatchReplayV1(settings=settings))
            extra = [register(view(settings)) for view in views]
            sightings = _Sightings([v.name for v in extra], replay_every=replay_every)
            result = run(horde, minutes, seed, on_snapshot=sightings)
            pooled.extend(seeded(sightings.outcomes(result.sim), seed))
            sighted.update({f"{seed}:{k}": v for k, v in sightings.replay_rows().items()})
    finally:
        for view in extra:
            ESTIMATORS.pop(view.name, None)
        enable()
    if dump:
        import pickle

        with open(dump, "wb") as fh:
            pickle.dump({"scenario": name, "world": world, "minutes": minutes, "seeds": list(seeds),
                         "pairs": pooled, "sighted": sighted}, fh)
    return documents(pooled, seeds, pool=pool)


def documents(pooled: list[Any], seeds: Sequence[int],
              pool: Sequence[Any] = ()) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The pooled and per-seed promotion documents of plain pairs, with the cross-calibrated series added."""
    from vecsched.core.forecasts import ESTIMATORS
    from vecsched.core.promotion import promotion_document

    enable()
    pooled = pooled + cross_calibrated(pooled, pool=pool)
    names = [*ESTIMATORS, CALIBRATED, "adr-wait", "horde-wide"]

    def document(pairs: list[Any], of: Sequence[int]) -> dict[str, Any]:
        times = [p.at for p in pairs] or [0.0]
        return promotion_document(pairs, now=max(times), window=max(max(times) - min(times), 1.0), seeds=list(of),
                                  estimators=names)

    per_seed = {seed: document([p for p in pooled if _seed(p) == str(seed)], [seed])
                for seed in seeds}
    return document(pooled, seeds), per_seed


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    from vecsched.core.promotion import format_table

    parser = argparse.ArgumentParser(prog="python -m vecsched.simulate.replay_scoring")
    parser.add_argument("scenario")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, action="append")
    parser.add_argument("-o", "--output")
    parser.add_argument("--dump", help="pickle of the plain pairs and first forecasts (for rescoring)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a ReplaySettings field, as a Python literal (e.g. spread=1,9)")
    parser.add_argument("--replay-every", type=float, metavar="SECONDS",
                        help="the replay off the main cycle, once per SECONDS of simulated time (default: every cycle)")
    parser.add_argument("--calibrate-with", action="append", default=[], metavar="DUMP",
                        help="a --dump file of earlier runs of the scenario, whose other seeds' pairs the p90s also learn from")
    parser.add_argument("--rescore", metavar="DUMP", help="score this --dump file's pairs (its seeds) instead of simulating")
    parser.add_argument("--world", default="as-is", choices=sorted(WORLDS),
                        help="the scenario with one mechanism switched off, to measure what it costs the forecasts")
    args = parser.parse_args(argv)
    pool = [p for path in args.calibrate_with for p in _dumped(path, args.scenario)["pairs"]]
    if args.rescore:
        dumped = _dumped(args.rescore, args.scenario)
        doc, per_seed = documents(dumped["pairs"], dumped["seeds"], pool=pool)
    else:
        changes = {k: ast.literal_eval(v) for k, v in (p.split("=", 1) for p in args.set)}
        doc, per_seed = score_seeds(args.scenario, args.minutes, args.seed or [0], dump=args.dump, changes=changes,
                                    replay_every=args.replay_every, pool=pool, world=args.world)
    print(format_table(doc))
    if args.output:
        # DIR/promotion.json pooled; DIR/seed-N/promotion.json per seed (benchmarks/promotion_tables.py reads both).
        for where, d in [(args.output, doc), *((os.path.join(args.output, f"seed-{k}"), v) for k, v in per_seed.items())]:
            os.makedirs(where, exist_ok=True)
            with open(os.path.join(where, "promotion.json"), "w", encoding="utf-8") as fh:
                json.dump(d, fh, indent=1)
    return 0


def _dumped(path: str, scenario: str) -> dict[str, Any]:
    """A ``--dump`` file, refused (SystemExit with the reason) unless it is of ``scenario``."""
    import pickle

    try:
        with open(path, "rb") as fh:
            dumped = pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError) as err:
        raise SystemExit(f"{path}: not a replay_scoring dump ({err})") from None
    if not isinstance(dumped, dict) or "pairs" not in dumped:
        raise SystemExit(f"{path}: not a replay_scoring dump")
    if dumped.get("scenario") != scenario:
        raise SystemExit(f"{path}: a dump of scenario {dumped.get('scenario')!r}, not {scenario!r}")
    return dumped


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
