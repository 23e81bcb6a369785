"""Fixtures for the real servers: a PostgreSQL schema and a Redis key prefix per test,
and a private redis-server the fault tests may stop and restart."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import settings

# No wall-clock limit on a Hypothesis example: its default 200 ms deadline is a timed
# assertion, and it failed a test of bucket hashing at load 9 on this shared machine.
settings.register_profile("vecsched", deadline=None)
settings.load_profile("vecsched")

PG_BASE = os.environ.get("VECSCHED_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_BASE = os.environ.get("VECSCHED_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped afterwards."""
    import sqlalchemy as sa

    schema = "vs_test_" + secrets.token_hex(6)
    admin = sa.create_engine(PG_BASE)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:  # pragma: no cover - server missing on this machine
        pytest.skip(f"PostgreSQL not reachable at {PG_BASE}: {exc}")
    # libpq's "options" sets the search_path for every connection of the URL.
    yield f"{PG_BASE}?options=-csearch_path%3D{schema}"
    with admin.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'horde.sqlite'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on the embedded SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'horde.sqlite'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def redis_prefix() -> str:
    return "vs-test-" + secrets.token_hex(6)


@pytest.fixture
def redis_store(redis_prefix: str) -> Iterator["object"]:
    """A RedisStore on the machine's Redis under a unique prefix, its keys deleted afterwards."""
    from vecsched.service.store.redis import RedisStore

    store = RedisStore(REDIS_BASE, prefix=redis_prefix)
    try:
        store.client.ping()
    except Exception as exc:  # pragma: no cover
        pytest.skip(f"Redis not reachable at {REDIS_BASE}: {exc}")
    yield store
    store.drop_all()
    store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A redis-server of the test's own, on a free port, that the test can stop and restart.

    It saves to an RDB file in its directory on stop, so what was published
    before a stop is there again after the restart (as with a production Redis
    that persists).
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.directory), "--dbfilename", "dump.rdb",
                "--save", "", "--appendonly", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                client.ping()
                client.close()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        """Save and stop the server (SHUTDOWN SAVE), and wait for it to exit."""
        import redis

        if self.process is None:
            return
        try:
            redis.Redis(port=self.port).shutdown(save=True)
        except redis.ConnectionError:
            pass
        self.process.wait(timeout=30)
        self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:  # pragma: no cover
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def build_estimates(now: float, ids: list[str], **fields: object) -> "object":
    """Hand-built Estimates: every FIELDS column, constant unless given (a scalar or a list)."""
    import numpy as np

    from vecsched.core.result import FIELDS, FLOAT_FIELDS, Estimates

    n = len(ids)
    defaults = {
        "gentype": 0, "eligible_workers": 2, "eligible_worker_threads": 4, "is_possible": True,
        "queue_position": 1, "wait_time": 12.4, "ahead_wait": 6.0, "horde_queue_position": 3,
        "horde_wait_time": 30.0, "fallback": False, "waiting": 1, "processing": 0,
        "finished": 0, "restarted": 0, "might_stall": False, "stall_evidence": -1,
    }
    columns = {}
    for name in FIELDS:
        value = fields.get(name, defaults.get(name, 0))
        arr = np.asarray(value if isinstance(value, (list, tuple, np.ndarray)) else [value] * n)
        if name in FLOAT_FIELDS:
            arr = arr.astype(np.float64)
        elif name in ("is_possible", "fallback", "might_stall"):
            arr = arr.astype(bool)
        elif name == "gentype":
            arr = arr.astype(np.int8)
        else:
            arr = arr.astype(np.int64)
        columns[name] = arr
    rid = np.empty(n, dtype=object)
    rid[:] = ids
    return Estimates(now=now, request_id=rid, request_index=np.arange(n), columns=columns,
                     horde={"text": {"threads": 4}})


@pytest.fixture
def make_estimates():
    return build_estimates
