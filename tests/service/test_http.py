"""The HTTP status service: the horde's paths and shapes, vecsched's own view, health, safety."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import vecsched
from vecsched.service import sql as _sql
from vecsched.service.http import StatusService, create_app
from vecsched.service.http.answers import MAX_ID_LENGTH
from vecsched.service.http.serve import redact_url
from vecsched.service.progress import DatabaseProgress
from vecsched.service.store.base import Cycle
from vecsched.service.store.sql import SQLStore


IDS = {key: f"00000000-0000-4000-8000-{k:012d}" for k, key in enumerate(
    ("normal", "fallback", "inflight", "offline", "faulted", "done", "behind", "new", "gone"), start=1)}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

REQUIRED = ("wait_time", "queue_position", "kudos", "waiting", "processing", "finished", "restarted", "done")
INT_FIELDS = ("queue_position", "wait_time", "waiting", "processing", "finished", "restarted")


def _get(client, path: str):
    got = client.get(path)
    return got.status_code, got.get_json(), got.headers


def _estimate_of(snapshot, key: str) -> dict:
    est = vecsched.estimate(snapshot).to_frame()
    return est.loc[IDS[key]].to_dict()


def test_normal_request_carries_the_cycle_figures_and_live_kudos(published_horde, http_service) -> None:
    client = create_app(http_service).test_client()
    expected = _estimate_of(published_horde.snapshot, "normal")
    code, body, headers = _get(client, f"/v2/generate/text/status/{IDS['normal']}")
    assert code == 200
    assert body["queue_position"] == int(expected["queue_position"])
    assert body["wait_time"] == int(round(expected["wait_time"]))
    assert body["eligible_workers"] == 1 and body["eligible_worker_threads"] == 2
    assert body["is_possible"] is True and body["might_stall"] is False
    assert body["kudos"] == 12.5 and body["generations"] == []
    assert body["done"] is False and body["faulted"] is False
    assert all(type(body[k]) is int for k in INT_FIELDS)
    assert headers["X-Vecsched-Cycle"] == "2026-11-29T12:00:00Z"
    # the request behind it waits longer and is further back
    _, behind, _ = _get(client, f"/v2/generate/text/status/{IDS['behind']}")
    assert behind["queue_position"] == body["queue_position"] + 1
    assert behind["wait_time"] > body["wait_time"]


def test_every_horde_answer_has_every_required_field(http_service) -> None:
    client = create_app(http_service).test_client()
    for key, gentype in [("normal", "text"), ("fallback", "text"), ("inflight", "text"), ("offline", "image"),
                         ("faulted", "text"), ("done", "text"), ("new", "text"), ("gone", "text")]:
        path = "/v2/generate/text/status/" if gentype == "text" else "/v2/generate/status/"
        code, body, _ = _get(client, path + IDS[key])
        assert code == 200, key
        assert not set(REQUIRED) - set(body), (key, body)
        assert type(body["kudos"]) is float, key


def test_fallback_uses_horde_wide_figures(published_horde, http_service) -> None:
    client = create_app(http_service).test_client()
    expected = _estimate_of(published_horde.snapshot, "fallback")
    assert expected["fallback"]
    code, body, _ = _get(client, f"/v2/generate/text/status/{IDS['fallback']}")
    assert body["eligible_workers"] == 0 and body["is_possible"] is False
    assert body["queue_position"] == int(expected["horde_queue_position"])
    assert body["wait_time"] == int(round(expected["horde_wait_time"]))


def test_no_worker_online_answers_wait_0_impossible(http_service) -> None:
    client = create_app(http_service).test_client()
    for path in ("/v2/generate/status/", "/v2/generate/check/"):
        code, body, _ = _get(client, path + IDS["offline"])
        assert code == 200
        assert body["wait_time"] == 0 and body["is_possible"] is False
        assert body["kudos"] == 1.5
    assert "generations" in _get(client, "/v2/generate/status/" + IDS["offline"])[1]
    assert "generations" not in _get(client, "/v2/generate/check/" + IDS["offline"])[1]
    # vecsched's own view omits the unknown wait instead
    code, own, _ = _get(client, "/vecsched/v1/status/" + IDS["offline"])
    assert code == 200 and "wait_time" not in own


def test_in_flight_progress_comes_from_the_database(published_horde, http_service) -> None:
    client = create_app(http_service).test_client()
    code, body, _ = _get(client, f"/v2/generate/text/status/{IDS['inflight']}")
    assert (body["waiting"], body["processing"], body["finished"]) == (1, 1, 0)
    assert body["is_possible"] is True and body["kudos"] == 3.0
    # the job finishes after the cycle: the route reports it at once
    with published_horde.engine.begin() as conn:
        conn.execute(_sql.processing_gens.update().values(state="finished"))
    code, body, _ = _get(client, f"/v2/generate/text/status/{IDS['inflight']}")
    assert (body["waiting"], body["processing"], body["finished"]) == (1, 0, 1)


def test_by_default_a_request_the_cycle_holds_costs_no_query(published_horde, http_service, cycle_service) -> None:
    """The default mode answers held requests from the cycle alone, with what the live
    mode answers while the database has not moved on; kudos is the cycle's."""
    live, cycle = create_app(http_service).test_client(), create_app(cycle_service).test_client()
    for key, path in [("normal", "/v2/generate/text/status/"), ("fallback", "/v2/generate/text/status/"),
                      ("inflight", "/v2/generate/text/status/"), ("offline", "/v2/generate/check/"),
                      ("behind", "/v2/generate/text/status/")]:
        assert _get(cycle, path + IDS[key])[:2] == _get(live, path + IDS[key])[:2], key
    assert cycle_service.progress.queries == 0
    assert _get(cycle, "/v2/generate/text/status/" + IDS["normal"])[1]["kudos"] == 12.5


def test_by_default_progress_is_as_of_the_cycle(published_horde, http_service, cycle_service) -> None:
    live, cycle = create_app(http_service).test_client(), create_app(cycle_service).test_client()
    with published_horde.engine.begin() as conn:
        conn.execute(_sql.processing_gens.update().values(state="finished"))
    path = f"/v2/generate/text/status/{IDS['inflight']}"
    held = _get(cycle, path)[1]
    assert (held["waiting"], held["processing"], held["finished"]) == (1, 1, 0)
    assert held["is_possible"] is True and held["might_stall"] is False
    now = _get(live, path)[1]
    assert (now["waiting"], now["processing"], now["finished"]) == (1, 0, 1)


def test_by_default_the_database_answers_what_the_cycle_lacks(published_horde, cycle_service) -> None:
    client = create_app(cycle_service).test_client()
    _, new, _ = _get(client, f"/v2/generate/text/status/{IDS['new']}")  # newer than the cycle
    assert new["waiting"] == 2 and new["kudos"] == 0.5
    _, done, _ = _get(client, f"/v2/generate/text/status/{IDS['done']}")  # ended in the cycle
    assert done["done"] is True and done["kudos"] == 9.0
    _, faulted, _ = _get(client, f"/v2/generate/text/status/{IDS['faulted']}")
    assert faulted["faulted"] is True and faulted["kudos"] == 4.0
    assert cycle_service.progress.queries == 3
    # gone from the database since the cycle: the cycle's figures stand, its kudos too
    code, gone, _ = _get(client, f"/v2/generate/text/status/{IDS['gone']}")
    assert code == 200 and gone["waiting"] == 1 and gone["kudos"] == 0.0
    assert cycle_service.progress.queries == 3


def test_faulted_and_done(http_service) -> None:
    client = create_app(http_service).test_client()
    _, faulted, _ = _get(client, f"/v2/generate/text/status/{IDS['faulted']}")
    # done, as the horde's is_completed() says of a faulted request (a client stops polling on it)
    assert faulted["faulted"] is True and faulted["done"] is True and faulted["is_possible"] is False
    assert faulted["wait_time"] == 0 and faulted["queue_position"] == 0 and faulted["kudos"] == 4.0
    _, done, _ = _get(client, f"/v2/generate/text/status/{IDS['done']}")
    assert done["done"] is True and done["finished"] == 1 and done["waiting"] == 0
    assert done["wait_time"] == 0 and done["queue_position"] == 0 and done["kudos"] == 9.0
    _, own, _ = _get(client, f"/vecsched/v1/status/{IDS['done']}")
    assert own["done"] is True and own["kudos"] == 9.0


def test_ended_in_the_cycle_and_gone_from_the_database_is_404(published_horde, http_service) -> None:
    client = create_app(http_service).test_client()
    assert published_horde.store.read_status(IDS["done"]).value == '{"ended":"done"}'
    with published_horde.engine.begin() as conn:
        conn.execute(_sql.waiting_prompts.delete().where(_sql.waiting_prompts.c.id == IDS["done"]))
    code, body, _ = _get(client, f"/v2/generate/text/status/{IDS['done']}")
    assert code == 404 and body["rc"] == "RequestNotFound"


def test_request_newer_than_the_cycle_gets_horde_wide_figures(published_horde, http_service) -> None:
    client = create_app(http_service).test_client()
    code, body, _ = _get(client, f"/v2/generate/text/status/{IDS['new']}")
    totals = vecsched.estimate(published_horde.snapshot).horde["text"]
    assert code == 200
    assert body["queue_position"] == totals["queued_requests"]
    rate = totals["mean_speed"] * min(totals["online_threads"], totals["queued_jobs"] + 2)
    assert body["wait_time"] == round((totals["queued_work"] + 2 * 200) / rate)
    assert body["waiting"] == 2 and body["kudos"] == 0.5
    assert "eligible_workers" not in body and "is_possible" not in body  # not known before the next cycle


def test_request_only_the_cycle_knows_keeps_its_figures(http_service) -> None:
    client = create_app(http_service).test_client()
    code, body, _ = _get(client, f"/v2/generate/text/status/{IDS['gone']}")
    assert code == 200 and body["kudos"] == 0.0 and body["waiting"] == 1


def test_404_unknown_and_other_gentype(http_service) -> None:
    client = create_app(http_service).test_client()
    for path in ("/v2/generate/text/status/00000000-0000-4000-8000-0000000000ff",
                 f"/v2/generate/status/{IDS['normal']}",  # a text request on the image path
                 f"/v2/generate/check/{IDS['normal']}",
                 f"/v2/generate/text/status/{IDS['offline']}",
                 "/vecsched/v1/status/00000000-0000-4000-8000-0000000000ff"):
        code, body, _ = _get(client, path)
        assert code == 404, path
        assert body == {"message": "The request was not found.", "rc": "RequestNotFound"}


def test_503_when_stale_or_never_published(published_horde, tmp_path) -> None:
    service = StatusService(store=published_horde.store, progress=DatabaseProgress(published_horde.engine),
                            clock=lambda: published_horde.now + 15.5)  # > 3 intervals of 5 s
    client = create_app(service).test_client()
    for path in (f"/v2/generate/text/status/{IDS['normal']}", f"/v2/generate/check/{IDS['offline']}"):
        got = client.get(path)
        assert got.status_code == 503 and got.headers["Retry-After"] == "5"
        assert got.get_json()["rc"] == "EstimatesStale" and set(got.get_json()) == {"message", "rc"}
    assert client.get("/vecsched/v1/health").status_code == 503
    assert client.get(f"/vecsched/v1/status/{IDS['normal']}").get_json()["stale"] is True
    empty = create_app(StatusService(store=SQLStore(f"sqlite:///{tmp_path / 'e.sqlite'}"))).test_client()
    assert empty.get(f"/v2/generate/text/status/{IDS['normal']}").status_code == 503


def test_health_and_prospective(http_service) -> None:
    client = create_app(http_service).test_client()
    got = client.get("/vecsched/v1/health")
    assert got.status_code == 200
    assert got.get_json() == {"fresh": True, "cycle_time": "2026-11-29T12:00:00Z", "age": 1.0, "interval": 5.0}
    got = client.post("/vecsched/v1/prospective", json={"gentype": "text", "models": ["m"], "max_length": 100})
    assert got.status_code == 200
    body = got.get_json()
    assert body["eligible_workers"] == 1 and body["eligible_worker_threads"] == 2
    assert 256 <= body["allowance"] <= 512
    assert client.post("/vecsched/v1/prospective", data="not json").status_code == 400


def test_prospective_bodies_a_client_may_send_are_answered_not_failed(http_service) -> None:
    """A review found 500s: state keys of a snapshot request, a body nested too deep; a 1 GB body was
    read whole; and every 400 said only 'SnapshotError'."""
    client = create_app(http_service).test_client()
    plain = client.post("/vecsched/v1/prospective", json={"gentype": "text", "models": ["m"], "max_length": 100})
    for state in ({"faulted": True}, {"active": False}, {"jobs": 0}):
        got = client.post("/vecsched/v1/prospective",
                          json={"gentype": "text", "models": ["m"], "max_length": 100, **state})
        assert got.status_code == 200 and got.get_json() == plain.get_json(), state  # about to be made: waiting
    deep = '{"gentype": "text", "models": ' + "[" * 5000 + "]" * 5000 + "}"
    got = client.post("/vecsched/v1/prospective", data=deep, content_type="application/json")
    assert got.status_code == 400 and got.get_json()["rc"] == "BadRequest"
    big = '{"gentype": "text", "pad": "' + "a" * (1 << 20) + '"}'
    got = client.post("/vecsched/v1/prospective", data=big, content_type="application/json")
    assert got.status_code == 413
    got = client.post("/vecsched/v1/prospective", json={"gentype": "text", "max_length": "300"})
    assert got.status_code == 400 and "max_length" in got.get_json()["message"]
    # n is judged like every key (it was overwritten unread, so "x" and -100 answered 200) ...
    for bad_n in ("x", -100, 1001):
        got = client.post("/vecsched/v1/prospective", json={"gentype": "text", "models": ["m"], "n": bad_n})
        assert got.status_code == 400 and "n:" in got.get_json()["message"], bad_n
    # ... and a good one changes nothing: the answer does not depend on the request's own size
    got = client.post("/vecsched/v1/prospective", json={"gentype": "text", "models": ["m"], "max_length": 100, "n": 7})
    assert got.status_code == 200 and got.get_json() == plain.get_json()


def test_blueprint_inside_another_app(http_service) -> None:
    from flask import Flask

    from vecsched.service.http import status_blueprint

    app = Flask("horde")
    app.register_blueprint(status_blueprint(http_service), url_prefix="/api")
    got = app.test_client().get(f"/api/v2/generate/text/status/{IDS['normal']}")
    assert got.status_code == 200 and got.get_json()["kudos"] == 12.5


@pytest.mark.parametrize("mode", ["cycle", "live"])
def test_the_fast_path_answers_as_the_flask_routes(mode, published_horde, http_service, cycle_service) -> None:
    """create_app answers horde-path polls without Flask's routing; the blueprint, which the
    horde mounts in its own app, must answer every one of them the same."""
    from flask import Flask

    from vecsched.service.http import HORDE_PATHS, status_blueprint

    service = http_service if mode == "live" else cycle_service
    fast = create_app(service).test_client()
    plain = Flask("horde")
    plain.register_blueprint(status_blueprint(service))
    flask_only = plain.test_client()
    ids = [*IDS.values(), "nope", "*", "a:b", "x" * (MAX_ID_LENGTH + 1)]
    for prefix in HORDE_PATHS:
        for rid in ids:
            path = prefix + urllib.parse.quote(rid, safe="")
            a, b = fast.get(path), flask_only.get(path)
            assert (a.status_code, a.get_json()) == (b.status_code, b.get_json()), path
            for header in ("Content-Type", "Retry-After", "X-Vecsched-Cycle"):
                assert a.headers.get(header) == b.headers.get(header), (path, header)
    # and the fast path is the one taken: Flask never sees a poll, only the rest
    app, seen = create_app(service), []
    app.before_request(lambda: seen.append(1))
    assert app.test_client().get(f"/v2/generate/text/status/{IDS['normal']}").status_code == 200 and seen == []
    app.test_client().get("/vecsched/v1/health")
    assert seen == [1]
    stale = StatusService(store=published_horde.store, clock=lambda: published_horde.now + 3600.0)
    a = create_app(stale).test_client().get(f"/v2/generate/check/{IDS['offline']}")
    assert a.status_code == 503 and a.headers["Retry-After"] == "5" and a.get_json()["rc"] == "EstimatesStale"


ODD_IDS = ["*", "?", "[", "]", ":", "a*", "a?c", "[ab]", "a:b", "a\nb", "\r\n", "x" * 1000, "é/ü", "%", "a b"]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_odd_ids_are_data_never_patterns(kind, tmp_path, request, caplog) -> None:
    """Ids that are glob or key-pattern characters match only themselves."""
    store = (request.getfixturevalue("redis_store") if kind == "redis"
             else SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}"))
    published = ["*", "a:b", "a\nb", "[ab]", "x" * 1000]
    payload = "[1,100.0,0,3,6,1,2,41.6,20.0,4,50.0,0,1,0,0,0]"
    store.publish(Cycle(100.0, 5.0, published, [payload] * len(published)))
    client = create_app(StatusService(store=store, clock=lambda: 101.0)).test_client()
    caplog.set_level(logging.DEBUG)
    for rid in ODD_IDS:
        got = client.get("/v2/generate/text/status/" + urllib.parse.quote(rid, safe=""))
        assert got.status_code == (200 if rid in published else 404), repr(rid)
        if got.status_code == 200:
            assert got.get_json()["queue_position"] == 2
    for raw in ("%FF", "%C3%28", "%ED%A0%80", "x" * (MAX_ID_LENGTH + 1)):  # not UTF-8; too long
        got = client.get("/v2/generate/text/status/" + raw)
        assert got.status_code == 404 and got.get_json()["rc"] == "RequestNotFound"
    assert not [r for r in caplog.records if "a:b" in r.getMessage() or "xxxx" in r.getMessage()]


def test_no_id_reaches_a_log_even_on_failure(published_horde, caplog) -> None:
    class Broken:
        def read_status(self, request_id):
            raise ConnectionError(f"store down while reading {request_id}")

    client = create_app(StatusService(store=Broken(), clock=lambda: 0.0)).test_client()
    caplog.set_level(logging.DEBUG)
    got = client.get(f"/v2/generate/text/status/{IDS['normal']}")
    assert got.status_code == 500 and got.get_json()["rc"] == "InternalServerError"
    assert IDS["normal"] not in got.get_data(as_text=True)
    assert caplog.records and not [r for r in caplog.records if IDS["normal"] in r.getMessage()]


def test_redact_url_hides_credentials() -> None:
    for url in ("rediss://user:hunter2@127.0.0.1:6380/0", "redis://:hunter2@cache:6379/1",
                "postgresql+psycopg://postgres:hunter2@127.0.0.1:5432/test?sslmode=require&password=hunter2"):
        shown = redact_url(url)
        assert "hunter2" not in shown and "user" not in shown and shown.startswith(url.split(":")[0] + "://")


def test_kudos_column_json_and_sql(db_url, horde_document) -> None:
    doc = horde_document()
    doc["requests"].append(dict(doc["requests"][0], id="neg", kudos=-1))
    snap = vecsched.load_snapshot(doc)
    assert [(e.id, e.field) for e in snap.rejected] == [("neg", "kudos")]
    kudos = dict(zip(snap.requests.id, snap.requests.kudos))
    assert kudos[IDS["normal"]] == 12.5 and kudos[IDS["behind"]] == 0.0  # default 0
    engine = _sql.make_engine(db_url)
    _sql.import_snapshot(engine, snap)
    back = _sql.load_horde(engine, snap.now)
    assert dict(zip(back.requests.id, back.requests.kudos)) == kudos
    assert DatabaseProgress(engine).read(IDS["normal"]).kudos == 12.5
    engine.dispose()


def test_serve_command_end_to_end(published_horde, tmp_path, horde_document) -> None:
    """`vecsched serve` under granian: a real id over real HTTP, no id or password in its output."""
    port = _free_port()
    # a fresh cycle for the wall clock: the server has no fake clock
    doc = horde_document()
    from vecsched.snapshot.times import iso

    doc["now"] = iso(time.time())
    snap = vecsched.load_snapshot(doc)
    from vecsched.service.job import run_cycle

    assert run_cycle(lambda now: snap, published_horde.store, time.time, interval=60.0).ok
    log_path = tmp_path / "serve.log"
    env = dict(os.environ, PYTHONPATH=str(Path(vecsched.__file__).parents[1]))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vecsched", "serve", "--port", str(port), "--processes", "2",
             "--threads", "2", "--db", published_horde.url, "--log-level", "INFO"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        body = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/v2/generate/text/status/{IDS['normal']}", timeout=2) as got:
                    body = json.loads(got.read())
                break
            except OSError:
                time.sleep(0.2)
        assert body is not None and body["kudos"] == 12.5 and body["done"] is False
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/generate/text/status/nope", timeout=2)
        assert missing.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    output = log_path.read_text()
    assert "Started worker" in output
    assert IDS["normal"] not in output and "nope" not in output


@pytest.fixture
def tls_redis(tmp_path):
    """A private redis-server on TLS only, with a password; its URL verifies the certificate."""
    import shutil

    if not (shutil.which("redis-server") and shutil.which("openssl")):
        pytest.skip("redis-server or openssl missing")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
         "--tls-auth-clients", "no", "--requirepass", "hunter2secret", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"rediss://:hunter2secret@127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    import redis

    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None:
                pytest.skip("this redis-server has no TLS")
            time.sleep(0.05)
    client.close()
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_tls_redis_with_a_password_works(tls_redis) -> None:
    from vecsched.service.config import open_store

    store = open_store(redis_url=tls_redis, env={})
    payload = "[1,100.0,0,3,6,1,2,41.6,20.0,4,50.0,0,1,0,0,0]"
    store.publish(Cycle(100.0, 5.0, ["r1"], [payload]))
    client = create_app(StatusService(store=store, clock=lambda: 101.0)).test_client()
    got = client.get("/v2/generate/text/status/r1")
    assert got.status_code == 200 and got.get_json()["wait_time"] == 42
    store.close()


def test_serve_never_prints_a_password(tls_redis, tmp_path) -> None:
    """`vecsched serve` on a TLS Redis and a PostgreSQL URL, both with passwords: it connects
    (503: nothing published yet, rather than 500) and prints neither password."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(Path(vecsched.__file__).parents[1]))
    db = "postgresql+psycopg://postgres:hunter2pg@127.0.0.1:5432/test"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vecsched", "serve", "--port", str(port), "--processes", "1", "--db", db,
         "--redis", tls_redis, "--prefix", "vs-test-tls", "--log-level", "DEBUG"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        code = None
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/generate/check/abc", timeout=5)
            except urllib.error.HTTPError as exc:
                code = exc.code
                break
            except OSError:
                time.sleep(0.2)
        assert code == 503
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "publication store RedisStore" in out and "postgresql+psycopg://127.0.0.1:5432/test" in out
    # at DEBUG too: the access log, which would hold ids, is never on
    assert "hunter2" not in out


def test_progress_reads_odd_ids_as_data(db_url, horde_document) -> None:
    doc = horde_document()
    odd = ["*", "%", "_", "a'b; DROP TABLE waiting_prompts; --", "a\nb"]
    doc["requests"] = [dict(doc["requests"][0], id=rid, kudos=k + 1) for k, rid in enumerate(odd)]
    engine = _sql.make_engine(db_url)
    _sql.import_snapshot(engine, vecsched.load_snapshot(doc))
    progress = DatabaseProgress(engine)
    assert [progress.read(rid).kudos for rid in odd] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert progress.read("a%") is None and progress.read("a_b") is None and progress.read("?") is None
    engine.dispose()


@pytest.mark.parametrize("cell", [
    {"kudos": float("inf")}, {"kudos": float("nan")}, {"kudos": -3.0}, {"max_length": -1_000_000_000},
    {"n": -1}, {"n": None}, {"width": 20_000},
])
def test_a_row_the_cycle_rejects_is_left_out_of_the_status_route_too(db_url, horde_document, cell, caplog) -> None:
    """Read per poll straight from the table, a bad cell once gave a 500, ``Infinity``/``NaN`` in the JSON, or a
    negative wait; the loader rejects such a row, and so does the route's read (one warning, naming the field)."""
    import sqlalchemy as sa

    from vecsched.service.sql.schema import waiting_prompts

    doc = horde_document()
    engine = _sql.make_engine(db_url)
    _sql.import_snapshot(engine, vecsched.load_snapshot(doc))
    rid = IDS["normal"]
    with engine.begin() as conn:
        conn.execute(sa.update(waiting_prompts).where(waiting_prompts.c.id == rid).values(**cell))
    field = next(iter(cell))
    loaded = _sql.load_horde(engine, vecsched.load_snapshot(doc).now)
    progress = DatabaseProgress(engine)
    with caplog.at_level(logging.WARNING, logger="vecsched.service.progress"):
        read = progress.read(rid)
    if db_url.startswith("sqlite") and cell[field] != cell[field]:  # NaN
        # SQLite stores a NaN as NULL, which takes the default: both read the row.
        assert rid in set(loaded.requests.id.tolist()) and read.kudos == 0.0
    else:
        assert rid not in set(loaded.requests.id.tolist()) and [e.field for e in loaded.rejected] == [field]
        assert read is None
        assert [r.getMessage() for r in caplog.records if repr(field) in r.getMessage()] and rid not in caplog.text
    assert progress.read(IDS["behind"]) is not None  # the other rows are read as before
    engine.dispose()


def test_a_text_cell_in_a_number_column_is_left_out_of_the_status_route(tmp_path, horde_document) -> None:
    """SQLite stores whatever it is given: ``kudos = 'lots'`` once raised a ValueError (HTTP 500)."""
    import sqlalchemy as sa

    engine = _sql.make_engine(f"sqlite:///{tmp_path / 'horde.sqlite'}")
    doc = horde_document()
    _sql.import_snapshot(engine, vecsched.load_snapshot(doc))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE waiting_prompts SET kudos = 'lots', n = 'x' WHERE id = :rid"), {"rid": IDS["normal"]})
    service = StatusService(store=None, progress=DatabaseProgress(engine))
    assert service.progress.read(IDS["normal"]) is None
    engine.dispose()


@pytest.mark.parametrize("db", ["nonsense://x", "postgresql+psycopg2://postgres:hunter2@127.0.0.1:5432/test"])
def test_serve_with_redis_refuses_a_bad_database_in_one_line_before_forking(db: str) -> None:
    """With --redis the store never opened the database, so a bad URL or missing driver once failed in every
    worker process, two tracebacks each, then a crash loop."""
    import importlib.util

    if "psycopg2" in db and importlib.util.find_spec("psycopg2") is not None:
        pytest.skip("psycopg2 is installed here: that URL would open")
    got = subprocess.run([sys.executable, "-m", "vecsched", "serve", "--processes", "1", "--port", str(_free_port()),
                          "--redis", "redis://127.0.0.1:6379/0", "--db", db],
                         capture_output=True, text=True, timeout=60)
    out = got.stdout + got.stderr
    assert got.returncode != 0 and "Traceback" not in out and "hunter2" not in out
    assert len(out.strip().splitlines()) == 1 and out.startswith("vecsched: ")


def test_serve_refuses_a_database_it_cannot_reach_before_forking() -> None:
    """serve() built the progress engine and closed it without connecting, so an unreachable database
    (with --redis the store never opens it) let the server start and fail every poll that needs it."""
    closed = _free_port()  # nothing listens there
    db = f"postgresql+psycopg://postgres:hunter2pg@127.0.0.1:{closed}/test"
    proc = subprocess.Popen([sys.executable, "-m", "vecsched", "serve", "--processes", "1", "--port", str(_free_port()),
                             "--redis", "redis://127.0.0.1:6379/0", "--db", db],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"serve started on a database it cannot reach: {out}")
    assert proc.returncode != 0 and "Traceback" not in out and "hunter2" not in out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vecsched: ") and f"127.0.0.1:{closed}" in lines[0], out


def test_a_bad_prospective_body_is_refused_under_a_stale_or_missing_cycle_too(published_horde, http_service) -> None:
    """Validity does not depend on the cycle: a stale or missing one once answered a garbage body 200."""
    from vecsched.service.store.sql import SQLStore

    stale = StatusService(store=http_service.store, clock=lambda: published_horde.now + 3600.0)
    empty = StatusService(store=SQLStore("sqlite://"))
    for service in (http_service, stale, empty):
        client = create_app(service).test_client()
        got = client.post("/vecsched/v1/prospective", json={"gentype": "audio", "max_length": "lots"})
        assert got.status_code == 400 and "gentype" in got.get_json()["message"]
        assert client.post("/vecsched/v1/prospective", json={"gentype": "text"}).status_code == 200


def test_readers_of_a_fresh_publication_database_make_no_tables(pg_url) -> None:
    """Several serve processes' first polls raced each other's CREATE TABLE (500s, duplicate key on
    pg_type) before the job's first cycle: a reader now finds no cycle, and leaves the tables to the job."""
    import sqlalchemy as sa

    from vecsched.service.store.sql import SQLStore

    store = SQLStore(pg_url)
    client = create_app(StatusService(store=store)).test_client()
    assert client.get("/vecsched/v1/health").status_code == 503
    assert client.get("/v2/generate/text/status/r1").get_json()["rc"] == "EstimatesStale"
    assert not sa.inspect(store.engine).has_table("vs_current")
    store.publish(Cycle(100.0, 5.0, ["r1"], ["[1,100.0,0,3,6,1,2,41.6,20.0,4,50.0,0,1,0,0,0]"]))
    assert store.read_status("r1").value is not None
    store.engine.dispose()
