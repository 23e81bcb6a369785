"""The job's cycle on PostgreSQL + Redis, stage by stage, for one checkout or two side by side.

Usage::

    python -m benchmarks.service [BEFORE_TREE] AFTER_TREE --workers 2000 --requests 50000 --rounds 5
    python -m benchmarks.service --workers 2000 --requests 50000 --db sqlite:///bench.sqlite --redis ''

Each tree runs in its own subprocess (``PYTHONPATH`` = the tree) with its own
throwaway PostgreSQL schema and Redis key prefix (both removed at the end),
imports the same synthetic horde (with five minutes of dispatch and return history,
:func:`vecsched.synthetic_history.with_history`, as a production cycle always has;
``--no-history`` leaves it out) and runs :func:`vecsched.service.job.run_cycle`
once per turn, the trees taking turns. The estimate forecasts only the
``--new-share`` of requests (1%: the job records a request's forecasts once,
so in steady state only new requests are forecast). Stages per cycle:

* ``load``: the SQL load (:class:`~vecsched.service.job.SQLLoader`);
* ``spec_3_6``: the estimate's prepare, horde, eligibility, competition and figures;
* ``stall``: might_stall (SPEC 7); ``forecasts``: compatible-queue-v1 and eligible-share-v1;
* ``job``: the rest of the estimate step: ``prospective`` state, payload ``encode``, ``ended``
  requests' markers, and what lies between;
* ``publish``: the store write;
* ``cycle_spec_3_6``: load + spec_3_6 + job + publish (issue 14: under 0.5 s);
* ``cycle``: the whole cycle, stall and forecasts included (under 1 s).

Prints one JSON document: per tree the median of each stage (and with one
tree, status read latencies); with two, the ratio of each median, AFTER over BEFORE.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

if __package__ in (None, ""):  # run as a file (python benchmarks/X.py): the checkout is the package root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.sidebyside import take_turns  # noqa: E402

_CHILD = r"""
import functools, inspect, json, secrets, statistics, sys, time
import numpy as np
import sqlalchemy as sa
import vecsched
from vecsched.service import job
from vecsched.service import sql as _sql
from vecsched.service.read import status
from vecsched.service.store.redis import RedisStore
from vecsched.service.store.sql import SQLStore
from vecsched.synthetic import horde
from vecsched.synthetic_history import with_history
from benchmarks.report import STAGES as SPEC_STAGES
INTERVAL = 5.0  # the job's default refresh interval

workers, requests, seed, db, redis_url, new_share, history, stall_refresh = sys.argv[1:9]
url, schema = db, None
if url.startswith("postgresql"):
    schema = "vs_bench_" + secrets.token_hex(4)
    with sa.create_engine(url).begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
store = RedisStore(redis_url, prefix="vs-bench-" + secrets.token_hex(4)) if redis_url else SQLStore(url)
spent = {}

def timed(name, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
    return wrapper

try:
    t = time.perf_counter()
    snap = horde(workers=int(workers), requests=int(requests), seed=int(seed))
    if history == "history":  # might_stall reads the last five minutes' pops and returns
        snap = with_history(snap, seed=int(seed))
    synthesize = time.perf_counter() - t
    engine = _sql.make_engine(url)
    t = time.perf_counter()
    _sql.import_snapshot(engine, snap)
    imported = time.perf_counter() - t
    loader = job.SQLLoader(engine)
    ids = snap.requests.id
    skip = ids[: int(len(ids) * (1.0 - float(new_share)))]
    timings = {}

    @functools.wraps(vecsched.estimate)  # its signature: the job's stall refresh sees what it may pass
    def estimate(snapshot, **kwargs):
        est = vecsched.estimate(snapshot, forecast_skip=skip, **kwargs)
        timings.update(est.timings)
        return est

    # The job's own section 7 refresh (a request's sums once a minute of its age), where the tree has it.
    kept = {}
    if "stall" in inspect.signature(job.run_cycle).parameters:
        from vecsched.service.stall_refresh import StallRefresh
        kept = {"stall": StallRefresh(float(stall_refresh))}
    for name in ("build_prospective_state", "encode_payloads", "ended_requests"):
        setattr(job, name, timed(name, getattr(job, name)))
    job.run_cycle(loader, store, lambda: snap.now, interval=INTERVAL, estimate=estimate, **kept)  # cold, not counted
    print(json.dumps({"synthesize_s": synthesize, "import_s": imported}), flush=True)
    cycle = 0
    for line in sys.stdin:
        cycle += 1
        if line.strip() == "reads":
            rng = np.random.default_rng(0)
            picks = [ids[i] for i in rng.integers(0, len(ids), 5000)]
            for rid in picks[:200]:  # warm up the connection and the script cache
                status(rid, store=store, now=snap.now + INTERVAL * (cycle - 1))
            lat = []
            for rid in picks:
                t = time.perf_counter()
                status(rid, store=store, now=snap.now + INTERVAL * (cycle - 1))
                lat.append((time.perf_counter() - t) * 1000)
            lat.sort()
            out = {"status_read_ms": {"n": len(lat), "p50": statistics.median(lat), "p99": lat[int(0.99 * (len(lat) - 1))]}}
            if isinstance(store, RedisStore):
                out["redis_hash_bytes"] = store.client.memory_usage(f"{store.prefix}:c:{store.read_meta().cycle_id}:s")
            print(json.dumps(out), flush=True)
            continue
        spent.clear()
        timings.clear()
        # The job's cadence: each cycle one interval after the last, on the same rows (no arrivals).
        report = job.run_cycle(loader, store, lambda: snap.now + INTERVAL * cycle, interval=INTERVAL,
                               estimate=estimate, **kept)
        assert report.ok, report.error
        in_estimate = sum(timings.values())
        spec = sum(timings.get(k, 0.0) for k in SPEC_STAGES)
        rest = report.estimate - in_estimate
        figures = {"load": report.load, "spec_3_6": spec, "stall": timings.get("stall", 0.0),
                   "forecasts": timings.get("forecasts", 0.0), "job": rest, "publish": report.publish,
                   "prospective": spent.get("build_prospective_state", 0.0),
                   "encode": spent.get("encode_payloads", 0.0), "ended": spent.get("ended_requests", 0.0)}
        figures["cycle_spec_3_6"] = report.load + spec + rest + report.publish
        figures["cycle"] = report.load + report.estimate + report.publish
        figures["published"] = report.published
        print(json.dumps(figures), flush=True)
finally:
    if isinstance(store, RedisStore):
        store.drop_all()
    if schema:
        with sa.create_engine(db).begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
"""
STAGES = ("load", "spec_3_6", "stall", "forecasts", "job", "prospective", "encode", "ended", "publish",
          "cycle_spec_3_6", "cycle")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.service", description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", help="one checkout (default: this one), or BEFORE and AFTER")
    ap.add_argument("--workers", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=50000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="'' to publish into the database")
    ap.add_argument("--rounds", "--cycles", type=int, default=3, dest="rounds")
    ap.add_argument("--new-share", type=float, default=0.01, help="share of requests not yet forecast")
    ap.add_argument("--stall-refresh", type=float, default=60.0,
                    help="the job's --stall-refresh (default 60; 0: every request's might_stall sums every cycle)")
    ap.add_argument("--history", action=argparse.BooleanOptionalAction, default=True,
                    help="five minutes of dispatch and return history in the horde (default: yes)")
    args = ap.parse_args(argv)
    trees = dict(zip(["before", "after"], args.trees)) if len(args.trees) == 2 else {"tree": (args.trees or ["."])[0]}
    child_args = [str(args.workers), str(args.requests), str(args.seed), args.db, args.redis, str(args.new_share),
                  "history" if args.history else "none", str(args.stall_refresh)]
    ready, turns = take_turns(trees, _CHILD, child_args, args.rounds, finish="reads" if len(trees) == 1 else None)
    out: dict = {"workers": args.workers, "requests": args.requests, "db": args.db.split("://")[0],
                 "store": "redis" if args.redis else "sql", "rounds": args.rounds, "new_share": args.new_share,
                 "history": args.history, "stall_refresh": args.stall_refresh}
    for name, tree in trees.items():
        cycles = [t for t in turns[name] if "load" in t]
        medians = {f"{k}_s": round(statistics.median(c[k] for c in cycles), 4) for k in STAGES}
        extra = [t for t in turns[name] if "load" not in t]
        out[name] = {"tree": tree, **{k: round(v, 3) for k, v in ready[name].items()}, **medians,
                     "cycles": cycles, **(extra[0] if extra else {})}
    if len(trees) == 2:
        out["after_over_before"] = {f"{k}_s": round(out["after"][f"{k}_s"] / out["before"][f"{k}_s"], 3)
                                    for k in STAGES if out["before"][f"{k}_s"] > 0}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
