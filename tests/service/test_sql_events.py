"""The event tables of SPEC section 7 in SQL: round trip, the cycle's read window, pruning, init on an old schema."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

import vecsched
from vecsched.service.sql import import_snapshot, init_db, load_horde, make_engine
from vecsched.service.sql import generic as _generic
from vecsched.service.sql.events import HISTORY_SECONDS, prune_events
from vecsched.service.sql.schema import capacity_returns, dispatches

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def _iso(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def _dispatch(did: str, ago: float, **kw) -> dict:
    row = {"dispatch_id": did, "worker_id": "w1", "worker_state": "s", "request_id": "r" + did,
           "request_created": _iso(ago + 5), "request_extra_priority": 1,
           "selected_from_priority_queue": False, "priority_user_ids": [],
           "dispatched_at": _iso(ago), "assigned_work": 80.0}
    row.update(kw)
    return row


def _snapshot(events_dispatches: list, events_returns: list) -> vecsched.Snapshot:
    return vecsched.load_snapshot({
        "format": "vecsched.snapshot/1", "now": _iso(0),
        "workers": [{"id": "w1", "user_id": "u", "gentype": "text", "last_check_in": _iso(10), "models": ["m"]}],
        "requests": [], "dispatches": events_dispatches, "capacity_returns": events_returns,
    })


def _events(snap: vecsched.Snapshot) -> tuple[dict, dict]:
    doc = snap.to_dict()
    return ({d["dispatch_id"]: d for d in doc["dispatches"]}, {c["dispatch_id"]: c for c in doc["capacity_returns"]})


def test_events_round_trip_and_the_cycle_reads_only_what_section_7_needs(db_url: str, monkeypatch) -> None:
    window = HISTORY_SECONDS
    disp = [
        _dispatch("recent", 30, selected_from_priority_queue=True, priority_user_ids=["b", "a"]),
        _dispatch("old-active", 5000),  # never returned: still occupies a thread, must load
        _dispatch("old-returned-late", window + 100),  # returned inside the history: must load
        _dispatch("old-returned-early", window + 300),  # returned before the history: left out
    ]
    rets = [
        {"dispatch_id": "old-returned-late", "worker_id": "w1", "returned_at": _iso(window - 50)},
        {"dispatch_id": "old-returned-early", "worker_id": "w1", "returned_at": _iso(window + 200)},
        {"dispatch_id": "ghost", "worker_id": "w1", "returned_at": _iso(20)},
    ]
    snap = _snapshot(disp, rets)
    assert snap.rejected == ()
    engine = make_engine(db_url)
    import_snapshot(engine, snap)
    if engine.dialect.name == "postgresql":
        # Fails if the fast path quietly fell back to the generic one.
        monkeypatch.setattr(_generic._GenericFetch, "main", None)
        fast_only = load_horde(engine, snap.now)
        monkeypatch.undo()
        assert _events(fast_only) == _events(load_horde(engine, snap.now, fast=False))
    for fast in (True, False):
        loaded = load_horde(engine, snap.now, fast=fast)
        assert loaded.rejected == ()
        got_d, got_r = _events(loaded)
        want_d, want_r = _events(snap)
        assert set(got_d) == {"recent", "old-active", "old-returned-late"}
        assert set(got_r) == {"old-returned-late", "ghost"}
        assert all(got_d[k] == want_d[k] for k in got_d)
        assert got_d["recent"]["priority_user_ids"] == ["b", "a"]
        assert all(got_r[k] == want_r[k] for k in got_r)


def test_prune_keeps_what_a_cycle_can_need(db_url: str) -> None:
    window = HISTORY_SECONDS
    disp = [_dispatch("keep-active", 3000), _dispatch("keep-recent", 10), _dispatch("drop", window + 300),
            _dispatch("drop-stale", 90_000)]
    rets = [{"dispatch_id": "drop", "worker_id": "w1", "returned_at": _iso(window + 200)},
            {"dispatch_id": "keep-recent", "worker_id": "w1", "returned_at": _iso(5)}]
    snap = _snapshot(disp, rets)
    engine = make_engine(db_url)
    import_snapshot(engine, snap)
    counts = prune_events(engine, snap.now)
    assert counts == {"dispatch_priority_users": 0, "dispatches": 2, "capacity_returns": 1}
    with engine.connect() as conn:
        left = set(conn.execute(sa.select(dispatches.c.dispatch_id)).scalars())
        returns = set(conn.execute(sa.select(capacity_returns.c.dispatch_id)).scalars())
    assert left == {"keep-active", "keep-recent"} and returns == {"keep-recent"}
    # What a cycle loads is unchanged by pruning.
    assert _events(load_horde(engine, snap.now)) == _events(load_horde(engine, snap.now, fast=False))


def test_init_adds_missing_tables_and_the_worker_state_column(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.begin() as conn:  # a database from before the event tables and worker state
        conn.exec_driver_sql("CREATE TABLE workers (id VARCHAR PRIMARY KEY, user_id VARCHAR, gentype VARCHAR(16))")
    init_db(engine)
    init_db(engine)  # idempotent
    insp = sa.inspect(engine)
    assert {"dispatches", "capacity_returns", "dispatch_priority_users"} <= set(insp.get_table_names())
    assert "state" in {c["name"] for c in insp.get_columns("workers")}
    assert any(ix["column_names"] == ["dispatched_at"] for ix in insp.get_indexes("dispatches"))
    assert any(ix["column_names"] == ["returned_at"] for ix in insp.get_indexes("capacity_returns"))


def test_the_job_loader_prunes_the_event_tables(sqlite_url: str) -> None:
    from vecsched.service.job import SQLLoader

    snap = _snapshot([_dispatch("drop", HISTORY_SECONDS + 300)],
                     [{"dispatch_id": "drop", "worker_id": "w1", "returned_at": _iso(HISTORY_SECONDS + 200)}])
    engine = make_engine(sqlite_url)
    import_snapshot(engine, snap)
    SQLLoader(engine)(snap.now)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(capacity_returns)).scalar_one() == 0


def test_a_return_without_a_time_is_rejected_and_counted_and_its_dispatch_kept(db_url: str) -> None:
    """A NULL returned_at fell outside the cut's comparison: the row was lost without a word."""
    snap = _snapshot([_dispatch("d1", 30), _dispatch("d2", 40)],
                     [{"dispatch_id": "d2", "worker_id": "w1", "returned_at": _iso(10)}])
    engine = make_engine(db_url)
    import_snapshot(engine, snap)
    with engine.begin() as conn:
        conn.execute(capacity_returns.insert().values(dispatch_id="d1", worker_id="w1", returned_at=None))
    for fast in (True, False):
        loaded = load_horde(engine, snap.now, fast=fast)
        assert [(e.table, e.id, e.field) for e in loaded.rejected] == [("capacity_returns", "d1", "returned_at")]
        got_d, got_r = _events(loaded)
        assert set(got_d) == {"d1", "d2"} and set(got_r) == {"d2"}
    engine.dispose()


def test_a_return_in_the_window_keeps_its_day_old_dispatch(db_url: str) -> None:
    # Pruning dropped every dispatch older than a day, even one whose return came a minute ago:
    # the orphaned return then read as incomplete history for ten minutes.
    snap = _snapshot([_dispatch("day-long", 90_000)],
                     [{"dispatch_id": "day-long", "worker_id": "w1", "returned_at": _iso(60)}])
    engine = make_engine(db_url)
    import_snapshot(engine, snap)
    assert prune_events(engine, snap.now) == {"dispatch_priority_users": 0, "dispatches": 0, "capacity_returns": 0}
    loaded = load_horde(engine, snap.now)
    assert list(loaded.dispatches.columns["dispatch_id"]) == ["day-long"] and loaded.rejected == ()


def test_event_times_written_as_other_iso_texts_are_cut_and_pruned_by_their_instant(db_url: str) -> None:
    # SQLite compares time text as text: an offset or a "T" sorted a time on the wrong side of the cut,
    # so a return 100 s old was never loaded (and was pruned), one two hours old loaded every cycle.
    engine = make_engine(db_url)
    import_snapshot(engine, _snapshot([_dispatch("recent", 200), _dispatch("old", 7200)], []))
    recent = (NOW - timedelta(seconds=100)).astimezone(timezone(timedelta(hours=-5))).isoformat(" ")
    old = (NOW - timedelta(seconds=7000)).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    with engine.begin() as conn:
        for did, text in (("recent", recent), ("old", old)):
            conn.execute(sa.text("INSERT INTO capacity_returns (dispatch_id, worker_id, returned_at) "
                                 "VALUES (:d, 'w1', :t)"), {"d": did, "t": text})
    for fast in (True, False):
        loaded = load_horde(engine, NOW.timestamp(), fast=fast)
        assert list(loaded.capacity_returns.columns["dispatch_id"]) == ["recent"], fast
        assert list(loaded.dispatches.columns["dispatch_id"]) == ["recent"], fast
    assert prune_events(engine, NOW.timestamp())["capacity_returns"] == 1
    with engine.connect() as conn:
        assert set(conn.execute(sa.select(capacity_returns.c.dispatch_id)).scalars()) == {"recent"}


def test_a_return_time_sqlite_cannot_read_is_rejected_and_counted(sqlite_url: str) -> None:
    # Compared by julianday(), text SQLite cannot read as a time fell outside both "after the cut"
    # and "NULL": never loaded, never rejected, never counted. (A number there was lost before too.)
    engine = make_engine(sqlite_url)
    import_snapshot(engine, _snapshot([_dispatch("bad", 60), _dispatch("epoch", 60)], []))
    with engine.begin() as conn:
        for did, value in (("bad", "not a time"), ("epoch", NOW.timestamp() - 30)):
            conn.execute(sa.text("INSERT INTO capacity_returns (dispatch_id, worker_id, returned_at) "
                                 "VALUES (:d, 'w1', :t)"), {"d": did, "t": value})
    loaded = load_horde(engine, NOW.timestamp())
    assert {(e.id, e.field) for e in loaded.rejected} == {("bad", "returned_at"), ("epoch", "returned_at")}
