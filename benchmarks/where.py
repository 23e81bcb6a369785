"""Where does ``vecsched.estimate`` spend its time and its memory? A sampling probe.

Usage::

    python -m benchmarks.where --workers 20000 --requests 200000 [--interval 0.02]

A background thread samples, every ``interval`` seconds, the process's RSS and
the vecsched function the main thread is in (innermost frame under
``vecsched/``, with its line). It prints, per function, the share of samples
(time) and the highest RSS seen there (memory), and the stack at the peak.
Sampling costs little, so the figures are close to an unprobed run.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

import vecsched
from vecsched.synthetic import horde

PACKAGE = str(Path(vecsched.__file__).resolve().parent)


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * 4096


def _where(frame) -> tuple[str, list[str]]:
    stack = traceback.extract_stack(frame)
    mine = [f for f in stack if f.filename.startswith(PACKAGE)]
    if not mine:
        return "(outside vecsched)", []
    inner = mine[-1]
    return f"{Path(inner.filename).name}:{inner.name}", [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in mine]


def probe(workers: int, requests: int, seed: int = 0, interval: float = 0.02) -> dict:
    """Run one estimate under the sampler; return samples per function, peak RSS per function, peak stack."""
    snap = horde(workers=workers, requests=requests, seed=seed)
    main = threading.main_thread().ident
    samples: Counter[str] = Counter()
    peak_by: dict[str, int] = {}
    peak = {"rss": 0, "stack": []}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            frame = sys._current_frames().get(main)
            if frame is not None:
                name, stack = _where(frame)
                rss = _rss()
                samples[name] += 1
                peak_by[name] = max(peak_by.get(name, 0), rss)
                if rss > peak["rss"]:
                    peak.update(rss=rss, stack=stack)
            time.sleep(interval)

    base = _rss()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    est = vecsched.estimate(snap)
    elapsed = time.perf_counter() - start
    done.set()
    thread.join()
    return {"elapsed_s": elapsed, "timings": est.timings, "rss_before": base, "samples": samples,
            "peak_by": peak_by, "peak": peak}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=50000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interval", type=float, default=0.02)
    args = ap.parse_args(argv)
    r = probe(args.workers, args.requests, args.seed, args.interval)
    total = sum(r["samples"].values()) or 1
    print(f"estimate {r['elapsed_s']:.2f} s; stages " + ", ".join(f"{k} {v:.2f}" for k, v in r["timings"].items()))
    print(f"RSS before {r['rss_before'] / 2**30:.2f} GiB, peak {r['peak']['rss'] / 2**30:.2f} GiB")
    print(f"{'function':<45} {'time':>6} {'peak RSS':>10}")
    for name, n in r["samples"].most_common(20):
        print(f"{name:<45} {n / total:>6.0%} {r['peak_by'][name] / 2**30:>8.2f} GiB")
    print("stack at the peak:\n  " + "\n  ".join(r["peak"]["stack"]))


if __name__ == "__main__":
    main()
