"""Notice when the embedded SQLite file is deleted or replaced under a running job.

A pooled SQLite connection keeps reading the file it opened, even after that
file was unlinked or another file was moved into its place: the job would go
on publishing a horde nobody can see any more. :func:`watch_file` makes an
engine check, on every checkout, that the path still names the file its
connection opened (device and inode). A replaced file is reopened (with a
WARNING); a vanished one fails the checkout with :class:`DatabaseFileMissing`,
and the engine refuses to create an empty file in its place, so the cycle fails
with one clear line instead of publishing old data or an empty horde.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

log = logging.getLogger("vecsched.db")


# Every watched engine per file path: when one notices the file gone or
# replaced, the others' idle connections to the old file are closed too. Until
# the last connection to the old file closes, SQLite keeps its write-ahead log
# at "<path>-wal", where a new file at the path would find and replay it.
_ENGINES: dict[str, weakref.WeakSet[Engine]] = {}


# The -wal and -shm files seen beside each database file (by identity). SQLite
# cannot checkpoint into a file that was unlinked, so its log stays behind at
# "<path>-wal"; a new file moved to the path would replay that stale log and
# show the old horde. Only a log seen beside the old file is moved aside.
_SIDECARS: dict[str, set[tuple[str, tuple[int, int]]]] = {}


def _note_sidecars(path: str) -> None:
    seen = _SIDECARS.setdefault(path, set())
    for suffix in ("-wal", "-shm"):
        ident = _identity(path + suffix)
        if ident is not None:
            seen.add((suffix, ident))


def _release_old_file(path: str, noticed_by: Engine) -> None:
    for other in list(_ENGINES.get(path, ())):
        if other is not noticed_by:
            other.dispose()
    for suffix, ident in sorted(_SIDECARS.pop(path, set())):
        if _identity(path + suffix) == ident:
            aside = f"{path}{suffix}.orphaned"
            os.replace(path + suffix, aside)
            log.warning("moved %s, left behind by the old database file, to %s", path + suffix, aside)


class DatabaseFileMissing(RuntimeError):
    """The SQLite file an engine was using is gone (deleted or moved away).

    Examples
    --------
    >>> str(DatabaseFileMissing("SQLite database file /srv/vs/vecsched.sqlite is missing"))[:20]
    'SQLite database file'
    """


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def sqlite_path(engine: Engine) -> str | None:
    """The absolute path of a file-backed SQLite engine, else None.

    Parameters
    ----------
    engine : Engine

    Returns
    -------
    str or None
        None for other databases, in-memory SQLite and URI file names.

    Examples
    --------
    >>> sqlite_path(sa.create_engine("sqlite://")) is None
    True
    >>> sqlite_path(sa.create_engine("sqlite:////srv/vs/vecsched.sqlite"))
    '/srv/vs/vecsched.sqlite'
    """
    if engine.dialect.name != "sqlite":
        return None
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:") or engine.url.query.get("uri"):
        return None
    return os.path.abspath(database)


def watch_file(engine: Engine) -> Engine:
    """Make ``engine`` notice its SQLite file vanishing or being replaced (no-op for other engines).

    Parameters
    ----------
    engine : Engine

    Returns
    -------
    Engine
        The same engine.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "h.sqlite")
    >>> engine = watch_file(sa.create_engine(f"sqlite:///{path}"))
    >>> with engine.connect() as conn:
    ...     conn.exec_driver_sql("select 1").scalar()
    1
    >>> os.remove(path)
    >>> try:
    ...     engine.connect()
    ... except DatabaseFileMissing as exc:
    ...     print("missing")
    missing
    >>> os.path.exists(path)
    False
    """
    path = sqlite_path(engine)
    if path is None or getattr(engine, "_vecsched_watched", False):
        return engine
    engine._vecsched_watched = True  # type: ignore[attr-defined]
    _ENGINES.setdefault(path, weakref.WeakSet()).add(engine)
    # Once the file has existed, an engine never creates it again: a missing
    # file is an error to report, not an empty horde to publish.
    seen = {"file": _identity(path) is not None}

    def missing() -> DatabaseFileMissing:
        return DatabaseFileMissing(f"SQLite database file {path} is missing (deleted or moved); not recreating it")

    @sa.event.listens_for(engine, "do_connect")
    def _refuse_to_recreate(dialect: Any, record: Any, cargs: Any, cparams: Any) -> None:
        if seen["file"] and _identity(path) is None:
            raise missing()

    @sa.event.listens_for(engine, "connect")
    def _remember(dbapi_conn: Any, record: Any) -> None:
        record.info["vecsched_file"] = _identity(path)
        seen["file"] = True

    @sa.event.listens_for(engine, "checkout")
    def _check(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        now = _identity(path)
        if now == record.info.get("vecsched_file"):
            _note_sidecars(path)
            return
        _release_old_file(path, engine)
        if now is None:
            raise missing()
        else:
            log.warning("SQLite database file %s was replaced; reopening it", path)
            # The pool drops this connection and opens the file now at the path.
            raise sa.exc.DisconnectionError(f"{path} was replaced")

    return engine
