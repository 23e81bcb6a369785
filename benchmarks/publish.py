"""Measure publishing one cycle's payloads to Redis, two ways side by side.

Usage::

    python -m benchmarks.publish --requests 300000 [--rounds 5] [--redis redis://127.0.0.1:6379/0]

Payloads come from :func:`vecsched.service.payload.encode_payloads` on random
figures (their encoding is timed too). Each round publishes the same cycle
with, in turn:

* ``per-request``: one hash field per request (``RedisStore(bucketed=False)``):
  a pipeline of ``HSET key mapping=...`` of 5,000 fields each;
* ``bucketed``: what :class:`~vecsched.service.store.redis.RedisStore` does by
  default, 16 requests per field (:mod:`vecsched.service.store.buckets`), through
  the same redis-py pipeline.

It prints one JSON document: medians of wall time, of Redis's own time in
HSET (``INFO commandstats``), of this process's CPU time, the ratios to ``per-request``, and the latency of a
status read from the per-request and the bucketed layouts (alternated). Everything runs
under a throwaway key prefix, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import time
from types import SimpleNamespace

import numpy as np

from vecsched.core.result import BOOL_FIELDS, INT_FIELDS
from vecsched.service.payload import encode_payloads
from vecsched.service.store.base import Cycle
from vecsched.service.store.redis import RedisStore


def fake_estimates(n: int, seed: int = 0) -> SimpleNamespace:
    """Estimates-shaped columns with plausible random figures for ``n`` requests."""
    rng = np.random.default_rng(seed)
    cols: dict[str, np.ndarray] = {f: rng.integers(0, 5000, n) for f in INT_FIELDS}
    cols.update({f: rng.random(n) < 0.5 for f in BOOL_FIELDS})
    for name in ("wait_time", "ahead_wait", "horde_wait_time"):
        values = rng.lognormal(4, 2, n)
        values[rng.random(n) < 0.05] = np.nan
        cols[name] = values
    cols["gentype"] = rng.integers(0, 2, n).astype(np.int8)
    ids = np.array([f"{secrets.token_hex(4)}-{k:08d}-4c1e-9a4b-{secrets.token_hex(6)}" for k in range(n)], dtype=object)
    return SimpleNamespace(request_id=ids, columns=cols)


def _read_latency(stores: dict[str, RedisStore], ids: list[str], n: int) -> dict[str, dict[str, float]]:
    """p50 and p99 of one status read (one EVALSHA) per layout, reads alternated between layouts."""
    rng = np.random.default_rng(1)
    picks = [ids[k] for k in rng.integers(0, len(ids), n)]
    lat: dict[str, list[float]] = {k: [] for k in stores}
    for rid in picks[:200]:
        for store in stores.values():
            store.read_status(rid)
    for rid in picks:
        for name, store in stores.items():
            t = time.perf_counter()
            store.read_status(rid)
            lat[name].append((time.perf_counter() - t) * 1000)
    return {
        k: {"p50": round(statistics.median(v), 4), "p99": round(sorted(v)[int(0.99 * (len(v) - 1))], 4)}
        for k, v in lat.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reads", type=int, default=5000, help="status reads per layout, alternated")
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = ap.parse_args()
    est = fake_estimates(args.requests)
    t = time.perf_counter()
    ids, payloads = encode_payloads(est, 1764417600.0)
    encode_s = time.perf_counter() - t
    prefix = "vs-bench-publish-" + secrets.token_hex(4)
    stores = {
        "per-request": RedisStore(args.redis, prefix=prefix + "-a", bucketed=False),
        "bucketed": RedisStore(args.redis, prefix=prefix + "-b"),
    }
    wall: dict[str, list[float]] = {k: [] for k in stores}
    server: dict[str, list[float]] = {k: [] for k in stores}
    cpu: dict[str, list[float]] = {k: [] for k in stores}
    try:
        for k in range(args.rounds):
            cycle = Cycle(1764417600.0 + k, 5.0, ids, payloads)
            for name, store in stores.items():
                store.client.delete(f"{store.prefix}:c:{cycle.id}:s")
                before = store.client.info("commandstats").get("cmdstat_hset", {}).get("usec", 0)
                t, c = time.perf_counter(), time.process_time()
                store.publish(cycle)
                wall[name].append(time.perf_counter() - t)
                cpu[name].append(time.process_time() - c)
                after = store.client.info("commandstats").get("cmdstat_hset", {}).get("usec", 0)
                server[name].append((after - before) / 1e6)
            got = stores["bucketed"].read_status(ids[len(ids) // 2])
            assert got is not None and got.value == payloads[len(ids) // 2], "bucketed read disagrees"
        reads = _read_latency(stores, ids, args.reads)
    finally:
        for store in stores.values():
            store.drop_all()
            store.close()
    base = statistics.median(wall["per-request"])
    out = {
        "requests": args.requests,
        "rounds": args.rounds,
        "encode_s": round(encode_s, 4),
        "publish_s": {k: round(statistics.median(v), 4) for k, v in wall.items()},
        "redis_hset_s": {k: round(statistics.median(v), 4) for k, v in server.items()},
        # CPU time of this process: what contention for the cores does not inflate.
        "client_cpu_s": {k: round(statistics.median(v), 4) for k, v in cpu.items()},
        "speedup_vs_per_request": {k: round(base / statistics.median(v), 2) for k, v in wall.items()},
        "status_read_ms": reads,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
