"""Service subcommands: ``db init|load|dump``, ``run [--once]``, ``status``, ``prospective``.

Configuration, each flag overriding its variable: ``--db`` /
``VECSCHED_DATABASE_URL`` (default: the SQLite file ``vecsched.sqlite`` in
``$VECSCHED_HOME``, default the current directory), ``--redis`` / ``REDIS_URL``
(default: publish into the database), ``--prefix`` / ``VECSCHED_REDIS_PREFIX``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

_REQUEST_FLAGS = (
    # (flag, key, type)
    ("--gentype", "gentype", str),
    ("--max-length", "max_length", int),
    ("--max-context-length", "max_context_length", int),
    ("--extra-priority", "extra_priority", int),
    ("--n", "n", int),
    ("--user-id", "user_id", str),
)
_REQUEST_BOOLS = ("is_chat", "slow_workers", "trusted_workers", "nsfw", "validated_backends",
                  "worker_blacklist")


def add_commands(sub: Any) -> None:
    def common(p: argparse.ArgumentParser, redis: bool = True) -> None:
        p.add_argument("--db", help="database URL (default: $VECSCHED_DATABASE_URL or the SQLite file)")
        if redis:
            p.add_argument("--redis", help="Redis URL (default: $REDIS_URL; none: publish into the database)")
            p.add_argument("--prefix", help="Redis key prefix (default: $VECSCHED_REDIS_PREFIX or vecsched)")

    db = sub.add_parser("db", help="the horde database: init, load (import), dump (export)")
    dbsub = db.add_subparsers(dest="db_command", required=True)
    p = dbsub.add_parser("init", help="create the horde tables")
    common(p, redis=False)
    p.set_defaults(func=_db_init)
    p = dbsub.add_parser("load", help="import a snapshot JSON file into the horde tables")
    p.add_argument("snapshot")
    p.add_argument("--append", action="store_true", help="keep the rows already there")
    p.add_argument("--shift-to-now", action="store_true", help="move the snapshot's times to now")
    common(p, redis=False)
    p.set_defaults(func=_db_load)
    p = dbsub.add_parser("dump", help="export the horde tables as a snapshot JSON file")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--now", help="snapshot instant (ISO 8601 with zone; default: now)")
    common(p, redis=False)
    p.set_defaults(func=_db_dump)

    p = sub.add_parser("run", help="run the periodic job (load, estimate, publish)")
    p.add_argument("--once", action="store_true", help="run one cycle and exit (non-zero if it failed)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between cycles (default 5)")
    p.add_argument("--no-seed", action="store_true", help="do not seed an empty SQLite file")
    p.add_argument("--log-level", default="INFO")
    common(p)
    p.set_defaults(func=_run)

    p = sub.add_parser("status", help="print a request's published status as JSON")
    p.add_argument("request_id")
    p.add_argument("--max-age", type=float, help="seconds after which figures are stale")
    common(p)
    p.set_defaults(func=_status)

    p = sub.add_parser("prospective", help="eligible workers, ahead_wait and allowance of a would-be request")
    p.add_argument("--request", help="the request as a JSON object (snapshot request keys)")
    p.add_argument("--models", help="comma-separated model names")
    for flag, key, typ in _REQUEST_FLAGS:
        p.add_argument(flag, dest=key, type=typ)
    for key in _REQUEST_BOOLS:
        p.add_argument("--" + key.replace("_", "-"), dest=key, action=argparse.BooleanOptionalAction)
    p.add_argument("--max-age", type=float)
    common(p)
    p.set_defaults(func=_prospective)


def _db_url(args: argparse.Namespace) -> str:
    from vecsched.service.config import default_database_url

    return args.db or default_database_url()


def _store(args: argparse.Namespace) -> Any:
    from vecsched.service.config import open_store

    return open_store(redis_url=args.redis, database_url=_db_url(args), prefix=args.prefix)


def _db_init(args: argparse.Namespace) -> int:
    from vecsched.service.sql import init_db, make_engine

    init_db(make_engine(_db_url(args)))
    return 0


def _db_load(args: argparse.Namespace) -> int:
    from vecsched.snapshot.snapshot import load_snapshot
    from vecsched.service.sql import import_snapshot, make_engine

    snapshot = load_snapshot(args.snapshot)
    for error in snapshot.rejected:
        print(f"vecsched: rejected {error}", file=sys.stderr)
    counts = import_snapshot(
        make_engine(_db_url(args)), snapshot, replace=not args.append,
        shift_to=time.time() if args.shift_to_now else None,
    )
    print(json.dumps(counts))
    return 0


def _db_dump(args: argparse.Namespace) -> int:
    from vecsched.snapshot.snapshot import _to_epoch
    from vecsched.service.sql import load_horde, make_engine

    now = _to_epoch(args.now) if args.now else time.time()
    snapshot = load_horde(make_engine(_db_url(args)), now)
    for error in snapshot.rejected:
        print(f"vecsched: rejected {error}", file=sys.stderr)
    snapshot.to_json(args.output)
    return 0


def seed_if_empty(engine: Any, now: float) -> bool:
    """Fill an empty embedded database with a synthetic horde that looks current at ``now``."""
    from vecsched.service.sql import import_snapshot, init_db, is_empty

    init_db(engine)
    if not is_empty(engine):
        return False
    from vecsched.synthetic import horde

    import_snapshot(engine, horde(workers=150, requests=3000, seed=0), shift_to=now)
    return True


def _run(args: argparse.Namespace) -> int:
    from vecsched.service.job import SQLLoader, forecast_tracker, run_cycle, run_service
    from vecsched.service.sql import init_db, make_engine

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("vecsched.job")
    url = _db_url(args)
    engine = make_engine(url)
    if engine.dialect.name == "sqlite" and not args.no_seed:
        try:
            if seed_if_empty(engine, time.time()):
                log.info("seeded the empty database %s with a synthetic horde", url)
        except Exception as exc:  # noqa: BLE001 - the job reports and retries
            log.warning("could not prepare %s: %s", url, exc)
    else:
        try:
            init_db(engine)
        except Exception as exc:  # noqa: BLE001 - database down: cycles will log and retry
            log.warning("could not create tables in %s: %s", url, exc)
    store = _store(args)
    loader = SQLLoader(engine)
    if args.once:
        report = run_cycle(loader, store, time.time, interval=args.interval, forecasts=forecast_tracker(store))
        return 0 if report.ok else 1
    run_service(loader, store, interval=args.interval)
    return 0


def _status(args: argparse.Namespace) -> int:
    from vecsched.service.read import status

    result = status(args.request_id, store=_store(args), max_age=args.max_age)
    print(json.dumps(result))
    return 0


def _prospective(args: argparse.Namespace) -> int:
    from vecsched.service.read import prospective

    request: dict[str, Any] = json.loads(args.request) if args.request else {}
    if args.models is not None:
        request["models"] = [m for m in args.models.split(",") if m]
    for _, key, _ in _REQUEST_FLAGS:
        if getattr(args, key) is not None:
            request[key] = getattr(args, key)
    for key in _REQUEST_BOOLS:
        if getattr(args, key) is not None:
            request[key] = getattr(args, key)
    request.setdefault("gentype", "text")
    print(json.dumps(prospective(request, store=_store(args), max_age=args.max_age)))
    return 0

