"""Every setting read from the environment, in one place.

``VECSCHED_DATABASE_URL`` (default: a SQLite file in ``$VECSCHED_HOME``),
``REDIS_URL`` (default: publish into the database), ``VECSCHED_REDIS_PREFIX``,
``VECSCHED_ELIGIBLE_IMAGE_WAIT`` (the job's image waits from eligible workers) and
``VECSCHED_REPLAY_EVERY`` (with ``vecsched run --replay``: seconds between replays
off the main cycle).
"""

from __future__ import annotations

import os

from vecsched.service.store.redis import RedisStore
from vecsched.service.store.sql import SQLStore


def default_database_url(env: dict[str, str] | None = None) -> str:
    """``$VECSCHED_DATABASE_URL``, else a SQLite file in ``$VECSCHED_HOME`` (default ``.``).

    Parameters
    ----------
    env : dict, optional
        The environment to read; default ``os.environ``.

    Returns
    -------
    str
        A SQLAlchemy database URL.

    Examples
    --------
    >>> default_database_url({"VECSCHED_HOME": "/srv/vs"})
    'sqlite:////srv/vs/vecsched.sqlite'
    """
    env = os.environ if env is None else env
    url = env.get("VECSCHED_DATABASE_URL")
    if url:
        return url
    home = env.get("VECSCHED_HOME") or "."
    return "sqlite:///" + os.path.join(home, "vecsched.sqlite")


def open_store(
    redis_url: str | None = None,
    database_url: str | None = None,
    prefix: str | None = None,
    env: dict[str, str] | None = None,
) -> RedisStore | SQLStore:
    """The configured store: Redis when a URL is given or ``$REDIS_URL`` is set,
    else the SQL database (``$VECSCHED_DATABASE_URL``, else the embedded SQLite file).

    Parameters
    ----------
    redis_url : str, optional
        Wins over ``$REDIS_URL``.
    database_url : str, optional
        Wins over ``$VECSCHED_DATABASE_URL``; used only without a Redis URL.
    prefix : str, optional
        Redis key prefix; default ``$VECSCHED_REDIS_PREFIX``, else ``"vecsched"``.
    env : dict, optional
        The environment to read; default ``os.environ``.

    Returns
    -------
    RedisStore or SQLStore

    Examples
    --------
    >>> type(open_store(database_url="sqlite://", env={})).__name__
    'SQLStore'
    >>> type(open_store(env={"REDIS_URL": "redis://127.0.0.1:6379/0"})).__name__
    'RedisStore'
    """

    env = dict(os.environ) if env is None else env
    redis_url = redis_url or env.get("REDIS_URL")
    if redis_url:
        return RedisStore(redis_url, prefix=prefix or env.get("VECSCHED_REDIS_PREFIX") or "vecsched")
    return SQLStore(database_url or default_database_url(env))


def database_is_named(env: dict[str, str] | None = None) -> bool:
    """Whether ``$VECSCHED_DATABASE_URL`` names the database (the demo then never touches it).

    Parameters
    ----------
    env : dict, optional
        The environment to read; default ``os.environ``.

    Returns
    -------
    bool

    Examples
    --------
    >>> database_is_named({}), database_is_named({"VECSCHED_DATABASE_URL": "sqlite:///h.sqlite"})
    (False, True)
    """
    env = os.environ if env is None else env
    return bool(env.get("VECSCHED_DATABASE_URL"))


def eligible_image_wait(env: dict[str, str] | None = None) -> bool:
    """``$VECSCHED_ELIGIBLE_IMAGE_WAIT`` as a flag (1, true, yes, on): the job's default.

    Parameters
    ----------
    env : dict, optional
        The environment to read; default ``os.environ``.

    Returns
    -------
    bool

    Examples
    --------
    >>> eligible_image_wait({"VECSCHED_ELIGIBLE_IMAGE_WAIT": "true"}), eligible_image_wait({})
    (True, False)
    """
    env = os.environ if env is None else env
    return env.get("VECSCHED_ELIGIBLE_IMAGE_WAIT", "").strip().lower() in ("1", "true", "yes", "on")


def replay_every(env: dict[str, str] | None = None) -> float | None:
    """``$VECSCHED_REPLAY_EVERY`` in seconds (> 0): the replay's cadence off the main cycle.

    Parameters
    ----------
    env : dict, optional
        The environment to read; default ``os.environ``.

    Returns
    -------
    float or None
        None when unset or empty: the replay runs inside every cycle.

    Raises
    ------
    vecsched.errors.SettingError
        When it is set but is not a finite number > 0.

    Examples
    --------
    >>> replay_every({"VECSCHED_REPLAY_EVERY": "60"}), replay_every({})
    (60.0, None)
    """
    from argparse import ArgumentTypeError

    from vecsched.arguments import seconds  # the --replay-every rule, so the two never differ
    from vecsched.errors import SettingError

    env = os.environ if env is None else env
    text = env.get("VECSCHED_REPLAY_EVERY", "").strip()
    if not text:
        return None
    try:
        return seconds(text)
    except ArgumentTypeError:
        raise SettingError(f"VECSCHED_REPLAY_EVERY must be a number of seconds > 0, not {text!r}") from None
