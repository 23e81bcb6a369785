"""``python -m benchmarks``: measure vecsched against its baselines and write the results.

Usage::

    python -m benchmarks            # full mode (~15 min): sizes, stress, sweeps, service
    python -m benchmarks --quick    # under two minutes: no stress, no service, smaller sweeps
    python -m benchmarks --mode toy --out /tmp/b   # seconds; what the smoke test runs

Each horde size runs in a fresh subprocess (:mod:`benchmarks.measure`) so its
peak RSS is its own; a watchdog stops a subprocess that outgrows its memory
or time allowance and keeps what it measured so far. Writes
``<out>/<mode>.json`` and ``<out>/<mode>.png``; the full mode also rewrites
the generated part of ``benchmarks/README.md`` (``--readme`` forces it,
``--no-readme`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .report import fit_exponent, series, spec_3_6

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GiB = 1 << 30


@dataclass(frozen=True)
class Size:
    """One horde size to measure and how (repeats, baselines, allowances)."""

    name: str
    workers: int
    requests: int
    repeats: int = 3
    reference_sample: int = 20
    dense: bool = True
    dense_max_flops: float = 6e11
    tracemalloc: bool = True
    timeout_s: float = 300.0
    max_rss_bytes: int = 10 * GiB
    horde: str = "realistic"
    history: bool = False  # five minutes of pops and returns (might_stall reads them)


@dataclass(frozen=True)
class Plan:
    """What a mode measures."""

    sizes: tuple[Size, ...]
    request_sweep_workers: int
    request_sweep: tuple[int, ...]
    worker_sweep_requests: int
    worker_sweep: tuple[int, ...]
    sweep_defaults: dict[str, Any] = field(default_factory=dict)
    service: bool = False
    # Requests of the adversarial sweep (every request names 2-5 random models), at request_sweep_workers.
    adversarial_sweep: tuple[int, ...] = ()


PLANS: dict[str, Plan] = {
    "full": Plan(
        sizes=(
            Size("today", 150, 3_000, repeats=9, reference_sample=200),
            # With history, as the job's cycle runs: issue 11 judges might_stall's stage here.
            Size("10x", 2_000, 50_000, repeats=5, reference_sample=40, dense_max_flops=2e12, history=True),
            # One counted run (the cold one is apart): each takes minutes at this size today.
            Size("stress", 20_000, 1_000_000, repeats=1, reference_sample=5, dense=False,
                 tracemalloc=False, timeout_s=600.0, max_rss_bytes=10 * GiB),
        ),
        request_sweep_workers=2_000,
        request_sweep=(3_125, 6_250, 12_500, 25_000, 50_000, 100_000, 200_000),
        worker_sweep_requests=50_000,
        worker_sweep=(125, 250, 500, 1_000, 2_000, 4_000, 8_000),
        sweep_defaults={"repeats": 3, "reference_sample": 10, "dense_max_flops": 6e11, "tracemalloc": False},
        service=True,
        # To 100,000: below 50,000 fixed costs hid how the competition sweep grows on this horde.
        adversarial_sweep=(3_125, 6_250, 12_500, 25_000, 50_000, 100_000),
    ),
    "quick": Plan(
        sizes=(
            Size("today", 150, 3_000, repeats=7, reference_sample=100),
            Size("10x", 2_000, 50_000, repeats=3, reference_sample=10, dense=False, tracemalloc=False),
        ),
        request_sweep_workers=500,
        request_sweep=(2_000, 4_000, 8_000, 16_000, 32_000),
        worker_sweep_requests=10_000,
        worker_sweep=(100, 200, 400, 800, 1_600),
        sweep_defaults={"repeats": 3, "reference_sample": 5, "dense_max_flops": 2e10, "tracemalloc": False},
        adversarial_sweep=(2_000, 4_000, 8_000, 16_000),
    ),
    "toy": Plan(
        sizes=(Size("today", 30, 300, repeats=2, reference_sample=5),),
        request_sweep_workers=20,
        request_sweep=(100, 200, 400),
        worker_sweep_requests=200,
        worker_sweep=(10, 20, 40),
        sweep_defaults={"repeats": 1, "reference_sample": 2, "dense_max_flops": 1e9, "tracemalloc": False},
        adversarial_sweep=(100, 200),
    ),
}


# ---------------------------------------------------------------------------------
# Running one size in a subprocess, under a watchdog
# ---------------------------------------------------------------------------------


def _rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_size(size: Size, seed: int = 0, log=print) -> dict[str, Any]:
    """Measure ``size`` in a fresh ``python -m benchmarks.measure`` process; return its result."""
    with tempfile.TemporaryDirectory(prefix="vs-bench-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [
            sys.executable, "-m", "benchmarks.measure",
            "--workers", str(size.workers), "--requests", str(size.requests), "--seed", str(seed),
            "--repeats", str(size.repeats), "--reference-sample", str(size.reference_sample),
            "--dense-max-flops", repr(size.dense_max_flops), "--out", out, "--horde", size.horde,
        ]
        if not size.dense:
            cmd.append("--no-dense")
        if not size.tracemalloc:
            cmd.append("--no-tracemalloc")
        if size.history:
            cmd.append("--history")
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stopped, sampled = None, 0
        while proc.poll() is None:
            sampled = max(sampled, _rss_of(proc.pid))
            if sampled > size.max_rss_bytes:
                stopped = f"stopped by the watchdog: RSS passed {size.max_rss_bytes / GiB:.0f} GiB"
            elif time.perf_counter() - start > size.timeout_s:
                stopped = f"stopped by the watchdog: still running after {size.timeout_s:.0f} s"
            if stopped:
                proc.kill()
                break
            time.sleep(0.1)
        _, err = proc.communicate()
        elapsed = time.perf_counter() - start
        try:
            with open(out, encoding="utf-8") as fh:
                result = json.load(fh)
        except (OSError, ValueError):
            result = {"workers": size.workers, "requests": size.requests, "phase": "none"}
    result["name"] = size.name
    result["wall_s"] = elapsed
    result["sampled_peak_rss_bytes"] = sampled
    if stopped:
        result["stopped"] = f"{stopped} (in phase after {result.get('phase')!r})"
    elif proc.returncode != 0:
        result["stopped"] = f"exit {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}"
    log(_one_line(result))
    return result


def _one_line(r: dict[str, Any]) -> str:
    parts = [f"{r.get('name', '')} {r['workers']}x{r['requests']}:"]
    if "batch" in r:
        parts.append(f"batch {r['batch']['total_s']:.3f}s ({r.get('batch_over_floor', float('nan')):.1f}x floor;")
        parts.append(f"SPEC 3-6 {spec_3_6(r) or float('nan'):.3f}s, {r.get('spec_3_6_over_floor', float('nan')):.1f}x)")
        parts.append(f"peak {r['peak_rss_bytes'] / GiB:.2f} GiB")
    if "total_s" in r.get("dense", {}):
        parts.append(f"dense {r['dense']['total_s']:.2f}s")
    if "speedup_per_request" in r.get("per_request", {}):
        parts.append(f"per-request x{r['per_request']['speedup_per_request']:.0f}")
    if "stopped" in r:
        parts.append(r["stopped"])
    parts.append(f"[{r['wall_s']:.0f}s]")
    return " ".join(parts)


def run_service(workers: int, requests: int, log=print, timeout_s: float = 600.0) -> dict[str, Any]:
    """The job's stages on PostgreSQL + Redis, by :mod:`benchmarks.service` in a subprocess."""
    cmd = [sys.executable, "-m", "benchmarks.service", "--workers", str(workers), "--requests", str(requests),
           "--rounds", "3"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    document = json.loads(done.stdout)
    result = document["tree"]
    result["history"] = document.get("history", False)
    result["stall_refresh"] = document.get("stall_refresh")
    result["median_load_s"] = result["load_s"]
    result["median_estimate_s"] = sum(result[f"{k}_s"] for k in ("spec_3_6", "stall", "forecasts", "job"))
    result["median_publish_s"] = result["publish_s"]
    log(f"service {workers}x{requests}: " + ", ".join(
        f"{k} {result[k]:.3f}s" for k in ("import_s", "median_load_s", "median_estimate_s", "median_publish_s") if k in result))
    return result


def run_publish(requests: int, log=print, timeout_s: float = 600.0) -> dict[str, Any]:
    """Publishing ``requests`` payloads to Redis three ways side by side (:mod:`benchmarks.publish`)."""
    cmd = [sys.executable, "-m", "benchmarks.publish", "--requests", str(requests), "--rounds", "5"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    result = json.loads(done.stdout)
    log(f"publish {requests}: " + ", ".join(f"{k} {v:.3f}s" for k, v in result["publish_s"].items()))
    return result


# ---------------------------------------------------------------------------------
# Sweeps (their fits are in report.py)
# ---------------------------------------------------------------------------------


def run_sweep(kind: str, plan: Plan, seed: int, log=print) -> dict[str, Any]:
    d = plan.sweep_defaults
    points = []
    over_requests = kind.startswith("requests")
    values = {"requests": plan.request_sweep, "workers": plan.worker_sweep,
              "requests-adversarial": plan.adversarial_sweep}[kind]
    extra = {"horde": "adversarial"} if kind == "requests-adversarial" else {}
    for v in values:
        workers, requests = (plan.request_sweep_workers, v) if over_requests else (v, plan.worker_sweep_requests)
        points.append(run_size(Size(f"{kind}-sweep", workers, requests, **d, **extra), seed=seed, log=log))
    # Fit against what the estimator actually gets: waiting requests (or workers).
    x = [p.get("waiting") if over_requests else p["workers"] for p in points]
    fits = {name: fit_exponent(x, ys) for name, ys in series(points).items()}
    fixed = {"workers": plan.request_sweep_workers} if over_requests else {"requests": plan.worker_sweep_requests}
    return {"over": kind, "fixed": fixed, "x": x, "points": points, "fits": fits}


# ---------------------------------------------------------------------------------
# The machine, and the run
# ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import pandas
    import vecsched  # noqa: F401 - its version/commit is what was measured

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pandas": pandas.__version__,
        "cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                               "OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        "load_average": os.getloadavg(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            models = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        info["cpu"] = models[0] if models else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            info["memory_bytes"] = int(fh.readline().split()[1]) * 1024
    except OSError:
        pass
    try:
        info["blas"] = [
            f"{c.get('internal_api', '?')} {c.get('version', '')} ({c.get('threading_layer', '')}, "
            f"{c.get('num_threads', '?')} threads, {c.get('architecture', '')})"
            for c in __import__("threadpoolctl").threadpool_info()
        ]
    except Exception:  # threadpoolctl is optional
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "vecsched"], cwd=ROOT, capture_output=True, text=True)
        info["git_commit"] = commit.stdout.strip()
        info["vecsched_dirty"] = bool(dirty.stdout.strip())
    except OSError:
        pass
    return info


def run(mode: str, out_dir: Path, seed: int = 0, readme: bool | None = None, log=print) -> dict[str, Any]:
    """Run a whole mode; write ``<out_dir>/<mode>.json`` and ``.png`` (and the README for full)."""
    from . import report

    plan = PLANS[mode]
    started = time.perf_counter()
    results: dict[str, Any] = {
        "format": "vecsched.benchmarks/1",
        "mode": mode,
        "command": "python -m benchmarks" + ("" if mode == "full" else f" --mode {mode}"),
        "seed": seed,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "sizes": {},
    }
    for size in plan.sizes:
        results["sizes"][size.name] = run_size(size, seed=seed, log=log)
    kinds = ("requests", "workers") + (("requests-adversarial",) if plan.adversarial_sweep else ())
    results["sweeps"] = {kind: run_sweep(kind, plan, seed, log=log) for kind in kinds}
    if plan.service:
        results["service"] = run_service(2_000, 50_000, log=log)
        results["publish"] = run_publish(300_000, log=log)
    results["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results["elapsed_s"] = time.perf_counter() - started
    results["machine"]["load_average_end"] = os.getloadavg()
    results["targets"] = report.targets(results)
    results["far_from_floor"] = report.far_from_floor(results)

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{mode}.json"
    json_path.write_text(json.dumps(results, indent=1, default=_jsonable) + "\n", encoding="utf-8")
    png_path = out_dir / f"{mode}.png"
    report.plot(results, png_path)
    if readme if readme is not None else mode == "full":
        report.write_readme(results, HERE / "README.md", png_path)
    log(f"wrote {json_path} and {png_path} in {results['elapsed_s']:.0f} s")
    return results


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON: {type(value)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=sorted(PLANS), default="full")
    ap.add_argument("--quick", action="store_const", const="quick", dest="mode", help="same as --mode quick")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="directory for <mode>.json and <mode>.png")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--readme", action=argparse.BooleanOptionalAction, default=None,
                    help="rewrite the generated table of benchmarks/README.md (default: full mode only)")
    args = ap.parse_args(argv)
    run(args.mode, args.out, seed=args.seed, readme=args.readme, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    main()
