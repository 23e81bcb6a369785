"""Argument parsing shared by every ``vecsched`` subcommand: one-line errors, defaults in the
help, and the argument types.

Its own module, below :mod:`vecsched.cli` and the modules that add subcommands
(:mod:`vecsched.service.commands`, :mod:`vecsched.simulate.commands`), so that
those need not import the command line that imports them.
"""

from __future__ import annotations

import argparse
import math
from typing import Any


class Formatter(argparse.HelpFormatter):
    """Help that shows each option's default (when it has a meaningful one).

    Examples
    --------
    >>> p = Parser(prog="x")
    >>> _ = p.add_argument("--n", type=int, default=3, help="how many")
    >>> "how many (default: 3)" in p.format_help()
    True
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, and whose help shows defaults.

    Subparsers made from it are of the same class (argparse's default).

    Examples
    --------
    >>> Parser(prog="x").formatter_class is Formatter
    True
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:
        """Exit 2 with one line: what is wrong and where the help is (argparse's hook).

        Parameters
        ----------
        message : str

        Returns
        -------
        typing.NoReturn
        """
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(text: str, kind: type, *, minimum: float, strict: bool, maximum: float = math.inf,
            what: str) -> Any:
    """``text`` as ``kind`` within the bounds, or the ArgumentTypeError that says what it must be."""
    try:
        value = kind(text)
    except ValueError:
        value = math.nan
    fits = math.isfinite(value) and (value > minimum if strict else value >= minimum) and value <= maximum
    if not fits:
        raise argparse.ArgumentTypeError(f"{text} is not {what}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0.

    Examples
    --------
    >>> non_negative_int("3")
    3
    >>> non_negative_int("-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: -1 is not an integer >= 0
    """
    return _number(text, int, minimum=0, strict=False, what="an integer >= 0")


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0.

    Examples
    --------
    >>> positive_float("2.5")
    2.5
    >>> positive_float("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 0 is not a number > 0
    """
    return _number(text, float, minimum=0.0, strict=True, what="a number > 0")


MAX_SECONDS = 86_400.0
"""The longest interval, cadence or age an option takes: a day (a larger one overflowed the scheduler's and Redis's integers)."""


def seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 and at most :data:`MAX_SECONDS`.

    Examples
    --------
    >>> seconds("5")
    5.0
    >>> seconds("1e300")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 1e300 is not a number of seconds > 0 and at most 86400
    """
    return _number(text, float, minimum=0.0, strict=True, maximum=MAX_SECONDS,
                   what=f"a number of seconds > 0 and at most {MAX_SECONDS:.0f}")


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0.

    Examples
    --------
    >>> non_negative_float("0")
    0.0
    >>> non_negative_float("-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: -1 is not a number >= 0
    """
    return _number(text, float, minimum=0.0, strict=False, what="a number >= 0")


def port_number(text: str) -> int:
    """An argparse type: a TCP port 1..65535.

    0 is refused: a server would bind a port of the system's choosing that no client knows.

    Examples
    --------
    >>> port_number("9464")
    9464
    >>> port_number("70000")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 70000 is not a port number 1..65535
    """
    return _number(text, int, minimum=1, strict=False, maximum=65535, what="a port number 1..65535")


def instant(text: str) -> float:
    """An argparse type: an ISO 8601 time with its zone, as epoch seconds.

    Examples
    --------
    >>> instant("2026-11-29T12:00:00Z")
    1795953600.0
    >>> instant("2026-11-29T12:00:00")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 2026-11-29T12:00:00 is not a time in ISO 8601 with its zone (e.g. 2026-11-29T12:00:00Z)
    """
    from vecsched.snapshot.times import to_epoch

    try:
        return to_epoch(text)
    except (TypeError, ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"{text} is not a time in ISO 8601 with its zone (e.g. 2026-11-29T12:00:00Z)") from None

