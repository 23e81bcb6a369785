"""The adversarial horde: every request names a random set of 2 to 5 models.

Realistic queues name one model mostly; a request naming several is nearly
always a unique set, so eligibility and competition groups stop repeating.
This horde takes :func:`vecsched.synthetic.horde` and gives every request a
set of 2 to 5 distinct models drawn uniformly from those its gentype's workers
serve: the shape that costs vecsched the most per request.

Usage (one size, JSON of the estimate's stages)::

    python -m benchmarks.adversarial --workers 2000 --requests 50000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

import vecsched
from vecsched.snapshot.snapshot import ListColumn, Snapshot, Table
from vecsched.synthetic import horde

CANDIDATES = 8  # draws per request; the first k distinct ones are kept


def adversarial_horde(workers: int, requests: int, seed: int = 0) -> Snapshot:
    """The synthetic horde of that size and seed, every request naming 2 to 5 random served models.

    Examples
    --------
    >>> snap = adversarial_horde(workers=40, requests=200, seed=1)
    >>> sizes = snap.requests.models.lengths
    >>> int(sizes.min()) >= 2 and int(sizes.max()) <= 5
    True
    """
    snap = horde(workers=workers, requests=requests, seed=seed)
    rng = np.random.default_rng(seed + 1)
    w, r = snap.workers, snap.requests
    n = len(r)
    want = rng.integers(2, 6, size=n)
    draws = np.zeros((n, CANDIDATES), dtype=np.int64)
    for gentype in np.unique(r.gentype):
        served = np.unique(w.models.values[np.repeat(w.gentype == gentype, w.models.lengths)])
        rows = np.flatnonzero(r.gentype == gentype)
        draws[rows] = served[rng.integers(0, len(served), size=(len(rows), CANDIDATES))]
    repeat = np.zeros_like(draws, dtype=bool)
    for j in range(1, CANDIDATES):
        repeat[:, j] = (draws[:, :j] == draws[:, j : j + 1]).any(axis=1)
    rank = np.cumsum(~repeat, axis=1) - 1
    keep = ~repeat & (rank < want[:, None])
    offsets = np.r_[0, np.cumsum(keep.sum(axis=1))].astype(np.int64)
    models = ListColumn(offsets, draws[keep].astype(r.models.values.dtype))
    requests_table = Table(r.name, {**r.columns, "models": models})
    return dataclasses.replace(snap, requests=requests_table)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=50000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    snap = adversarial_horde(args.workers, args.requests)
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        est = vecsched.estimate(snap)
        runs.append({"total": time.perf_counter() - t, **est.timings})
    print(json.dumps({"workers": args.workers, "requests": args.requests, "runs": runs, "groups": est.groups}, indent=1))


if __name__ == "__main__":
    main()
