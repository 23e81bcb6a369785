"""The demo horde of ``vecsched run`` stays alive, drives only its own file, and says how to read it."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from vecsched.cli import main
from vecsched.service import sql as _sql
from vecsched.service.demo import DemoHorde, is_demo
from vecsched.service.job import SQLLoader, _CycleWithHint, run_cycle
from vecsched.service.store.sql import SQLStore
from vecsched.service.top import current_payloads, top_frame
from vecsched.synthetic import horde

T0 = 1.9e9  # an injected clock: the demo never reads the wall clock


def test_fifteen_simulated_minutes_stay_alive(tmp_path: Path) -> None:
    engine = _sql.make_engine(f"sqlite:///{tmp_path / 'demo.sqlite'}")
    store = SQLStore(engine)
    demo = DemoHorde(engine, now=T0)
    clock = [T0]
    seen: list[dict[str, float]] = []
    for step in range(0, 15 * 60 + 1, 30):
        clock[0] = T0 + step
        report = run_cycle(demo, store, lambda: clock[0], interval=30.0)
        assert report.ok, report.error
        meta = store.read_meta().value["horde"]
        # workers keep checking in: both gentypes have online workers throughout
        assert meta["text"]["online_workers"] > 0 and meta["image"]["online_workers"] > 0
        reading, payloads = current_payloads(store)
        assert reading.time == clock[0]
        frame = top_frame(payloads, limit=0)
        assert len(frame) > 0 and frame["wait_time"].notna().any()
        seen.append(frame["wait_time"].to_dict())
    first, last = seen[0], seen[-1]
    # requests arrive and leave (taken, finished, expired): the queue turns over ...
    assert set(last) - set(first) and set(first) - set(last)
    # ... and the waits of the requests that stay change
    both = set(first) & set(last)
    assert not both or any(first[r] != last[r] for r in both)
    # a request that left the queue by finishing reads done, not unknown
    from vecsched.service.read import status

    finished = [rid for rid, r in demo.sim.requests.items() if r.status == "done"]
    assert finished and status(finished[-1], store=store, now=clock[0])["done"] is True
    # the database holds the horde of the last instant, as a real horde database would
    snap = _sql.load_horde(engine, clock[0])
    assert len(snap.workers) > 0 and len(snap.requests) >= len(payloads)


def test_a_clock_jump_starts_a_new_horde(tmp_path: Path) -> None:
    engine = _sql.make_engine(f"sqlite:///{tmp_path / 'demo.sqlite'}")
    demo = DemoHorde(engine, now=T0)
    demo(T0 + 5)
    later = T0 + 6 * 3600
    snap = demo(later)
    online = later - snap.workers.last_check_in <= 300
    assert online.any() and demo.sim.now == later


def test_a_restarted_demo_never_reuses_the_ids_of_the_last_one(tmp_path: Path) -> None:
    # Forecasts are recorded once per request id in the demo's own file: a new horde that
    # reused the old ids would pair the old forecasts with its own outcomes.
    import uuid

    engine = _sql.make_engine(f"sqlite:///{tmp_path / 'demo.sqlite'}")
    first = set(DemoHorde(engine, now=T0)(T0 + 5).requests.id)
    again = set(DemoHorde(engine, now=T0)(T0 + 5).requests.id)
    restarted = DemoHorde(engine, now=T0 + 60)(T0 + 65)
    assert first and first == again  # one start is reproducible
    assert not first & set(restarted.requests.id)
    # ids as the horde's are, so the status route's horde paths and horde-sdk accept them
    assert all(str(uuid.UUID(rid)) == rid for rid in [*restarted.requests.id, *restarted.workers.id])


def test_a_finished_demo_request_reads_done_with_its_generations_finished(tmp_path: Path) -> None:
    # The demo kept a finished request's row without its jobs: the status route answered done with
    # one generation still waiting, and the forecast tracker recorded each one as cancelled.
    from vecsched.service.progress import DatabaseProgress

    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    engine = _sql.make_engine(url)
    demo = DemoHorde(engine, now=T0)
    demo(T0 + 120)
    with engine.connect() as conn:
        ended = conn.execute(sa.text("select id from waiting_prompts where not active")).scalars().all()
    assert ended
    progress = DatabaseProgress(url)
    for rid in ended:
        row = progress.read(rid)
        assert row.done and row.waiting == 0 and row.finished == row.jobs > 0
    progress.close()


def _env(monkeypatch, tmp_path: Path) -> None:
    for name in ("VECSCHED_DATABASE_URL", "REDIS_URL", "VECSCHED_REDIS_PREFIX", "VECSCHED_ELIGIBLE_IMAGE_WAIT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VECSCHED_HOME", str(tmp_path))


def _horde_rows(url: str) -> int:
    engine = _sql.make_engine(url)
    with engine.connect() as conn:
        return conn.execute(sa.text("select count(*) from workers")).scalar_one()


def test_run_drives_the_default_file_and_tells_how_to_read_it(monkeypatch, tmp_path: Path, caplog) -> None:
    _env(monkeypatch, tmp_path)
    with caplog.at_level(logging.INFO):
        assert main(["run", "--once"]) == 0
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any("list them with vecsched top, read one with vecsched status ID" in m for m in messages)
    url = f"sqlite:///{tmp_path / 'vecsched.sqlite'}"
    assert is_demo(_sql.make_engine(url)) and _horde_rows(url) > 0
    # no request id in any log line at INFO or above
    _, payloads = current_payloads(SQLStore(url))
    assert payloads and not any(rid in m for rid in payloads for m in messages)


@pytest.mark.parametrize("how", ["--db", "env"])
def test_a_named_database_is_never_touched(monkeypatch, tmp_path: Path, caplog, how: str) -> None:
    _env(monkeypatch, tmp_path)
    url = f"sqlite:///{tmp_path / 'mine.sqlite'}"
    argv = ["run", "--once"]
    if how == "--db":
        argv += ["--db", url]
    else:
        monkeypatch.setenv("VECSCHED_DATABASE_URL", url)
    with caplog.at_level(logging.WARNING, logger="vecsched.job"):
        assert main(argv) == 0
    assert _horde_rows(url) == 0  # neither demo nor seed wrote a row
    assert not (tmp_path / "vecsched.sqlite").exists()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no worker at all" in w for w in warnings)
    assert any("no request is waiting" in w for w in warnings)


def test_no_demo_and_a_loaded_horde_in_the_default_file(monkeypatch, tmp_path: Path, capsys) -> None:
    _env(monkeypatch, tmp_path)
    url = f"sqlite:///{tmp_path / 'vecsched.sqlite'}"
    src = tmp_path / "mine.json"
    horde(workers=7, requests=30, seed=3, now=time.time()).to_json(src)
    assert main(["db", "load", str(src)]) == 0
    assert main(["run", "--once"]) == 0  # the default file, but a horde of the user's own
    assert _horde_rows(url) == 7
    assert main(["run", "--once", "--no-demo"]) == 0
    assert _horde_rows(url) == 7


def test_warns_when_no_worker_is_online(caplog) -> None:
    import vecsched

    snap = vecsched.load_snapshot({
        "format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z",
        "workers": [{"id": "w1", "user_id": "u1", "gentype": "text", "last_check_in": "2026-11-29T11:54:59Z",
                     "models": ["m"]}],
        "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1, "created": "2026-11-29T11:58:00Z",
                      "expiry": "2026-11-29T12:18:00Z", "models": ["m"]}]})
    with caplog.at_level(logging.WARNING, logger="vecsched.job"):
        report = run_cycle(lambda now: snap, SQLStore("sqlite://"), lambda: snap.now)
    assert report.ok and report.published == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no worker is online" in warnings[0]


def test_a_good_horde_draws_no_warning(caplog) -> None:
    snap = horde(workers=30, requests=200, seed=2)
    with caplog.at_level(logging.WARNING, logger="vecsched.job"):
        assert run_cycle(lambda now: snap, SQLStore("sqlite://"), lambda: snap.now).ok
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_hint_comes_once_after_the_first_good_cycle(caplog) -> None:
    snap = horde(workers=10, requests=50, seed=2)
    store = SQLStore("sqlite://")
    cycle = _CycleWithHint(interval=5.0)

    def broken(now: float):
        raise ConnectionError("down")

    with caplog.at_level(logging.INFO, logger="vecsched.job"):
        cycle(broken, store, lambda: snap.now)
        cycle(lambda now: snap, store, lambda: snap.now)
        cycle(lambda now: snap, store, lambda: snap.now + 5)
    hints = [r.getMessage() for r in caplog.records if "vecsched top" in r.getMessage()]
    assert len(hints) == 1 and hints[0].startswith("published ")


def test_sql_loader_is_unchanged_for_named_databases(tmp_path: Path) -> None:
    # the demo is a loader like SQLLoader: both read the same tables
    engine = _sql.make_engine(f"sqlite:///{tmp_path / 'demo.sqlite'}")
    demo = DemoHorde(engine, now=T0)
    a = demo(T0 + 30)
    b = SQLLoader(engine)(T0 + 30)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)


def test_the_demo_queue_stays_a_few_hundred_requests_deep() -> None:
    # The README promises a small living horde: after the twenty minutes a request may wait, the
    # queue has stopped growing. (At the steady scenario's own 0.85 it holds up to about 1,300.)
    from sqlalchemy import create_engine

    demo = DemoHorde(create_engine("sqlite://"), now=T0)
    waiting = []
    for minute in (10, 20, 30):
        demo.sim.run_until(T0 + minute * 60)
        waiting.append(sum(r.status == "waiting" for r in demo.sim.requests.values()))
    assert all(0 < count < 1500 for count in waiting), waiting
