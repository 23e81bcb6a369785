"""The periodic job: one log line per cycle, faults that publish nothing, recovery, CLI."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import sqlalchemy as sa

import vecsched
from vecsched.service import sql as _sql
from vecsched.service.job import SQLLoader, run_cycle, run_service
from vecsched.service.store.redis import RedisStore
from vecsched.service.store.sql import SQLStore
from vecsched.service.read import status
from vecsched.synthetic import horde

UNREACHABLE_DB = "postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2"


@pytest.fixture
def small_horde(sqlite_url):
    snap = horde(workers=40, requests=300, seed=2)
    _sql.import_snapshot(_sql.make_engine(sqlite_url), snap)
    return sqlite_url, snap


def _a_waiting_id(snap) -> str:
    return vecsched.estimate(snap).request_id[0]


def test_cycle_report_and_log_line(small_horde, redis_store, caplog) -> None:
    url, snap = small_horde
    with caplog.at_level(logging.INFO, logger="vecsched.job"):
        report = run_cycle(SQLLoader(url), redis_store, lambda: snap.now)
    assert report.ok and report.error is None
    assert (report.workers, report.requests) == (len(snap.workers), len(snap.requests))
    assert report.published == len(vecsched.estimate(snap))
    assert min(report.load, report.estimate, report.publish) > 0
    lines = [r.getMessage() for r in caplog.records if r.name == "vecsched.job"]
    assert len(lines) == 1
    for part in ("load=", "estimate=", "publish=", "workers=40", "requests=300", "rejected=0"):
        assert part in lines[0]


def test_unreachable_database_publishes_nothing(small_horde, redis_store, caplog) -> None:
    url, snap = small_horde
    rid = _a_waiting_id(snap)
    assert run_cycle(SQLLoader(url), redis_store, lambda: snap.now).ok
    before = status(rid, store=redis_store, now=snap.now + 1)
    with caplog.at_level(logging.INFO, logger="vecsched.job"):
        report = run_cycle(SQLLoader(UNREACHABLE_DB), redis_store, lambda: snap.now + 5)
    assert not report.ok and "OperationalError" in report.error
    assert "FAILED" in caplog.records[-1].getMessage()
    # the last good cycle is still the one readers get, until it goes stale
    assert status(rid, store=redis_store, now=snap.now + 1) == before
    assert status(rid, store=redis_store, now=snap.now + 16)["stale"] is True


def test_bad_rows_are_counted_not_fatal(small_horde, redis_store) -> None:
    url, snap = small_horde
    engine = _sql.make_engine(url)
    with engine.begin() as conn:
        conn.execute(_sql.workers.insert(), [{"id": "zz-bad", "user_id": "u", "gentype": "text",
                                              "last_check_in": None, "threads": -1}])
        conn.execute(_sql.waiting_prompts.insert(), [{"id": "zz-bad-wp", "user_id": "u", "gentype": "audio",
                                                      "n": 1, "created": None, "expiry": None}])
    report = run_cycle(SQLLoader(engine), redis_store, lambda: snap.now)
    assert report.ok
    assert {e.id for e in report.rejected} == {"zz-bad", "zz-bad-wp"}
    assert report.published == len(vecsched.estimate(snap))  # others' figures unharmed
    assert status("zz-bad-wp", store=redis_store, now=snap.now)["unknown"] is True


def test_failing_estimate_publishes_nothing(small_horde, sql_url_store) -> None:
    url, snap = small_horde
    store = sql_url_store
    assert run_cycle(SQLLoader(url), store, lambda: snap.now).ok
    first = store.read_status("x")

    def boom(snapshot):
        raise RuntimeError("estimator bug")

    report = run_cycle(SQLLoader(url), store, lambda: snap.now + 5, estimate=boom)
    assert not report.ok and report.error == "RuntimeError: estimator bug"
    assert store.read_status("x").cycle_id == first.cycle_id


@pytest.fixture
def sql_url_store(tmp_path):
    return SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


class _Reports(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        if record.name == "vecsched.job" and record.getMessage().startswith("cycle"):
            self.lines.append(record.getMessage())


def test_redis_stopped_mid_run_then_restarted(small_horde, private_redis) -> None:
    url, snap = small_horde
    rid = _a_waiting_id(snap)
    store = RedisStore(private_redis.url, prefix="job")
    reader = RedisStore(private_redis.url, prefix="job")
    handler = _Reports()
    logger = logging.getLogger("vecsched.job")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    clock_base = time.time()
    # The horde's own clock advances with the wall clock from the snapshot's now.
    clock = lambda: snap.now + (time.time() - clock_base)  # noqa: E731
    stop = threading.Event()
    job = threading.Thread(target=run_service, args=(SQLLoader(url), store),
                           kwargs={"interval": 0.2, "clock": clock, "stop": stop, "install_signals": False})
    job.start()
    try:
        assert _wait_for(lambda: any(line.startswith("cycle ok") for line in handler.lines))
        good = reader.read_status(rid)
        private_redis.stop()
        n = len(handler.lines)
        assert _wait_for(lambda: any("FAILED" in line for line in handler.lines[n:]))
        failed = [line for line in handler.lines[n:] if "FAILED" in line]
        assert "ConnectionError" in failed[0] or "Connection" in failed[0]
        assert job.is_alive()
        private_redis.start()
        # after the restart the last good cycle is there (never a partial one) ...
        after = reader.read_status(rid)
        assert after.time >= good.time
        # ... and the next cycle publishes again
        m = len(handler.lines)
        assert _wait_for(lambda: any(line.startswith("cycle ok") for line in handler.lines[m:]))
        assert _wait_for(lambda: reader.read_status(rid).time > after.time)
    finally:
        stop.set()
        job.join(timeout=60)
        logger.removeHandler(handler)
    assert not job.is_alive()


def _env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VECSCHED_DATABASE_URL", "REDIS_URL", "VECSCHED_REDIS_PREFIX")}
    env["VECSCHED_HOME"] = str(tmp_path)
    return env


def test_embedded_default_run_once_then_status(tmp_path) -> None:
    env = _env(tmp_path)
    # A long interval: the figures stay fresh (three intervals) however slowly the
    # three interpreters below start on a loaded machine.
    run = subprocess.run([sys.executable, "-m", "vecsched", "run", "--once", "--interval", "600"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "demo" in run.stderr and "cycle ok" in run.stderr
    # the first cycle tells where the figures are
    assert "list them with vecsched top, read one with vecsched status ID" in run.stderr
    assert (tmp_path / "vecsched.sqlite").exists()
    # A waiting request of the demo horde, listed by top, reads back through the CLI.
    store = SQLStore(f"sqlite:///{tmp_path / 'vecsched.sqlite'}")
    top = subprocess.run([sys.executable, "-m", "vecsched", "top", "--json", "-n", "1"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    rid = json.loads(top.stdout)[0]["id"]
    out = subprocess.run([sys.executable, "-m", "vecsched", "status", rid], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=True)
    doc = json.loads(out.stdout)
    assert doc["stale"] is False and isinstance(doc["queue_position"], int)
    store.close()


def test_run_once_fails_with_unreachable_database(tmp_path) -> None:
    env = _env(tmp_path)
    run = subprocess.run([sys.executable, "-m", "vecsched", "run", "--once", "--db", UNREACHABLE_DB],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "FAILED" in run.stderr and "OperationalError" in run.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_shuts_down_cleanly_on_signal(tmp_path, sig) -> None:
    env = _env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "vecsched", "run", "--interval", "0.5"], env=env,
                            cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr))
    reader.start()
    try:
        assert _wait_for(lambda: any("cycle ok" in line for line in lines), timeout=120)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=10)
    assert any("job stopped" in line for line in lines)
    # one line per cycle: the scheduler's own per-run lines stay out of an INFO log
    assert not any("apscheduler" in line for line in lines if " INFO " in line)


@pytest.mark.parametrize("backend", ["redis", "sql"])
def test_superseded_cycle_reports_nothing_published(backend, small_horde, request, tmp_path, caplog) -> None:
    """Another job process already published a newer cycle: this one switches nothing,
    so it says published=0 and superseded (still ok, not an error)."""
    url, snap = small_horde
    store = (request.getfixturevalue("redis_store") if backend == "redis"
             else SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}"))
    newer = run_cycle(SQLLoader(url), store, lambda: snap.now + 10)
    assert newer.ok and newer.published > 0 and not newer.superseded
    with caplog.at_level(logging.INFO, logger="vecsched.job"):
        older = run_cycle(SQLLoader(url), store, lambda: snap.now)
    assert older.ok and older.error is None
    assert older.published == 0 and older.superseded
    *_, line, warning = [r for r in caplog.records if r.name == "vecsched.job"]
    assert line.levelno == logging.INFO
    assert "superseded" in line.getMessage() and "published=0" in line.getMessage()
    # And at WARNING, with the cause an operator checks: a lone job whose clock went back
    # publishes nothing until it passes the current cycle's time.
    assert warning.levelno == logging.WARNING and "clock went back" in warning.getMessage()
    assert store.read_status(_a_waiting_id(snap)).time == snap.now + 10


def test_a_second_stop_signal_exits_even_while_a_cycle_hangs(tmp_path) -> None:
    # A cycle stuck on a database that stopped answering held the first signal's graceful stop for as
    # long as it hung; a second signal now exits at once, publishing nothing half-done.
    code = textwrap.dedent("""
        import logging, sys, threading, time
        from vecsched.service.job import run_service
        from vecsched.service.store.sql import SQLStore
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        def hang(now):
            print("loading", flush=True)
            time.sleep(600)
        run_service(hang, SQLStore("sqlite://"), interval=0.5)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "loading"
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)  # the first waits for the running cycle
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "second stop signal" in proc.stderr.read()
