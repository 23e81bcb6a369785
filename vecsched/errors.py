"""One clear line for each failure a command-line user can meet.

The command line prints :func:`describe` of whatever went wrong instead of a
traceback. The line names what failed and, where there is one, the fix (the
extra to install, the flag to pass); it never carries a password (database
and Redis errors are described by their driver's first line, which names
host and port only).
"""

from __future__ import annotations

import json
from typing import Any


class UserError(Exception):
    """A failure whose message is already the line to show (no type name added).

    Examples
    --------
    >>> describe(UserError("no request r1 in the current cycle"))
    'no request r1 in the current cycle'
    """


class SettingError(UserError):
    """A flag or environment setting that cannot be used (a malformed URL, a bad number).

    The command line exits 2 for it, as for a bad flag: the fix is in how the
    command was called, not in the data or the servers.

    Examples
    --------
    >>> describe(SettingError("bad Redis URL: Port out of range 0-65535"))
    'bad Redis URL: Port out of range 0-65535'
    """


# Optional drivers a database URL may need, and the extra that installs them.
_DRIVER_EXTRAS = {
    "psycopg": "postgres",
    "psycopg2": "postgres",
    "psycopg_binary": "postgres",
}


def describe(exc: BaseException) -> str:
    """One line for ``exc``, for a command-line user.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    str

    Examples
    --------
    >>> describe(FileNotFoundError(2, "No such file or directory", "missing/x.json"))
    'No such file or directory: missing/x.json'
    >>> describe(ModuleNotFoundError("No module named 'psycopg'", name="psycopg"))
    "the PostgreSQL driver psycopg is not installed: python -m pip install 'vecsched[postgres]'"
    >>> describe(RuntimeError("boom"))
    'RuntimeError: boom (rerun as vecsched --debug ... for the traceback)'
    """
    for kinds, say in _RULES:
        if isinstance(exc, kinds()):
            return say(exc)
    return f"{type(exc).__name__}: {_first_line(exc)} (rerun as vecsched --debug ... for the traceback)"


def _first_line(value: Any) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else ""


def _os_error(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else ""
    reason = exc.strerror or _first_line(exc)
    return f"{reason}: {where}" if where else reason


def _missing_module(exc: ModuleNotFoundError) -> str:
    top = (exc.name or "").split(".")[0]
    extra = _DRIVER_EXTRAS.get(top)
    if extra:
        return f"the PostgreSQL driver {top} is not installed: python -m pip install 'vecsched[{extra}]'"
    return f"the module {exc.name} is not installed: {_first_line(exc)}"


def _redis(exc: Exception) -> str:
    return f"cannot reach Redis: {_first_line(exc)}"


def _database(exc: Exception) -> str:
    orig = getattr(exc, "orig", None)
    return f"database error: {_first_line(orig if orig is not None else exc)}"


def _redis_kinds() -> tuple[type, ...]:
    try:
        import redis
    except ModuleNotFoundError:  # pragma: no cover - a core dependency
        return ()
    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def _sqlalchemy_kinds() -> tuple[type, ...]:
    import sqlalchemy.exc as sa_exc

    return (sa_exc.DBAPIError,)


_RULES = (
    (lambda: (UserError,), lambda e: str(e)),
    (lambda: (ModuleNotFoundError,), _missing_module),
    (_redis_kinds, _redis),
    (_sqlalchemy_kinds, _database),
    (lambda: (json.JSONDecodeError,), lambda e: f"bad JSON: {e}"),
    (lambda: (OSError,), _os_error),
    (lambda: (ValueError,), _first_line),
)
