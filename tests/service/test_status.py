"""The status read and the prospective request, end to end on the real servers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading

import numpy as np
import pytest

import vecsched
from vecsched.service import sql as _sql
from vecsched.service.job import SQLLoader, run_cycle
from vecsched.service.store.base import Cycle
from vecsched.service.store.redis import RedisStore
from vecsched.service.store.sql import SQLStore
from vecsched.service.payload import encode_payloads
from vecsched.service.read import AllowancePolicy, prospective, status
from vecsched.cli import main
from vecsched.synthetic import horde


def _publish(store, est, t, interval=5.0):
    ids, payloads = encode_payloads(est, t)
    store.publish(Cycle(t, interval, ids, payloads))


@pytest.fixture
def sql_store(tmp_path):
    return SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")


def test_fields_and_types(redis_store, make_estimates) -> None:
    est = make_estimates(100.0, ["a", "b"], wait_time=[41.5, float("nan")], queue_position=[3, 0],
                         eligible_workers=[2, 0], eligible_worker_threads=[5, 0], is_possible=[True, False],
                         ahead_wait=[20.25, float("nan")], waiting=[2, 1], processing=[1, 0])
    _publish(redis_store, est, 100.0)
    a = status("a", store=redis_store, now=101.0)
    assert a == {
        "queue_position": 3, "wait_time": 42, "is_possible": True, "eligible_workers": 2,
        "eligible_worker_threads": 5, "waiting": 2, "processing": 1, "finished": 0, "restarted": 0,
        "done": False, "ahead_wait": 20.25, "stale": False, "cycle_time": "1970-01-01T00:01:40Z",
    }
    assert all(type(a[k]) is int for k in ("queue_position", "wait_time", "eligible_workers"))
    b = status("b", store=redis_store, now=101.0)
    assert "wait_time" not in b and "ahead_wait" not in b  # unknown: omitted, not 0
    assert b["is_possible"] is False and b["queue_position"] == 0


def test_stale_and_unknown(redis_store, make_estimates) -> None:
    assert status("x", store=redis_store) == {"unknown": True}
    _publish(redis_store, make_estimates(100.0, ["a"]), 100.0, interval=5.0)
    assert status("a", store=redis_store, now=115.0)["stale"] is False  # 3 intervals: still current
    stale = status("a", store=redis_store, now=115.5)
    assert stale["stale"] is True
    assert not {"queue_position", "wait_time", "eligible_workers", "is_possible"} & set(stale)
    assert status("a", store=redis_store, now=101.0, max_age=0.5)["stale"] is True
    missing = status("nope", store=redis_store, now=101.0)
    assert missing["unknown"] is True and "queue_position" not in missing


def test_live_progress_wins(sql_store, make_estimates) -> None:
    _publish(sql_store, make_estimates(100.0, ["a"], eligible_workers=0, eligible_worker_threads=0,
                                       is_possible=False, waiting=2), 100.0)
    got = status("a", store=sql_store, now=101.0, progress={"waiting": 1, "processing": 1, "finished": 0})
    assert (got["waiting"], got["processing"], got["is_possible"]) == (1, 1, True)
    done = status("a", store=sql_store, now=101.0, progress={"finished": 2, "done": True, "processing": 0})
    assert done["done"] is True and done["wait_time"] == 0 and done["queue_position"] == 0
    # live progress of a request the cycle never saw is still reported
    fresh = status("new", store=sql_store, now=101.0, progress={"processing": 1})
    assert fresh["unknown"] is True and fresh["processing"] == 1 and fresh["is_possible"] is True


def _check_against_estimate(store, snapshot_path, now) -> int:
    snap = vecsched.load_snapshot(snapshot_path)
    frame = vecsched.estimate(snap).to_frame()
    assert len(frame) > 0
    for rid, row in frame.iterrows():
        got = status(rid, store=store, now=now)
        assert got["stale"] is False and "unknown" not in got
        assert got["queue_position"] == int(row.queue_position)
        if math.isnan(row.wait_time):
            assert "wait_time" not in got
        else:
            assert abs(got["wait_time"] - row.wait_time) <= 0.5 + 1e-3
        if math.isnan(row.ahead_wait):
            assert "ahead_wait" not in got
        else:
            assert got["ahead_wait"] == pytest.approx(row.ahead_wait, abs=1e-3)
        assert got["is_possible"] == bool(row.is_possible)
        for name in ("eligible_workers", "eligible_worker_threads", "waiting", "processing",
                     "finished", "restarted"):
            assert got[name] == int(getattr(row, name)), name
    # requests that are not waiting read faulted, done or unknown, never a queue position
    r = snap.requests
    kinds = {rid: "faulted" if f else "done" if not a else "unknown"
             for rid, f, a in zip(r.id.tolist(), r.faulted.tolist(), r.active.tolist()) if rid not in frame.index}
    assert set(kinds.values()) == {"faulted", "done", "unknown"}  # the synthetic horde has each kind
    for rid, kind in kinds.items():
        got = status(rid, store=store, now=now)
        assert got.get(kind) is True, (rid, kind, got)
        assert got.get("queue_position", 0) == 0 and "eligible_workers" not in got
        if kind == "faulted":
            assert got["done"] is False and got["is_possible"] is False
    return len(frame)


@pytest.mark.parametrize("backend", ["postgresql+redis", "sqlite"])
def test_end_to_end(backend, request, tmp_path) -> None:
    source = horde(workers=150, requests=3000, seed=0)
    src = tmp_path / "horde.json"
    source.to_json(src)
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'vecsched.sqlite'}"
        store = SQLStore(url)
    else:
        url = request.getfixturevalue("pg_url")
        store = request.getfixturevalue("redis_store")
    assert main(["db", "load", str(src), "--db", url, "--keep-times"]) == 0
    report = run_cycle(SQLLoader(url), store, lambda: source.now)
    assert report.ok, report.error
    assert report.requests == 3000 and report.published > 0
    dumped = tmp_path / "dump.json"
    assert main(["db", "dump", "-o", str(dumped), "--db", url,
                 "--now", vecsched.load_snapshot(src).to_dict()["now"]]) == 0
    assert _check_against_estimate(store, dumped, source.now) == report.published


def test_cli_status_prints_json(tmp_path, make_estimates) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    import time

    _publish(SQLStore(url), make_estimates(time.time(), ["abc"], queue_position=4), time.time())
    out = subprocess.run([sys.executable, "-m", "vecsched", "status", "abc", "--db", url],
                         capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    doc = json.loads(out.stdout)
    assert doc["queue_position"] == 4 and doc["stale"] is False


def test_allowance_policy() -> None:
    p = AllowancePolicy()
    assert [p(3, w) for w in (0.0, 10.0, 255.6, 256.0, 5000.0)] == [512, 502, 256, 256, 256]
    assert p(0, 0.0) == 256 and p(3, None) == 256 and p(3, float("nan")) == 256
    assert AllowancePolicy(ceiling=1024, floor=128, per_second=2.0)(1, 100.0) == 824
    with pytest.raises(ValueError):
        AllowancePolicy(ceiling=100, floor=200)


def test_prospective_without_a_cycle_takes_the_floor(sql_store) -> None:
    got = prospective({"gentype": "text"}, store=sql_store)
    assert got == {"unknown": True, "allowance": 256}


def _text_request(snap, est) -> dict:
    """A new request shaped like a waiting text request with eligible threads."""
    frame = est.to_frame()
    ok = frame[(frame.gentype == "text") & (frame.eligible_worker_threads > 0) & (frame.queue_position > 0)]
    rid = ok.index[0]
    k = int(np.flatnonzero(snap.requests.id == rid)[0])
    row = snap.to_dict()["requests"][k]
    return {key: row[key] for key in ("gentype", "models", "max_length", "max_context_length", "is_chat",
                                      "slow_workers", "trusted_workers", "nsfw", "validated_backends",
                                      "extra_priority", "user_id")}


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_prospective_matches_the_first_published_estimate(backend, request, tmp_path) -> None:
    pytest.importorskip("vecsched.core.prospective", reason="the lead's vecsched/_prospective.py has not landed")
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    store = request.getfixturevalue("redis_store") if backend == "redis" else SQLStore(url)
    snap = horde(workers=150, requests=3000, seed=1)
    engine = _sql.make_engine(url)
    _sql.import_snapshot(engine, snap)
    assert run_cycle(SQLLoader(engine), store, lambda: snap.now).ok
    ask = _text_request(snap, vecsched.estimate(snap))
    answer = prospective(ask, store=store, now=snap.now)
    assert answer["stale"] is False and answer["eligible_worker_threads"] > 0
    assert answer["ahead_wait"] is not None and answer["ahead_wait"] > 0
    assert answer["allowance"] == AllowancePolicy()(answer["eligible_worker_threads"], answer["ahead_wait"])
    # The request is created right after the answer; nothing else changes.
    new = dict(ask, id="zz-new-request", n=1, created=snap.to_dict()["now"],
               expiry="2026-11-29T12:20:00Z")
    _sql.import_snapshot(engine, vecsched.load_snapshot(
        {"format": "vecsched.snapshot/1", "now": snap.to_dict()["now"], "workers": [], "requests": [new]}),
        replace=False)
    assert run_cycle(SQLLoader(engine), store, lambda: snap.now).ok
    got = status("zz-new-request", store=store, now=snap.now)
    assert got["eligible_worker_threads"] == answer["eligible_worker_threads"]
    assert got["eligible_workers"] == answer["eligible_workers"]
    assert got["ahead_wait"] == pytest.approx(answer["ahead_wait"], abs=1e-3)


def _overwrite_published_state(store, cycle_id: str, blob: bytes) -> None:
    """Replace the current cycle's published prospective bytes in place (same cycle id)."""
    if isinstance(store, RedisStore):
        store.client.set(f"{store.prefix}:c:{cycle_id}:p", blob)
    else:
        from vecsched.service.store.sql import vs_cycles

        with store.engine.begin() as conn:
            conn.execute(vs_cycles.update().where(vs_cycles.c.id == cycle_id).values(prospective=blob))


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_prospective_state_is_parsed_once_per_cycle(backend, request, tmp_path) -> None:
    """Within one cycle the answer comes from the state parsed on the first call: even
    if the published bytes were garbage now, later answers would not notice. A new cycle
    is parsed afresh, and the cache keeps a bounded number of states."""
    pytest.importorskip("vecsched.core.prospective")
    from vecsched.service import read as _read

    getattr(_read, "clear_state_cache", lambda: None)()  # test isolation
    store = request.getfixturevalue("redis_store") if backend == "redis" else SQLStore(
        f"sqlite:///{tmp_path / 'p.sqlite'}")
    snap = horde(workers=60, requests=600, seed=3)
    assert run_cycle(lambda now: snap, store, lambda: snap.now).ok
    ask = _text_request(snap, vecsched.estimate(snap))
    first = prospective(ask, store=store, now=snap.now)
    cycle_id = store.read_status("x").cycle_id
    _overwrite_published_state(store, cycle_id, b"not an npz file")
    results: list[dict] = []
    threads = [threading.Thread(target=lambda: results.append(prospective(ask, store=store, now=snap.now)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [first] * 8
    # a new cycle is read and parsed again (its bytes are whole)
    for k in range(1, _read.STATE_CACHE_SIZE + 3):
        assert run_cycle(lambda now: snap, store, lambda: snap.now + k).ok
        again = prospective(ask, store=store, now=snap.now + k)
        assert again["eligible_worker_threads"] == first["eligible_worker_threads"]
        assert len(_read._states) <= _read.STATE_CACHE_SIZE
    latest = store.read_status("x").cycle_id
    assert latest in _read._states and cycle_id not in _read._states
    _overwrite_published_state(store, latest, b"garbage")
    _read.clear_state_cache()
    with pytest.raises(Exception):
        prospective(ask, store=store, now=snap.now + k)
