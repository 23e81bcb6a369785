"""Measure one horde size in this process (run by ``python -m benchmarks`` in a fresh subprocess).

Usage::

    python -m benchmarks.measure --workers 2000 --requests 50000 --out result.json

Phases, in order, the result file rewritten after each (so a run stopped for
time or memory still leaves what it measured):

1. synthesize the horde (:func:`vecsched.synthetic.horde`);
2. the floor and ``vecsched.estimate`` alternately, ``--repeats`` times each
   (one cold estimate first, not counted), then the peak RSS so far: the
   batch's peak, before any baseline allocates;
3. one estimate under :mod:`tracemalloc` (its peak Python/NumPy allocation);
4. the dense baseline, where it fits and ``--dense-max-flops`` allows, checked
   against the batch;
5. the per-request path: :func:`vecsched.reference.prepare` once, then
   :func:`vecsched.reference.estimate_one` on ``--reference-sample`` requests
   spread evenly over the queue, checked against the batch;
6. the batch once more, so the baselines' ratios have a batch time from both
   sides of them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import tracemalloc
from time import perf_counter
from typing import Any

import numpy as np

import vecsched
from vecsched import reference
from vecsched.synthetic import horde

from .dense import compare, dense_bytes, dense_estimate, dense_flops
from .floor import input_bytes, one_pass
from .report import STAGES as SPEC_STAGES

DENSE_MAX_BYTES = 4 << 30


def max_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _write(path: str | None, result: dict[str, Any]) -> None:
    text = json.dumps(result, indent=1, default=_jsonable)
    if path is None:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value)}")


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def measure(
    workers: int,
    requests: int,
    seed: int = 0,
    repeats: int = 3,
    reference_sample: int = 20,
    dense: bool = True,
    dense_max_flops: float = 2e12,
    tracemalloc_run: bool = True,
    out: str | None = None,
    horde_kind: str = "realistic",
    history: bool = False,
) -> dict[str, Any]:
    """Measure one size; see the module docstring for the phases. Returns the result mapping.

    Examples
    --------
    >>> res = measure(20, 100, repeats=1, reference_sample=2, tracemalloc_run=False)
    >>> res["waiting"] > 0 and res["dense"]["agreement"]["agrees"]
    True
    """
    result: dict[str, Any] = {"workers": workers, "requests": requests, "seed": seed, "phase": "start",
                              "horde": horde_kind, "history": history}
    result["rss_start_bytes"] = max_rss_bytes()

    t = perf_counter()
    if horde_kind == "adversarial":
        from benchmarks.adversarial import adversarial_horde

        snap = adversarial_horde(workers, requests, seed=seed)
    else:
        snap = horde(workers=workers, requests=requests, seed=seed)
    if history:  # five minutes of pops and returns, as a production cycle has: might_stall's cost follows them
        from vecsched.synthetic_history import with_history

        snap = with_history(snap, seed=seed)
    result["synthesize_s"] = perf_counter() - t
    result["input_bytes"] = input_bytes(snap)
    result["jobs"] = len(snap.jobs)
    result["excluded_pairs"] = len(snap.excluded_pairs.worker_id)
    result["models"] = len(snap.model_names)
    result["rss_after_synthesis_bytes"] = max_rss_bytes()
    result["phase"] = "synthesized"
    _write(out, result)

    # -- the batch and the floor, alternately ---------------------------------------
    t = perf_counter()
    est = vecsched.estimate(snap)
    result["batch_cold_s"] = perf_counter() - t
    waiting = len(est.request_id)
    result["waiting"] = waiting
    result["waiting_text"] = int((est.columns["gentype"] == 0).sum())
    result["groups"] = dict(est.groups)
    # Kept apart from the counted runs, but reported: at the largest sizes it may be the only run that ends.
    result["batch_cold_stages_s"] = dict(est.timings)
    result["phase"] = "cold"
    _write(out, result)
    totals: list[float] = []
    stages: dict[str, list[float]] = {}
    floors: list[dict[str, float]] = []
    for _ in range(repeats):
        gc.collect()
        floors.append(one_pass(snap))
        del est
        gc.collect()
        t = perf_counter()
        est = vecsched.estimate(snap)
        totals.append(perf_counter() - t)
        for name, seconds in est.timings.items():
            stages.setdefault(name, []).append(seconds)
        result["batch_runs_so_far_s"] = totals
        _write(out, result)
    # Issue 14's targets are on SPEC 3-6 alone; the whole estimate adds might_stall and the shadow forecasts.
    spec_runs = [sum(runs[i] for name, runs in stages.items() if name in SPEC_STAGES) for i in range(len(totals))]
    result["batch"] = {
        "total_s": _median(totals),
        "total_runs_s": totals,
        "spec_3_6_s": _median(spec_runs),
        "spec_3_6_runs_s": spec_runs,
        "stages_s": {name: _median(v) for name, v in stages.items()},
        "stages_runs_s": stages,
    }
    result["floor"] = {key: _median([f[key] for f in floors]) for key in ("total", "numbers", "strings")}
    result["floor"]["runs_s"] = [f["total"] for f in floors]
    result["batch_over_floor"] = result["batch"]["total_s"] / result["floor"]["total"]
    result["spec_3_6_over_floor"] = result["batch"]["spec_3_6_s"] / result["floor"]["total"]
    result["peak_rss_bytes"] = max_rss_bytes()
    result["phase"] = "batch"
    _write(out, result)
    batch_frame = est.to_frame()
    del est
    gc.collect()

    if tracemalloc_run:
        tracemalloc.start()
        vecsched.estimate(snap)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        result["tracemalloc_peak_bytes"] = peak
        _write(out, result)

    # -- dense baseline --------------------------------------------------------------
    text_share = result["waiting_text"] / max(waiting, 1)
    need = dense_bytes(workers, waiting, text_share)
    flops = dense_flops(workers, waiting, text_share)
    result["dense"] = {"estimated_bytes": need, "competition_multiply_adds": flops}
    if not dense:
        result["dense"]["skipped"] = "not asked"
    elif need > DENSE_MAX_BYTES:
        result["dense"]["skipped"] = f"does not fit: ~{need / 2**30:.1f} GiB > {DENSE_MAX_BYTES / 2**30:.0f} GiB"
    elif flops > dense_max_flops:
        result["dense"]["skipped"] = f"too slow for this mode: {flops:.2g} multiply-adds > {dense_max_flops:.2g}"
    else:
        t = perf_counter()
        frame = dense_estimate(snap)
        result["dense"]["total_s"] = perf_counter() - t
        result["dense"]["agreement"] = compare(frame, batch_frame)
        del frame
        gc.collect()
    result["phase"] = "dense"
    _write(out, result)

    # -- the per-request path --------------------------------------------------------
    if reference_sample > 0 and waiting:
        t = perf_counter()
        prepared = reference.prepare(snap)
        prepare_s = perf_counter() - t
        queue = [r["id"] for r in prepared.waiting]
        picks = sorted({queue[k] for k in np.linspace(0, len(queue) - 1, min(reference_sample, len(queue))).astype(int)})
        times, mismatched = [], 0
        for rid in picks:
            t = perf_counter()
            fig = reference.estimate_one(snap, rid, prepared)
            times.append(perf_counter() - t)
            mine = batch_frame.loc[rid]
            for name in ("eligible_workers", "queue_position", "wait_time"):
                a, b = float(fig[name]), float(mine[name])
                if not (np.isclose(a, b, rtol=1e-6) or (np.isnan(a) and np.isnan(b))):
                    mismatched += 1
                    break
        per_request = float(np.mean(times))
        result["per_request"] = {
            "prepare_s": prepare_s,
            "sample": len(picks),
            "mean_s": per_request,
            "median_s": _median(times),
            "max_s": max(times),
            "scaled_to_queue_s": per_request * waiting,
            "sample_mismatches": mismatched,
        }
        del prepared
        gc.collect()
        result["phase"] = "per_request"
        _write(out, result)

    # -- the batch again, after the baselines -----------------------------------------
    after = []
    for _ in range(repeats // 2):
        t = perf_counter()
        vecsched.estimate(snap)
        after.append(perf_counter() - t)
    result["batch"]["after_baselines_s"] = _median(after) if after else None
    batch_s = _median(totals + after)
    result["batch"]["ratio_basis_s"] = batch_s
    if "per_request" in result:
        pr = result["per_request"]
        pr["batch_per_request_s"] = batch_s / waiting
        pr["speedup_per_request"] = pr["mean_s"] / (batch_s / waiting)
    if "total_s" in result["dense"]:
        result["dense"]["over_batch"] = result["dense"]["total_s"] / batch_s
    result["phase"] = "done"
    _write(out, result)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reference-sample", type=int, default=20)
    ap.add_argument("--no-dense", action="store_true")
    ap.add_argument("--dense-max-flops", type=float, default=2e12)
    ap.add_argument("--no-tracemalloc", action="store_true")
    ap.add_argument("--out", default=None, help="result file (rewritten after every phase)")
    ap.add_argument("--horde", choices=("realistic", "adversarial"), default="realistic",
                    help="adversarial: every request names 2 to 5 random models (benchmarks/adversarial.py)")
    ap.add_argument("--history", action="store_true",
                    help="five minutes of dispatch and return history (vecsched.synthetic_history)")
    args = ap.parse_args(argv)
    result = measure(
        args.workers,
        args.requests,
        seed=args.seed,
        repeats=args.repeats,
        reference_sample=args.reference_sample,
        dense=not args.no_dense,
        dense_max_flops=args.dense_max_flops,
        tracemalloc_run=not args.no_tracemalloc,
        out=args.out,
        horde_kind=args.horde,
        history=args.history,
    )
    if args.out is None:
        json.dump(result, sys.stdout, indent=1, default=_jsonable)


if __name__ == "__main__":
    main()
