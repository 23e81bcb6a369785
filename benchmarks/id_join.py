"""Ways to find request rows for a few ids among a million (prepare's excluded pairs and jobs).

Usage::

    python benchmarks/id_join.py --requests 1000000 --lookups 50000 --rounds 3

``_prepare`` (vecsched/core/estimate.py) hashes every request id once (``pd.Index``) and looks the
excluded pairs' and jobs' request ids up in it. docs/speed.md listed a sorted ``searchsorted`` join
as a way to drop that hash build. This measures, on the same UUID-shaped ids in one process, one
way after the other in every round: the hash of all ids (what prepare does), the hash of the looked
up ids probed by all ids (the smaller table), and sorted joins on the object ids and on fixed-width
bytes. Prints one JSON object with the best round of each, in seconds.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

import numpy as np
import pandas as pd


def _hash_all(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    return pd.Index(ids).get_indexer(wanted)


def _hash_wanted(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    unique_wanted, back = np.unique(wanted, return_inverse=True)
    hit = pd.Index(unique_wanted).get_indexer(ids)
    rows = np.full(len(unique_wanted), -1, dtype=np.int64)
    found = np.flatnonzero(hit >= 0)
    rows[hit[found]] = found
    return rows[back]


def _sorted_join(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    order = np.argsort(ids)
    at = np.minimum(np.searchsorted(ids[order], wanted), len(ids) - 1)
    rows = order[at]
    return np.where(ids[rows] == wanted, rows, -1)


def _sorted_join_bytes(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    return _sorted_join(ids.astype(np.bytes_), wanted.astype(np.bytes_))


WAYS = {
    "hash_all_ids": _hash_all,
    "hash_looked_up_ids": _hash_wanted,
    "sorted_join_object": _sorted_join,
    "sorted_join_fixed_bytes": _sorted_join_bytes,
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    ids = np.array([str(uuid.UUID(int=int(v))) for v in rng.integers(0, 2**63, args.requests)], dtype=object)
    # A few ids no request has (a pair or job of a request that has left) must come back as -1.
    absent = np.array([str(uuid.UUID(int=2**64 + i)) for i in range(max(1, args.lookups // 100))], dtype=object)
    wanted = np.concatenate([ids[rng.integers(0, args.requests, args.lookups)], absent])
    expected = _hash_all(ids, wanted)
    best = {name: float("inf") for name in WAYS}
    for round_number in range(args.rounds):
        names = list(WAYS) if round_number % 2 == 0 else list(WAYS)[::-1]
        for name in names:
            start = time.perf_counter()
            rows = WAYS[name](ids, wanted)
            best[name] = min(best[name], time.perf_counter() - start)
            if not np.array_equal(rows, expected):
                raise AssertionError(f"{name} found other rows than the hash of all ids")
    result = {"requests": args.requests, "lookups": args.lookups, "rounds": args.rounds, "seconds": best}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
