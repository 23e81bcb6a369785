"""Defects of the status route a review found: each test failed before its fix."""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.parse

import pytest
import sqlalchemy as sa

import vecsched
from vecsched.service import sql as _sql
from vecsched.service.http import StatusService, create_app
from vecsched.service.job import run_cycle
from vecsched.service.progress import DatabaseProgress
from vecsched.service.sql import schema
from vecsched.service.store.base import Cycle
from vecsched.service.store.sql import SQLStore

IDS = {key: f"00000000-0000-4000-8000-{k:012d}" for k, key in enumerate(
    ("normal", "fallback", "inflight", "offline", "faulted", "done", "behind", "new", "gone"), start=1)}


def _timed_get(client, path: str, limit: float) -> tuple[int | None, float]:
    """(status code, seconds) of a GET, or (None, limit) when it has not answered within ``limit``."""
    out: dict[str, int] = {}
    start = time.monotonic()
    thread = threading.Thread(target=lambda: out.update(code=client.get(path).status_code), daemon=True)
    thread.start()
    thread.join(limit)
    return out.get("code"), time.monotonic() - start


@pytest.fixture
def pg_horde(pg_url, horde_document, tmp_path):
    """The tests' horde in PostgreSQL, one cycle published to SQLite; ``new`` arrives after the cycle."""
    engine = _sql.make_engine(pg_url)
    snap = vecsched.load_snapshot(horde_document())
    _sql.import_snapshot(engine, snap)
    store = SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")  # polls run on other threads
    assert run_cycle(lambda now: snap, store, lambda: snap.now, interval=5.0).ok
    newer = horde_document()
    newer["workers"], newer["jobs"] = [], []
    newer["requests"] = [dict(newer["requests"][0], id=IDS["new"], created="2026-11-29T12:00:01Z")]
    _sql.import_snapshot(engine, vecsched.load_snapshot(newer), replace=False)
    yield pg_url, engine, store, snap
    engine.dispose()


def test_a_poll_fails_within_the_lock_timeout_when_a_table_is_locked(pg_horde, monkeypatch) -> None:
    """The route's engine once skipped make_engine's lock_timeout: a poll waited for as long as a
    migration held waiting_prompts."""
    url, engine, store, snap = pg_horde
    monkeypatch.setattr(schema, "LOCK_TIMEOUT_SECONDS", 0.5)
    progress = DatabaseProgress(url)
    client = create_app(StatusService(store=store, progress=progress, clock=lambda: snap.now + 1)).test_client()
    path = f"/v2/generate/text/status/{IDS['new']}"
    assert client.get(path).status_code == 200
    locker = sa.create_engine(url).connect()
    tx = locker.begin()
    try:
        locker.exec_driver_sql("LOCK TABLE waiting_prompts IN ACCESS EXCLUSIVE MODE")
        code, seconds = _timed_get(client, path, 8.0)
        assert code == 500 and seconds < 5.0, (code, seconds)
    finally:
        tx.rollback()
        locker.close()
    assert client.get(path).status_code == 200
    progress.close()


def test_a_poll_fails_within_the_connect_timeout_when_the_server_is_silent(pg_horde, monkeypatch) -> None:
    """A server that accepts TCP and never answers held the poll with no connect timeout."""
    _, _, store, snap = pg_horde
    monkeypatch.setattr(schema, "CONNECT_TIMEOUT_SECONDS", 2)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"postgresql+psycopg://postgres@127.0.0.1:{silent.getsockname()[1]}/test"
        progress = DatabaseProgress(url)
        client = create_app(StatusService(store=store, progress=progress, clock=lambda: snap.now + 1)).test_client()
        code, seconds = _timed_get(client, f"/v2/generate/text/status/{IDS['new']}", 8.0)
        assert code == 500 and seconds < 7.0, (code, seconds)
        progress.close()


def test_the_route_reads_without_a_ping_per_poll(pg_url) -> None:
    """make_engine pings every checkout; the route's one statement per poll needs no extra round trip."""
    progress = DatabaseProgress(pg_url)
    assert progress.engine.pool._pre_ping is False
    progress.close()


@pytest.mark.parametrize("kind", ["sql", "redis"])
def test_an_id_holding_nul_is_unknown_on_postgresql(kind, pg_url, horde_document, request, caplog) -> None:
    """PostgreSQL refuses NUL in text (psycopg DataError): such an id gave a 500 and an ERROR line per
    poll; SQLite answered 404, and so does the horde (no UUID holds a NUL)."""
    engine = _sql.make_engine(pg_url)
    snap = vecsched.load_snapshot(horde_document())
    _sql.import_snapshot(engine, snap)
    store = request.getfixturevalue("redis_store") if kind == "redis" else SQLStore(engine)
    assert run_cycle(lambda now: snap, store, lambda: snap.now, interval=5.0).ok
    progress = DatabaseProgress(pg_url)
    client = create_app(StatusService(store=store, progress=progress, clock=lambda: snap.now + 1)).test_client()
    caplog.set_level(logging.WARNING)
    for path in ("/v2/generate/text/status/abc%00def", "/v2/generate/check/%00", "/vecsched/v1/status/abc%00",
                 f"/v2/generate/text/status/{IDS['normal']}%00", f"/vecsched/v1/status/{IDS['normal']}%00"):
        got = client.get(path)
        assert got.status_code == 404 and got.get_json()["rc"] == "RequestNotFound", path
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    progress.close()
    engine.dispose()


def _forged_ids(store) -> list[tuple[str, str]]:
    """(forged id, the id whose entry it reaches) for adjacent entries of the packed index:
    ``ID1 \\t ROW1 \\n ID2`` spans two entries, ``"\\nID1\\tROW1\\nID2\\t"``."""
    raw = store.client.get(f"{store.prefix}:c:{store.read_current().cycle_id}:s")
    head = raw[:64].split()
    at_index, at_rows = int(head[5]), int(head[6])
    entries = [e.split("\t") for e in raw[at_index:at_rows].decode().split("\n")[1:]]
    return [(f"{a}\t{row}\n{b}", b) for (a, row), (b, _) in zip(entries, entries[1:])]


def test_a_forged_id_never_reads_another_requests_packed_row(redis_store) -> None:
    """The packed index was searched for ``"\\n" .. id .. "\\t"``, which an id holding a tab and a newline
    matches across two entries: a forged id read another request's figures (200). No packed cycle holds
    such an id (pack_status publishes those cycles a field per request), so it is never searched there."""
    ids = [f"r{k}" for k in range(40)]
    payloads = [f"[1,100.0,0,{k},6,1,2,41.6,20.0,4,50.0,0,1,0,0,0]" for k in range(40)]
    assert redis_store.publish(Cycle(100.0, 5.0, ids, payloads))
    forged = _forged_ids(redis_store)
    assert forged
    client = create_app(StatusService(store=redis_store, clock=lambda: 101.0)).test_client()
    for rid, target in forged:
        assert redis_store.read_status(rid).value is None, (rid, target)
        got = client.get("/v2/generate/text/status/" + urllib.parse.quote(rid, safe=""))
        assert got.status_code == 404, (rid, got.get_json())
        assert redis_store.read_status(target).value is not None
    # an id that does hold a tab is published a field per request, and found
    assert redis_store.publish(Cycle(110.0, 5.0, ["a\tb", "r1"], payloads[:2]))
    assert redis_store.read_status("a\tb").value == payloads[0]
    got = client.get("/v2/generate/text/status/" + urllib.parse.quote("a\tb", safe=""))
    assert got.status_code == 200


def test_the_own_path_reports_a_request_faulted_since_the_cycle_as_not_waiting(published_horde, cycle_service) -> None:
    """The database faulted the request after the cycle: vecsched's path kept the cycle's position, wait and
    is_possible true beside faulted true, where docs/http.md says faulted is position 0, wait 0, not possible."""
    from vecsched.service.sql.schema import waiting_prompts

    with published_horde.engine.begin() as conn:
        conn.execute(sa.update(waiting_prompts).where(waiting_prompts.c.id == IDS["behind"]).values(faulted=True))
    got = create_app(cycle_service).test_client().get(f"/vecsched/v1/status/{IDS['behind']}")
    body = got.get_json()
    assert got.status_code == 200 and body["faulted"] is True and body["done"] is False
    assert (body["queue_position"], body["wait_time"], body["is_possible"]) == (0, 0, False), body
    assert "ahead_wait" not in body and "might_stall" not in body


def test_a_request_newer_than_the_cycle_has_no_made_up_is_possible(published_horde, horde_document, cycle_service) -> None:
    """Its eligibility is not known before the next cycle (SPEC section 9: omit what the route does not have):
    ``threads > 0`` horde-wide once said possible for an image request 768 px wide that no worker had the
    pixels for, and the next cycle said impossible. With a job in flight it is possible (SPEC section 4)."""
    from vecsched.service.sql.schema import processing_gens

    client = create_app(cycle_service).test_client()
    got = client.get(f"/v2/generate/text/status/{IDS['new']}")
    body = got.get_json()
    assert got.status_code == 200 and "is_possible" not in body and "eligible_workers" not in body
    assert body["queue_position"] > 0 and body["done"] is False
    with published_horde.engine.begin() as conn:
        conn.execute(sa.insert(processing_gens).values(id="jn", wp_id=IDS["new"], worker_id="w1", state="processing"))
    body = client.get(f"/v2/generate/text/status/{IDS['new']}").get_json()
    assert body["processing"] == 1 and body["is_possible"] is True


@pytest.fixture(params=["refused", "silent"])
def unreachable_redis(request):
    """A RedisStore whose server refuses connections, or accepts them and never answers."""
    import redis

    from vecsched.service.store.redis import RedisStore

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if request.param == "silent":
            listener.listen(16)
        else:
            listener.close()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        client = redis.Redis(host="127.0.0.1", port=port, password="hunter2pw", socket_timeout=0.5,
                             socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
        yield RedisStore(client, prefix="vs-test-down")
        client.close()


def test_an_unreachable_redis_answers_503_with_retry_after(unreachable_redis, caplog) -> None:
    """Redis down or silent once gave every route, health included, a 500 InternalServerError:
    a load balancer and a client should hear 'unavailable, retry', as for a stale cycle."""
    client = create_app(StatusService(store=unreachable_redis, clock=lambda: 101.0)).test_client()
    caplog.set_level(logging.DEBUG)
    for method, path in [("get", f"/v2/generate/text/status/{IDS['normal']}"), ("get", f"/vecsched/v1/status/{IDS['normal']}"),
                         ("get", "/vecsched/v1/health"), ("post", "/vecsched/v1/prospective")]:
        got = getattr(client, method)(path, json={"gentype": "text"} if method == "post" else None)
        assert got.status_code == 503 and got.headers["Retry-After"] == "5", (path, got.status_code)
        assert got.get_json()["rc"] == "StoreUnavailable"
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert "hunter2pw" not in caplog.text and IDS["normal"] not in caplog.text
