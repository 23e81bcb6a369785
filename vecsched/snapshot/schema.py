"""The one place where snapshot columns are named, typed, defaulted and checked.

Every path into a :class:`~vecsched.Snapshot` (JSON files, SQL rows, synthetic
hordes) ends in :func:`validate_columns`, so a rule about what a valid row is
lives here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vecsched.snapshot.cells import MAX_STRING_BYTES, printable_id, string_problems  # noqa: F401 - re-exported
from vecsched.snapshot.times import EARLIEST, END

REQUIRED = object()
"""Marker default: the key must be present."""

GENTYPES = ("text", "image")
TEXT, IMAGE = 0, 1

CHAT_MODES = ("none", "opt_in", "only")
CHAT_NONE, CHAT_OPT_IN, CHAT_ONLY = 0, 1, 2

SOURCE_PROCESSING = ("txt2img", "img2img", "inpainting", "outpainting")
JOB_STATES = ("processing", "finished", "faulted")
JOB_PROCESSING, JOB_FINISHED, JOB_FAULTED = 0, 1, 2

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Column:
    """One snapshot column.

    ``kind`` is one of ``str``, ``bool``, ``int``, ``float``, ``time``,
    ``enum``, ``str_list``. ``minimum`` applies to numbers; ``nullable``
    floats keep ``NaN`` for JSON ``null``. ``default`` may name another
    column (``"=max_length"``) whose value it copies.
    """

    name: str
    kind: str
    default: Any = REQUIRED
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    choices: tuple[str, ...] = ()
    dtype: str = ""


def _c(name: str, kind: str, default: Any = REQUIRED, **kw: Any) -> Column:
    dtype = kw.pop("dtype", "") or {
        "str": "object",
        "bool": "bool",
        "int": "int64",
        "float": "float64",
        "time": "float64",
        "enum": "int8",
        "str_list": "object",
    }[kind]
    return Column(name, kind, default, dtype=dtype, **kw)


WORKER_COLUMNS: tuple[Column, ...] = (
    _c("id", "str"),
    _c("user_id", "str"),
    _c("gentype", "enum", choices=GENTYPES),
    _c("owner_trusted", "bool", False),
    _c("last_check_in", "time"),
    _c("threads", "int", 1, minimum=1, maximum=50, dtype="int32"),
    _c("speed", "float", None, minimum=0.0, nullable=True),
    _c("maintenance", "bool", False),
    _c("paused", "bool", False),
    _c("nsfw", "bool", True),
    _c("models", "str_list"),
    _c("bridge_agent", "str", "unknown:0:unknown"),
    _c("state", "str", ""),
    # text
    _c("max_length", "int", 512, minimum=0, dtype="int32"),
    _c("max_context_length", "int", 2048, minimum=0, dtype="int32"),
    _c("chat_mode", "enum", "none", choices=CHAT_MODES),
    _c("chat_max_length", "int", "=max_length", minimum=0, dtype="int32"),
    _c("chat_max_context_length", "int", "=max_context_length", minimum=0, dtype="int32"),
    # image
    _c("max_pixels", "int", 262144, minimum=0, maximum=INT32_MAX),
    _c("allow_img2img", "bool", True),
    _c("allow_painting", "bool", True),
    _c("allow_post_processing", "bool", True),
    _c("allow_controlnet", "bool", False),
    _c("allow_sdxl_controlnet", "bool", False),
    _c("allow_lora", "bool", False),
    _c("extra_slow_worker", "bool", False),
)

REQUEST_COLUMNS: tuple[Column, ...] = (
    _c("id", "str"),
    _c("user_id", "str"),
    _c("gentype", "enum", choices=GENTYPES),
    _c("created", "time"),
    _c("expiry", "time"),
    # The horde's priority is a 32-bit integer; bounded so that ordering by
    # -priority can never overflow.
    _c("extra_priority", "int", 0, minimum=-INT32_MAX, maximum=INT32_MAX),
    # Bounds keep one request's work (n * width * height * steps) below 2**53.
    _c("n", "int", minimum=0, maximum=1000, dtype="int32"),
    _c("jobs", "int", "=n", minimum=0, maximum=1000, dtype="int32"),
    _c("active", "bool", True),
    _c("faulted", "bool", False),
    _c("models", "str_list", ()),
    _c("slow_workers", "bool", True),
    _c("trusted_workers", "bool", False),
    _c("nsfw", "bool", False),
    _c("worker_blacklist", "bool", False),
    _c("worker_ids", "str_list", (), maximum=5),
    # text
    _c("max_length", "int", 80, minimum=0, maximum=1_000_000, dtype="int32"),
    _c("max_context_length", "int", 2048, minimum=0, dtype="int32"),
    _c("is_chat", "bool", False),
    _c("validated_backends", "bool", False),
    # image
    _c("width", "int", 512, minimum=0, maximum=16384),
    _c("height", "int", 512, minimum=0, maximum=16384),
    _c("steps", "int", 30, minimum=0, maximum=10000),
    _c("extra_slow_workers", "bool", False),
    _c("source_image", "bool", False),
    _c("loras", "bool", False),
    _c("tis", "bool", False),
    _c("control_type", "bool", False),
    _c("hires_fix", "bool", False),
    _c("tiling", "bool", False),
    _c("transparent", "bool", False),
    _c("extra_source_images", "bool", False),
    _c("source_processing", "enum", "txt2img", choices=SOURCE_PROCESSING),
    _c("post_processing", "int", 0, minimum=0, dtype="int32"),
    _c("r2", "bool", True),
    # kudos consumed so far: not an input of the estimate, read by the HTTP status route
    _c("kudos", "float", 0.0, minimum=0.0),
)

JOB_COLUMNS: tuple[Column, ...] = (
    _c("id", "str"),
    _c("request_id", "str"),
    _c("worker_id", "str"),
    _c("started", "time"),
    _c("state", "enum", "processing", choices=JOB_STATES),
)

# Scheduling events (SPEC section 7). Their key is ``dispatch_id``: a dispatch
# happens once and returns its capacity at most once.
DISPATCH_COLUMNS: tuple[Column, ...] = (
    _c("dispatch_id", "str"),
    _c("worker_id", "str"),
    _c("worker_state", "str", ""),
    _c("request_id", "str"),
    _c("request_created", "time"),
    _c("request_extra_priority", "int", 0),
    _c("selected_from_priority_queue", "bool", False),
    _c("priority_user_ids", "str_list", ()),
    _c("dispatched_at", "time"),
    _c("assigned_work", "float", minimum=0.0),
)

CAPACITY_RETURN_COLUMNS: tuple[Column, ...] = (
    _c("dispatch_id", "str"),
    _c("worker_id", "str"),
    _c("returned_at", "time"),
)

TABLES: dict[str, tuple[Column, ...]] = {
    "workers": WORKER_COLUMNS,
    "requests": REQUEST_COLUMNS,
    "jobs": JOB_COLUMNS,
    "dispatches": DISPATCH_COLUMNS,
    "capacity_returns": CAPACITY_RETURN_COLUMNS,
}

# The column that identifies a row (in errors, and for duplicates) where it is not ``id``.
KEY_COLUMNS: dict[str, str] = {"dispatches": "dispatch_id", "capacity_returns": "dispatch_id"}


@dataclass(frozen=True)
class RowError:
    """A rejected row: which table, which row (position and id), which field, why."""

    table: str
    row: int
    id: str | None
    field: str
    message: str

    def __str__(self) -> str:
        who = f"{self.table}[{self.row}]" + (f" (id {self.id!r})" if self.id is not None else "")
        return f"{who}: field {self.field!r}: {self.message}"


def validate_columns(
    table: str,
    columns: dict[str, np.ndarray],
    errors: list[RowError],
    positions: np.ndarray | None = None,
) -> np.ndarray:
    """Check value rules on typed columns; return the mask of rows to keep.

    Appends one :class:`RowError` per (row, field) that breaks a rule. Type
    errors were already caught where the values were parsed; this pass holds
    the value rules (ranges, finiteness, list sizes, duplicate ids) that every
    source of rows shares.
    """
    spec = TABLES[table]
    ids = columns[KEY_COLUMNS.get(table, "id")]
    n = len(ids)
    bad = np.zeros(n, dtype=bool)

    def reject(mask: np.ndarray, field: str, message: str) -> None:
        for row in np.flatnonzero(mask & ~bad):
            where = int(positions[row]) if positions is not None else int(row)
            errors.append(RowError(table, where, _as_id(ids[row]), field, message))
        bad[mask] = True

    for col in spec:
        values = columns[col.name]
        if col.kind == "str":
            for mask, message in string_problems(values):
                reject(mask, col.name, message)
        elif col.kind == "str_list":
            # A list's entries obey the string rules; an entry's fault is its row's.
            for mask, message in string_problems(values.values):
                reject(np.bincount(values.owners()[mask], minlength=n) > 0, col.name, "entry " + message)
        for mask, message in value_problems(col, values):
            reject(mask, col.name, message)
        if col.kind == "str_list" and col.maximum is not None:
            offsets = values.offsets
            reject(np.diff(offsets) > col.maximum, col.name, f"at most {int(col.maximum)} entries")
        elif col.kind == "time":
            # Within what a datetime holds, so every source agrees (SQLite's text refuses year
            # 294000, PostgreSQL's timestamp holds it) and a dump can always write the value back.
            with np.errstate(invalid="ignore"):
                reject(~((values >= EARLIEST) & (values < END)), col.name, "must be a time")

    # A repeated id would make two rows answer for one request (or one
    # dispatch return twice): keep the first.
    first = np.zeros(n, dtype=bool)
    if n:
        import pandas as pd

        first = ~pd.Index(ids).duplicated(keep="first")
    reject(~first, "id", "duplicate id")
    return ~bad


def value_problems(col: Column, values: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """The value rules of an enum or number column on its typed ``values``: ``[(bad mask, message), ...]``.

    Shared by :func:`validate_columns` and by the status route's read of one
    row (:mod:`vecsched.service.progress`), so a cell the cycle rejects is
    rejected there too.

    Examples
    --------
    >>> n = next(c for c in REQUEST_COLUMNS if c.name == "n")
    >>> [(mask.tolist(), message) for mask, message in value_problems(n, np.array([3, -1, 5000]))]
    [([False, True, False], 'must be >= 0'), ([False, False, True], 'must be <= 1000')]
    """
    problems: list[tuple[np.ndarray, str]] = []
    if col.kind == "enum":
        problems.append(((values < 0) | (values >= len(col.choices)), f"must be one of {', '.join(col.choices)}"))
    elif col.kind in ("int", "float"):
        present = np.ones(len(values), dtype=bool)
        if col.kind == "float":
            finite = np.isfinite(values)
            problems.append((~finite if not col.nullable else (~finite & ~np.isnan(values)), "must be a finite number"))
            present = ~np.isnan(values)
        if col.minimum is not None:
            problems.append((present & (values < col.minimum), f"must be >= {_number(col.minimum)}"))
        if col.maximum is not None:
            problems.append((present & (values > col.maximum), f"must be <= {_number(col.maximum)}"))
        if col.kind == "int":
            # Integers arrive 64-bit and are narrowed after this check, so a
            # value the column's dtype cannot hold is an error, never a wrap.
            limits = np.iinfo(np.dtype(col.dtype))
            problems.append(((values < limits.min) | (values > limits.max), f"must fit {col.dtype}"))
    return [(mask, message) for mask, message in problems if mask.any()]


def _as_id(value: Any) -> str | None:
    return printable_id(value)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
