"""A small published horde for the HTTP tests: one request of every kind the status route meets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

import vecsched
from vecsched.service import sql as _sql
from vecsched.service.job import run_cycle
from vecsched.service.progress import DatabaseProgress
from vecsched.service.sql.schema import waiting_prompts
from vecsched.service.store.sql import SQLStore

NOW = "2026-11-29T12:00:00Z"
IDS = {
    # Horde ids are UUIDs (horde-sdk's client insists on them).
    "normal": "00000000-0000-4000-8000-000000000001",
    "fallback": "00000000-0000-4000-8000-000000000002",
    "inflight": "00000000-0000-4000-8000-000000000003",
    "offline": "00000000-0000-4000-8000-000000000004",
    "faulted": "00000000-0000-4000-8000-000000000005",
    "done": "00000000-0000-4000-8000-000000000006",
    "behind": "00000000-0000-4000-8000-000000000007",
    "new": "00000000-0000-4000-8000-000000000008",
    "gone": "00000000-0000-4000-8000-000000000009",
}


def _request(key: str, **extra: Any) -> dict[str, Any]:
    row = {"id": IDS[key], "user_id": "u-" + key, "gentype": "text", "n": 1, "max_length": 200,
           "created": "2026-11-29T11:50:00Z", "expiry": "2026-11-29T12:30:00Z", "models": ["m"]}
    row.update(extra)
    return row


@pytest.fixture(name="horde_document")
def _horde_document_fixture():
    """The document builder (tests change a fresh copy)."""
    return horde_document


def horde_document() -> dict[str, Any]:
    """Text workers online, the only image worker offline; requests of every kind."""
    return {
        "format": "vecsched.snapshot/1", "now": NOW,
        "workers": [
            {"id": "w1", "user_id": "o1", "gentype": "text", "speed": 20, "threads": 2,
             "last_check_in": "2026-11-29T11:59:30Z", "models": ["m"]},
            {"id": "w2", "user_id": "o2", "gentype": "image", "speed": 2e6,
             "last_check_in": "2026-11-29T10:00:00Z", "models": ["sd"]},
        ],
        "requests": [
            _request("normal", kudos=12.5, created="2026-11-29T11:51:00Z"),
            _request("behind", n=2, created="2026-11-29T11:52:00Z"),
            # no worker serves "other": no eligible thread, horde-wide figures stand in
            _request("fallback", models=["other"]),
            _request("inflight", n=1, jobs=2, kudos=3),
            _request("offline", gentype="image", models=["sd"], kudos=1.5),
            _request("faulted", faulted=True, kudos=4),
            _request("done", n=0, jobs=1, kudos=9, active=False),
            _request("gone"),
        ],
        "jobs": [
            {"id": "j1", "request_id": IDS["inflight"], "worker_id": "w1", "started": "2026-11-29T11:59:50Z",
             "state": "processing"},
            {"id": "j2", "request_id": IDS["done"], "worker_id": "w1", "started": "2026-11-29T11:55:00Z",
             "state": "finished"},
        ],
    }


@dataclass(frozen=True)
class PublishedHorde:
    url: str
    engine: Any
    store: Any
    snapshot: Any
    now: float


@pytest.fixture
def published_horde(tmp_path) -> PublishedHorde:
    """The document in a SQLite horde database, one cycle published into it; then
    ``new`` arrives in the database after the cycle and ``gone`` leaves it."""
    url = f"sqlite:///{tmp_path / 'horde.sqlite'}"
    engine = _sql.make_engine(url)
    snapshot = vecsched.load_snapshot(horde_document())
    _sql.import_snapshot(engine, snapshot)
    store = SQLStore(engine)
    report = run_cycle(lambda now: snapshot, store, lambda: snapshot.now, interval=5.0)
    assert report.ok
    newer = horde_document()
    newer["requests"] = [_request("new", n=2, kudos=0.5, created="2026-11-29T12:00:01Z")]
    newer["workers"], newer["jobs"] = [], []
    _sql.import_snapshot(engine, vecsched.load_snapshot(newer), replace=False)
    with engine.begin() as conn:
        conn.execute(sa.delete(waiting_prompts).where(waiting_prompts.c.id == IDS["gone"]))
    return PublishedHorde(url, engine, store, snapshot, snapshot.now)


@pytest.fixture
def http_service(published_horde):
    """The service reading the database on every poll (``--live-progress``)."""
    from vecsched.service.http import StatusService

    return StatusService(store=published_horde.store, progress=DatabaseProgress(published_horde.engine),
                         live_progress=True, clock=lambda: published_horde.now + 1.0)


class CountingProgress(DatabaseProgress):
    """A :class:`DatabaseProgress` that counts its queries."""

    def __init__(self, engine):
        super().__init__(engine)
        self.queries = 0

    def read(self, request_id):
        self.queries += 1
        return super().read(request_id)


@pytest.fixture
def cycle_service(published_horde):
    """The default service: the database is asked only for what the cycle does not hold."""
    from vecsched.service.http import StatusService

    return StatusService(store=published_horde.store, progress=CountingProgress(published_horde.engine),
                         clock=lambda: published_horde.now + 1.0)


@pytest.fixture
def reader():
    """An in-memory OpenTelemetry reader and a meter of its own provider (the SDK's, never a mock)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    in_memory = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[in_memory])
    yield in_memory, provider.get_meter("vecsched")
    provider.shutdown()
