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

from vecsched.snapshot.lists import ListColumn
from vecsched.snapshot.schema import (
    REQUIRED,
    TABLES,
    Column,
    RowError,
    validate_columns,
)
from vecsched.snapshot.times import iso, parse_times, to_epoch

FORMAT = "vecsched.snapshot/1"
_MISSING = object()


class SnapshotError(ValueError):
    """The input is not a snapshot at all (as opposed to one bad row in it)."""


class Table:
    """Named columns of equal length; columns read as attributes (``table.threads``)."""

    __slots__ = ("name", "columns")

    def __init__(self, name: str, columns: dict[str, Any]):
        self.name = name
        self.columns = columns

    def __getattr__(self, key: str) -> Any:
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
    dispatches: tuple[dict[str, Any], ...] = ()
    capacity_returns: tuple[dict[str, Any], ...] = ()
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
        dispatches: Iterable[dict[str, Any]] = (),
        capacity_returns: Iterable[dict[str, Any]] = (),
        rejected: Iterable[RowError] = (),
    ) -> "Snapshot":
        """Build a snapshot from typed columns (arrays, or lists for list columns).

        Columns follow SNAPSHOT_FORMAT.md; times are epoch seconds; a missing
        optional column takes its default. Value rules are checked here, bad
        rows left out and reported in :attr:`rejected`.
        """
        errors: list[RowError] = list(rejected)
        typed = {}
        for table, given in (("workers", workers), ("requests", requests), ("jobs", jobs or {})):
            typed[table] = _typed_columns(table, dict(given))
        # Models of workers and requests share one vocabulary, so a code compares
        # equal across the two tables.
        w_models, r_models = typed["workers"]["models"], typed["requests"]["models"]
        codes, vocabulary = pd.factorize(
            np.concatenate([w_models.values, r_models.values]).astype(object), use_na_sentinel=False
        )
        codes = codes.astype(np.int32)
        split = len(w_models.values)
        typed["workers"]["models"] = ListColumn(w_models.offsets, codes[:split])
        typed["requests"]["models"] = ListColumn(r_models.offsets, codes[split:])

        tables = {}
        for table, cols in typed.items():
            positions = cols.pop("__row__", None)
            keep = validate_columns(table, cols, errors, positions)
            for col in TABLES[table]:
                if col.kind in ("int", "enum"):
                    cols[col.name] = cols[col.name].astype(col.dtype)
            tables[table] = Table(table, cols) if keep.all() else Table(table, cols).take(keep)

        pairs = dict(excluded_pairs or {})
        pair_table = Table(
            "excluded_pairs",
            {
                "worker_id": _object_array(pairs.get("worker_id", [])),
                "request_id": _object_array(pairs.get("request_id", [])),
            },
        )
        pair_table.columns["id"] = pair_table.columns["worker_id"]
        return cls(
            now=to_epoch(now),
            workers=tables["workers"],
            requests=tables["requests"],
            jobs=tables["jobs"],
            excluded_pairs=pair_table,
            model_names=np.asarray(vocabulary, dtype=object),
            dispatches=tuple(dispatches),
            capacity_returns=tuple(capacity_returns),
            rejected=tuple(errors),
        )

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
        for table in ("workers", "requests", "jobs"):
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
        out["dispatches"] = list(self.dispatches)
        out["capacity_returns"] = list(self.capacity_returns)
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
    if isinstance(source, Mapping):
        doc = source
    else:
        try:
            with open(source, encoding="utf-8") as fh:
                doc = json.load(fh)
        except OSError as exc:
            raise SnapshotError(f"cannot read snapshot {os.fspath(source)!r}: {exc.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"{os.fspath(source)!r} is not JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise SnapshotError("a snapshot is a JSON object with a 'format' key")
    if doc.get("format") != FORMAT:
        raise SnapshotError(f"not a snapshot: 'format' is {doc.get('format')!r}, expected {FORMAT!r}")
    try:
        now = to_epoch(doc.get("now"))
    except (TypeError, ValueError):
        raise SnapshotError(f"'now' must be an ISO 8601 time with a zone, got {doc.get('now')!r}") from None
    errors: list[RowError] = []
    columns = {}
    for table in ("workers", "requests", "jobs"):
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
        dispatches=_list_of_objects(doc, "dispatches"),
        capacity_returns=_list_of_objects(doc, "capacity_returns"),
        rejected=errors,
    )


def _list_of_objects(doc: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise SnapshotError(f"'{key}' must be a list of objects")
    return value


def columns_from_records(table: str, rows: list[Any], errors: list[RowError]) -> dict[str, Any]:
    """Typed columns from JSON objects; a row with a value of the wrong type is dropped."""
    spec = TABLES[table]
    n = len(rows)
    is_obj = [isinstance(r, dict) for r in rows]
    rows = [r if ok else {} for r, ok in zip(rows, is_obj)]
    bad = ~np.asarray(is_obj, dtype=bool) if n else np.zeros(0, dtype=bool)
    raw_ids = [r.get("id") for r in rows]
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
    values = np.empty(n, dtype=np.int64 if col.kind == "int" else col.dtype)
    if col.kind == "str":
        for k, v in enumerate(raw):
            if isinstance(v, str):
                values[k] = v
            else:
                values[k] = ""
                if v is not _MISSING:
                    reject(k, col.name, "must be a string")
    elif col.kind == "bool":
        for k, v in enumerate(raw):
            if isinstance(v, bool):
                values[k] = v
            else:
                values[k] = False
                if v is not _MISSING:
                    reject(k, col.name, "must be true or false")
    elif col.kind == "int":
        for k, v in enumerate(raw):
            if isinstance(v, int) and not isinstance(v, bool) and -(2**62) < v < 2**62:
                values[k] = v
            else:
                values[k] = 0
                if v is not _MISSING:
                    reject(k, col.name, "must be an integer")
    elif col.kind == "float":
        for k, v in enumerate(raw):
            if v is None and col.nullable:
                values[k] = np.nan
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                values[k] = v
                if not math.isfinite(v):
                    reject(k, col.name, "must be a finite number")
            else:
                values[k] = 0.0
                if v is not _MISSING:
                    reject(k, col.name, "must be a number" + (" or null" if col.nullable else ""))
    elif col.kind == "enum":
        index = {c: i for i, c in enumerate(col.choices)}
        for k, v in enumerate(raw):
            code = index.get(v) if isinstance(v, str) else None
            if code is None:
                values[k] = 0
                if v is not _MISSING:
                    reject(k, col.name, f"must be one of {', '.join(col.choices)}")
            else:
                values[k] = code
    elif col.kind == "time":
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
