"""Where one publication's time goes: this process's CPU per step, the Redis server's CPU, a profile.

Usage::

    PYTHONPATH=TREE python benchmarks/publish_steps.py --requests 300000 [--cycles 6] [--profile]

Publishes ``--cycles`` cycles of :func:`benchmarks.publish.fake_estimates` with
the default :class:`~vecsched.service.store.redis.RedisStore` of the tree on
``PYTHONPATH`` (any tree: main's bucketed hash too) and prints, per cycle, the
wall time, this process's CPU (user and system), its minor page faults, the
Redis server's CPU (``INFO cpu``) and Redis's time in commands (``INFO
commandstats``). Where the tree has the packed layout
(:mod:`vecsched.service.store.packed`), it then times each step of making the
status string alone, best of 9 (CPU): the ids (join, encode, lengths), their
hashes, the index plan, the index entries, the rows, and sending as many
bytes of zeros to Redis. ``--profile`` adds a cProfile of one more publication.
Everything runs under a throwaway key prefix, removed at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import secrets
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # benchmarks.publish; the tree's vecsched stays first

from benchmarks.publish import fake_estimates  # noqa: E402
from vecsched.service.payload import encode_payloads  # noqa: E402
from vecsched.service.store.base import Cycle  # noqa: E402
from vecsched.service.store.redis import RedisStore  # noqa: E402


def _server(store: RedisStore) -> tuple[float, float]:
    cpu = store.client.info("cpu")
    usec = sum(v["usec"] for k, v in store.client.info("commandstats").items() if k != "cmdstat_info")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"], usec / 1e6


def _cycles(store: RedisStore, est, count: int) -> list[dict[str, float]]:
    out = []
    for k in range(count):
        t = 1764417600.0 + k
        usage, server, start = resource.getrusage(resource.RUSAGE_SELF), _server(store), time.perf_counter()
        ids, payloads = encode_payloads(est, t)
        store.publish(Cycle(t, 5.0, ids, payloads))
        wall, after, server_after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF), _server(store)
        out.append({"wall_s": round(wall, 4), "user_s": round(after.ru_utime - usage.ru_utime, 4),
                    "sys_s": round(after.ru_stime - usage.ru_stime, 4),
                    "minor_faults": after.ru_minflt - usage.ru_minflt,
                    "redis_cpu_s": round(server_after[0] - server[0], 4),
                    "redis_commands_s": round(server_after[1] - server[1], 4)})
    return out


def _best(fn, times: int = 9) -> float:
    spent = []
    for _ in range(times):
        start = time.process_time()
        fn()
        spent.append(time.process_time() - start)
    return round(min(spent) * 1000, 1)


def _steps(store: RedisStore, est) -> dict[str, float] | None:
    """CPU milliseconds of each step of the packed layout, best of 9; None for a tree without it."""
    try:
        from vecsched.service.store import packed
        from vecsched.service.store.buckets import _Ids
    except ImportError:
        return None
    ids, payloads = encode_payloads(est, 0.0)
    n, chunk = len(ids), packed._CHUNK
    id_bytes = _Ids(ids)
    index = packed._Index(id_bytes)
    width = payloads.row_width()
    size = packed.pack_status(ids, payloads)[0]

    def rows() -> None:
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            payloads.write_run(start, stop, np.empty((stop - start, width), dtype=np.uint8))

    def whole() -> None:
        for _ in packed.pack_status(ids, payloads)[1]:
            pass

    conn = store.client.connection_pool.get_connection()
    zeros = memoryview(bytes(width * chunk))
    key = (store.prefix + ":zeros").encode()

    def send() -> None:
        pieces = size // len(zeros)
        conn.send_packed_command([b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, pieces * len(zeros)),
                                  *[zeros] * pieces, b"\r\n"])
        conn.read_response()

    try:
        return {"encode_payloads": _best(lambda: encode_payloads(est, 0.0)),
                "ids (join, encode, lengths)": _best(lambda: _Ids(ids)),
                "hashes": _best(id_bytes.hashes),
                "index plan (hashes included)": _best(lambda: packed._Index(id_bytes)),
                "index entries": _best(lambda: [index.entries(s, min(s + chunk, n)) for s in range(0, n, chunk)]),
                "rows": _best(rows),
                "pack_status, every piece": _best(whole),
                f"send {size / 1e6:.1f} MB of zeros": _best(send)}
    finally:
        store.client.connection_pool.release(conn)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300_000)
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--profile", action="store_true", help="cProfile one more publication (top 20 by own time)")
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = ap.parse_args()
    est = fake_estimates(args.requests)
    store = RedisStore(args.redis, prefix="vs-bench-steps-" + secrets.token_hex(4))
    try:
        out = {"requests": args.requests, "cycles": _cycles(store, est, args.cycles),
               "steps_cpu_ms": _steps(store, est), "load_average": os.getloadavg()}
        print(json.dumps(out, indent=1))
        if args.profile:
            ids, payloads = encode_payloads(est, 1764417700.0)
            profile = cProfile.Profile()
            profile.enable()
            store.publish(Cycle(1764417700.0, 5.0, ids, payloads))
            profile.disable()
            pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(20)
    finally:
        store.drop_all()
        store.close()


if __name__ == "__main__":
    main()
