"""Load on the HTTP status service while the job keeps publishing (127.0.0.1 only).

Usage::

    python benchmarks/http_load.py --workers 2000 --requests 50000 --seconds 20 --clients 16
    python benchmarks/http_load.py --quick          # 150 x 3,000, 5 s: a smoke run
    python benchmarks/http_load.py --rate 2000 ...  # the Python clients open loop at 2,000 reads/s

What it does, all on this machine:

1. imports a synthetic horde into a throwaway PostgreSQL schema (times shifted to now);
2. starts the publisher: the real job (load from PostgreSQL, estimate, publish to
   Redis under a throwaway prefix) every ``--interval`` seconds; before each cycle
   it changes every text worker's thread count, so consecutive cycles give most
   requests different figures, and it records what each cycle published for the
   polled ids;
3. starts ``vecsched serve`` (granian, ``--processes`` x ``--threads``; progress as of the
   cycle, or read on every poll with ``--live-progress``);
4. polls the horde paths from ``--clients`` threads with keep-alive connections
   for ``--seconds`` (a bounded loop), and with ``wrk`` too when it is installed;
5. checks every answer of the Python clients against the cycle its
   ``X-Vecsched-Cycle`` header names: an answer whose figures differ from that
   cycle's is *mixed*;
6. times the in-process read (``vecsched.status``) from 8 threads.

Prints one JSON document. Everything it created is removed at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa

HERE = Path(__file__).resolve().parents[1]
CHECKED = ("queue_position", "wait_time", "eligible_workers", "eligible_worker_threads")


def _iso(t: float) -> str:
    from vecsched.snapshot.times import iso

    return iso(t)


def _publisher(url: str, redis_url: str, prefix: str, interval: float, stop_at: float,
               sample: list[str], out_path: str, niceness: int = 0) -> None:
    """The job, with the thread counts changed before each cycle; what each cycle published, recorded."""
    if niceness:
        # What an operator running the job beside the server does: the batch yields the CPU
        # to the latency-bound polls (its cycles take longer, its figures are the same).
        os.nice(niceness)
    from vecsched.service.job import SQLLoader, run_cycle
    from vecsched.service.payload import decode_payload
    from vecsched.service.sql import make_engine, workers
    from vecsched.service.store.redis import RedisStore

    engine = make_engine(url)
    store = RedisStore(redis_url, prefix=prefix)
    loader = SQLLoader(engine)
    k = 0
    with open(out_path, "w") as out:
        while time.time() < stop_at:
            started = time.time()
            with engine.begin() as conn:
                conn.execute(sa.update(workers).where(workers.c.gentype == "text").values(threads=1 + k % 3))
            t = time.time()
            report = run_cycle(loader, store, lambda: t, interval=interval)
            took = time.time() - t
            if report.ok:
                figures = {}
                for rid in sample:
                    got = store.read_status(rid)
                    # ended requests ({"ended": ...}) carry no figures to hold answers to
                    if got is not None and got.value and not got.value.startswith("{") \
                            and abs(got.time - t) < 1e-6:
                        f = decode_payload(got.value)
                        figures[rid] = [None if f[c] is None else (int(round(f[c])) if c == "wait_time" else int(f[c]))
                                        for c in CHECKED]
                out.write(json.dumps({"cycle": _iso(t), "seconds": round(took, 3),
                                      "figures": figures}) + "\n")
                out.flush()
            k += 1
            time.sleep(max(0.0, interval - (time.time() - started)))
    store.close()
    engine.dispose()


def _client(port: int, paths: list[str], deadline: float, record: list, errors: list,
            period: float = 0.0, offset: float = 0.0) -> None:
    """Poll until ``deadline``: back to back, or one read every ``period`` seconds (open loop).

    Open loop, a read's latency runs from when it was due, not from when it was sent: a
    server that falls behind delays every read queued after it, and those delays count
    (closed-loop clients, wrk included, wait for each answer before asking again, so a
    stall shows as one slow read instead of many).
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    rng = random.Random()
    due = time.perf_counter() + offset
    while time.time() < deadline:
        path = rng.choice(paths)
        if period:
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            t0, due = due, due + period
        else:
            t0 = time.perf_counter()
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            data = resp.read()
            took = time.perf_counter() - t0
            if resp.status != 200:
                errors.append(resp.status)
                continue
            body = json.loads(data)
            record.append((took, path.rsplit("/", 1)[1], resp.getheader("X-Vecsched-Cycle"),
                           [body.get(c) for c in CHECKED]))
        except (OSError, http.client.HTTPException) as exc:
            errors.append(type(exc).__name__)
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.close()


def _wrk(port: int, paths: list[str], seconds: int, connections: int) -> dict | None:
    """wrk's figures over ``paths`` (drawn at random per request), or None without wrk."""
    if shutil.which("wrk") is None:
        return None
    script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
    lines = ",\n".join(json.dumps(p) for p in paths[:2000])
    script.write(f"""local paths = {{{lines}}}
local errors = 0
request = function() return wrk.format("GET", paths[math.random(#paths)]) end
""")
    script.close()
    try:
        out = subprocess.run(
            ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", script.name,
             f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=seconds + 60).stdout
    finally:
        os.unlink(script.name)
    result: dict = {"paths": len(paths[:2000]), "connections": connections}
    for line in out.splitlines():
        parts = line.split()
        if line.startswith("Requests/sec:"):
            result["reads_per_s"] = float(parts[1])
        elif len(parts) == 2 and parts[0] in ("50%", "99%"):
            result["p" + parts[0].rstrip("%") + "_ms"] = _ms(parts[1])
        elif "Non-2xx" in line or "Socket errors" in line:
            result.setdefault("errors", []).append(line.strip())
    return result


def _server_cpu(server_pid: int) -> float:
    """CPU seconds (user + system) used so far by the server's worker processes (Linux /proc)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    try:
        children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    except OSError:
        return float("nan")
    for pid in children:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _ms(text: str) -> float:
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return round(float(text[: -len(unit)]) * scale, 3)
    return float("nan")


def _in_process(store, ids: list[str], threads: int = 8, per_thread: int = 2000) -> dict:
    from vecsched.service.read import status

    times: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        rng = random.Random()
        mine = []
        for _ in range(per_thread):
            t0 = time.perf_counter()
            status(rng.choice(ids), store=store)
            mine.append(time.perf_counter() - t0)
        with lock:
            times.extend(mine)

    t0 = time.perf_counter()
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    wall = time.perf_counter() - t0
    arr = np.array(times) * 1e3
    return {"threads": threads, "reads": len(times), "reads_per_s": round(len(times) / wall),
            "p50_ms": round(float(np.percentile(arr, 50)), 3), "p99_ms": round(float(np.percentile(arr, 99)), 3)}


def _wait_health(port: int, limit: float = 60.0) -> None:
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/vecsched/v1/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the server never became healthy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=50000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=16, help="Python client threads")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between job cycles")
    ap.add_argument("--sample", type=int, default=2000, help="request ids polled")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="Python clients' reads/s in all, each read timed from when it was due (open loop); "
                         "0: back to back")
    ap.add_argument("--wrk-seconds", type=int, default=10, help="0: skip wrk")
    ap.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--job-nice", type=int, default=0,
                    help="run the publishing job at this niceness (os.nice), as beside a server")
    ap.add_argument("--live-progress", action="store_true",
                    help="serve with --live-progress (a database query per poll)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.workers, args.requests, args.seconds, args.wrk_seconds = 150, 3000, 5.0, 3

    from vecsched.service.sql import import_snapshot, make_engine
    from vecsched.service.store.redis import RedisStore
    from vecsched.synthetic import horde

    schema = "vs_bench_" + secrets.token_hex(4)
    prefix = "vs-bench-" + secrets.token_hex(4)
    admin = sa.create_engine(args.db)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = f"{args.db}{'&' if '?' in args.db else '?'}options=-csearch_path%3D{schema}"
    store = RedisStore(args.redis, prefix=prefix)
    procs: list = []
    out: dict = {"workers": args.workers, "requests": args.requests, "processes": args.processes,
                 "threads": args.threads, "clients": args.clients, "seconds": args.seconds,
                 "interval": args.interval, "cores": os.cpu_count(),
                 "progress": "live" if args.live_progress else "cycle", "job_nice": args.job_nice}
    tmp = tempfile.mkdtemp(prefix="vs-http-load-")
    try:
        snap = horde(workers=args.workers, requests=args.requests, seed=0)
        engine = make_engine(url)
        import_snapshot(engine, snap, shift_to=time.time())
        ids = list(map(str, snap.requests.id))
        gentypes = snap.requests.gentype
        rng = np.random.default_rng(0)
        pick = rng.choice(len(ids), size=min(args.sample, len(ids)), replace=False)
        sample = [ids[i] for i in pick]
        paths = [("/v2/generate/text/status/" if gentypes[i] == 0 else "/v2/generate/check/") + ids[i] for i in pick]

        cycles_path = os.path.join(tmp, "cycles.jsonl")
        total = args.seconds + (args.wrk_seconds or 0) + 60
        pub = multiprocessing.get_context("spawn").Process(
            target=_publisher, args=(url, args.redis, prefix, args.interval, time.time() + total, sample, cycles_path,
                  args.job_nice))
        pub.start()
        procs.append(pub)
        while store.read_current() is None:
            time.sleep(0.2)
            if not pub.is_alive():
                raise RuntimeError("the publisher died")

        from socket import socket

        with socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=str(HERE))
        server = subprocess.Popen(
            [sys.executable, "-m", "vecsched", "serve", "--port", str(port), "--processes", str(args.processes),
             "--threads", str(args.threads), "--db", url, "--redis", args.redis, "--prefix", prefix,
             "--log-level", "WARNING"] + (["--live-progress"] if args.live_progress else []), env=env,
            stdout=sys.stderr)
        procs.append(server)
        _wait_health(port)

        record: list = []
        errors: list = []
        deadline = time.time() + args.seconds
        period = args.clients / args.rate if args.rate else 0.0
        clients = [threading.Thread(target=_client, args=(port, paths, deadline, record, errors,
                                                          period, period * k / args.clients))
                   for k in range(args.clients)]
        t0 = time.perf_counter()
        for th in clients:
            th.start()
        for th in clients:
            th.join()
        wall = time.perf_counter() - t0
        lat = np.array([r[0] for r in record]) * 1e3
        out["python_clients"] = {
            "mode": f"open loop at {args.rate:g} reads/s" if args.rate else "closed loop",
            "reads": len(record), "reads_per_s": round(len(record) / wall),
            "p50_ms": round(float(np.percentile(lat, 50)), 3) if len(lat) else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 3) if len(lat) else None,
            "p99.9_ms": round(float(np.percentile(lat, 99.9)), 3) if len(lat) else None,
            "errors": len(errors), "error_kinds": sorted(set(map(str, errors))),
        }
        if args.wrk_seconds:
            cpu0 = _server_cpu(server.pid)
            out["wrk"] = _wrk(port, paths, args.wrk_seconds, connections=args.clients)
            if out["wrk"] and out["wrk"].get("reads_per_s"):
                reads = out["wrk"]["reads_per_s"] * args.wrk_seconds
                # The server processes' own CPU per read (PostgreSQL and Redis not included):
                # what a read costs whatever else the machine is running.
                out["wrk"]["server_cpu_ms_per_read"] = round((_server_cpu(server.pid) - cpu0) / reads * 1e3, 3)
            # The same server on its cheapest route (one Redis GET, no database): the
            # HTTP stack's own ceiling on this machine, measured side by side.
            out["wrk_health_baseline"] = _wrk(port, ["/vecsched/v1/health"], args.wrk_seconds,
                                              connections=args.clients)
        out["in_process_status_8_threads"] = _in_process(store, sample)
        server.terminate()
        server.wait(timeout=30)
        pub.join(timeout=total + 60)

        cycles = {}
        seconds = []
        with open(cycles_path) as fh:
            for line in fh:
                doc = json.loads(line)
                cycles[doc["cycle"]] = doc["figures"]
                seconds.append(doc["seconds"])
        checked = mixed = not_in_cycle = 0
        cycles_seen = set()
        for _, rid, cycle, figures in record:
            # ids the cycle does not hold (not waiting: done, faulted, all handed out) answer
            # from the database alone; there is no cycle figure to hold them to
            expected = cycles.get(cycle, {}).get(rid)
            if expected is None:
                not_in_cycle += 1
                continue
            cycles_seen.add(cycle)
            checked += 1
            mixed += expected != figures
        out["cycles_published"] = len(cycles)
        out["cycle_seconds_median"] = float(np.median(seconds)) if seconds else None
        out["cycle_seconds_max"] = max(seconds) if seconds else None
        out["mixed_check"] = {"answers_checked": checked, "mixed": mixed, "not_in_cycle": not_in_cycle,
                              "cycles_answered_from": len(cycles_seen)}
    finally:
        for proc in procs:
            if proc.poll() is None if hasattr(proc, "poll") else proc.is_alive():
                proc.terminate()
        store.drop_all()
        store.close()
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
