"""One table as a handful of aggregated values: the SQL and the parse of the PostgreSQL fast path.

PostgreSQL spends most of a wide ``array_agg`` read on the arrays themselves
(a length word and a function call per element): 0.16 s of server time for
the 34 columns of 50,000 requests. Instead, every fixed-width column of a row
goes into one binary record (``int8send(a) || float8send(b) || ...``, the
booleans as bits of one integer) and the records into one ``bytea`` by
``string_agg``; NumPy reads that as a structured array. Text columns go into
one ``string_agg`` each, joined by :data:`SEP`, which Python splits in C. All
aggregates of one plain Agg node read the rows together, so the pieces line
up row by row (0.05 s of server time for the same table).

The read is first tried as if no cell were NULL and no text held
:data:`SEP`: a NULL makes its row's record NULL (and ``string_agg`` skips
it), so either shows as a count that does not match ``count(*)``. Only then is
the table read again (:func:`aggregates` with ``nullable`` and ``as_arrays``)
with the NULL-holding fixed-width columns coalesced and marked in a bit mask,
and the odd text columns read as arrays, whose NULLs psycopg reports itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

SEP = "\x1f"
"""The separator of a text column's cells (ASCII unit separator); a cell that holds it is read as an array."""

# scalar type oid -> (send function, big-endian dtype, the oid of its array type)
FIXED: dict[int, tuple[str, str, int]] = {
    16: ("boolsend", "?", 1000),  # bool: read as a bit, see _Plan
    21: ("int2send", ">i2", 1005),
    23: ("int4send", ">i4", 1007),
    20: ("int8send", ">i8", 1016),
    700: ("float4send", ">f4", 1021),
    701: ("float8send", ">f8", 1022),
    1114: ("timestamp_send", ">i8", 1115),
    1184: ("timestamptz_send", ">i8", 1185),
}
TIMES = frozenset({1114, 1184})
# The zero a NULL cell is read as, in its column's own type: coalesce(smallint, 0) is an integer,
# which int2send does not take.
_ZEROS = {21: "0::int2", 23: "0::int4", 20: "0::int8", 700: "0::float4", 701: "0::float8",
          1114: "'epoch'::timestamp", 1184: "'epoch'::timestamptz"}
_BOOL = 16
_BITS = 31  # booleans (and NULL marks) per int4 word


@dataclass(frozen=True)
class Part:
    """How one column travels: in the ``record`` (a field or a bit of it), as ``text`` or as an ``array``."""

    how: str  # "field", "bit", "text", "array"
    slot: int  # field index, bit word, text index or array index
    bit: int = 0
    null_bit: tuple[int, int] | None = None  # (word, bit) of its NULL mark, when the column may hold NULL


@dataclass(frozen=True)
class Plan:
    """The aggregates of one read and where each column lands in the result row."""

    parts: tuple[Part, ...]
    sql: tuple[str, ...]  # the outer SELECT list: count(*), the record, texts with their counts, arrays
    record: np.dtype | None
    n_texts: int


def plan(labels: list[str], oids: list[int], text: list[bool], nullable: set[int], as_arrays: set[int]) -> Plan:
    """The aggregates reading columns ``labels`` (of a subquery ``s``) of type ``oids``.

    ``text[k]``: the column is read as text (string and enumeration columns,
    already cast to text by the caller). ``nullable``: the fixed-width columns
    that may hold NULL (coalesced and marked); ``as_arrays``: the columns read
    by ``array_agg`` (text columns whose cells hold NULL or :data:`SEP`, and
    types without a fixed-width binary form).
    """
    fields: list[tuple[str, str]] = []  # (SQL, dtype) of each record field
    bit_terms: list[list[str]] = []
    null_terms: list[list[str]] = []
    texts: list[str] = []
    arrays: list[str] = []
    parts = []

    def new_bit(terms: list[list[str]], expr: str) -> tuple[int, int]:
        if not terms or len(terms[-1]) == _BITS:
            terms.append([])
        terms[-1].append(f"({expr} << {len(terms[-1])})")
        return len(terms) - 1, len(terms[-1]) - 1

    for k, (label, oid) in enumerate(zip(labels, oids)):
        col = f"s.{label}"
        if k in as_arrays or (not text[k] and oid not in FIXED):
            arrays.append(f"array_agg({col})")  # psycopg reports its NULLs
            parts.append(Part("array", len(arrays) - 1))
            continue
        if text[k]:
            texts.append(col)
            parts.append(Part("text", len(texts) - 1))
            continue
        null_bit = new_bit(null_terms, f"({col} IS NULL)::int4") if k in nullable else None
        if oid == _BOOL:
            value = f"coalesce({col}::int4, 0)" if null_bit else f"{col}::int4"
            word, bit = new_bit(bit_terms, value)
            parts.append(Part("bit", word, bit, null_bit))
        else:
            send, dtype, _ = FIXED[oid]
            value = f"{send}(coalesce({col}, {_ZEROS[oid]}))" if null_bit else f"{send}({col})"
            fields.append((value, dtype))
            parts.append(Part("field", len(fields) - 1, null_bit=null_bit))
    words = [" | ".join(terms) for terms in bit_terms + null_terms]
    pieces = [sql for sql, _ in fields] + [f"int4send({w})" for w in words]
    dtype = None
    sql = ["count(*)"]
    if pieces:
        dtype = np.dtype([(f"f{i}", d) for i, (_, d) in enumerate(fields)]
                         + [(f"w{i}", ">i4") for i in range(len(words))])
        sql.append(f"string_agg({' || '.join(pieces)}, ''::bytea)")
    for col in texts:
        sql += [f"string_agg({col}, chr(31))", f"count({col})"]
    sql += arrays
    # Bit words come after the fields; a NULL mark's word follows the value words.
    n_value_words = len(bit_terms)
    parts = [_shift_null_word(p, n_value_words) for p in parts]
    return Plan(tuple(parts), tuple(sql), dtype, len(texts))


def _shift_null_word(part: Part, n_value_words: int) -> Part:
    if part.null_bit is None:
        return part
    word, bit = part.null_bit
    return Part(part.how, part.slot, part.bit, (word + n_value_words, bit))


class Texts(list):  # type: ignore[type-arg]
    """The cells of a text column read whole by ``string_agg``: every one a ``str``, none NULL.

    The count of its cells matched ``count(*)`` and ``count(column)``, so the
    judging may skip the checks for NULLs and other types a list from an array
    needs (:func:`vecsched.service.sql.pg._raw_from_texts`).
    """

    __slots__ = ()


@dataclass
class Read:
    """The parsed result row: per column its values, or why the optimistic read must be redone."""

    columns: list[Any]  # per column: (values ndarray, null ndarray), Texts, or a list of cells (None for NULL)
    short_record: bool  # some fixed-width cell was NULL (the record count fell short)
    odd_texts: list[int]  # text columns (by column index) holding NULL or SEP


def parse(p: Plan, row: tuple[Any, ...], oids: list[int]) -> Read:
    """The columns of result ``row`` of :func:`plan` ``p``."""
    n = int(row[0])
    at = 1
    record = None
    short = False
    if p.record is not None:
        data = row[at] or b""
        at += 1
        if len(data) != n * p.record.itemsize:
            short = True
        else:
            record = np.frombuffer(data, dtype=p.record, count=n)
    texts = []
    for _ in range(p.n_texts):
        joined, count = row[at], int(row[at + 1])
        at += 2
        cells = Texts() if joined is None else Texts(joined.split(SEP))
        texts.append(cells if count == n and len(cells) == n else None)
    arrays = row[at:]
    odd = [k for k, part in enumerate(p.parts) if part.how == "text" and texts[part.slot] is None]
    if short or odd:
        return Read([], short, odd)
    columns: list[Any] = []
    for part, oid in zip(p.parts, oids):
        null = _bit(record, part.null_bit, n) if part.null_bit else np.zeros(n, dtype=bool)
        if part.how == "array":
            columns.append(arrays[part.slot])
        elif part.how == "text":
            columns.append(texts[part.slot])
        elif part.how == "bit":
            columns.append((_bit(record, (part.slot, part.bit), n), null))
        else:
            assert record is not None
            values = record[f"f{part.slot}"]
            columns.append((values.astype(values.dtype.newbyteorder("=")), null))
    return Read(columns, False, [])


def joined(reads: list[Read]) -> Read:
    """One read from reads of parts of a table (block ranges), rows in part order.

    Short or odd when any part is; parts hold no array columns (psycopg's lists
    and NumPy's arrays of those are not joined here).
    """
    if len(reads) == 1:
        return reads[0]
    short = any(r.short_record for r in reads)
    odd = sorted({k for r in reads for k in r.odd_texts})
    if short or odd:
        return Read([], short, odd)
    columns: list[Any] = []
    for parts in zip(*(r.columns for r in reads)):
        if isinstance(parts[0], tuple):  # fixed-width values and their NULL masks
            columns.append((np.concatenate([v for v, _ in parts]), np.concatenate([z for _, z in parts])))
        else:
            cells = type(parts[0])()  # Texts stay Texts
            for part in parts:
                cells += part  # one C-level copy per part, not a Python step per cell
            columns.append(cells)
    return Read(columns, False, [])


def _bit(record: np.ndarray | None, where: tuple[int, int], n: int) -> np.ndarray:
    if record is None:
        return np.zeros(n, dtype=bool)
    word, bit = where
    return (record[f"w{word}"].astype(np.int32) >> bit) & 1 == 1
