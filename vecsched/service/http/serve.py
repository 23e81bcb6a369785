"""``vecsched serve``: the status app under granian (worker processes, threads in each).

Each process opens its own store and database connections when it starts.
The access log stays off: a request line holds the request id, and ids are
never logged.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.parse
from typing import Any

from vecsched.service.progress import DatabaseProgress

log = logging.getLogger("vecsched.http")


def redact_url(url: str | None) -> str:
    """A URL fit for a log line: scheme, host, port and path, never user or password.

    Examples
    --------
    >>> redact_url("rediss://user:s3cret@cache.example:6380/0")
    'rediss://cache.example:6380/0'
    >>> redact_url("postgresql+psycopg://postgres:pw@127.0.0.1:5432/test?sslmode=require")
    'postgresql+psycopg://127.0.0.1:5432/test'
    >>> redact_url(None)
    'none'
    """
    if not url:
        return "none"
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


SERVE_CONFIG_ENV = "VECSCHED_SERVE_CONFIG"
"""How ``vecsched serve`` hands its configuration to the server's worker processes
(JSON in the environment they inherit: never on a command line, never logged)."""


def server_options(*, host: str, port: int, processes: int, threads: int, log_level: str) -> dict[str, Any]:
    """Granian settings for ``vecsched serve``.

    Granian parses HTTP in Rust; measured side by side on this project's
    status app it spends well under half of gunicorn's CPU per request
    (``docs/http.md``, "Under load").

    Examples
    --------
    >>> opts = server_options(host="::1", port=8080, processes=2, threads=4, log_level="INFO")
    >>> opts["address"], opts["workers"], opts["blocking_threads"], opts["log_access"], opts["interface"]
    ('::1', 2, 4, False, 'wsgi')
    """
    return {
        "target": f"{__name__}:app_from_environment",
        "factory": True,
        "interface": "wsgi",
        "address": host.strip("[]"),
        "port": port,
        "workers": processes,
        # WSGI views run on these threads: one blocks on a store read while another answers.
        "blocking_threads": threads,
        # A request line holds the id: no access log, whatever the level.
        "log_access": False,
        "log_level": log_level.lower(),
        "websockets": False,
        # A worker that dies is replaced rather than leaving the port half-served.
        "respawn_failed_workers": True,
    }


def app_from_environment() -> Any:
    """The WSGI app of one server process, from :data:`SERVE_CONFIG_ENV` (set by :func:`serve`).

    Each process opens its own store and database connections here, after it
    started.
    """
    from vecsched.service.http import StatusService, create_app

    config = json.loads(os.environ.get(SERVE_CONFIG_ENV) or "{}")
    return create_app(StatusService.from_environment(**config))


def check_port_free(host: str, port: int) -> None:
    """Fail in one line when ``host:port`` is taken; granian binds with port reuse and would share it.

    A second ``vecsched serve`` on a busy port (a redeploy beside the old one, another store)
    started without a word, and clients then got answers from the two servers in turn.

    Raises
    ------
    vecsched.errors.UserError
        The port is in use, or the address cannot be bound at all.

    Examples
    --------
    >>> import socket
    >>> with socket.socket() as taken:
    ...     taken.bind(("127.0.0.1", 0)); taken.listen()
    ...     check_port_free("127.0.0.1", taken.getsockname()[1])
    Traceback (most recent call last):
    ...
    vecsched.errors.UserError: --port ...: cannot serve on 127.0.0.1: the port is in use (another vecsched serve?); choose another with --port
    """
    import errno
    import socket

    from vecsched.errors import UserError

    address = host.strip("[]")
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            # SO_REUSEADDR passes a port a stopped server left in TIME_WAIT; without SO_REUSEPORT
            # the bind fails on any socket still listening there.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as exc:
        why = ("the port is in use (another vecsched serve?)" if exc.errno == errno.EADDRINUSE
               else exc.strerror or str(exc))
        raise UserError(f"--port {port}: cannot serve on {address}: {why}; choose another with --port") from None


def run_server(options: dict[str, Any]) -> None:
    """Run the status app under granian until a signal stops it."""
    try:
        from granian import Granian
    except ImportError as exc:
        from vecsched.errors import UserError

        raise UserError("vecsched serve needs granian (python -m pip install granian); "
                        "create_app() also serves under any WSGI server") from exc
    options = dict(options)
    Granian(options.pop("target"), **options).serve()


def announce_publication(name: str, store: Any, *, now: float | None = None) -> bool:
    """Log once whether ``name``'s forecast reaches clients now; returns whether it is approved.

    The server processes keep checking the verdicts (it can be approved, or
    lose approval, while they run); this is the operator's one line at startup.
    """
    import time

    from vecsched.service.read import ForecastPublication

    approved = ForecastPublication.for_store(name, store).approved(time.time() if now is None else now)
    if approved:
        log.info("publishing forecast %s: approved, so the horde paths' wait_time is its completion p50 "
                 "(the ADR wait stays on /vecsched/v1/status)", name)
    else:
        log.warning("publishing forecast %s asked for, but its promotion verdict is not approved "
                    "(vecsched promotion): clients keep the ADR wait until it is", name)
    return approved


def _connect_once(database_url: str) -> None:
    """Connect to the horde database once; a failure is one line naming it, without its password.

    Raises
    ------
    UserError
        The database cannot be reached (or refuses the login): the driver's reason.
    """
    import sqlalchemy as sa

    from vecsched.errors import UserError
    from vecsched.service.redact import mask_text

    progress = DatabaseProgress(database_url)
    try:
        progress.connect_once()
    except sa.exc.DBAPIError as exc:
        reason = str(exc.orig if exc.orig is not None else exc).strip().splitlines() or [type(exc).__name__]
        raise UserError(f"the horde database {redact_url(database_url)} cannot be reached: "
                        f"{mask_text(reason[0])}") from None
    finally:
        progress.close()


def serve(
    *,
    host: str,
    port: int,
    processes: int,
    threads: int,
    database_url: str,
    redis_url: str | None,
    prefix: str | None,
    max_age: float | None,
    live_progress: bool = False,
    log_level: str = "INFO",
    publish_forecast: str | None = None,
) -> int:
    """Serve the status routes until stopped; the job's configuration, read the job's way.

    Returns
    -------
    int
        The exit code.
    """
    if processes < 1 or threads < 1:
        raise ValueError("--processes and --threads must be >= 1")
    from vecsched.service.config import open_store

    # Opened once here so a bad configuration fails before any process forks: the store, and the
    # horde database the per-poll progress reads (with --redis the store never opens it), whose bad
    # URL, missing driver or unreachable server would otherwise fail in every worker process.
    store = open_store(redis_url=redis_url, database_url=database_url, prefix=prefix)
    kind = type(store).__name__
    if publish_forecast:
        announce_publication(publish_forecast, store)
    store.close()
    _connect_once(database_url)
    check_port_free(host, port)
    log.info(
        "serving on %s:%s with %d processes x %d threads; publication store %s; database %s; progress %s",
        host, port, processes, threads, kind, redact_url(database_url),
        "live (a query per poll)" if live_progress else "as of the cycle",
    )
    os.environ[SERVE_CONFIG_ENV] = json.dumps({
        "database_url": database_url, "redis_url": redis_url, "prefix": prefix, "max_age": max_age,
        "live_progress": live_progress, "publish_forecast": publish_forecast,
    })
    run_server(server_options(host=host, port=port, processes=processes, threads=threads, log_level=log_level))
    return 0
