"""The SQL load alone (``load_horde``), for one checkout or two side by side, on one horde in PostgreSQL.

Usage::

    python -m benchmarks.load_versus /work/main /work/wt/load --workers 2000 --requests 50000 --rounds 7

The synthetic horde is imported once into a throwaway PostgreSQL schema
(removed at the end) and every tree reads those same tables, each in its own
subprocess (``PYTHONPATH`` = the tree), the trees taking turns. A turn is
``--loads`` loads; it reports the fastest and the median wall time, and the
process CPU time per load (what the client spends: parsing, judging, building
the snapshot), which a shared machine disturbs less than wall time. The first
load of each child (a cold cycle: statements compiled, types probed) is
reported apart as ``first_s``. ``--fast no`` times the generic path.

Prints one JSON document: per tree the medians over turns, and with two
trees the ratios AFTER over BEFORE.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys

if __package__ in (None, ""):  # run as a file (python benchmarks/X.py): the checkout is the package root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.sidebyside import take_turns  # noqa: E402

_CHILD = r"""
import json, statistics, sys, time
from vecsched.service import sql as _sql
from vecsched.service.sql import load_horde

url, now, loads, fast = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "yes"
engine = _sql.make_engine(url)
t = time.perf_counter()
snap = load_horde(engine, now, fast=fast)
print(json.dumps({"first_s": time.perf_counter() - t, "requests": len(snap.requests),
                  "rejected": len(snap.rejected)}), flush=True)
for line in sys.stdin:
    wall, cpu = [], []
    for _ in range(loads):
        t, c = time.perf_counter(), time.process_time()
        load_horde(engine, now, fast=fast)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    print(json.dumps({"best": min(wall), "median": statistics.median(wall), "cpu": statistics.median(cpu)}),
          flush=True)
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.load_versus", description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", help="one checkout (default: this one), or BEFORE and AFTER")
    ap.add_argument("--workers", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=50000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loads", type=int, default=3, help="loads per turn")
    ap.add_argument("--fast", choices=("yes", "no"), default="yes", help="no: the generic path")
    args = ap.parse_args(argv)
    import sqlalchemy as sa

    from vecsched.service import sql as _sql
    from vecsched.synthetic import horde

    schema = "vs_bench_" + secrets.token_hex(4)
    admin = sa.create_engine(args.db)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = f"{args.db}{'&' if '?' in args.db else '?'}options=-csearch_path%3D{schema}"
        snap = horde(workers=args.workers, requests=args.requests, seed=args.seed)
        _sql.import_snapshot(_sql.make_engine(url), snap)
        trees = dict(zip(["before", "after"], args.trees)) if len(args.trees) == 2 else {"tree": (args.trees or ["."])[0]}
        ready, turns = take_turns(trees, _CHILD, [url, repr(snap.now), str(args.loads), args.fast], args.rounds)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    out: dict = {"workers": args.workers, "requests": args.requests, "rounds": args.rounds, "loads": args.loads,
                 "fast": args.fast}
    for name, tree in trees.items():
        out[name] = {"tree": tree, **ready[name],
                     **{f"{k}_s": round(statistics.median(t[k] for t in turns[name]), 4) for k in ("best", "median", "cpu")}}
    if len(trees) == 2:
        out["after_over_before"] = {f"{k}_s": round(out["after"][f"{k}_s"] / out["before"][f"{k}_s"], 3)
                                    for k in ("first", "best", "median", "cpu")}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
