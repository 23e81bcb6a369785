"""Judging single cells by value, whatever source they came from.

A JSON file, a SQLite file and a PostgreSQL database hand over a column's
values as Python objects of whatever type they happen to hold: SQLite keeps
text in a number column, a REAL in an integer one, ``'yes'`` in a boolean,
bytes that are not UTF-8 in a text column. :func:`judge_cells` decides, value
by value and the same way for every source, whether each cell is what its
column needs; nothing is truncated, rounded or guessed. :func:`string_problems`
holds the rules every string obeys (valid Unicode, no NUL, at most
:data:`MAX_STRING_BYTES` bytes).

This module is a leaf: it imports nothing from the package, so the column table
(:mod:`vecsched.snapshot.schema`) can use it.
"""

from __future__ import annotations

import math
import operator
from decimal import Decimal
from itertools import repeat
from typing import Any
from uuid import UUID

import numpy as np
import pandas as pd

MAX_STRING_BYTES = 256
"""The longest id, user id, model name, bridge agent or state tag, in UTF-8 bytes.

The horde's own columns are bounded far below this. A longer value is a bad
cell; rejecting it keeps every array, payload and published state
proportional to the number of rows, never to the longest string.
"""

INT_LIMIT = 2**62
"""Integers at or beyond this magnitude are out of range for every column (no int64 wrap)."""

# Messages, one per rule, shared by every source.
NOT_STRING = "must be a string"
NOT_UTF8 = "is not valid UTF-8"
BLOB = "must be text, not a blob"
SURROGATE = "is not valid Unicode (lone surrogate)"
NUL = "contains a NUL character"
TOO_LONG = f"is longer than {MAX_STRING_BYTES} bytes"
NOT_BOOL = "must be true or false"
NOT_INT = "must be an integer"
INT_RANGE = "is out of range"
NOT_FINITE = "must be a finite number"


class UndecodableText:
    """A text cell whose bytes are not UTF-8 (SQLite stores whatever it is given).

    It stands in the column where the text would be, so the row is rejected by
    value with :data:`NOT_UTF8` instead of the whole query failing.

    Examples
    --------
    >>> cell = UndecodableText(b"\\xff\\xfeA")
    >>> cell.escaped
    '\\\\xff\\\\xfeA'
    """

    __slots__ = ("raw",)

    def __init__(self, raw: bytes):
        self.raw = bytes(raw)

    @property
    def escaped(self) -> str:
        """The bytes with every invalid one shown as ``\\xNN`` (printable, loggable).

        Returns
        -------
        str
        """
        return self.raw.decode("utf-8", "backslashreplace")

    def __repr__(self) -> str:
        return f"UndecodableText({self.raw[:40]!r})"


def decode_text(raw: bytes) -> str | UndecodableText:
    """``raw`` as UTF-8 text, or an :class:`UndecodableText` (a sqlite3 ``text_factory``).

    Parameters
    ----------
    raw : bytes
        A text cell's bytes as SQLite holds them.

    Returns
    -------
    str or UndecodableText

    Examples
    --------
    >>> decode_text(b"abc"), decode_text(b"\\xff")
    ('abc', UndecodableText(b'\\xff'))
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return UndecodableText(raw)


def string_problems(values: Any) -> list[tuple[np.ndarray, str]]:
    """Which of ``values`` break a string rule: ``[(mask, message), ...]``.

    Not a string (or undecodable), a lone surrogate, a NUL character (neither
    PostgreSQL nor the published state can hold one), more than
    :data:`MAX_STRING_BYTES` UTF-8 bytes. Whole columns are checked with C-level
    passes; only non-ASCII strings are encoded one by one.

    Parameters
    ----------
    values : sequence or ndarray of object
        One column's cells (or a list column's entries).

    Returns
    -------
    list of (ndarray of bool, str)
        One boolean mask per broken rule, with its message; empty when all is well.

    Examples
    --------
    >>> [(m.tolist(), msg) for m, msg in string_problems(["ok", 3, "x" * 300])]
    [([False, True, False], 'must be a string'), ([False, False, True], 'is longer than 256 bytes')]
    """
    items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    n = len(items)
    out: list[tuple[np.ndarray, str]] = []
    try:
        joined = "".join(items)  # fails on the first cell that is not a str: one pass, not a type scan first
    except TypeError:
        joined = None
    if joined is None:
        is_str = np.fromiter((isinstance(v, str) for v in items), dtype=bool, count=n)
        for message, kind in ((NOT_UTF8, UndecodableText), (BLOB, (bytes, bytearray, memoryview))):
            mask = np.fromiter((isinstance(v, kind) for v in items), dtype=bool, count=n)
            if mask.any():
                out.append((mask, message))
        other = ~is_str
        for mask, _ in out:
            other &= ~mask
        if other.any():
            out.append((other, NOT_STRING))
        items = [v if ok else "" for v, ok in zip(items, is_str.tolist())]
        joined = "".join(items)
    # The usual column (short ASCII, no NUL) is cleared by three C-level passes.
    if joined.isascii() and "\x00" not in joined and max(map(len, items), default=0) <= MAX_STRING_BYTES:
        return out
    del joined
    size = np.fromiter(map(len, items), dtype=np.int64, count=n)
    ascii_ = np.fromiter(map(str.isascii, items), dtype=bool, count=n)
    surrogate = np.zeros(n, dtype=bool)
    for k in np.flatnonzero(~ascii_).tolist():
        try:
            size[k] = len(items[k].encode("utf-8"))
        except UnicodeEncodeError:
            surrogate[k] = True
    nul = np.fromiter(map(operator.contains, items, repeat("\x00")), dtype=bool, count=n)
    for mask, message in ((surrogate, SURROGATE), (nul, NUL), (size > MAX_STRING_BYTES, TOO_LONG)):
        if mask.any():
            out.append((mask, message))
    return out


def printable_id(value: Any) -> str | None:
    """An id fit for an error message: escaped if undecodable or surrogate, cut if oversized.

    Parameters
    ----------
    value : object
        The id cell as read.

    Returns
    -------
    str or None
        None when the cell is not text at all.

    Examples
    --------
    >>> printable_id("w1"), printable_id(7), printable_id("x" * 1000)[-12:]
    ('w1', None, '(1000 chars)')
    """
    if isinstance(value, UndecodableText):
        value = value.escaped
    if not isinstance(value, str):
        return None
    if len(value) > 64:
        value = value[:32] + f"...({len(value)} chars)"
    if not value.isascii():
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def judge_cells(
    kind: str,
    values: list[Any],
    *,
    choices: tuple[str, ...] = (),
    nullable: bool = False,
    sql: bool = False,
) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, str]]]:
    """Type one column's cells by value: ``(array, null, [(bad mask, message), ...])``.

    ``kind`` is a column kind of the schema (``str``, ``bool``, ``int``,
    ``float``, ``enum``). ``None`` is NULL where ``nullable``, else a bad cell.
    ``sql`` admits SQL's spelling of booleans (the integers 0 and 1, as SQLite
    stores them); every other rule is the same for every source. Bad cells
    hold a placeholder (0, ``False``, ``""``) in the array.

    Parameters
    ----------
    kind : str
        The column's kind.
    values : list
        The cells as read (Python objects).
    choices : tuple of str
        An enumeration's names; its cells become their codes.
    nullable : bool
        Whether ``None`` is NULL (SQL) or a bad cell (a JSON null where none is allowed).
    sql : bool
        Whether the cells come from SQL (0 and 1 are booleans there).

    Returns
    -------
    array : ndarray
        Typed values: object (str), bool, int64 (int, enum codes), float64 (NaN for NULL).
    null : ndarray of bool
        Where the cell was NULL.
    problems : list of (ndarray of bool, str)
        The bad cells, one mask per message.

    Examples
    --------
    >>> arr, null, bad = judge_cells("int", [3, 3.7, "abc", None], nullable=True)
    >>> arr.tolist(), null.tolist(), [(m.tolist(), msg) for m, msg in bad]
    ([3, 0, 0, 0], [False, False, False, True], [([False, True, True, False], 'must be an integer')])
    >>> judge_cells("bool", [1, "yes"], sql=True)[2][0][0].tolist()
    [False, True]
    """
    n = len(values)
    null = np.fromiter((v is None for v in values), dtype=bool, count=n) if None in values else np.zeros(n, bool)
    if not nullable and null.any():
        # JSON null in a column that has no null: a bad cell like any other.
        null, was_null = np.zeros(n, dtype=bool), null
    else:
        was_null = np.zeros(n, dtype=bool)
    types = set(map(type, values))
    arr = None
    if sql and kind == "bool" and types <= {int, bool, type(None)}:
        # SQLite's booleans are the integers 0 and 1: one pass over the column.
        try:
            filled = [0 if v is None else v for v in values] if null.any() or was_null.any() else values
            ints = np.asarray(filled, dtype=np.int64) if n else np.zeros(0, dtype=np.int64)
        except OverflowError:
            ints = None
        if ints is not None and ((ints == 0) | (ints == 1)).all():
            return ints.astype(bool), null, ([(was_null, NOT_BOOL)] if was_null.any() else [])
    if kind == "enum" and types <= {str, type(None)}:
        codes = pd.Index(list(choices), dtype=object).get_indexer(pd.Index(values, dtype=object)).astype(np.int64)
        unknown = (codes < 0) & ~null
        codes[codes < 0] = 0
        problems = [(unknown, bad_cell_message(kind, choices))] if unknown.any() else []
        if was_null.any():
            problems.append((was_null, bad_cell_message(kind, choices)))
        return codes, null, problems
    if types <= _FAST.get(kind, set()) | {type(None)}:
        try:
            arr = _convert(kind, values, null | was_null)
        except OverflowError:  # an integer beyond int64 / float64: judged one by one
            arr = None
    if arr is not None:
        bad = _range_bad(kind, arr, null | was_null)
        problems = [(bad, INT_RANGE if kind == "int" else NOT_FINITE)] if bad.any() else []
    else:
        arr, problems = _one_by_one(kind, values, null | was_null, choices, sql)
    if was_null.any():
        problems.append((was_null, bad_cell_message(kind, choices)))
    return arr, null, problems


_FAST = {"str": {str}, "bool": {bool}, "int": {int}, "float": {int, float}}


def bad_cell_message(kind: str, choices: tuple[str, ...]) -> str:
    """The message of a cell that is not of its column's ``kind`` (``choices``: an enumeration's names).

    Parameters
    ----------
    kind : str
        The column's kind.
    choices : tuple of str
        An enumeration's names.

    Returns
    -------
    str

    Examples
    --------
    >>> bad_cell_message("enum", ("text", "image"))
    'must be one of text, image'
    """
    return {
        "str": NOT_STRING,
        "bool": NOT_BOOL,
        "int": NOT_INT,
        "float": "must be a number",
        "enum": f"must be one of {', '.join(choices)}",
    }[kind]


def _convert(kind: str, values: list[Any], null: np.ndarray) -> np.ndarray:
    if kind == "str":
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        arr[null] = ""
        return arr
    filled = [0 if v is None else v for v in values] if null.any() else values
    dtype = {"bool": bool, "float": np.float64, "int": np.int64}[kind]
    arr = np.asarray(filled, dtype=dtype) if filled else np.zeros(0, dtype=dtype)
    if kind == "float":
        arr[null] = np.nan
    return arr


def _range_bad(kind: str, arr: np.ndarray, null: np.ndarray) -> np.ndarray:
    if kind == "int":
        bad = (arr <= -INT_LIMIT) | (arr >= INT_LIMIT)
        arr[bad] = 0
        return bad
    if kind == "float":
        bad = ~np.isfinite(arr) & ~null
        arr[bad] = 0.0
        return bad
    return np.zeros(len(arr), dtype=bool)


def _one_by_one(
    kind: str, values: list[Any], null: np.ndarray, choices: tuple[str, ...], sql: bool
) -> tuple[np.ndarray, list[tuple[np.ndarray, str]]]:
    """The rare column with odd cells: judge each one."""
    n = len(values)
    arr = np.zeros(n, dtype={"str": object, "enum": np.int64, "bool": bool, "int": np.int64, "float": np.float64}[kind])
    if kind == "str":
        arr[:] = ""
    messages: dict[str, list[int]] = {}
    index = {c: i for i, c in enumerate(choices)}
    for k, v in enumerate(values):
        if null[k]:
            if kind == "float":
                arr[k] = np.nan
            continue
        got, message = _cell(kind, v, index, sql)
        if message is None:
            arr[k] = got
        else:
            messages.setdefault(message if message else bad_cell_message(kind, choices), []).append(k)
    problems = []
    for message, rows in messages.items():
        mask = np.zeros(n, dtype=bool)
        mask[rows] = True
        problems.append((mask, message))
    return arr, problems


def _cell(kind: str, v: Any, index: dict[str, int], sql: bool) -> tuple[Any, str | None]:
    """One cell's typed value and ``None``, or a placeholder and its message ("" = the kind's own)."""
    if isinstance(v, UndecodableText):
        return None, NOT_UTF8
    if isinstance(v, (bytes, bytearray, memoryview)):
        return None, BLOB if kind in ("str", "enum") else ""
    if kind in ("str", "enum"):
        if isinstance(v, UUID) and kind == "str":
            # The horde keys its rows by uuid columns: a UUID is its canonical text.
            return str(v), None
        if not isinstance(v, str):
            return None, ""
        if kind == "str":
            return v, None
        return (index[v], None) if v in index else (None, "")
    if isinstance(v, bool):
        return (v, None) if kind == "bool" else (None, "")
    if kind == "bool":
        # SQL has no boolean storage in SQLite: 0 and 1 are its booleans, nothing else is.
        return (bool(v), None) if sql and type(v) is int and v in (0, 1) else (None, "")
    if isinstance(v, Decimal):
        if not v.is_finite():
            return None, NOT_FINITE if kind == "float" else ""
        v = int(v) if kind == "int" and v == v.to_integral_value() else (float(v) if kind == "float" else v)
    if kind == "int":
        if not isinstance(v, int):
            return None, ""
        return (v, None) if -INT_LIMIT < v < INT_LIMIT else (None, INT_RANGE)
    if isinstance(v, (int, float)):
        try:
            f = float(v)
        except OverflowError:
            return None, NOT_FINITE
        return (f, None) if math.isfinite(f) else (None, NOT_FINITE)
    return None, ""
