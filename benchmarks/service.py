"""Measure the service path: import, one cycle (load / estimate / publish), status reads.

Usage::

    python benchmarks/service.py --workers 2000 --requests 50000 \\
        --db postgresql+psycopg://postgres@127.0.0.1:5432/test --redis redis://127.0.0.1:6379/0
    python benchmarks/service.py --workers 2000 --requests 50000 --db sqlite:///bench.sqlite

PostgreSQL runs in a throwaway schema and Redis under a throwaway key prefix;
both are removed at the end. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import time

import numpy as np
import sqlalchemy as sa

from vecsched.service import sql as _sql
from vecsched.service.job import SQLLoader, run_cycle
from vecsched.service.store.redis import RedisStore
from vecsched.service.store.sql import SQLStore
from vecsched.service.read import status
from vecsched.synthetic import horde


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=50000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="'' to publish into the database")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--reads", type=int, default=20000)
    args = ap.parse_args()

    url, schema = args.db, None
    if url.startswith("postgresql"):
        schema = "vs_bench_" + secrets.token_hex(4)
        with sa.create_engine(url).begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        url = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    store = RedisStore(args.redis, prefix="vs-bench-" + secrets.token_hex(4)) if args.redis else SQLStore(url)
    out: dict = {"workers": args.workers, "requests": args.requests, "db": args.db.split("://")[0],
                 "store": type(store).__name__}
    try:
        t = time.perf_counter()
        snap = horde(workers=args.workers, requests=args.requests, seed=args.seed)
        out["synthesize_s"] = round(time.perf_counter() - t, 3)
        engine = _sql.make_engine(url)
        t = time.perf_counter()
        _sql.import_snapshot(engine, snap)
        out["import_s"] = round(time.perf_counter() - t, 3)
        loader = SQLLoader(engine)
        cycles = []
        for k in range(args.cycles):
            report = run_cycle(loader, store, lambda: snap.now + k, interval=5.0)
            assert report.ok, report.error
            cycles.append({"load_s": round(report.load, 3), "estimate_s": round(report.estimate, 3),
                           "publish_s": round(report.publish, 3), "published": report.published,
                           "rejected": len(report.rejected)})
        out["cycles"] = cycles
        ids = list(snap.requests.id)
        rng = np.random.default_rng(0)
        picks = [ids[i] for i in rng.integers(0, len(ids), args.reads)]
        now = snap.now + args.cycles
        for rid in picks[:200]:  # warm up the connection and the script cache
            status(rid, store=store, now=now)
        lat = []
        for rid in picks:
            t = time.perf_counter()
            status(rid, store=store, now=now)
            lat.append(time.perf_counter() - t)
        lat_ms = sorted(x * 1000 for x in lat)
        out["status_read_ms"] = {
            "n": len(lat_ms),
            "p50": round(statistics.median(lat_ms), 4),
            "p99": round(lat_ms[int(0.99 * (len(lat_ms) - 1))], 4),
            "max": round(lat_ms[-1], 4),
        }
        if isinstance(store, RedisStore):
            meta = store.read_meta()
            key = f"{store.prefix}:c:{meta.cycle_id}:s"
            out["redis_hash_bytes"] = store.client.memory_usage(key)
    finally:
        if isinstance(store, RedisStore):
            store.drop_all()
        if schema:
            with sa.create_engine(args.db).begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
