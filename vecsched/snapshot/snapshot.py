"""A horde at one instant, held as columns of NumPy arrays.

A :class:`Snapshot` is what every estimator reads. It is built from the JSON
interchange format (:func:`load_snapshot`), from SQL rows, or from synthetic
columns (:meth:`Snapshot.from_columns`); all three end in the same checks of
:mod:`vecsched.snapshot.schema`, and a bad row is left out with a :class:`RowError`
rather than failing the whole snapshot.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from vecsched.snapshot.cells import judge_cells, string_problems
from vecsched.snapshot.lists import ListColumn
from vecsched.snapshot.schema import (
    KEY_COLUMNS,
    REQUIRED,
    TABLES,
    Column,
    RowError,
    validate_columns,
)
from vecsched.snapshot.times import iso, parse_times, to_epoch

FORMAT = "vecsched.snapshot/1"
_MISSING = object()
EVENT_TABLES = ("dispatches", "capacity_returns")
_ROW_TABLES = ("workers", "requests", "jobs") + EVENT_TABLES


class SnapshotError(ValueError):
    """The input is not a snapshot at all (as opposed to one bad row in it)."""


class Table:
    """Named columns of equal length; columns read as attributes (``table.threads``)."""

    __slots__ = ("name", "columns")

    def __init__(self, name: str, columns: dict[str, Any]):
        self.name = name
        self.columns = columns

    def __getattr__(self, key: str) -> Any:
        if key in Table.__slots__:  # not set yet (unpickling, copying): no columns to look in
            raise AttributeError(key)
        try:
            return self.columns[key]
        except KeyError:
            raise AttributeError(f"{self.name} has no column {key!r}") from None

    def __len__(self) -> int:
        return len(self.columns["id"])

    def take(self, rows: np.ndarray) -> "Table":
        return Table(
            self.name,
            {k: (v.take(rows) if isinstance(v, ListColumn) else v[rows]) for k, v in self.columns.items()},
        )

    def __repr__(self) -> str:
        return f"<Table {self.name}: {len(self)} rows>"


@dataclass(frozen=True)
class Snapshot:
    """A horde at instant :attr:`now`: workers, requests, jobs, excluded pairs, events.

    Times are float seconds since the Unix epoch. ``models`` list columns hold
    codes into :attr:`model_names`. Rows that broke a rule are not in the
    tables; each is described in :attr:`rejected`.

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({
    ...     "format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z",
    ...     "workers": [{"id": "w1", "user_id": "u1", "gentype": "text",
    ...                  "last_check_in": "2026-11-29T11:59:30Z", "models": ["m"]}],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1,
    ...                   "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z", "models": ["m"]}]})
    >>> len(snap.workers), len(snap.requests), snap.rejected
    (1, 1, ())
    """

    now: float
    workers: Table
    requests: Table
    jobs: Table
    excluded_pairs: Table
    model_names: np.ndarray
    dispatches: Table = field(default_factory=lambda: _empty_events("dispatches"))
    capacity_returns: Table = field(default_factory=lambda: _empty_events("capacity_returns"))
    rejected: tuple[RowError, ...] = field(default=())

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_columns(
        cls,
        now: float | datetime | str,
        workers: Mapping[str, Any],
        requests: Mapping[str, Any],
        jobs: Mapping[str, Any] | None = None,
        excluded_pairs: Mapping[str, Any] | None = None,
        dispatches: Mapping[str, Any] | Iterable[dict[str, Any]] = (),
        capacity_returns: Mapping[str, Any] | Iterable[dict[str, Any]] = (),
        rejected: Iterable[RowError] = (),
    ) -> "Snapshot":
        """Build a snapshot from typed columns (arrays, or lists for list columns).

        Columns follow SNAPSHOT_FORMAT.md; times are epoch seconds; a missing
        optional column takes its default. Value rules are checked here, bad
        rows left out and reported in :attr:`rejected`. ``dispatches`` and
        ``capacity_returns`` are columns too, or a list of JSON-like objects
        (times as ISO strings).
        """
        errors: list[RowError] = list(rejected)
        typed = {}
        for table, given in (("workers", workers), ("requests", requests), ("jobs", jobs or {})):
            typed[table] = _typed_columns(table, dict(given))
        tables = {}
        for table, cols in typed.items():
            positions = cols.pop("__row__", None)
            keep = validate_columns(table, cols, errors, positions)
            for col in TABLES[table]:
                if col.kind in ("int", "enum"):
                    cols[col.name] = cols[col.name].astype(col.dtype)
            tables[table] = Table(table, cols) if keep.all() else Table(table, cols).take(keep)

        # Models of workers and requests share one vocabulary, so a code compares
        # equal across the two tables. Only kept rows name models: a rejected
        # row's oversized name never reaches the vocabulary.
        w_models, r_models = tables["workers"].models, tables["requests"].models
        codes, vocabulary = pd.factorize(
            np.concatenate([w_models.values, r_models.values]).astype(object), use_na_sentinel=False
        )
        codes = codes.astype(np.int32)
        split = len(w_models.values)
        tables["workers"].columns["models"] = ListColumn(w_models.offsets, codes[:split])
        tables["requests"].columns["models"] = ListColumn(r_models.offsets, codes[split:])

        pairs = dict(excluded_pairs or {})
        pair_table = _pair_table(
            _object_array(pairs.get("worker_id", [])), _object_array(pairs.get("request_id", [])), errors
        )
        pair_table.columns["id"] = pair_table.columns["worker_id"]
        return cls(
            now=to_epoch(now),
            workers=tables["workers"],
            requests=tables["requests"],
            jobs=tables["jobs"],
            excluded_pairs=pair_table,
            model_names=np.asarray(vocabulary, dtype=object),
            rejected=tuple(errors),
        ).with_events(dispatches, capacity_returns)

    def with_events(
        self,
        dispatches: Mapping[str, Any] | Iterable[dict[str, Any]],
        capacity_returns: Mapping[str, Any] | Iterable[dict[str, Any]],
    ) -> "Snapshot":
        """This snapshot with other scheduling events (columns or JSON-like rows), checked like any.

        Examples
        --------
        >>> import vecsched
        >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
        ...     "now": "2026-11-29T12:00:00Z", "workers": [], "requests": []})
        >>> more = snap.with_events({"dispatch_id": ["d1"], "worker_id": ["w"], "request_id": ["r"],
        ...     "request_created": [0.0], "dispatched_at": [1.0], "assigned_work": [-1.0]}, {})
        >>> len(more.dispatches), more.rejected[0].field
        (0, 'assigned_work')
        """
        import dataclasses

        errors = list(self.rejected)
        tables = {}
        for table, given in (("dispatches", dispatches), ("capacity_returns", capacity_returns)):
            if isinstance(given, Mapping):
                cols = _typed_columns(table, dict(given))
            else:
                cols = _typed_columns(table, columns_from_records(table, list(given), errors))
            tables[table] = _checked_table(table, cols, errors)
        return dataclasses.replace(self, rejected=tuple(errors), **tables)

    # -- views --------------------------------------------------------------------
    def model_lists(self, table: str) -> list[list[str]]:
        """The model names of each row of ``workers`` or ``requests``."""
        col = getattr(self, table).models
        names = self.model_names[col.values].tolist()
        offs = col.offsets.tolist()
        return [names[a:b] for a, b in zip(offs[:-1], offs[1:])]

    def to_frames(self) -> dict[str, pd.DataFrame]:
        """One pandas DataFrame per table, with readable values.

        Enumerations are strings, times are UTC timestamps, list columns hold
        Python lists. Meant for notebooks and for the scalar reference.
        """
        frames = {}
        for table in ("workers", "requests", "jobs"):
            t: Table = getattr(self, table)
            data = {}
            for col in TABLES[table]:
                data[col.name] = _readable(self, table, col, t.columns[col.name])
            frames[table] = pd.DataFrame(data)
        frames["excluded_pairs"] = pd.DataFrame(
            {
                "worker_id": self.excluded_pairs.worker_id,
                "request_id": self.excluded_pairs.request_id,
            }
        )
        return frames

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as a JSON-ready mapping in the interchange format."""
        out: dict[str, Any] = {"format": FORMAT, "now": iso(self.now)}
        for table in _ROW_TABLES:
            t: Table = getattr(self, table)
            cols: dict[str, list[Any]] = {}
            for col in TABLES[table]:
                values = t.columns[col.name]
                if col.kind == "time":
                    cols[col.name] = [iso(v) for v in values.tolist()]
                elif col.kind == "enum":
                    cols[col.name] = [col.choices[v] for v in values.tolist()]
                elif col.kind == "str_list":
                    if col.name == "models":
                        cols[col.name] = self.model_lists(table)
                    else:
                        cols[col.name] = values.tolist()
                elif col.kind == "float" and col.nullable:
                    cols[col.name] = [None if math.isnan(v) else v for v in values.tolist()]
                else:
                    cols[col.name] = values.tolist()
            names = list(cols)
            out[table] = [dict(zip(names, row)) for row in zip(*(cols[k] for k in names))]
        out["excluded_pairs"] = [
            [w, r]
            for w, r in zip(
                self.excluded_pairs.worker_id.tolist(), self.excluded_pairs.request_id.tolist()
            )
        ]
        return out

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """Serialise to the interchange format; also write it to ``path`` if given."""
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text

    def __repr__(self) -> str:
        return (
            f"<Snapshot at {iso(self.now)}: {len(self.workers)} workers, "
            f"{len(self.requests)} requests, {len(self.jobs)} jobs, "
            f"{len(self.rejected)} rejected rows>"
        )


def _pair_table(worker_id: np.ndarray, request_id: np.ndarray, errors: list[RowError]) -> Table:
    """Excluded pairs whose ids obey the string rules; the others become RowErrors."""
    bad = np.zeros(len(worker_id), dtype=bool)
    for mask, message in string_problems(worker_id) + string_problems(request_id):
        for k in np.flatnonzero(mask & ~bad).tolist():
            errors.append(RowError("excluded_pairs", k, None, "pair", message))
        bad |= mask
    if bad.any():
        worker_id, request_id = worker_id[~bad], request_id[~bad]
    return Table("excluded_pairs", {"worker_id": worker_id, "request_id": request_id})


# -- JSON interchange ---------------------------------------------------------------


def load_snapshot(source: str | os.PathLike[str] | Mapping[str, Any]) -> Snapshot:
    """Read a snapshot from a JSON file path or an already-parsed mapping.

    A row with a bad value is left out and described in
    :attr:`Snapshot.rejected` (row, id and field); everything else loads.
    Input that is not a snapshot at all raises :class:`SnapshotError` with one
    clear message.

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z", "workers": [], "requests": [
    ...     {"id": "bad", "user_id": "u", "gentype": "text", "n": -1,
    ...      "created": "2026-11-29T11:00:00Z", "expiry": "2026-11-29T13:00:00Z"}]})
    >>> print(snap.rejected[0])
    requests[0] (id 'bad'): field 'n': must be >= 0
    """
    doc = source if isinstance(source, Mapping) else _read_json(source)
    if not isinstance(doc, Mapping):
        raise SnapshotError("a snapshot is a JSON object with a 'format' key")
    if doc.get("format") != FORMAT:
        raise SnapshotError(f"not a snapshot: 'format' is {_short(doc.get('format'))}, expected {FORMAT!r}")
    try:
        # A time in the file is text (SNAPSHOT_FORMAT.md); a number is refused, not guessed at.
        if not isinstance(doc.get("now"), str):
            raise TypeError("not a string")
        now = to_epoch(doc.get("now"))
    except (TypeError, ValueError, OverflowError):
        raise SnapshotError(f"'now' must be an ISO 8601 time with a zone, got {_short(doc.get('now'))}") from None
    errors: list[RowError] = []
    columns = {}
    for table in _ROW_TABLES:
        rows = doc.get(table, [])
        if not isinstance(rows, list):
            raise SnapshotError(f"'{table}' must be a list of objects")
        columns[table] = columns_from_records(table, rows, errors)
    pairs = doc.get("excluded_pairs", [])
    if not isinstance(pairs, list):
        raise SnapshotError("'excluded_pairs' must be a list of [worker_id, request_id]")
    good_pairs = []
    for k, pair in enumerate(pairs):
        if (
            isinstance(pair, (list, tuple))
            and len(pair) == 2
            and all(isinstance(x, str) for x in pair)
        ):
            good_pairs.append(pair)
        else:
            errors.append(RowError("excluded_pairs", k, None, "pair", "must be [worker_id, request_id]"))
    return Snapshot.from_columns(
        now,
        columns["workers"],
        columns["requests"],
        columns["jobs"],
        {"worker_id": [p[0] for p in good_pairs], "request_id": [p[1] for p in good_pairs]},
        dispatches=columns["dispatches"],
        capacity_returns=columns["capacity_returns"],
        rejected=errors,
    )


MAX_DEPTH = 64
"""How deeply a snapshot file may nest arrays and objects (a snapshot needs 4).

Checked on the raw bytes before parsing, so a hostile file cannot exhaust the
parser's recursion; the error names the limit.
"""


def _read_json(source: str | os.PathLike[str]) -> Any:
    name = os.fspath(source)
    try:
        with open(source, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {name!r}: {exc.strerror}") from None
    depth = json_depth(data)
    if depth > MAX_DEPTH:
        raise SnapshotError(f"{name!r} nests arrays or objects {depth} deep; a snapshot may nest at most {MAX_DEPTH}")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{name!r} is not JSON: {exc}") from None
    except RecursionError:  # pragma: no cover - json_depth refuses these first
        raise SnapshotError(f"{name!r} nests too deeply to parse") from None


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text, brackets inside strings ignored.

    Vectorized over the bytes (a few passes, memory a small multiple of the
    quotes and brackets), so it costs little next to parsing.

    Examples
    --------
    >>> json_depth(b'{"a": [1, [2]], "b": "[[[["}')
    3
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    quotes = np.flatnonzero(buf == ord('"'))
    # A quote is escaped when an odd run of backslashes precedes it.
    run = np.zeros(len(quotes), dtype=np.int64)
    active = quotes > 0
    step = 1
    while active.any():
        at = quotes[active] - step
        is_bs = buf[at] == ord("\\")
        idx = np.flatnonzero(active)
        run[idx[is_bs]] += 1
        active[idx[~is_bs]] = False
        active[idx[is_bs][at[is_bs] == 0]] = False
        step += 1
    quotes = quotes[run % 2 == 0]
    brackets = np.flatnonzero((buf == ord("[")) | (buf == ord("{")) | (buf == ord("]")) | (buf == ord("}")))
    # Quotes before each bracket: an odd count means the bracket is inside a string.
    outside = np.searchsorted(quotes, brackets) % 2 == 0
    brackets = brackets[outside]
    if not len(brackets):
        return 0
    step_depth = np.where((buf[brackets] == ord("[")) | (buf[brackets] == ord("{")), 1, -1)
    return int(np.cumsum(step_depth).max())


def _short(value: Any) -> str:
    """``repr`` of a value from the file, cut short (a file may put megabytes in one key)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} chars)"


def _list_of_objects(doc: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise SnapshotError(f"'{key}' must be a list of objects")
    return value


def _checked_table(table: str, cols: dict[str, Any], errors: list[RowError]) -> Table:
    """Validate typed columns of an event table; ``id`` aliases its key column."""
    positions = cols.pop("__row__", None)
    keep = validate_columns(table, cols, errors, positions)
    for col in TABLES[table]:
        if col.kind in ("int", "enum"):
            cols[col.name] = cols[col.name].astype(col.dtype)
    cols["id"] = cols[KEY_COLUMNS[table]]
    return Table(table, cols) if keep.all() else Table(table, cols).take(keep)


def _empty_events(table: str) -> Table:
    return _checked_table(table, _typed_columns(table, {}), [])


def columns_from_records(table: str, rows: list[Any], errors: list[RowError]) -> dict[str, Any]:
    """Typed columns from JSON objects; a row with a value of the wrong type is dropped."""
    spec = TABLES[table]
    n = len(rows)
    is_obj = [isinstance(r, dict) for r in rows]
    rows = [r if ok else {} for r, ok in zip(rows, is_obj)]
    bad = ~np.asarray(is_obj, dtype=bool) if n else np.zeros(0, dtype=bool)
    raw_ids = [r.get(KEY_COLUMNS.get(table, "id")) for r in rows]
    for k in np.flatnonzero(bad):
        errors.append(RowError(table, int(k), None, "row", "must be a JSON object"))

    def reject(k: int, fieldname: str, message: str) -> None:
        if not bad[k]:
            errors.append(RowError(table, k, raw_ids[k] if isinstance(raw_ids[k], str) else None, fieldname, message))
            bad[k] = True

    out: dict[str, Any] = {}
    for col in spec:
        raw = [r.get(col.name, _MISSING) for r in rows]
        out[col.name] = _parse_column(col, raw, reject, out)
    keep = ~bad
    # Rows already rejected for their type keep placeholder values; drop them
    # here so the value checks see only well-typed rows.
    result = {}
    for name, values in out.items():
        result[name] = values.take(keep) if isinstance(values, ListColumn) else values[keep]
    # Row positions in later errors must still point into the original file.
    result["__row__"] = np.flatnonzero(keep)
    return result


def _parse_column(col: Column, raw: list[Any], reject: Any, done: dict[str, Any]) -> Any:
    n = len(raw)
    if not col.nullable:
        # null where no null is meant is a cell left unset, as SQL NULL is in the loader: the default,
        # or "is required" (files written from data frames or database rows carry nulls for gaps).
        raw = [_MISSING if v is None else v for v in raw]
    missing = [k for k, v in enumerate(raw) if v is _MISSING]
    if missing:
        if col.default is REQUIRED:
            for k in missing:
                reject(k, col.name, "is required")
        elif isinstance(col.default, str) and col.default.startswith("="):
            source = done[col.default[1:]]
            for k in missing:
                raw[k] = int(source[k])
        else:
            for k in missing:
                raw[k] = col.default
    if col.kind == "str_list":
        lists = []
        for k, v in enumerate(raw):
            if v is _MISSING:
                lists.append([])
            elif isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
                lists.append(v)
            else:
                reject(k, col.name, "must be a list of strings")
                lists.append([])
        return ListColumn.from_lists(lists)
    if col.kind in ("str", "bool", "int", "float", "enum"):
        cells = [None if v is _MISSING else v for v in raw]
        values, _, problems = judge_cells(col.kind, cells, choices=col.choices, nullable=col.nullable)
        for mask, message in problems:
            for k in np.flatnonzero(mask).tolist():
                reject(k, col.name, message)
        return values
    values = np.empty(n, dtype=col.dtype)
    if col.kind == "time":
        values[:] = parse_times(raw)
        for k in np.flatnonzero(np.isnan(values)):
            if raw[k] is not _MISSING:
                reject(int(k), col.name, "must be an ISO 8601 time with a zone")
    else:  # pragma: no cover - the spec only uses the kinds above
        raise AssertionError(col.kind)
    return values


def _typed_columns(table: str, given: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and coerce the columns of one table to their dtypes."""
    spec = TABLES[table]
    row_positions = given.pop("__row__", None)
    n = None
    for col in spec:
        if col.name in given:
            n = len(given[col.name])
            break
    if n is None:
        n = 0
    out: dict[str, Any] = {}
    for col in spec:
        value = given.get(col.name, _MISSING)
        if value is _MISSING:
            if col.default is REQUIRED:
                if n == 0:
                    value = [] if col.kind == "str_list" else np.zeros(0, dtype=col.dtype)
                else:
                    raise SnapshotError(f"{table}: column {col.name!r} is required")
            elif isinstance(col.default, str) and col.default.startswith("="):
                value = out[col.default[1:]].copy()
            elif col.kind == "str_list":
                value = ListColumn(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=object))
            elif col.kind == "enum":
                value = np.full(n, col.choices.index(col.default), dtype=col.dtype)
            elif col.kind == "float" and col.default is None:
                value = np.full(n, np.nan)
            else:
                value = np.full(n, col.default, dtype=col.dtype)
        if col.kind == "str_list":
            if not isinstance(value, ListColumn):
                value = ListColumn.from_lists(value)
            value = ListColumn(np.asarray(value.offsets, dtype=np.int64), _object_array(value.values))
        elif col.kind == "enum":
            value = np.asarray(value)
            if len(value) and not np.issubdtype(value.dtype, np.integer):
                # An unknown name becomes -1, which validation rejects for that row.
                index = {c: i for i, c in enumerate(col.choices)}
                value = np.fromiter((index.get(v, -1) for v in value.tolist()), dtype=np.int64, count=len(value))
            value = value.astype(np.int64)
        elif col.kind in ("str",):
            value = _object_array(value)
        elif col.kind == "int":
            value = np.asarray(value).astype(np.int64)  # narrowed once validated
        else:
            value = np.asarray(value).astype(col.dtype, copy=False)
        if len(value) != n:
            raise SnapshotError(f"{table}: column {col.name!r} has {len(value)} rows, expected {n}")
        out[col.name] = value
    if row_positions is not None:
        out["__row__"] = row_positions
    return out


def _object_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values) if not isinstance(values, np.ndarray) else values.tolist()
    return arr


def _readable(snap: Snapshot, table: str, col: Column, values: Any) -> Any:
    if col.kind == "time":
        return pd.to_datetime(values, unit="s", utc=True)
    if col.kind == "enum":
        return pd.Categorical.from_codes(values.astype(np.int64), categories=list(col.choices))
    if col.kind == "str_list":
        return snap.model_lists(table) if col.name == "models" else values.tolist()
    return values
