"""The fault suite: a corrupted database, oversized strings, a replaced file, secrets in logs.

Every case is a way an operator's worst day broke the job before: one bad
SQLite cell failed the whole cycle or was silently taken for something else,
one oversized string took gigabytes, a deleted file went on being read, a
password reached the log. Each is judged the way a JSON row is: the row is
left out with an error naming table, row, id and field, and every other row
loads exactly as if the bad one were absent.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import vecsched
from vecsched.cli import main
from vecsched.service import sql as _sql
from vecsched.service.job import SQLLoader, run_cycle
from vecsched.service.sql import generic as _generic
from vecsched.service.store.sql import SQLStore
from vecsched.snapshot import cells
from vecsched.snapshot.cells import printable_id
from vecsched.synthetic import horde


def _sibling(name: str) -> Any:
    """A test module beside this one, loaded by path (tests are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_sibling_{name}", Path(__file__).parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_same_snapshot = _sibling("test_sql")._same_snapshot  # the differential check of the two SQL paths

SNAP = horde(workers=30, requests=200, seed=4)

# (case, SQL table, snapshot table, statement with :id, field, message)
SQLITE_CORRUPTIONS = [
    ("text in threads", "workers", "update workers set threads = 'abc' where id = :id", "threads", cells.NOT_INT),
    ("text in speed", "workers", "update workers set speed = 'fast' where id = :id", "speed", "must be a number"),
    ("text in n", "requests", "update waiting_prompts set n = 'two' where id = :id", "n", cells.NOT_INT),
    ("blob in n", "requests", "update waiting_prompts set n = x'00ff' where id = :id", "n", cells.NOT_INT),
    ("REAL threads", "workers", "update workers set threads = 3.7 where id = :id", "threads", cells.NOT_INT),
    ("REAL n", "requests", "update waiting_prompts set n = 2.5 where id = :id", "n", cells.NOT_INT),
    ("text boolean", "workers", "update workers set maintenance = 'yes' where id = :id", "maintenance", cells.NOT_BOOL),
    ("boolean 2", "workers", "update workers set paused = 2 where id = :id", "paused", cells.NOT_BOOL),
    ("most negative priority", "requests",
     "update waiting_prompts set extra_priority = -9223372036854775808 where id = :id", "extra_priority", cells.INT_RANGE),
    ("priority past 32 bits", "requests",
     "update waiting_prompts set extra_priority = 2147483648 where id = :id", "extra_priority", "must be <= 2147483647"),
    ("REAL +1e300 priority", "requests",
     "update waiting_prompts set extra_priority = 1e300 where id = :id", "extra_priority", cells.NOT_INT),
    ("REAL -1e300 priority", "requests",
     "update waiting_prompts set extra_priority = -1e300 where id = :id", "extra_priority", cells.NOT_INT),
    ("infinite speed", "workers", "update workers set speed = 9e999 where id = :id", "speed", cells.NOT_FINITE),
    ("invalid UTF-8 text", "workers",
     "update workers set bridge_agent = cast(x'fffe41' as text) where id = :id", "bridge_agent", cells.NOT_UTF8),
    ("invalid UTF-8 id", "requests",
     "update waiting_prompts set id = cast(x'fffe41' as text) || id where id = :id", "id", cells.NOT_UTF8),
    ("lone surrogate id", "workers",
     "update workers set id = cast(x'eda080' as text) || id where id = :id", "id", cells.NOT_UTF8),
    ("invalid UTF-8 model", "workers",
     "update worker_models set model = cast(x'c0' as text) where worker_id = :id", "models", "entry " + cells.NOT_UTF8),
    ("invalid UTF-8 time", "jobs",
     "update processing_gens set started = cast(x'ff' as text) where id = :id", "started", cells.NOT_UTF8),
    ("blob user id", "requests", "update waiting_prompts set user_id = x'00' where id = :id", "user_id", cells.BLOB),
    ("NUL in a string", "workers", "update workers set state = cast(x'610062' as text) where id = :id", "state", cells.NUL),
    ("oversized user id", "requests",
     "update waiting_prompts set user_id = printf('%.300c', 'u') where id = :id", "user_id", cells.TOO_LONG),
    ("oversized model", "requests",
     "update wp_models set model = printf('%.257c', 'm') where wp_id = :id", "models", "entry " + cells.TOO_LONG),
    ("oversized targeted worker", "requests",
     "insert into wp_allowed_workers values (:id, 9, printf('%.999c', 'w'))", "worker_ids", "entry " + cells.TOO_LONG),
    ("text time", "requests", "update waiting_prompts set created = 'yesterday' where id = :id", "created", "must be a time"),
    ("blob time", "workers", "update workers set last_check_in = x'ff' where id = :id", "last_check_in", "must be a time"),
    ("number as enum", "jobs", "update processing_gens set state = 5 where id = :id", "state",
     "must be one of processing, finished, faulted"),
]

_SQL_TABLE = {"workers": "workers", "requests": "waiting_prompts", "jobs": "processing_gens"}


@pytest.fixture(scope="module")
def base_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "base.sqlite"
    engine = _sql.make_engine(f"sqlite:///{path}")
    _sql.import_snapshot(engine, SNAP)
    engine.dispose()
    return path


def _target(snapshot: vecsched.Snapshot, table: str) -> tuple[int, str]:
    """A row of ``table`` that has models and jobs to damage: the loader's row number and its id."""
    ids = getattr(snapshot, table).id.tolist()
    if table == "requests":
        with_models = set(snapshot.requests.id[snapshot.requests.models.lengths > 0].tolist())
        with_models &= set(snapshot.jobs.request_id.tolist()) | with_models
        k = next(k for k, i in enumerate(ids) if i in with_models)
    else:
        k = 3
    return k, ids[k]


@pytest.mark.parametrize("case, table, statement, field, message", SQLITE_CORRUPTIONS, ids=[c[0] for c in SQLITE_CORRUPTIONS])
def test_sqlite_bad_cell_costs_its_row_only(tmp_path: Path, base_file: Path, case: str, table: str,
                                            statement: str, field: str, message: str) -> None:
    damaged, deleted = tmp_path / "damaged.sqlite", tmp_path / "deleted.sqlite"
    shutil.copy(base_file, damaged)
    shutil.copy(base_file, deleted)
    clean = _sql.load_horde(_sql.make_engine(f"sqlite:///{base_file}"), SNAP.now)
    row, rid = _target(clean, table)
    with sqlite3.connect(damaged) as conn:
        conn.execute(statement, {"id": rid})
    with sqlite3.connect(deleted) as conn:
        conn.execute(f"delete from {_SQL_TABLE[table]} where id = :id", {"id": rid})

    got = _sql.load_horde(_sql.make_engine(f"sqlite:///{damaged}"), SNAP.now)
    (error,) = got.rejected
    assert (error.table, error.field, error.message) == (table, field, message)
    if field != "id":
        assert (error.row, error.id) == (row, rid)
    else:  # a damaged id sorts elsewhere; the error shows it escaped
        assert error.id is not None and error.id.endswith(rid) and error.id != rid
    str(error).encode("utf-8")
    # Every other row loads exactly as if the damaged one had never been there.
    want = _sql.load_horde(_sql.make_engine(f"sqlite:///{deleted}"), SNAP.now)
    assert got.to_dict() == want.to_dict()
    assert vecsched.estimate(got).to_frame().equals(vecsched.estimate(want).to_frame())


# PostgreSQL's types rule out invalid UTF-8, lone surrogates and NUL; a horde
# database (or a view over one) can still hold text or numeric where a number
# is due, or an integer where a boolean is.
PG_CORRUPTIONS = [
    # (ALTER or None, table, field, new value, message, whether the ALTER makes every row's cell wrong)
    ("ALTER TABLE workers ALTER COLUMN threads TYPE text", "workers", "threads", "'abc'", cells.NOT_INT, True),
    ("ALTER TABLE workers ALTER COLUMN speed TYPE text", "workers", "speed", "'fast'", "must be a number", True),
    ("ALTER TABLE waiting_prompts ALTER COLUMN n TYPE numeric", "requests", "n", "2.5", cells.NOT_INT, False),
    ("ALTER TABLE workers ALTER COLUMN maintenance TYPE integer USING maintenance::int", "workers", "maintenance",
     "2", cells.NOT_BOOL, False),
    (None, "requests", "extra_priority", "-9223372036854775808", cells.INT_RANGE, False),
    ("ALTER TABLE waiting_prompts ALTER COLUMN width TYPE numeric", "requests", "width", "1e300", cells.INT_RANGE, False),
    (None, "workers", "speed", "'NaN'", cells.NOT_FINITE, False),
    (None, "workers", "speed", "'-Infinity'", cells.NOT_FINITE, False),
    # 1.0 is no boolean (nor is it in JSON)
    ("ALTER TABLE workers ALTER COLUMN nsfw TYPE float8 USING nsfw::int::float8", "workers", "nsfw", "0.5",
     cells.NOT_BOOL, True),
    (None, "workers", "user_id", "repeat('u', 300)", cells.TOO_LONG, False),
]


@pytest.mark.parametrize("alter, table, field, value, message, every_row", PG_CORRUPTIONS, ids=[f"{c[2]}={c[3][:20]}" for c in PG_CORRUPTIONS])
def test_pg_bad_cell_on_both_paths(pg_url: str, monkeypatch: pytest.MonkeyPatch, alter: str | None, table: str,
                                   field: str, value: str, message: str, every_row: bool) -> None:
    snap = horde(workers=20, requests=100, seed=4)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap)
    clean = _sql.load_horde(engine, snap.now)
    rid = getattr(clean, table).id[5]
    with engine.begin() as conn:
        if alter:
            conn.execute(sa.text(alter))
        conn.execute(sa.text(f"UPDATE {_SQL_TABLE[table]} SET {field} = {value} WHERE id = :id"), {"id": rid})
    # The fast path must judge these itself: it may not quietly fall back.
    monkeypatch.setattr(_generic._GenericFetch, "main", None)
    fast = _sql.load_horde(engine, snap.now)
    monkeypatch.undo()
    _same_snapshot(fast, _sql.load_horde(engine, snap.now, fast=False))
    mine = [e for e in fast.rejected if e.id == rid]
    assert [(e.table, e.row, e.field, e.message) for e in mine] == [(table, 5, field, message)]
    if every_row:
        # Text where a number is due is no number, whatever it spells (as in JSON): every row
        # with a value there goes; a NULL takes the default.
        with engine.connect() as conn:
            nulls = conn.execute(sa.text(f"SELECT count(*) FROM {_SQL_TABLE[table]} WHERE {field} IS NULL")).scalar()
        assert len(getattr(fast, table)) == nulls
    else:
        assert len(fast.rejected) == 1
        assert len(getattr(fast, table)) == len(getattr(clean, table)) - 1


# -- oversized strings: memory stays proportional to rows -------------------------------------------


def _oversized_sqlite(path: Path) -> tuple[str, str]:
    snap = horde(workers=50, requests=500, seed=9)
    engine = _sql.make_engine(f"sqlite:///{path}")
    _sql.import_snapshot(engine, snap)
    engine.dispose()
    worker, request = snap.workers.id[0], snap.requests.id[0]
    with sqlite3.connect(path) as conn:
        conn.execute("update worker_models set model = ? where worker_id = ?", ("M" * 5_000_000, worker))
        conn.execute("update waiting_prompts set user_id = ? where id = ?", ("U" * 2_000_000, request))
    return worker, request


def test_oversized_strings_cost_their_rows_not_the_cycle(tmp_path: Path) -> None:
    path = tmp_path / "big.sqlite"
    worker, request = _oversized_sqlite(path)
    loader, store = SQLLoader(f"sqlite:///{path}"), SQLStore(f"sqlite:///{path}")
    run_cycle(loader, store, lambda: SNAP.now)  # warm-up: imports and caches out of the measure
    tracemalloc.start()
    try:
        report = run_cycle(loader, store, lambda: SNAP.now + 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.ok, report.error
    assert {(e.id, e.field, e.message) for e in report.rejected} == {
        (worker, "models", "entry " + cells.TOO_LONG), (request, "user_id", cells.TOO_LONG)}
    # Before: 6.2 GB and a failed cycle. Now the oversized cells are cut in SQL and
    # the cycle costs what it costs without them (under 1 MiB here).
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    reading = store.read_prospective()
    assert reading is not None and len(reading.value) < 2**20


@pytest.mark.parametrize("fast", [True, False])
def test_oversized_strings_on_postgresql_are_cut_in_sql(pg_url: str, fast: bool) -> None:
    snap = horde(workers=50, requests=500, seed=9)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap)
    worker, request = snap.workers.id[0], snap.requests.id[0]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE worker_models SET model = repeat('M', 5000000) WHERE worker_id = :w"), {"w": worker})
        conn.execute(sa.text("UPDATE waiting_prompts SET user_id = repeat('U', 2000000) WHERE id = :r"), {"r": request})
    _sql.load_horde(engine, snap.now, fast=fast)  # warm-up
    tracemalloc.start()
    try:
        got = _sql.load_horde(engine, snap.now, fast=fast)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert {(e.id, e.field) for e in got.rejected} == {(worker, "models"), (request, "user_id")}
    # psycopg took 174 MiB to fetch these 7 MB; cut in SQL, they cost nothing.
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_oversized_strings_from_json_stay_small() -> None:
    doc = horde(workers=50, requests=500, seed=9).to_dict()
    doc["workers"][0]["models"] = ["M" * 5_000_000]
    doc["requests"][0]["user_id"] = "U" * 2_000_000
    from vecsched.core.prospective import build_prospective_state
    from vecsched.service.payload import encode_payloads

    tracemalloc.start()
    try:
        snap = vecsched.load_snapshot(doc)
        estimates = vecsched.estimate(snap)
        state = build_prospective_state(snap, estimates)
        encode_payloads(estimates, snap.now)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(snap.rejected) == 2 and len(state) < 2**20
    assert max(map(len, snap.model_names.tolist())) <= cells.MAX_STRING_BYTES
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_prospective_state_has_no_fixed_width_strings() -> None:
    # A state built from rows with long (allowed) names is as big as the names, not rows x longest.
    import io

    import numpy as np

    from vecsched.core.prospective import build_prospective_state

    doc = horde(workers=200, requests=300, seed=1).to_dict()
    doc["workers"][0]["models"].append("L" * cells.MAX_STRING_BYTES)
    with np.load(io.BytesIO(build_prospective_state(vecsched.load_snapshot(doc))), allow_pickle=False) as data:
        kinds = {data[k].dtype.kind for k in data.files}
    assert "U" not in kinds and "S" not in kinds


# -- a replaced or deleted database file --------------------------------------------------------------


def test_deleted_then_replaced_file_is_noticed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, other = tmp_path / "vecsched.sqlite", tmp_path / "other.sqlite"
    first, second = horde(workers=20, requests=100, seed=1), horde(workers=10, requests=50, seed=2)
    for snap, where in ((first, path), (second, other)):
        engine = _sql.make_engine(f"sqlite:///{where}")
        _sql.import_snapshot(engine, snap)
        engine.dispose()
    loader, store = SQLLoader(f"sqlite:///{path}"), SQLStore(f"sqlite:///{path}")
    assert run_cycle(loader, store, lambda: first.now).workers == 20

    os.remove(path)
    report = run_cycle(loader, store, lambda: first.now + 1)
    assert not report.ok and "DatabaseFileMissing" in report.error and str(path) in report.error
    assert not path.exists()  # not silently recreated empty

    os.replace(other, path)
    report = run_cycle(loader, store, lambda: first.now + 2)
    assert report.ok and report.workers == 10 and report.requests == 50
    assert store.read_current() is not None


def test_file_replaced_in_place_is_reopened(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, other = tmp_path / "vecsched.sqlite", tmp_path / "other.sqlite"
    first, second = horde(workers=20, requests=100, seed=1), horde(workers=10, requests=50, seed=2)
    for snap, where in ((first, path), (second, other)):
        engine = _sql.make_engine(f"sqlite:///{where}")
        _sql.import_snapshot(engine, snap)
        engine.dispose()
    loader = SQLLoader(f"sqlite:///{path}")
    assert len(loader(first.now).workers) == 20
    os.replace(other, path)
    with caplog.at_level(logging.WARNING, logger="vecsched.db"):
        assert len(loader(first.now).workers) == 10
    assert any("was replaced" in r.getMessage() for r in caplog.records)


# -- logs --------------------------------------------------------------------------------------------


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vecsched", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_database_password_never_logged(tmp_path: Path) -> None:
    result = _run_cli("run", "--once", "--db", "postgresql+psycopg://postgres:PASSWORD@127.0.0.1:1/test")
    assert result.returncode == 1
    assert "PASSWORD" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    # One line per event: the driver's hints do not spill over.
    assert all(line[:4].isdigit() for line in result.stderr.strip().splitlines()), result.stderr


def test_log_filter_masks_any_record(caplog: pytest.LogCaptureFixture) -> None:
    from vecsched.service.redact import MaskPasswords

    handler = logging.StreamHandler(io := __import__("io").StringIO())
    handler.addFilter(MaskPasswords())
    log = logging.getLogger("vecsched.test_mask")
    log.addHandler(handler)
    try:
        log.warning("engine %s failed", "postgresql+psycopg://postgres:PASSWORD@db:5432/horde")
        log.warning("redis at rediss://default:PASSWORD@cache:6380/0 is down")
    finally:
        log.removeHandler(handler)
    assert "PASSWORD" not in io.getvalue() and io.getvalue().count(":***@") == 2


def test_redis_password_never_logged(tmp_path: Path) -> None:
    result = _run_cli("run", "--once", "--db", f"sqlite:///{tmp_path / 'h.sqlite'}",
                      "--redis", "redis://:PASSWORD@127.0.0.1:1/0")
    assert result.returncode == 1
    assert "PASSWORD" not in result.stderr + result.stdout


def test_no_ids_at_info_and_rejections_counted_per_field(tmp_path: Path, base_file: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "h.sqlite"
    shutil.copy(base_file, path)
    ids = SNAP.workers.id.tolist()[:2] + SNAP.requests.id.tolist()[:3]
    with sqlite3.connect(path) as conn:
        conn.execute("update workers set threads = 'abc' where id in (?, ?)", ids[:2])
        conn.execute("update waiting_prompts set n = 2.5 where id in (?, ?)", ids[2:4])
        conn.execute("update waiting_prompts set user_id = x'00' where id = ?", ids[4:])
    with caplog.at_level(logging.DEBUG, logger="vecsched"):
        report = run_cycle(SQLLoader(f"sqlite:///{path}"), SQLStore("sqlite://"), lambda: SNAP.now)
    assert report.ok and len(report.rejected) == 5
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    (line,) = loud
    assert "rejected=5" in line and "rejected_by_field=[requests.n=2,workers.threads=2,requests.user_id=1]" in line
    users = set(SNAP.workers.user_id.tolist()) | set(SNAP.requests.user_id.tolist())
    assert not any(i in line for i in ids + sorted(users))
    quiet = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert all(any(i in m for m in quiet) for i in ids)  # the ids are there for whoever asks


def test_db_check_lists_every_rejected_row(tmp_path: Path, base_file: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "h.sqlite"
    shutil.copy(base_file, path)
    url = f"sqlite:///{path}"
    assert main(["db", "check", "--db", url]) == 0
    ids = SNAP.requests.id.tolist()[:4]
    with sqlite3.connect(path) as conn:
        conn.execute("update waiting_prompts set n = 'two' where id in (?, ?, ?, ?)", ids)
    capsys.readouterr()
    assert main(["db", "check", "--db", url]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and out[-1].startswith("4 rejected rows (requests.n=4)")
    for rid, line in zip(sorted(ids), out):
        assert printable_id(rid) in line and "'n'" in line


def test_pg_uuid_keys_read_as_text(pg_url: str) -> None:
    # The horde keys workers by uuid columns; such a key is its text, on both paths.
    snap = horde(workers=20, requests=100, seed=4)
    engine = _sql.make_engine(pg_url)
    _sql.import_snapshot(engine, snap)
    before = _sql.load_horde(engine, snap.now)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE workers ALTER COLUMN id TYPE uuid USING id::uuid"))
        conn.execute(sa.text("ALTER TABLE worker_models ALTER COLUMN worker_id TYPE uuid USING worker_id::uuid"))
    for fast in (True, False):
        got = _sql.load_horde(engine, snap.now, fast=fast)
        assert got.rejected == () and got.to_dict() == before.to_dict()


@pytest.mark.parametrize("module", ["service/redact", "service/sqlite_file", "snapshot/cells"])
def test_new_modules_have_type_hints_and_numpydoc(module: str) -> None:
    assert _sibling("test_publish")._api_problems(f"{vecsched.__path__[0]}/{module}.py") == []
