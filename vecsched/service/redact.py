"""Nothing secret in a log line: URL passwords masked wherever text is logged.

A database or Redis URL may carry a password (``postgresql://user:PASSWORD@host``).
:func:`mask_url` renders a URL with the password hidden (SQLAlchemy's own
rendering); :func:`mask_text` masks every URL-like credential inside arbitrary
text (an exception message may quote a URL); :class:`MaskPasswords` is a
logging filter that applies :func:`mask_text` to every record a handler emits,
so a library's log line is masked too.
"""

from __future__ import annotations

import logging
import re

_CREDENTIAL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<secret>[^\s@/]+)@")


def mask_url(url: str) -> str:
    """``url`` with its password shown as ``***``.

    Parameters
    ----------
    url : str
        A SQLAlchemy database URL or a Redis URL.

    Returns
    -------
    str

    Examples
    --------
    >>> mask_url("postgresql+psycopg://postgres:s3cret@127.0.0.1:5432/test")
    'postgresql+psycopg://postgres:***@127.0.0.1:5432/test'
    >>> mask_url("rediss://:s3cret@cache:6380/0")
    'rediss://:***@cache:6380/0'
    """
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: mask textually
        return mask_text(url)


def mask_text(text: str) -> str:
    """Every ``scheme://user:password@`` in ``text`` with the password as ``***``.

    Parameters
    ----------
    text : str
        Any text: a log message, an exception's message.

    Returns
    -------
    str

    Examples
    --------
    >>> mask_text("cannot reach redis://default:hunter2@10.0.0.5:6379/0 (timeout)")
    'cannot reach redis://default:***@10.0.0.5:6379/0 (timeout)'
    """
    return _CREDENTIAL.sub(lambda m: m.group("head") + "***@", text)


class MaskPasswords(logging.Filter):
    """A handler filter: the record's message with every URL password masked.

    Examples
    --------
    >>> record = logging.LogRecord("x", logging.WARNING, __file__, 1, "db %s down", ("pg://u:pw@h/d",), None)
    >>> MaskPasswords().filter(record), record.getMessage()
    (True, 'db pg://u:***@h/d down')
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Mask the record's message (and formatted traceback) in place; always keep the record.

        Parameters
        ----------
        record : logging.LogRecord

        Returns
        -------
        bool
            True: the record is emitted, masked.
        """
        message = record.getMessage()
        masked = mask_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_text:
            record.exc_text = mask_text(record.exc_text)
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Add :class:`MaskPasswords` to every handler of ``logger`` (default: the root logger).

    Parameters
    ----------
    logger : logging.Logger, optional
        Whose handlers to filter; default the root logger (what ``basicConfig`` set up).

    Examples
    --------
    >>> log = logging.getLogger("vecsched.example")
    >>> log.addHandler(logging.NullHandler())
    >>> install(log)
    >>> any(isinstance(f, MaskPasswords) for f in log.handlers[0].filters)
    True
    """
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, MaskPasswords) for f in handler.filters):
            handler.addFilter(MaskPasswords())
