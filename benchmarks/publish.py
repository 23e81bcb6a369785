"""Measure publishing one cycle's payloads to Redis, two ways side by side.

Usage::

    python -m benchmarks.publish --requests 300000 [--rounds 5] [--redis redis://127.0.0.1:6379/0]

Payloads come from :func:`vecsched.service.payload.encode_payloads` on random
figures. Each round encodes and publishes the same figures as a new cycle
with, in turn:

* ``per-request``: one hash field per request (``RedisStore(bucketed=False)``):
  a pipeline of ``HSET key mapping=...`` of 5,000 fields each;
* ``bucketed``: what :class:`~vecsched.service.store.redis.RedisStore` does by
  default, many requests per Redis value: one string per cycle
  (:mod:`vecsched.service.store.packed`) where the tree has it, else the hash
  of 16 requests per field (before the packed layout). The name stays for
  ``benchmarks.report``, which reads it.

It prints one JSON document: medians of wall time of ``publish`` (``encode``,
:func:`encode_payloads`, plus ``write``, :meth:`RedisStore.publish`; the
payload bytes are formatted inside the write), of Redis's own
time in HSET and in every command of the publication (``redis_s``: HSET, SET,
the write script, EXPIRE, the switch; ``INFO commandstats``), of the Redis
server's whole CPU time over the publication (``redis_cpu_s``, ``INFO cpu``:
commands plus reading the socket, parsing and freeing), of this process's CPU
time, of building the default layout's bytes alone (no Redis), the ratios to
``per-request``, and the latency of a status read from the per-request and the
default layouts (alternated) with Redis's own time per read
(``EVALSHA``, ``INFO commandstats``; ``redis_us`` the least of ten blocks of
reads, layouts alternated, ``redis_us_median`` their median). The first tree may be an older one: the
script uses whatever layout its ``vecsched`` has. Everything runs under a
throwaway key prefix, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
from collections import defaultdict
import time
from types import SimpleNamespace

import numpy as np

from vecsched.core.result import BOOL_FIELDS, FLOAT_FIELDS, INT_FIELDS
from vecsched.core.stall import EVIDENCE
from vecsched.service.payload import encode_payloads
from vecsched.service.store.base import Cycle
from vecsched.service.store.redis import RedisStore

try:
    from vecsched.service.store.packed import pack_status

    def _build(ids: list[str], payloads) -> None:
        for _ in pack_status(ids, payloads)[1]:
            pass
except ImportError:  # a tree before the packed layout
    from vecsched.service.store.buckets import bucket_fields as _build


def fake_estimates(n: int, seed: int = 0) -> SimpleNamespace:
    """Estimates-shaped columns with plausible random figures for ``n`` requests (every FIELDS entry)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, np.ndarray] = {f: rng.integers(0, 5000, n) for f in INT_FIELDS}
    cols.update({f: rng.random(n) < 0.5 for f in BOOL_FIELDS})
    for name in FLOAT_FIELDS:
        values = rng.lognormal(4, 2, n)
        values[rng.random(n) < 0.05] = np.nan
        cols[name] = values
    cols["gentype"] = rng.integers(0, 2, n).astype(np.int8)
    cols["stall_evidence"] = rng.integers(-1, len(EVIDENCE), n).astype(np.int8)
    ids = np.array([f"{secrets.token_hex(4)}-{k:08d}-4c1e-9a4b-{secrets.token_hex(6)}" for k in range(n)], dtype=object)
    return SimpleNamespace(request_id=ids, columns=cols)


def _read_latency(stores: dict[str, RedisStore], ids: list[str], n: int) -> dict[str, dict[str, float]]:
    """p50 and p99 of one status read (one EVALSHA) per layout, reads alternated between layouts,
    and Redis's own time per read (each layout's reads in a run of their own)."""
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
    # Redis's time per read: blocks of reads, layouts alternated; the least block is the least disturbed
    server: dict[str, list[float]] = {k: [] for k in stores}
    block = max(1, len(picks) // 10)
    for start in range(0, len(picks), block):
        for name, store in stores.items():
            before = _server_usec(store)["cmdstat_evalsha"]
            for rid in picks[start : start + block]:
                store.read_status(rid)
            server[name].append((_server_usec(store)["cmdstat_evalsha"] - before) / len(picks[start : start + block]))
    return {
        k: {"p50": round(statistics.median(v), 4), "p99": round(sorted(v)[int(0.99 * (len(v) - 1))], 4),
            "redis_us": round(min(server[k]), 2), "redis_us_median": round(statistics.median(server[k]), 2)}
        for k, v in lat.items()
    }


def _round(store: RedisStore, est: SimpleNamespace, cycle_time: float) -> dict[str, float]:
    """One cycle encoded and published to ``store``: wall times, this process's CPU, Redis's HSET time."""
    before, cpu_before = _server_usec(store), _server_cpu(store)
    t0, c0 = time.perf_counter(), time.process_time()
    ids, payloads = encode_payloads(est, cycle_time)
    t1 = time.perf_counter()
    store.publish(Cycle(cycle_time, 5.0, ids, payloads))
    t2, c2 = time.perf_counter(), time.process_time()
    after, cpu_after = _server_usec(store), _server_cpu(store)
    return {"encode_s": t1 - t0, "write_s": t2 - t1, "publish_s": t2 - t0, "client_cpu_s": c2 - c0,
            "redis_hset_s": (after["cmdstat_hset"] - before["cmdstat_hset"]) / 1e6,
            "redis_s": sum(after[k] - before[k] for k in after) / 1e6,
            "redis_cpu_s": cpu_after - cpu_before}


def _server_cpu(store: RedisStore) -> float:
    """The Redis server's CPU time so far (user + system, every thread; ``INFO cpu``)."""
    cpu = store.client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def _server_usec(store: RedisStore) -> dict[str, int]:
    """Redis's own time per command so far (``INFO commandstats``), INFO itself left out."""
    stats = store.client.info("commandstats")
    return defaultdict(int, {k: v["usec"] for k, v in stats.items() if k != "cmdstat_info"})


def _build_time(est: SimpleNamespace, cycle_time: float) -> float:
    """Wall time of making the default layout's bytes alone (formatting included), no Redis."""
    ids, payloads = encode_payloads(est, cycle_time)
    t = time.perf_counter()
    _build(ids, payloads)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reads", type=int, default=5000, help="status reads per layout, alternated")
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = ap.parse_args()
    est = fake_estimates(args.requests)
    prefix = "vs-bench-publish-" + secrets.token_hex(4)
    stores = {
        "per-request": RedisStore(args.redis, prefix=prefix + "-a", bucketed=False),
        "bucketed": RedisStore(args.redis, prefix=prefix + "-b"),
    }
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in stores}
    fields: list[float] = []
    try:
        for k in range(args.rounds):
            cycle_time = 1764417600.0 + k
            for name, store in stores.items():
                rounds[name].append(_round(store, est, cycle_time))
            fields.append(_build_time(est, cycle_time))
            ids, payloads = encode_payloads(est, cycle_time)
            for k in (0, len(ids) // 2, len(ids) - 1):
                got = stores["bucketed"].read_status(ids[k])
                assert got is not None and got.value == payloads[k], "bucketed (default) layout's read disagrees"
        ids = encode_payloads(est, 0.0)[0]
        reads = _read_latency(stores, ids, args.reads)
    finally:
        for store in stores.values():
            store.drop_all()
            store.close()

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[key] for r in rounds[name]), 4)

    keys = ("publish_s", "write_s", "client_cpu_s", "redis_hset_s", "redis_s", "redis_cpu_s")
    out = {
        "requests": args.requests,
        "rounds": args.rounds,
        # publish = encode (encode_payloads, the same for both layouts) + write (RedisStore.publish);
        # medians over rounds
        "encode_s": median("bucketed", "encode_s"),
        **{key: {name: median(name, key) for name in stores} for key in keys},
        "build_s": round(statistics.median(fields), 4),
        "speedup_vs_per_request": {name: round(median("per-request", "publish_s") / median(name, "publish_s"), 2)
                                   for name in stores},
        "status_read_ms": reads,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
