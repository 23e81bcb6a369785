"""vecsched.events: the horde's pops and returns reach the event tables without ever blocking or raising."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

import vecsched.events
from vecsched.events import EventRecorder
from vecsched.service.sql import load_horde
from vecsched.service.sql.schema import capacity_returns, dispatches


def test_recorded_events_load_as_the_snapshot_has_them(db_url: str) -> None:
    recorder = EventRecorder(db_url)
    now = time.time()
    assert recorder.record_dispatch("d1", worker_id="w1", request_id="r1", request_created=now - 30,
                                    dispatched_at=now - 20, assigned_work=80, worker_state="s",
                                    request_extra_priority=3, selected_from_priority_queue=True,
                                    priority_user_ids=["u2", "u1"])
    assert recorder.record_dispatch("d2", worker_id="w1", request_id="r2", request_created=now - 10,
                                    dispatched_at=now - 5, assigned_work=7.5)
    assert recorder.record_capacity_return("d1", worker_id="w1", returned_at=now - 2)
    # A retried call records once.
    assert recorder.record_capacity_return("d1", worker_id="w1", returned_at=now - 1)
    recorder.close()
    assert recorder.written == 4 and not recorder.dropped
    doc = load_horde(recorder.engine, now).to_dict()
    by_id = {d["dispatch_id"]: d for d in doc["dispatches"]}
    assert by_id["d1"]["priority_user_ids"] == ["u2", "u1"] and by_id["d1"]["request_extra_priority"] == 3
    assert by_id["d2"]["assigned_work"] == 7.5 and by_id["d2"]["priority_user_ids"] == []
    assert [c["dispatch_id"] for c in doc["capacity_returns"]] == ["d1"]


def test_never_raises_never_blocks_and_counts_drops(sqlite_url: str) -> None:
    recorder = EventRecorder(sqlite_url, maxsize=3)
    assert recorder.record_dispatch("bad", worker_id=7, request_id="r", request_created=0.0,
                                    assigned_work=1) is False
    assert recorder.record_dispatch("bad", worker_id="w", request_id="r", request_created=0.0,
                                    assigned_work=float("nan")) is False
    assert recorder.record_capacity_return("bad", worker_id="w", returned_at="yesterday") is False
    assert recorder.dropped["invalid"] == 3
    # A full queue drops at once instead of waiting for the writer.
    from vecsched.service.sql.schema import init_db

    init_db(recorder.engine)  # the tables, to hold a write lock on
    started = time.perf_counter()
    with recorder.engine.begin() as conn:  # holds SQLite's write lock: the writer is stuck
        conn.execute(sa.text("DELETE FROM capacity_returns"))
        results = [recorder.record_capacity_return(f"d{k}", worker_id="w", returned_at=1.0) for k in range(50)]
        assert time.perf_counter() - started < 1.0
    assert results.count(False) >= 40 and recorder.dropped["queue_full"] == results.count(False)
    recorder.close()
    assert recorder.record_capacity_return("late", worker_id="w") is False
    assert recorder.dropped["closed"] == 1


def test_a_failed_write_is_counted_and_the_writer_goes_on(sqlite_url: str) -> None:
    recorder = EventRecorder(sqlite_url)
    assert recorder.record_capacity_return("d0", worker_id="w", returned_at=1.0)
    recorder.flush()  # the writer has made the tables
    with recorder.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE capacity_returns"))
    assert recorder.record_capacity_return("d1", worker_id="w", returned_at=1.0)
    recorder.flush()
    assert recorder.dropped["write_failed"] == 1
    with recorder.engine.begin() as conn:
        capacity_returns.create(conn)
    assert recorder.record_capacity_return("d2", worker_id="w", returned_at=1.0)
    recorder.close()
    with recorder.engine.connect() as conn:
        assert conn.execute(sa.select(capacity_returns.c.dispatch_id)).scalars().all() == ["d2"]


@pytest.mark.parametrize("fields", [
    {"returned_at": time.time_ns()},  # nanoseconds as seconds: OSError from datetime, once raised into the pop
    {"returned_at": -1e17},
    {"worker_id": "w\x00"},  # neither database stores a NUL
    {"worker_id": "w\udc80"},  # nor a lone surrogate
])
def test_a_return_no_database_could_store_is_refused_at_the_call(sqlite_url: str, fields: dict) -> None:
    recorder = EventRecorder(sqlite_url)
    assert recorder.record_capacity_return("d", **{"worker_id": "w", "returned_at": 1.0, **fields}) is False
    assert vecsched.events.record_capacity_return("d", **{"worker_id": "w", "returned_at": 1.0, **fields}) is False
    recorder.close()
    assert recorder.dropped["invalid"] == 1


@pytest.mark.parametrize("fields", [
    {"request_extra_priority": 3.9},  # was stored as 3
    {"request_extra_priority": 2**70},  # once failed its whole batch
    {"request_extra_priority": True},
    {"selected_from_priority_queue": "no"},  # was stored as True
    {"dispatched_at": time.time() * 1000},
])
def test_a_dispatch_field_the_loader_would_refuse_is_refused_at_the_call(sqlite_url: str, fields: dict) -> None:
    recorder = EventRecorder(sqlite_url)
    good = {"worker_id": "w", "request_id": "r", "request_created": 0.0, "assigned_work": 1.0,
            "dispatched_at": 5.0, "request_extra_priority": 2, "selected_from_priority_queue": 1}
    assert recorder.record_dispatch("ok", **good) is True
    assert recorder.record_dispatch("bad", **{**good, **fields}) is False
    recorder.close()
    assert recorder.dropped == {"invalid": 1} and recorder.written == 1


def test_one_event_the_database_refuses_drops_only_itself(sqlite_url: str) -> None:
    # The writer inserts a batch in one transaction; a refused row used to take the other 499 with it.
    engine = sa.create_engine(sqlite_url)
    strict = sa.Table("capacity_returns", sa.MetaData(),
                      *(sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
                        for c in capacity_returns.columns),
                      sa.CheckConstraint("worker_id != 'refused'"))
    strict.create(engine)
    recorder = EventRecorder(sqlite_url)
    for k in range(300):
        assert recorder.record_capacity_return(f"d{k}", worker_id="refused" if k == 150 else "w", returned_at=1.0)
    recorder.close()
    assert recorder.written == 299 and recorder.dropped == {"write_failed": 1}
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(strict)).scalar_one() == 299


def test_close_keeps_one_bound_and_counts_every_event_once(tmp_path) -> None:
    # A database that holds the writer past the timeout, and a full queue: close used to take three
    # timeouts, leave the writer running for good, and count as dropped events it then wrote.
    import sqlite3

    path = tmp_path / "held.sqlite"
    recorder = EventRecorder(f"sqlite:///{path}", maxsize=10)
    assert recorder.record_capacity_return("warm", worker_id="w", returned_at=1.0) and recorder.flush()
    hold = sqlite3.connect(path, isolation_level=None, timeout=1)
    hold.execute("BEGIN EXCLUSIVE")
    for k in range(30):
        recorder.record_capacity_return(f"d{k}", worker_id="w", returned_at=2.0)
        time.sleep(0.02 if k < 11 else 0.0)  # the writer takes its batch, then the queue fills
    started = time.monotonic()
    recorder.close(timeout=1.0)
    closing = time.monotonic() - started
    hold.execute("ROLLBACK")
    hold.close()
    recorder._thread.join(30)
    assert closing < 2.5 and not recorder._thread.is_alive()
    assert recorder.written + sum(recorder.dropped.values()) == 31
    with recorder.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(capacity_returns)).scalar_one() == recorder.written


def test_a_database_that_does_not_answer_never_holds_the_caller() -> None:
    # The recorder used to create its tables in the caller's thread: with a server that accepts and never
    # replies, every record call of the horde's pop path took the 10 s connect timeout.
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    try:
        started = time.perf_counter()
        recorder = EventRecorder(f"postgresql+psycopg://u@127.0.0.1:{port}/db?connect_timeout=3")
        results = [recorder.record_capacity_return(f"d{k}", worker_id="w", returned_at=1.0) for k in range(3)]
        assert time.perf_counter() - started < 1.0 and results == [True] * 3
        recorder.close(timeout=0.2)
    finally:
        silent.close()


def _run(code: str, tmp_path) -> str:
    import subprocess
    import sys
    import textwrap

    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_events_accepted_before_the_interpreter_exits_are_written(tmp_path) -> None:
    # The writer is a daemon thread: at exit, 1,500 of 2,000 accepted events vanished uncounted.
    url = f"sqlite:///{tmp_path / 'horde.sqlite'}"
    _run(f"""
        import vecsched.events as events
        events.configure({url!r})
        for k in range(2000):
            assert events.record_dispatch(f"d{{k}}", worker_id="w", request_id="r", request_created=1.0,
                                          assigned_work=1.0, dispatched_at=2.0)
    """, tmp_path)
    with sa.create_engine(url).connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar() == 2000


def test_a_recorder_configured_before_a_fork_writes_in_the_child(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'horde.sqlite'}"
    out = _run(f"""
        import os
        import vecsched.events as events
        recorder = events.configure({url!r})
        pid = os.fork()
        if pid == 0:
            for k in range(10):
                events.record_capacity_return(f"c{{k}}", worker_id="w", returned_at=1.0)
            recorder.close()
            print("child", recorder.written, dict(recorder.dropped), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
    """, tmp_path)
    assert out.strip() == "child 10 {}"


def test_module_functions_use_the_configured_database(sqlite_url: str) -> None:
    recorder = vecsched.events.configure(sqlite_url)
    assert vecsched.events.record_dispatch("d1", worker_id="w", request_id="r", request_created=1.0,
                                           assigned_work=1.0, dispatched_at=2.0)
    assert vecsched.events.record_dispatch("d2", worker="typo") is False  # an unknown keyword: dropped
    recorder.close()
    with recorder.engine.connect() as conn:
        assert conn.execute(sa.select(dispatches.c.dispatch_id)).scalars().all() == ["d1"]
