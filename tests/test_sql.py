"""Schema, loader, import and export against the real SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa

import vecsched
from vecsched import _sql
from vecsched.cli import main
from vecsched.synthetic import horde

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def _by_id(doc: dict) -> dict:
    """The snapshot document with each table keyed by id (the loader orders rows by id)."""
    out = dict(doc)
    for table in ("workers", "requests", "jobs"):
        out[table] = {row["id"]: row for row in doc[table]}
    out["excluded_pairs"] = sorted(map(tuple, doc["excluded_pairs"]))
    return out


def test_round_trip_keeps_every_value(db_url: str) -> None:
    snap = horde(workers=60, requests=400, seed=3)
    engine = _sql.make_engine(db_url)
    counts = _sql.import_snapshot(engine, snap)
    assert counts["workers"] == len(snap.workers) and counts["waiting_prompts"] == len(snap.requests)
    loaded = _sql.load_horde(engine, snap.now)
    assert loaded.rejected == ()
    assert _by_id(loaded.to_dict()) == _by_id(snap.to_dict())


def test_model_order_survives(db_url: str) -> None:
    # The first model decides the text speed floor, so order must round-trip.
    snap = vecsched.load_snapshot({
        "format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z",
        "workers": [{"id": "w", "user_id": "u", "gentype": "text", "last_check_in": "2026-11-29T11:59:00Z",
                     "models": ["zeta", "alpha", "mid"]}],
        "requests": [{"id": "r", "user_id": "u", "gentype": "text", "n": 1, "created": "2026-11-29T11:00:00Z",
                      "expiry": "2026-11-29T13:00:00Z", "models": ["b", "a"], "worker_ids": ["w9", "w1"]}],
    })
    engine = _sql.make_engine(db_url)
    _sql.import_snapshot(engine, snap)
    loaded = _sql.load_horde(engine, snap.now)
    assert loaded.model_lists("workers") == [["zeta", "alpha", "mid"]]
    assert loaded.model_lists("requests") == [["b", "a"]]
    assert loaded.requests.worker_ids.tolist() == [["w9", "w1"]]


def _insert_bad_rows(engine: sa.Engine) -> None:
    # executemany takes its columns from the first row: give every row every key.
    good = dict(user_id="u", gentype="text", last_check_in=NOW, threads=2, speed=None, chat_mode="none")
    rows = [
        dict(good, id="w-good"),
        dict(good, id="w-neg-threads", threads=-3),
        dict(good, id="w-bad-gentype", gentype="video"),
        dict(good, id="w-no-user", user_id=None),
        dict(good, id="w-neg-speed", speed=-1.0),
        dict(good, id="w-bad-chat", chat_mode="sometimes"),
    ]
    req = dict(user_id="u", gentype="text", n=1, created=NOW, expiry=NOW, max_length=80)
    reqs = [
        dict(req, id="r-good"),
        dict(req, id="r-neg-n", n=-2),
        dict(req, id="r-no-created", gentype="image", created=None),
        dict(req, id="r-neg-len", max_length=-5),
    ]
    with engine.begin() as conn:
        conn.execute(_sql.workers.insert(), rows)
        conn.execute(_sql.waiting_prompts.insert(), reqs)
        conn.execute(_sql.worker_models.insert(), [
            {"worker_id": "w-good", "position": 0, "model": "m"},
            {"worker_id": "w-ghost", "position": 0, "model": "m"},  # unknown worker: ignored
        ])
        conn.execute(_sql.processing_gens.insert(), [
            {"id": "j1", "wp_id": "r-good", "worker_id": "w-good", "started": NOW, "state": "processing"},
            {"id": "j2", "wp_id": "r-good", "worker_id": "w-good", "started": NOW, "state": "exploded"},
        ])


def test_bad_rows_become_row_errors(db_url: str) -> None:
    engine = _sql.make_engine(db_url)
    _sql.init_db(engine)
    _insert_bad_rows(engine)
    snap = _sql.load_horde(engine, NOW.timestamp())
    assert snap.workers.id.tolist() == ["w-good"]
    assert snap.requests.id.tolist() == ["r-good"]
    assert snap.jobs.id.tolist() == ["j1"]
    assert snap.model_lists("workers") == [["m"]]
    by_id = {e.id: e for e in snap.rejected}
    assert by_id["w-neg-threads"].field == "threads"
    assert by_id["w-bad-gentype"].field == "gentype"
    assert by_id["w-no-user"].field == "user_id"
    assert by_id["w-neg-speed"].field == "speed"
    assert by_id["w-bad-chat"].field == "chat_mode"
    assert by_id["r-neg-n"].field == "n"
    assert by_id["r-no-created"].field == "created"
    assert by_id["r-neg-len"].field == "max_length"
    assert by_id["j2"].field == "state"
    assert len(snap.rejected) == 9
    assert "w-neg-threads" in str(by_id["w-neg-threads"])


def test_nulls_in_optional_columns_take_defaults(db_url: str) -> None:
    engine = _sql.make_engine(db_url)
    _sql.init_db(engine)
    with engine.begin() as conn:
        conn.execute(_sql.workers.insert(), [dict(id="w", user_id="u", gentype="text", last_check_in=NOW,
                                                  max_length=300)])
    snap = _sql.load_horde(engine, NOW.timestamp())
    assert snap.rejected == ()
    assert snap.workers.threads.tolist() == [1]
    assert snap.workers.chat_max_length.tolist() == [300]  # "=max_length" default
    assert snap.workers.nsfw.tolist() == [True]


def test_unreachable_database_raises_clearly() -> None:
    engine = _sql.make_engine("postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2")
    with pytest.raises(sa.exc.OperationalError):
        _sql.load_horde(engine, 0.0)


def test_cli_init_load_dump(db_url: str, tmp_path, capsys) -> None:
    snap = horde(workers=30, requests=200, seed=5)
    src = tmp_path / "in.json"
    out = tmp_path / "out.json"
    snap.to_json(src)
    assert main(["db", "init", "--db", db_url]) == 0
    assert main(["db", "load", str(src), "--db", db_url]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["workers"] == len(snap.workers)
    assert main(["db", "dump", "-o", str(out), "--db", db_url, "--now", "2026-11-29T12:00:00Z"]) == 0
    dumped = vecsched.load_snapshot(out)
    assert dumped.now == snap.now
    assert _by_id(dumped.to_dict()) == _by_id(snap.to_dict())


def test_env_url_is_used(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VECSCHED_DATABASE_URL", f"sqlite:///{tmp_path / 'env.sqlite'}")
    assert main(["db", "init"]) == 0
    assert sa.inspect(_sql.make_engine(f"sqlite:///{tmp_path / 'env.sqlite'}")).has_table("waiting_prompts")
    monkeypatch.delenv("VECSCHED_DATABASE_URL")
    monkeypatch.setenv("VECSCHED_HOME", str(tmp_path))
    assert _sql.default_database_url() == f"sqlite:///{tmp_path / 'vecsched.sqlite'}"
