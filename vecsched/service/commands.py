"""Service subcommands: ``db init|load|dump``, ``run [--once]``, ``status``, ``top``, ``prospective``, ``serve``.

Configuration, each flag overriding its variable: ``--db`` /
``VECSCHED_DATABASE_URL`` (default: the SQLite file ``vecsched.sqlite`` in
``$VECSCHED_HOME``, default the current directory), ``--redis`` / ``REDIS_URL``
(default: publish into the database), ``--prefix`` / ``VECSCHED_REDIS_PREFIX``,
``--eligible-image-wait`` / ``VECSCHED_ELIGIBLE_IMAGE_WAIT``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from typing import Any, Callable

_REQUEST_FLAGS = (
    # (flag, key, type, help)
    ("--gentype", "gentype", str, "the request's gentype"),
    ("--max-length", "max_length", int, "tokens to generate (text)"),
    ("--max-context-length", "max_context_length", int, "context tokens (text)"),
    ("--extra-priority", "extra_priority", int, "the request's priority (kudos)"),
    ("--n", "n", int, "generations asked for (judged as any key; the answer does not depend on it)"),
    ("--user-id", "user_id", str, "the requesting user (owner of workers in maintenance, priority users)"),
)
GENTYPE_CHOICES = ("text", "image")
OLD_SNAPSHOT = 3600.0
"""A snapshot whose ``now`` is older than this (seconds) is not loaded as it is without a say."""
_REQUEST_BOOLS = ("is_chat", "slow_workers", "trusted_workers", "nsfw", "validated_backends",
                  "worker_blacklist")


def add_commands(sub: Any) -> None:
    """Add ``db``, ``run``, ``status``, ``top``, ``prospective`` and ``serve`` to the ``vecsched`` command line."""

    def common(p: argparse.ArgumentParser, redis: bool = True) -> None:
        p.add_argument("--db", help="database URL (default: $VECSCHED_DATABASE_URL, else the embedded "
                                    "SQLite file $VECSCHED_HOME/vecsched.sqlite)")
        if redis:
            p.add_argument("--redis", help="Redis URL (default: $REDIS_URL; none: publish into the database)")
            p.add_argument("--prefix", help="Redis key prefix (default: $VECSCHED_REDIS_PREFIX, else vecsched)")

    _add_db_commands(sub, common)
    _add_job_and_read_commands(sub, common)
    _add_serve_command(sub, common)


def _add_db_commands(sub: Any, common: Callable[..., None]) -> None:
    from vecsched.arguments import instant

    db = sub.add_parser("db", help="the horde database: init, load (import), dump (export)")
    dbsub = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    p = dbsub.add_parser("init", help="create the horde tables")
    common(p, redis=False)
    p.set_defaults(func=_db_init)
    p = dbsub.add_parser("load", help="import a snapshot JSON file into the horde tables")
    p.add_argument("snapshot", help="snapshot JSON file (vecsched.snapshot/1)")
    p.add_argument("--append", action="store_true", help="keep the rows already there")
    times = p.add_mutually_exclusive_group()
    times.add_argument("--shift-to-now", action="store_true",
                       help="move every time of the snapshot so that its 'now' is the current time")
    times.add_argument("--keep-times", action="store_true",
                   help=f"load a snapshot older than {OLD_SNAPSHOT / 3600:g} h with its times unchanged")
    common(p, redis=False)
    p.set_defaults(func=_db_load)
    p = dbsub.add_parser("check", help="list every row the loader rejects, with its id and field (exit 1 if any)")
    common(p, redis=False)
    p.set_defaults(func=_db_check)
    p = dbsub.add_parser("dump", help="export the horde tables as a snapshot JSON file")
    p.add_argument("-o", "--output", required=True, help="the snapshot JSON file to write")
    p.add_argument("--now", type=instant, help="snapshot instant (ISO 8601 with zone; default: the current time)")
    common(p, redis=False)
    p.set_defaults(func=_db_dump)


def _add_job_and_read_commands(sub: Any, common: Callable[..., None]) -> None:
    from vecsched.arguments import non_negative_float, non_negative_int, port_number, seconds
    from vecsched.service.config import eligible_image_wait

    p = sub.add_parser(
        "run", help="run the periodic job (load, estimate, publish)",
        description="Every --interval seconds: load the horde, estimate every waiting request, publish. "
                    "On the embedded default (no --db, no $VECSCHED_DATABASE_URL) a simulated demo horde "
                    "lives in the SQLite file; read the figures with 'vecsched top' and "
                    "'vecsched status ID' from another terminal.")
    p.add_argument("--once", action="store_true", help="run one cycle and exit (non-zero if it failed)")
    p.add_argument("--interval", type=seconds, default=5.0, help="seconds between cycles")
    p.add_argument("--no-demo", action="store_true",
                   help="do not drive the simulated demo horde in the embedded SQLite file")
    p.add_argument("--no-seed", action="store_true",
                   help="with --no-demo: do not seed an empty default file with a (frozen) synthetic horde")
    p.add_argument("--eligible-image-wait", action="store_true",
                   default=eligible_image_wait(),
                   help="image queue_position/wait_time from eligible workers, not horde-wide "
                        "(default: $VECSCHED_ELIGIBLE_IMAGE_WAIT, else off)")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log threshold")
    p.add_argument("--replay", action="store_true",
                   help="also record the dispatch-replay-v1 shadow forecast (costly on large hordes; "
                        "install the 'replay' extra for its compiled loop; default off)")
    p.add_argument("--replay-every", type=seconds, metavar="SECONDS",
                   help="run the replay off the main cycle, in a thread of its own, at most once per SECONDS "
                        "(implies --replay; forecasts of requests first seen between replays are recorded "
                        "late, with their true first sighting; default: $VECSCHED_REPLAY_EVERY with --replay, "
                        "else inside every cycle)")
    p.add_argument("--stall-refresh", type=non_negative_float, default=60.0, metavar="SECONDS",
                   help="compute a request's might_stall sums again each SECONDS of its age, as the horde keeps "
                        "them 60 s; whether a job is in flight, its eligible threads and the evidence are judged "
                        "every cycle; 0: every request's sums every cycle")
    p.add_argument("--metrics", choices=("none", "console", "prometheus"), default="none",
                   help="OpenTelemetry metrics: none, console (JSON to stdout) or prometheus")

    p.add_argument("--metrics-port", type=port_number, default=9464,
                   help="Prometheus scrape port, 1..65535")
    common(p)
    p.set_defaults(func=_run)

    p = sub.add_parser("status", help="print a request's published status as JSON (exit 1 if unknown)")
    p.add_argument("request_id", help="the request id (list them with vecsched top)")
    _add_max_age(p)
    _add_publish_option(p)
    common(p)
    p.set_defaults(func=_status)

    p = sub.add_parser("top", help="the current cycle's requests, longest wait first")
    p.add_argument("--gentype", choices=GENTYPE_CHOICES, help="only this gentype (default: both)")
    p.add_argument("-n", type=non_negative_int, default=20, dest="limit", help="rows shown; 0: all")
    p.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    _add_max_age(p, then=": shown, then exit 1")
    common(p)
    p.set_defaults(func=_top)

    p = sub.add_parser("prospective", help="eligible workers, ahead_wait and allowance of a would-be request")
    p.add_argument("--request", type=_json_object, help="the request as a JSON object (snapshot request keys)")
    p.add_argument("--models", help="comma-separated model names")
    for flag, key, typ, text in _REQUEST_FLAGS:
        if key == "gentype":
            p.add_argument(flag, dest=key, choices=GENTYPE_CHOICES, help=text + " (default: text)")
        else:
            p.add_argument(flag, dest=key, type=typ, help=text)
    for key in _REQUEST_BOOLS:
        p.add_argument("--" + key.replace("_", "-"), dest=key, action=argparse.BooleanOptionalAction,
                       help=f"the request's {key} flag (default: the snapshot default)")
    _add_max_age(p)
    common(p)
    p.set_defaults(func=_prospective)


def _add_max_age(p: argparse.ArgumentParser, then: str = "") -> None:
    from vecsched.arguments import positive_float

    p.add_argument("--max-age", type=positive_float,
                   help=f"seconds after which figures are stale{then} (default: three refresh intervals)")


def _add_serve_command(sub: Any, common: Callable[..., None]) -> None:
    from vecsched.arguments import port_number

    p = sub.add_parser("serve", help="serve the status routes over HTTP (docs/http.md)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port_number, default=8080, help="port to listen on")
    p.add_argument("--processes", type=_at_least_one, default=2,
                   help="server processes; not --workers, which are the horde's")
    p.add_argument("--threads", type=_at_least_one, default=8, help="threads per process")
    _add_max_age(p)
    p.add_argument("--live-progress", action="store_true",
                   help="read progress and kudos from the database on every horde-path poll; by default a "
                        "request the cycle holds answers from the cycle alone, as of the cycle (docs/http.md)")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="log level; no level logs request lines, which hold ids")
    _add_publish_option(p)
    common(p)
    p.set_defaults(func=_serve)


PUBLISHABLE = ("compatible-queue-v1", "eligible-share-v1", "dispatch-replay-v1")
"""Estimators whose forecast may be published (the scored-only adr-wait and horde-wide are what it replaces)."""


def _add_publish_option(p: Any) -> None:
    p.add_argument("--publish-forecast", metavar="NAME", choices=PUBLISHABLE,
                   help="once NAME's promotion verdict is approved (vecsched promotion), its completion p50 "
                        "is the wait_time clients see, the ADR wait shown beside it on vecsched's path; "
                        "until then nothing changes (choices: %(choices)s)")


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return value


def _db_url(args: argparse.Namespace, *, reading: bool = False) -> str:
    """The database URL of the command; a SQLite file a reader would only create empty is refused.

    Opening a SQLite file creates it: top, status, check and dump in the wrong directory left an
    empty file behind and answered "no cycle"; a missing directory gave a bare "unable to open
    database file". Both now name the path.
    """
    import os

    import sqlalchemy as sa

    from vecsched.errors import UserError
    from vecsched.service.config import default_database_url
    from vecsched.service.sqlite_file import sqlite_path

    url = args.db or default_database_url()
    try:
        path = sqlite_path(sa.create_engine(url))  # an engine connects only when used: no file yet
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ValueError, ImportError):
        return url  # make_engine says what is wrong with it
    if path is None:
        return url
    if reading and not os.path.exists(path):
        raise UserError(f"no database at {path}: start vecsched run (or vecsched db load) there first, "
                        "or name one with --db or VECSCHED_DATABASE_URL")
    if not os.path.isdir(os.path.dirname(path)):
        raise UserError(f"cannot open the database {path}: its directory does not exist")
    return url


def command_store(args: argparse.Namespace, *, reading: bool = False) -> Any:
    """The store a command's ``--redis``, ``--db`` and ``--prefix`` name; a reader's SQLite file must exist."""
    import os

    from vecsched.service.config import open_store

    redis_url = args.redis or os.environ.get("REDIS_URL")
    database_url = args.db if redis_url else _db_url(args, reading=reading)  # with Redis the file is not read
    return open_store(redis_url=redis_url, database_url=database_url, prefix=args.prefix)


def _db_init(args: argparse.Namespace) -> int:
    from vecsched.service.sql import init_db, make_engine

    init_db(make_engine(_db_url(args)))
    return 0


def _db_load(args: argparse.Namespace) -> int:
    from vecsched.errors import UserError
    from vecsched.service.demo import forget_demo
    from vecsched.service.sql import import_snapshot, make_engine
    from vecsched.snapshot.snapshot import load_snapshot
    from vecsched.snapshot.times import iso

    snapshot = load_snapshot(args.snapshot)
    age = time.time() - snapshot.now
    if age > OLD_SNAPSHOT and not (args.shift_to_now or args.keep_times):
        # Loaded as is, every request of an old snapshot has expired and nothing
        # is published; shifting production data must be asked for, never silent.
        raise UserError(
            f"{args.snapshot} was taken at {iso(snapshot.now)}, {age / 3600:.1f} h ago: its requests have "
            "expired; pass --shift-to-now to move its times to now (or --keep-times to load it as it is)")
    for error in snapshot.rejected:
        print(f"vecsched: rejected {error}", file=sys.stderr)
    engine = make_engine(_db_url(args))
    counts = import_snapshot(
        engine, snapshot, replace=not args.append,
        shift_to=time.time() if args.shift_to_now else None,
    )
    forget_demo(engine)  # the file now holds this horde: the demo never overwrites it
    print(json.dumps(counts))
    return 0


def _db_dump(args: argparse.Namespace) -> int:
    from vecsched.service.sql import load_horde, make_engine

    now = args.now if args.now is not None else time.time()
    # The whole event history the tables hold, not the cycle's ten minutes: a dump is an export.
    snapshot = load_horde(make_engine(_db_url(args, reading=True)), now, history=math.inf)
    for error in snapshot.rejected:
        print(f"vecsched: rejected {error}", file=sys.stderr)
    snapshot.to_json(args.output)
    return 0


def _db_check(args: argparse.Namespace) -> int:
    from vecsched.service.job import rejected_counts
    from vecsched.service.sql import load_horde, make_engine

    snapshot = load_horde(make_engine(_db_url(args, reading=True)), time.time())
    for error in snapshot.rejected:
        print(f"rejected {error}")
    summary = rejected_counts(list(snapshot.rejected)) or "none"
    print(f"{len(snapshot.rejected)} rejected rows ({summary}); "
          f"{len(snapshot.workers)} workers, {len(snapshot.requests)} requests, {len(snapshot.jobs)} jobs load")
    return 1 if snapshot.rejected else 0


def seed_if_empty(engine: Any, now: float) -> bool:
    """Fill an empty embedded database with a synthetic horde that looks current at ``now``."""
    from vecsched.service.sql import import_snapshot, init_db, is_empty

    init_db(engine)
    if not is_empty(engine):
        return False
    from vecsched.synthetic import horde

    from vecsched.service.demo import mark_demo

    import_snapshot(engine, horde(workers=150, requests=3000, seed=0), shift_to=now)
    mark_demo(engine)  # vecsched's own rows: the demo may take the file over later
    return True


def _named(args: argparse.Namespace) -> bool:
    """Whether the user named the database (then vecsched never writes horde rows into it)."""
    from vecsched.service.config import database_is_named

    return bool(args.db) or database_is_named()


def _demo_wanted(args: argparse.Namespace, engine: Any) -> bool:
    """The demo drives only the embedded default file, and only a file of its own."""
    from vecsched.service.demo import is_demo

    if args.no_demo or _named(args) or engine.dialect.name != "sqlite":
        return False
    if is_demo(engine):
        return True
    logging.getLogger("vecsched.job").warning(
        "the embedded database holds a horde loaded with 'vecsched db load': running on it without the "
        "demo (delete the file to get the demo back)")
    return False


def _run(args: argparse.Namespace) -> int:
    from functools import partial

    from vecsched.core.estimate import estimate
    from vecsched.service.job import SQLLoader, how_to_read, run_cycle, run_service

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from vecsched.service import redact

    redact.install()  # no URL password in any log line, whoever logs it
    if args.log_level != "DEBUG":
        # one line per cycle: the scheduler's own "running job" lines only under DEBUG
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    url = _db_url(args)
    engine = _prepare(args, url)
    loader: Any = SQLLoader(engine)
    if _demo_wanted(args, engine):
        from vecsched.service.demo import DemoHorde

        loader = DemoHorde(engine, now=time.time())
        logging.getLogger("vecsched.job").info(
            "demo: a simulated horde lives in %s (--no-demo turns it off)", url)
    store = command_store(args)
    every = None  # the replay, when on, runs inside every cycle
    if args.replay or args.replay_every is not None:
        from vecsched.core.replay import enable
        from vecsched.service.config import replay_every

        enable()
        every = args.replay_every if args.replay_every is not None else replay_every()
    figures = partial(estimate, eligible_image_wait=args.eligible_image_wait)
    from vecsched.service.metrics import CycleMetrics, setup_metrics

    provider = setup_metrics(args.metrics, port=args.metrics_port)
    observe = CycleMetrics().observer(args.interval) if provider is not None else None
    try:
        if args.once:
            report = run_cycle(loader, store, time.time, interval=args.interval, estimate=figures,
                               observe=observe)
            if report.ok:
                logging.getLogger("vecsched.job").info("%s", how_to_read(report.published))
            return 0 if report.ok else 1
        run_service(loader, store, interval=args.interval, estimate=figures, observe=observe, replay_every=every,
                    stall_refresh=args.stall_refresh)
        return 0
    finally:
        if provider is not None:
            provider.shutdown()  # the console exporter prints the last export here


def _prepare(args: argparse.Namespace, url: str) -> Any:
    """The engine, tables made; a frozen seed only when the demo is off on an empty default file."""
    from vecsched.service.sql import init_db, make_engine

    log = logging.getLogger("vecsched.job")
    engine = make_engine(url)
    try:
        init_db(engine)
        frozen_seed = args.no_demo and not args.no_seed and not _named(args)
        if frozen_seed and seed_if_empty(engine, time.time()):
            log.info("seeded the empty database with a synthetic horde (frozen: its workers never check in)")
    except Exception as exc:  # noqa: BLE001 - database down: cycles will log and retry
        from vecsched.service.redact import mask_text

        log.warning("could not prepare the database: %s", mask_text(str(exc).splitlines()[0] if str(exc) else repr(exc)))
    return engine


def _status(args: argparse.Namespace) -> int:
    from vecsched.errors import UserError
    from vecsched.service.read import status

    from vecsched.service.read import ForecastPublication

    store = command_store(args, reading=True)
    publish = ForecastPublication.for_store(args.publish_forecast, store) if args.publish_forecast else None
    result = status(args.request_id, store=store, max_age=args.max_age, publish=publish)
    print(json.dumps(result))
    if "cycle_time" not in result:
        raise UserError("no cycle was published yet: is vecsched run running?")
    if result.get("unknown"):
        raise UserError(f"no request {args.request_id} in the current cycle (list them with vecsched top)")
    return 0


def _top(args: argparse.Namespace) -> int:
    from vecsched.errors import UserError
    from vecsched.service.read import cycle_age
    from vecsched.service.top import as_records, current_payloads, render, top_frame

    reading, payloads = current_payloads(command_store(args, reading=True))
    if reading is None:
        raise UserError("no cycle was published yet: is vecsched run running?")
    frame = top_frame(payloads, gentype=args.gentype, limit=args.limit)
    print(json.dumps(as_records(frame)) if args.json else render(frame, reading))
    age, stale = cycle_age(reading, max_age=args.max_age)
    if stale:
        # Shown, as status shows a stale cycle, and an exit status an operator's check can read.
        raise UserError(f"the cycle shown is stale ({age:.0f} s old): is vecsched run running?")
    return 0


def _prospective(args: argparse.Namespace) -> int:
    from vecsched.service.read import prospective

    request: dict[str, Any] = dict(args.request or {})
    if args.models is not None:
        request["models"] = [m for m in args.models.split(",") if m]
    for _, key, _, _ in _REQUEST_FLAGS:
        if getattr(args, key) is not None:
            request[key] = getattr(args, key)
    for key in _REQUEST_BOOLS:
        if getattr(args, key) is not None:
            request[key] = getattr(args, key)
    request.setdefault("gentype", "text")
    print(json.dumps(prospective(request, store=command_store(args, reading=True), max_age=args.max_age)))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from vecsched.service.http.serve import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return serve(host=args.host, port=args.port, processes=args.processes, threads=args.threads,
                 database_url=_db_url(args), redis_url=args.redis, prefix=args.prefix,
                 max_age=args.max_age, live_progress=args.live_progress, log_level=args.log_level,
                 publish_forecast=args.publish_forecast)
