"""``vecsched serve``: the status app under gunicorn (pre-forked processes, threads in each).

Each process opens its own store and database connections after the fork.
Gunicorn's access log stays off: a request line holds the request id, and ids
are never logged at INFO.
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any, Callable

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


def gunicorn_options(*, host: str, port: int, processes: int, threads: int, log_level: str) -> dict[str, Any]:
    """Gunicorn settings for ``vecsched serve``.

    Examples
    --------
    >>> opts = gunicorn_options(host="::1", port=8080, processes=2, threads=8, log_level="info")
    >>> opts["bind"], opts["workers"], opts["worker_class"], opts["accesslog"]
    (['[::1]:8080'], 2, 'gthread', None)
    """
    bind_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return {
        "bind": [f"{bind_host}:{port}"],
        "workers": processes,
        "threads": threads,
        "worker_class": "gthread",
        "accesslog": None,
        "errorlog": "-",
        "loglevel": log_level.lower(),
        "proc_name": "vecsched-serve",
        # A poll answers in milliseconds; a worker stuck this long is restarted.
        "timeout": 30,
        "graceful_timeout": 10,
        "keepalive": 5,
        # No control socket in the home directory (gunicorn >= 25; ignored where unknown).
        "control_socket_disable": True,
    }


def run_gunicorn(factory: Callable[[], Any], options: dict[str, Any]) -> None:
    """Run ``factory()``'s WSGI app under gunicorn until a signal stops it."""
    try:
        from gunicorn.app.base import BaseApplication
    except ImportError as exc:
        from vecsched.errors import UserError

        raise UserError(
            "vecsched serve needs gunicorn (python -m pip install gunicorn; it does not run on Windows, "
            "where create_app() serves under any WSGI server)"
        ) from exc

    class _Application(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for key, value in options.items():
                if key in self.cfg.settings:
                    self.cfg.set(key, value)

        def load(self) -> Any:
            return factory()

    _Application().run()


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
    log_level: str = "INFO",
) -> int:
    """Serve the status routes until stopped; the job's configuration, read the job's way.

    Returns
    -------
    int
        The exit code.
    """
    from vecsched.service.http import StatusService, create_app

    if processes < 1 or threads < 1:
        raise ValueError("--processes and --threads must be >= 1")

    def factory() -> Any:
        service = StatusService.from_environment(
            database_url=database_url, redis_url=redis_url, prefix=prefix, max_age=max_age
        )
        return create_app(service)

    from vecsched.service.config import open_store

    # Opened once here so a bad configuration fails before any process forks.
    store = open_store(redis_url=redis_url, database_url=database_url, prefix=prefix)
    kind = type(store).__name__
    store.close()
    log.info(
        "serving on %s:%s with %d processes x %d threads; publication store %s; database %s",
        host, port, processes, threads, kind, redact_url(database_url),
    )
    run_gunicorn(factory, gunicorn_options(host=host, port=port, processes=processes, threads=threads,
                                           log_level=log_level))
    return 0
