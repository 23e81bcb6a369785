"""Schema, loader, import and export against the real SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

import vecsched
from vecsched.service import sql as _sql
from vecsched.service.config import default_database_url
from vecsched.service.sql import generic as _generic, pg as _pg
from vecsched.cli import main
from vecsched.synthetic import horde
from vecsched.snapshot.snapshot import Table

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
    assert main(["db", "load", str(src), "--db", db_url, "--keep-times"]) == 0
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
    assert default_database_url() == f"sqlite:///{tmp_path / 'vecsched.sqlite'}"


def _same_snapshot(a: vecsched.Snapshot, b: vecsched.Snapshot) -> None:
    """Equal documents, equal RowErrors in order, and equal column arrays with equal dtypes."""
    import numpy as np

    assert a.rejected == b.rejected
    assert a.to_dict() == b.to_dict()
    assert a.model_names.tolist() == b.model_names.tolist()
    for table in ("workers", "requests", "jobs"):
        for name, x in getattr(a, table).columns.items():
            y = getattr(b, table).columns[name]
            if hasattr(x, "offsets"):
                assert np.array_equal(x.offsets, y.offsets) and np.array_equal(x.values, y.values), name
            else:
                assert x.dtype == y.dtype, (table, name)
                assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (table, name)


def test_fast_path_loads_what_the_generic_path_loads(pg_url: str, monkeypatch) -> None:
    # The PostgreSQL fast path parses binary arrays itself; it must agree with
    # the generic row path value for value, bad rows and their order included.
    from datetime import timedelta

    snap = horde(workers=80, requests=600, seed=11)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap, shift_to=NOW.timestamp())
    _insert_bad_rows(engine)
    # executemany takes its columns from the first row: give every row every key.
    odd = dict(user_id="u", gentype="text", n=1, jobs=1, created=NOW, expiry=NOW, width=512,
               extra_priority=0, active=True, steps=30)
    with engine.begin() as conn:
        # NULLs inside numeric arrays (the variable-stride parse), a NULL
        # required time, microseconds, +infinity and far-off timestamps.
        conn.execute(_sql.waiting_prompts.insert(), [
            dict(odd, id="r-odd-1", width=None, extra_priority=2**53 + 1, active=None),
            dict(odd, id="r-odd-2", created=None, steps=None),
            dict(odd, id="r-odd-3", created=NOW + timedelta(microseconds=123457), expiry=NOW.replace(year=9999)),
            dict(odd, id="r-odd-4", created=NOW.replace(year=1), n=None, jobs=None),
        ])
        conn.execute(sa.text("INSERT INTO waiting_prompts (id, user_id, gentype, n, created, expiry) "
                             "VALUES ('r-odd-5', 'u', 'text', 1, '-infinity', 'infinity')"))
        conn.execute(sa.text("UPDATE workers SET speed = NULL WHERE id LIKE '%1'"))
    judged = []  # (kind, bad cells) of each text column read whole: the unknown gentype and state among them
    real_texts = _pg._raw_from_texts

    def texts_judged(col, cells):
        raw = real_texts(col, cells)
        judged.append((col.kind, sum(int(mask.sum()) for mask, _ in raw.errors)))
        return raw

    monkeypatch.setattr(_pg, "_raw_from_texts", texts_judged)
    fast = _sql.load_horde(engine, NOW.timestamp())
    monkeypatch.undo()
    assert ("enum", 1) in judged and ("str", 0) in judged
    generic = _sql.load_horde(engine, NOW.timestamp(), fast=False)
    assert len(fast.requests) > 500 and len(fast.rejected) >= 11
    assert {"r-odd-2", "r-odd-4", "r-odd-5", "w-neg-threads", "j2"} <= {e.id for e in fast.rejected}
    _same_snapshot(fast, generic)

    # Types the fast path has no NumPy parser for go through psycopg's
    # loaders (numeric) or the other timestamp type, with the same result.
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE workers ALTER COLUMN speed TYPE numeric"))
        conn.execute(sa.text("ALTER TABLE workers ALTER COLUMN threads TYPE integer"))
        conn.execute(sa.text("ALTER TABLE processing_gens ALTER COLUMN started TYPE timestamp "
                             "USING started AT TIME ZONE 'UTC'"))
    # Fails if the fast path quietly fell back to the generic one.
    monkeypatch.setattr(_generic._GenericFetch, "main", None)
    fast = _sql.load_horde(engine, NOW.timestamp())
    monkeypatch.undo()
    _same_snapshot(fast, _sql.load_horde(engine, NOW.timestamp(), fast=False))


def test_pg_epochs_round_once_like_postgresql() -> None:
    import numpy as np

    us = np.array([0, 123457, -1, 2**53, -(2**60), np.iinfo(np.int64).max, np.iinfo(np.int64).min])
    got = _pg._pg_epochs(us)
    want = [(int(u) + _pg._PG_EPOCH_US) / 1_000_000 for u in us[:5]] + [float("inf"), float("-inf")]
    assert got.tolist() == want


def test_fast_path_falls_back_and_leaves_the_transaction_as_it_was(pg_url: str) -> None:
    # A time column of a type the fast path does not parse (date) sends the
    # load to the generic path, in the caller's transaction, whose settings
    # come back unchanged.
    snap = horde(workers=20, requests=100, seed=2)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE processing_gens ALTER COLUMN started TYPE date"))
    with engine.connect() as conn, conn.begin():
        conn.exec_driver_sql("SET LOCAL max_parallel_workers_per_gather = 3")
        fast = _sql.load_horde(conn, snap.now)
        assert conn.exec_driver_sql("SHOW max_parallel_workers_per_gather").scalar() == "3"
        generic = _sql.load_horde(conn, snap.now, fast=False)
    assert len(fast.jobs) == len(snap.jobs) > 0
    _same_snapshot(fast, generic)


@pytest.mark.parametrize("oid,fmt", [(1000, "?"), (1005, "h"), (1007, "i"), (1016, "q"), (1021, "f"), (1022, "d")])
@pytest.mark.parametrize("p_null", [0.0, 0.3, 1.0])
def test_binary_array_parse_with_and_without_nulls(oid: int, fmt: str, p_null: float) -> None:
    import struct

    import numpy as np

    rng = np.random.default_rng(oid)
    n = 500
    values = rng.integers(-100, 100, n)
    null = rng.random(n) < p_null
    width = struct.calcsize(fmt)
    parts = [struct.pack(">iiiii", 1, int(null.any()), 0, n, 1)]  # ndim, has-null, oid, length, lbound
    for v, z in zip(values.tolist(), null.tolist()):
        x = v > 0 if fmt == "?" else (float(v) if fmt in "fd" else v)
        parts.append(struct.pack(">i", -1) if z else struct.pack(">i" + fmt, width, x))
    got = _pg._parse_pg_array(b"".join(parts), oid)
    assert got.null.tolist() == null.tolist()
    assert got.values.tolist() == np.where(null, 0, values > 0 if fmt == "?" else values).tolist()


def _fast_only(monkeypatch) -> None:
    """Make any fallback to the generic read fail the test (the fast path must read these itself)."""
    monkeypatch.setattr(_generic._GenericFetch, "main", None)


def test_fast_path_reads_separators_nulls_and_odd_links_itself(pg_url: str, monkeypatch) -> None:
    # The packed read assumes no NULL and no separator in a text cell; where
    # that fails it reads the table again with those columns as arrays, and
    # the snapshot is the generic path's, value for value.
    from vecsched.service.sql import packed

    snap = horde(workers=30, requests=200, seed=5)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap, shift_to=NOW.timestamp())
    sep = packed.SEP
    with engine.begin() as conn:
        conn.execute(_sql.waiting_prompts.insert(), [
            dict(id=f"r{sep}sep", user_id=f"u{sep}{sep}", gentype="text", n=1, jobs=1, created=NOW, expiry=NOW),
            dict(id="r-null-user", user_id=None, gentype="text", n=1, jobs=1, created=NOW, expiry=NOW),
        ])
        conn.execute(_sql.wp_models.insert(), [dict(wp_id=f"r{sep}sep", position=0, model=f"m{sep}x"),
                                               dict(wp_id=f"r{sep}sep", position=1, model="a")])
        # A link table without its key constraint: a NULL position sorts last, a NULL value is a bad entry.
        conn.execute(sa.text("ALTER TABLE worker_models DROP CONSTRAINT worker_models_pkey"))
        conn.execute(sa.text("ALTER TABLE worker_models ALTER COLUMN position DROP NOT NULL, ALTER COLUMN model DROP NOT NULL"))
        w = snap.workers.id[0]
        conn.execute(sa.text("INSERT INTO worker_models VALUES (:w, NULL, 'last'), (:w, 99, 'z-99')"), {"w": w})
        conn.execute(sa.text("INSERT INTO worker_models VALUES (:w, 100, NULL)"), {"w": snap.workers.id[1]})
        conn.execute(sa.text("INSERT INTO excluded_pairs VALUES (:w, :r)"), {"w": f"w{sep}", "r": "r"})
    _fast_only(monkeypatch)
    fast = _sql.load_horde(engine, NOW.timestamp())
    monkeypatch.undo()
    generic = _sql.load_horde(engine, NOW.timestamp(), fast=False)
    _same_snapshot(fast, generic)
    assert fast.model_lists("requests")[fast.requests.id.tolist().index(f"r{sep}sep")] == [f"m{sep}x", "a"]
    assert fast.model_lists("workers")[fast.workers.id.tolist().index(w)][-2:] == ["z-99", "last"]
    assert {(e.id, e.field) for e in fast.rejected} >= {("r-null-user", "user_id"), (snap.workers.id[1], "models")}
    assert f"w{sep}" in fast.excluded_pairs.worker_id.tolist()


def test_pipelined_reads_learn_nulls_and_keep_errors(pg_url: str, monkeypatch) -> None:
    # Every table's first read is sent at once (libpq pipeline mode), a large
    # table's in block ranges; a second read closes the pipeline, and the next
    # load plans for the NULLs and odd texts found (a wider plan reads the same
    # cells), so it stays open. A database error in a pipelined read is the
    # error raised, not "aborted".
    import psycopg

    from vecsched.service.sql import packed, pg

    snap = horde(workers=30, requests=200, seed=7)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap, shift_to=NOW.timestamp())
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE workers SET speed = NULL WHERE id LIKE '%1'"))
        conn.execute(_sql.wp_models.insert(), [dict(wp_id=snap.requests.id[0], position=9, model=f"m{packed.SEP}")])
    generic = _sql.load_horde(engine, NOW.timestamp(), fast=False)
    _fast_only(monkeypatch)
    monkeypatch.setattr(pg._PgFetch, "_learned", {})  # nothing learned from other tests' tables
    monkeypatch.setattr(pg, "_PART_PAGES", 1)  # every table of two pages or more is read in block ranges
    parts: list[int] = []
    real_ranges = pg._block_ranges
    monkeypatch.setattr(pg, "_block_ranges", lambda pages: parts.append(len(real_ranges(pages))) or real_ranges(pages))
    _same_snapshot(_sql.load_horde(engine, NOW.timestamp()), generic)
    assert max(parts) > 1
    taken: list[bool] = []
    real_take = pg._Pipeline.take

    def take(self: pg._Pipeline, key: str) -> object:
        got = real_take(self, key)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(pg._Pipeline, "take", take)
    _same_snapshot(_sql.load_horde(engine, NOW.timestamp()), generic)
    assert taken and all(taken)  # every read came from the pipeline
    real_sql = pg._PgFetch._plan_sql
    monkeypatch.setattr(pg._PgFetch, "_plan_sql",
                        lambda self, q, oids, p, blocks=None: "SELECT 1/0" if q.key.startswith("main:processing_gens")
                        else real_sql(self, q, oids, p, blocks))
    with pytest.raises(psycopg.errors.DivisionByZero):
        _sql.load_horde(engine, NOW.timestamp())
    monkeypatch.undo()
    _same_snapshot(_sql.load_horde(engine, NOW.timestamp()), generic)  # the connection is usable again


def test_fast_path_falls_back_when_rows_change_between_its_reads(pg_url: str, monkeypatch) -> None:
    # A second read that still does not line up (rows changed in between, in
    # a caller's READ COMMITTED transaction) goes to the generic path.
    from vecsched.service.sql import packed

    snap = horde(workers=10, requests=50, seed=3)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap)
    real = packed.parse
    monkeypatch.setattr(packed, "parse", lambda p, row, oids: packed.Read([], True, []) if row[0] else real(p, row, oids))
    fast = _sql.load_horde(engine, snap.now)
    monkeypatch.undo()
    _same_snapshot(fast, _sql.load_horde(engine, snap.now, fast=False))
    assert len(fast.requests) == len(snap.requests)


def test_link_position_not_an_integer_reads_generically(pg_url: str) -> None:
    snap = horde(workers=10, requests=50, seed=4)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE wp_models ALTER COLUMN position TYPE text"))
    _same_snapshot(_sql.load_horde(engine, snap.now), _sql.load_horde(engine, snap.now, fast=False))


def test_list_column_attaches_a_repeated_id_to_its_first_row() -> None:
    import numpy as np

    rows = _generic.RowNumbers(np.array(["a", "b", "a"], dtype=object))
    col = _generic._list_column(["a", "b", "a", "zz"], ["x", "y", "w", "q"], np.array([1, 0, 0, 0]), rows)
    assert col.tolist() == [["w", "x"], ["y"], []]
    col = _generic._list_column(["b", "a", "a"], ["y", "x", "w"], None, rows)
    assert col.tolist() == [["x", "w"], ["y"], []]


def test_sqlite_times_far_out_or_spelled_as_words_cost_their_row_only(tmp_path) -> None:
    """Year 2999 once overflowed nanoseconds and failed the whole load; 'now' was read as the wall clock."""
    engine = _sql.make_engine(f"sqlite:///{tmp_path / 'horde.sqlite'}")
    _sql.init_db(engine)
    row = dict(user_id="u", gentype="text", n=1, created="2026-11-29 11:58:00", expiry="2026-11-29 12:18:00")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO waiting_prompts (id, user_id, gentype, n, created, expiry) "
                             "VALUES (:id, :user_id, :gentype, :n, :created, :expiry)"),
                     [dict(row, id="r-good"), dict(row, id="r-2999", expiry="2999-01-01 00:00:00"),
                      dict(row, id="r-now", created="now"), dict(row, id="r-today", expiry="today"),
                      dict(row, id="r-nano", created="2026-11-29 11:58:00.123456789")])
    snap = _sql.load_horde(engine, NOW.timestamp())
    assert sorted(snap.requests.id.tolist()) == ["r-2999", "r-good", "r-nano"]
    assert {(e.id, e.field) for e in snap.rejected} == {("r-now", "created"), ("r-today", "expiry")}
    times = dict(zip(snap.requests.id, snap.requests.expiry))
    assert times["r-2999"] == datetime(2999, 1, 1, tzinfo=timezone.utc).timestamp()
    engine.dispose()


@pytest.mark.parametrize(("column", "column_type"), [("max_length", "smallint"), ("max_length", "bigint"),
                                                    ("speed", "double precision"), ("speed", "real")])
def test_fast_path_reads_a_null_in_a_column_of_any_fixed_width_type(pg_url: str, column: str, column_type: str,
                                                                    monkeypatch) -> None:
    """coalesce(smallint, 0) is an integer, which int2send does not take: a NULL once failed the whole load.
    And a real came back as 25.700000762939453 on the fast path, 25.7 on the generic one."""
    snap = horde(workers=40, requests=200, seed=5)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap, shift_to=NOW.timestamp())
    with engine.begin() as conn:
        conn.execute(sa.text(f"ALTER TABLE workers ALTER COLUMN {column} TYPE {column_type}"))
        conn.execute(sa.text(f"UPDATE workers SET {column} = NULL WHERE id LIKE '%1'"))
    monkeypatch.setattr(_generic._GenericFetch, "main", None)  # fails if the fast path fell back
    fast = _sql.load_horde(engine, NOW.timestamp())
    monkeypatch.undo()
    _same_snapshot(fast, _sql.load_horde(engine, NOW.timestamp(), fast=False))
    assert len(fast.workers) == len(snap.workers) and fast.rejected == ()
    engine.dispose()


def test_a_table_locked_by_a_migration_fails_the_cycle_with_its_reason(pg_url: str, monkeypatch) -> None:
    """With no lock timeout, a held ACCESS EXCLUSIVE lock stalled the job without a log line until released."""
    import time as _time

    from vecsched.service.job import run_cycle
    from vecsched.service.sql import schema as _schema
    from vecsched.service.store.sql import SQLStore

    monkeypatch.setattr(_schema, "LOCK_TIMEOUT_SECONDS", 0.5)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, horde(workers=10, requests=50, seed=1), shift_to=NOW.timestamp())
    migration = sa.create_engine(pg_url)
    with migration.connect() as holder:
        holder.execute(sa.text("LOCK TABLE waiting_prompts IN ACCESS EXCLUSIVE MODE"))
        started = _time.monotonic()
        report = run_cycle(lambda now: _sql.load_horde(engine, now), SQLStore(_sql.make_engine("sqlite://")),
                           lambda: NOW.timestamp())
        waited = _time.monotonic() - started
        holder.rollback()
    assert not report.ok and "lock timeout" in (report.error or "").lower() and waited < 5.0
    assert _sql.load_horde(engine, NOW.timestamp()).requests  # the lock gone, the next cycle loads
    engine.dispose()
    migration.dispose()


def test_both_postgresql_paths_order_ids_by_code_point_whatever_the_collation(pg_url: str, monkeypatch) -> None:
    """Under an ICU or en_US collation the generic path's ORDER BY id once gave another row order than the fast path's."""
    snap = horde(workers=60, requests=300, seed=8)
    doc = snap.to_dict()
    for k, w in enumerate(doc["workers"]):  # ids a linguistic collation sorts differently: case and punctuation
        w["id"] = ("W" if k % 2 else "w") + ("-" if k % 3 else "_") + w["id"]
    snap = vecsched.load_snapshot(doc)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap, shift_to=NOW.timestamp())
    with engine.begin() as conn:
        conn.execute(sa.text('ALTER TABLE workers ALTER COLUMN id TYPE varchar COLLATE "en-US-x-icu"'))
        conn.execute(sa.text('ALTER TABLE waiting_prompts ALTER COLUMN id TYPE varchar COLLATE "en-US-x-icu"'))
        conn.execute(sa.text("UPDATE workers SET threads = -1 WHERE id LIKE 'W-%'"))  # errors' row numbers too
    monkeypatch.setattr(_generic._GenericFetch, "main", None)  # fails if the fast path fell back
    fast = _sql.load_horde(engine, NOW.timestamp())
    monkeypatch.undo()
    generic = _sql.load_horde(engine, NOW.timestamp(), fast=False)
    assert fast.workers.id.tolist() == sorted(fast.workers.id.tolist())  # code point order
    _same_snapshot(fast, generic)
    engine.dispose()


def test_postgresql_connections_carry_keepalives_so_a_silent_server_ends_the_cycle(pg_url: str) -> None:
    # Without them a pooled connection whose server went silent mid-query (a partition, a frozen host)
    # blocked the cycle until TCP gave up, hours later, with no cycle line at all.
    engine = _sql.make_engine(pg_url)
    own = _sql.make_engine(pg_url + ("&" if "?" in pg_url else "?") + "keepalives_idle=20")
    try:
        for e, idle in ((engine, "10"), (own, "20")):
            with e.connect() as conn:
                params = dict(p.split("=", 1) for p in conn.connection.dbapi_connection.info.dsn.split())
            assert params["keepalives"] == "1" and params["keepalives_idle"] == idle
            assert params["tcp_user_timeout"] == "30000" and params["keepalives_count"] == "3"
    finally:
        engine.dispose()
        own.dispose()


def test_a_dump_exports_every_event_row_not_a_cycles_ten_minutes(db_url: str, tmp_path, capsys) -> None:
    # db dump read through the cycle's cut: dumped 20 minutes later, every returned pop and its return
    # older than ten minutes was left out without a word, though the tables still held them.
    from datetime import timedelta

    from vecsched.synthetic_history import with_history

    snap = with_history(horde(workers=30, requests=200, seed=5), seed=5)
    assert len(snap.dispatches) and len(snap.capacity_returns)
    src, out = tmp_path / "in.json", tmp_path / "out.json"
    snap.to_json(src)
    assert main(["db", "load", str(src), "--db", db_url, "--keep-times"]) == 0
    capsys.readouterr()
    later = (datetime.fromtimestamp(snap.now, tz=timezone.utc) + timedelta(minutes=20)).isoformat()
    assert main(["db", "dump", "-o", str(out), "--db", db_url, "--now", later]) == 0
    dumped = vecsched.load_snapshot(out).to_dict()
    original = snap.to_dict()
    for table, key in (("dispatches", "dispatch_id"), ("capacity_returns", "dispatch_id")):
        assert sorted(r[key] for r in dumped[table]) == sorted(r[key] for r in original[table]), table
    # The cycle itself still reads its ten minutes only.
    cycle = _sql.load_horde(_sql.make_engine(db_url), snap.now + 1200.0)
    assert len(cycle.capacity_returns) < len(snap.capacity_returns)


def test_init_db_brings_an_older_database_up_to_date(db_url: str) -> None:
    # A database made before waiting_prompts.kudos and the processing_gens index: init_db added
    # missing columns to workers alone, and create_all makes indexes only with a new table, so
    # every cycle failed on the missing column after an upgrade.
    engine = _sql.make_engine(db_url)
    _sql.init_db(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_processing_gens_wp_id")
        conn.exec_driver_sql("ALTER TABLE waiting_prompts DROP COLUMN kudos")
    _sql.init_db(engine)
    _sql.init_db(engine)  # idempotent
    inspector = sa.inspect(engine)
    assert "kudos" in {c["name"] for c in inspector.get_columns("waiting_prompts")}
    assert "ix_processing_gens_wp_id" in {ix["name"] for ix in inspector.get_indexes("processing_gens")}
    _insert_bad_rows(engine)
    assert _sql.load_horde(engine, NOW.timestamp()).requests.id.tolist() == ["r-good"]


def test_a_time_past_year_9999_is_a_bad_cell_on_every_path(db_url: str) -> None:
    # PostgreSQL's timestamp holds year 294000; SQLite's text, JSON and Python's datetime do not.
    # Both PostgreSQL paths took it, and db dump then failed as a whole naming no row.
    engine = _sql.make_engine(db_url)
    _sql.init_db(engine)
    _insert_bad_rows(engine)
    far = "294000-01-01 00:00:00" + ("+00" if engine.dialect.name == "postgresql" else ".000000")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE waiting_prompts SET expiry = :far WHERE id = 'r-good'"), {"far": far})
    for fast in (True, False):
        snap = _sql.load_horde(engine, NOW.timestamp(), fast=fast)
        assert "r-good" not in snap.requests.id.tolist()
        assert [(e.id, e.field) for e in snap.rejected if e.id == "r-good"] == [("r-good", "expiry")]


def test_a_never_expiring_request_survives_a_shift_to_now(tmp_path: Path) -> None:
    from vecsched.snapshot.times import LATEST

    snap = horde(workers=5, requests=20, seed=1)
    expiry = snap.requests.columns["expiry"].copy()
    expiry[0] = LATEST  # 9999-12-31T23:59:59Z, a horde's "never"
    snap = dataclasses.replace(snap, requests=Table("requests", {**snap.requests.columns, "expiry": expiry}))
    engine = _sql.make_engine(f"sqlite:///{tmp_path / 'h.sqlite'}")
    _sql.import_snapshot(engine, snap, shift_to=snap.now + 86_400.0)  # once: "year 10000 is out of range"
    loaded = _sql.load_horde(engine, snap.now + 86_400.0)
    assert loaded.rejected == () and loaded.requests.expiry.max() == LATEST


def test_a_view_exposing_a_time_as_text_loads_and_judges_each_cell(pg_url: str) -> None:
    # extract(epoch) on a text column failed every cycle ("function pg_catalog.extract(unknown, text)
    # does not exist"), naming no table or column; SQLite reads such text as times, cell by cell.
    engine = _sql.make_engine(pg_url)
    snap = horde(workers=5, requests=30, seed=2)
    _sql.import_snapshot(engine, snap)
    before = _sql.load_horde(engine, snap.now)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE waiting_prompts RENAME TO base_waiting_prompts")
        names = [c["name"] for c in sa.inspect(conn).get_columns("base_waiting_prompts")]
        first = before.requests.id[0]
        shown = ", ".join(
            f"CASE WHEN id = '{first}' THEN 'soon' ELSE to_char(expiry AT TIME ZONE 'UTC', "
            "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') END AS expiry" if name == "expiry" else name for name in names)
        conn.exec_driver_sql(f"CREATE VIEW waiting_prompts AS SELECT {shown} FROM base_waiting_prompts")
    after = _sql.load_horde(engine, snap.now)
    assert [(e.id, e.field) for e in after.rejected] == [(first, "expiry")]
    keep = before.requests.id != first
    assert after.requests.id.tolist() == before.requests.id[keep].tolist()
    assert after.requests.expiry.tolist() == before.requests.expiry[keep].tolist()
    engine.dispose()
