"""A cycle's per-request payloads: one short JSON array per request, encoded in bulk.

A payload is a short JSON array (:data:`PAYLOAD_FIELDS`), about 100 bytes, that
carries its cycle time. Encoding works on whole columns at once (a few digits
per table lookup), never request by request in Python.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from vecsched.core.result import BOOL_FIELDS, EVIDENCE_FIELDS, FIELDS, FLOAT_FIELDS, INT_FIELDS
from vecsched.core.stall import EVIDENCE
from vecsched.snapshot.schema import GENTYPES

# 2: section 7 (might_stall, stall_evidence as its code, -1 for null, and the
# pressure figures) appended; 3: the request's kudos appended, so the status
# route answers a request the cycle holds without a database query. An older
# payload decodes to the fields it has.
PAYLOAD_VERSION = 3

REQUEST_FIELDS = ("kudos",)
"""Columns of the snapshot's request table carried as they were loaded (not estimates)."""

# A payload is the estimate's fields (vecsched.core.result.FIELDS) and the
# request columns behind a version and the cycle time; bump PAYLOAD_VERSION
# when either changes.
PAYLOAD_FIELDS = ("version", "cycle_time") + FIELDS + REQUEST_FIELDS

_INT = INT_FIELDS

_BOOL = BOOL_FIELDS

_FLOAT = FLOAT_FIELDS + REQUEST_FIELDS


def encode_payloads(
    estimates: Any, cycle_time: float, requests: Any = None
) -> tuple[list[str], "PayloadRows"]:
    """Request ids and compact JSON payloads for every request of ``estimates``.

    Floats are kept to the millisecond; unknown (NaN, and the infinities JSON
    cannot carry) is ``null``. The payloads come back as :class:`PayloadRows`,
    a sequence of str formatted column-wise on demand, chunk by chunk of rows
    and in whatever row order a store asks for (the bucketed Redis layout asks
    for its own), so the cost per request is NumPy's, not the interpreter's.

    Parameters
    ----------
    estimates : Estimates
        Anything with ``request_id`` (array of str) and ``columns`` (name ->
        array, every :data:`PAYLOAD_FIELDS` entry after the first two).
    cycle_time : float
        Epoch seconds of the cycle, carried by every payload.
    requests : RequestTable, optional
        The snapshot's requests, for :data:`REQUEST_FIELDS` (rows picked by
        ``estimates.request_index``); without it they are 0.

    Returns
    -------
    ids : list of str
    payloads : PayloadRows
        Aligned: ``payloads[k]`` is the JSON array of ``ids[k]``.

    Raises
    ------
    ValueError
        When a column's length differs from the number of requests.

    Examples
    --------
    >>> import numpy as np
    >>> from types import SimpleNamespace
    >>> cols = {f: np.zeros(1, dtype=np.int64) for f in _INT}
    >>> cols.update({f: np.zeros(1, dtype=bool) for f in _BOOL})
    >>> cols.update({f: np.array([np.nan]) for f in _FLOAT})
    >>> cols["gentype"] = np.zeros(1, dtype=np.int8)
    >>> cols["stall_evidence"] = np.full(1, -1, dtype=np.int8)
    >>> est = SimpleNamespace(request_id=np.array(["r1"], dtype=object), columns=cols)
    >>> ids, payloads = encode_payloads(est, 1700000000.0)
    >>> payloads[0]
    '[3,1700000000.0,0,0,0,0,0,null,null,0,null,0,0,0,0,0,0,-1,0,0,0,0,null,null,0.0]'
    >>> got = decode_payload(payloads[0])
    >>> got["wait_time"] is None, got["stall_evidence"] is None, got["might_stall"]
    (True, True, False)
    """
    ids = np.asarray(estimates.request_id, dtype=object).tolist()
    if set(map(type, ids)) != {str}:  # a quarter of the cost of str() on each (300,000 ids: 5 ms against 18 ms)
        ids = list(map(str, ids))  # map() calls str from C: no interpreter step per request
    n = len(ids)
    cols = {**estimates.columns, **_request_columns(estimates, requests, n)}
    names = PAYLOAD_FIELDS[2:]
    slots = []
    for k, name in enumerate(names):
        values = np.asarray(cols[name])
        if len(values) != n:
            raise ValueError(f"column {name!r} has {len(values)} values for {n} requests")
        sep = b"]" if k == len(names) - 1 else b","
        slots.append(_FloatSlot(values, sep) if name in _FLOAT else _IntSlot(values, sep))
    return ids, PayloadRows(f"[{PAYLOAD_VERSION},{float(cycle_time)!r},".encode("ascii"), slots, n)


def _request_columns(estimates: Any, requests: Any, n: int) -> dict[str, np.ndarray]:
    if requests is None:
        return {name: np.zeros(n) for name in REQUEST_FIELDS}
    rows = np.asarray(estimates.request_index)
    return {name: np.asarray(getattr(requests, name))[rows] for name in REQUEST_FIELDS}


# -- digit tables ------------------------------------------------------------------
#
# A chunk of payload rows is built in a NUL-padded byte matrix; each column of
# the payload has a slot of its own, as wide as its longest text, made of
# pieces (a sign, groups of four digits, the lowest digits with the separator)
# whose text comes from one table lookup each. A text is right-aligned in its
# piece and the NULs are dropped at the end in one pass.

_GROUP = 10_000  # four digits per group
_UNITS = 10_000  # milliseconds of a float's units digit and fraction: one entry of the units table
_NULL = _UNITS  # the units table's entry for an unknown value: the text null


def _table(texts: list[bytes]) -> np.ndarray:
    """The texts right-aligned in 8 NUL-padded bytes each, one row per text."""
    return np.frombuffer(b"".join(t.rjust(8, b"\0") for t in texts), dtype=np.uint8).reshape(-1, 8)


@functools.cache
def _tables() -> dict[str, np.ndarray]:
    """The digit tables, made on first use (importing this module for decode_payload stays cheap)."""
    return {
        # a group of four digits by kind: blank when 0 (a leading group), always shown
        # (a float's units), zero-filled (below a shown group): entry g + kind * _GROUP
        "group": _table([b"%d" % g if g else b"" for g in range(_GROUP)] + [b"%d" % g for g in range(_GROUP)]
                        + [b"%04d" % g for g in range(_GROUP)]),
        # an integer's lowest four digits and separator: plain, with a minus sign
        # (+ _GROUP), or zero-filled below a higher group (+ 2 * _GROUP)
        **{"low" + sep.decode(): _table([b"%d" % g + sep for g in range(_GROUP)]
                                        + [b"-%d" % g + sep for g in range(_GROUP)]
                                        + [b"%04d" % g + sep for g in range(_GROUP)]) for sep in (b",", b"]")},
        # a float's units digit, milliseconds (trailing zeros trimmed, one digit kept) and
        # separator, by milliseconds modulo 10 s; _NULL: null
        **{"units" + sep.decode(): _table([b"%d." % (m // 1000) + (b"%03d" % (m % 1000)).rstrip(b"0").ljust(1, b"0")
                                           + sep for m in range(_UNITS)] + [b"null" + sep]) for sep in (b",", b"]")},
    }


_NARROW: dict[tuple[str, int], np.ndarray] = {}


def _lookup(name: str, width: int) -> np.ndarray:
    """Table ``name`` cut to its last ``width`` bytes per entry, as one ``V{width}`` item per entry."""
    key = (name, width)
    if key not in _NARROW:
        _NARROW[key] = np.ascontiguousarray(_tables()[name][:, 8 - width :]).view(f"V{width}").ravel()
    return _NARROW[key]


def split(values: np.ndarray, divisor: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.divmod(values, divisor)`` for integers, as a floor division and a product: twice as fast.

    (NumPy divides by a scalar with a precomputed multiplier in ``//``, not in ``divmod``.)

    Parameters
    ----------
    values : ndarray of int
    divisor : int

    Returns
    -------
    quotient, remainder : ndarray

    Examples
    --------
    >>> [a.tolist() for a in split(np.array([12345, -7]), 100)]
    [[123, -1], [45, 93]]
    """
    quotient = values // divisor
    return quotient, values - quotient * divisor


def _group_widths(digits: int, below: int) -> list[int]:
    """Widths of the four-digit groups above the lowest ``below`` digits of a ``digits``-digit number, highest first."""
    count = max(0, -(-(digits - below) // 4))
    return [digits - below - 4 * (count - 1)] + [4] * (count - 1) if count else []


def _group_pieces(rest: np.ndarray, widths: list[int], units_kind: Any = 0) -> list[tuple[str, int, np.ndarray]]:
    """The pieces of the four-digit groups of ``rest``, highest first.

    ``units_kind`` is the lowest group's kind when nothing shows above it
    (0: blank when 0; 1, or an array of 0/1 per row: "0" shows).
    """
    if not widths:
        return []
    if len(widths) == 1:  # nothing above the one group
        return [("group", widths[0], rest + units_kind * _GROUP if np.ndim(units_kind) or units_kind else rest)]
    pieces = []
    for k, width in enumerate(reversed(widths[1:])):
        rest, group = split(rest, _GROUP)
        group += np.where(rest > 0, 2 * _GROUP, units_kind * _GROUP if k == 0 else 0)
        pieces.append(("group", width, group))
    # the highest group: the widths follow the column's largest value, so nothing is left above it
    pieces.append(("group", widths[0], rest))
    return pieces[::-1]


def write_decimal(values: np.ndarray, out: np.ndarray) -> None:
    """Non-negative integers as zero-padded decimal text in the rows of ``out``, four digits per table lookup.

    Parameters
    ----------
    values : ndarray of int
        Each below ``10 ** out.shape[1]``.
    out : ndarray of uint8
        ``(len(values), width)``, its rows contiguous (a run of columns of a larger matrix will do).

    Examples
    --------
    >>> out = np.zeros((2, 6), dtype=np.uint8)
    >>> write_decimal(np.array([7, 123456]), out)
    >>> out.tobytes()
    b'000007123456'
    """
    rest = values.astype(np.int64)
    for end in range(out.shape[1], 0, -4):
        size = min(4, end)
        rest, group = split(rest, _GROUP)
        out[:, end - size : end].view(f"V{size}")[:, 0] = np.take(_lookup("group", size), group + 2 * _GROUP)


def _sign_piece(minus: np.ndarray) -> tuple[str, int, np.ndarray]:
    return "sign", 1, np.where(minus, ord("-"), 0).astype(np.uint8)


class _Slot:
    """One column's bytes in the row: pieces left to right, each a table lookup per row.

    A piece is ``(table, width, index)``: the entries ``index`` of table
    ``table`` cut to ``width`` bytes, or with table ``"sign"`` the row's byte
    itself. The slot's layout (its pieces' widths) is fixed from the whole
    column when the slot is made; the pieces are worked out per chunk of rows.
    """

    width: int

    def __init__(self, values: np.ndarray):
        self.values = values

    def pieces(self, values: np.ndarray) -> list[tuple[str, int, np.ndarray]]:
        """The pieces of ``values`` (rows of the column), left to right.

        Parameters
        ----------
        values : ndarray

        Returns
        -------
        list of (str, int, ndarray)
        """
        raise NotImplementedError

    def write(self, rows: slice | np.ndarray, out: np.ndarray) -> None:
        """Write rows ``rows`` of the column into ``out``, a (rows, width) byte view.

        Parameters
        ----------
        rows : slice or array of int
            A run of rows, or any rows in any order (the bucketed layout's).
        out : ndarray of uint8
        """
        pieces = self.pieces(self.values[rows])
        at = self.width - sum(width for _, width, _ in pieces)
        out[:, :at] = 0  # spare bytes (room for an odd float)
        for name, width, index in pieces:
            if name == "sign":
                out[:, at] = index
            else:
                out[:, at : at + width].view(f"V{width}")[:, 0] = np.take(_lookup(name, width), index)
            at += width


class _IntSlot(_Slot):
    """An integer column: [sign] [groups of four digits] [lowest four digits + separator].

    The lowest piece carries the sign itself when no higher group shows, so a
    column below 10,000 (counts, codes, flags) is one piece.
    """

    def __init__(self, values: np.ndarray, sep: bytes):
        if values.dtype == bool:
            values = values.view(np.uint8)  # an index, not a mask
        super().__init__(values)
        top, bottom = (int(values.max()), int(values.min())) if len(values) else (0, 0)
        self.groups = _group_widths(len(str(max(top, -bottom))), 4)
        self.low_table = "low" + sep.decode()
        self.low = 5 + (bottom < 0) if self.groups else max(len(str(top)), len(str(bottom))) + 1
        self.negative = bottom < 0
        self.signed = bool(self.groups) and bottom <= -_GROUP
        self.width = self.signed + sum(self.groups) + self.low

    def pieces(self, values: np.ndarray) -> list[tuple[str, int, np.ndarray]]:  # noqa: D102 - as _Slot's
        if not (self.groups or self.negative):
            return [(self.low_table, self.low, values)]  # the common case: the value is the index
        values = values.astype(np.int64, copy=False)
        magnitude, minus = np.abs(values), values < 0
        if not self.groups:
            return [(self.low_table, self.low, magnitude + minus * _GROUP)]
        rest, low = split(magnitude, _GROUP)
        # the sign is the lowest piece's unless a higher group shows (then it has its own byte)
        pieces = _group_pieces(rest, self.groups)
        pieces.append((self.low_table, self.low, low + np.where(rest > 0, 2 * _GROUP, minus * _GROUP)))
        return [_sign_piece(minus & (rest > 0)), *pieces] if self.signed else pieces


class _FloatSlot(_Slot):
    """A float column: [spare] [sign] [groups of four digits] [units digit, fraction, separator].

    Floats are kept to the millisecond (``np.round(x, 3)``); unknown (NaN, and
    the infinities JSON cannot carry) is null. Rows beyond exact milliseconds
    (|x| >= 1e15, far above any wait) are formatted one by one with
    ``repr(round(x, 3))`` when the slot is made: rare.
    """

    def __init__(self, values: np.ndarray, sep: bytes):
        values = values.astype(np.float64, copy=False)
        super().__init__(values)
        magnitude = np.abs(values)
        # fmax and fmin pass over NaN: when the largest magnitude is exact, so is every value but NaN
        largest = np.fmax.reduce(magnitude, initial=0.0)
        if largest < _FLOAT_EXACT_LIMIT:
            extremes = [largest, np.fmin.reduce(values, initial=0.0)]
            self.odd_rows = np.zeros(0, dtype=np.int64)
        else:
            exact = magnitude < _FLOAT_EXACT_LIMIT  # NaN and the infinities are not
            extremes = [magnitude.max(where=exact, initial=0.0), values.min(where=exact, initial=0.0)]
            self.odd_rows = np.flatnonzero(~exact & (magnitude != np.inf) & ~np.isnan(values))
        # rint is monotonic: the extremes of the milliseconds are those of the values
        top, bottom = (np.rint(np.array(extremes) * 1000.0)).tolist()
        tens = int(top) // _UNITS  # what shows left of the units digit
        self.groups = _group_widths(len(str(tens)) if tens else 0, 0)
        self.signed = bottom < 0
        self.units_table = "units" + sep.decode()
        # round(), not np.round(): x * 1000 would overflow near the top of the range
        self.odd_texts = [repr(round(v, 3)).encode("ascii") + sep for v in values[self.odd_rows].tolist()]
        used = self.signed + sum(self.groups) + 6
        self.width = max(used, max(map(len, self.odd_texts), default=0))

    def pieces(self, values: np.ndarray) -> list[tuple[str, int, np.ndarray]]:  # noqa: D102 - as _Slot's
        finite = np.isfinite(values)
        # rint(x * 1000) is what np.round(x, 3) rounds; m / 1000 parses back to the same double.
        scaled = np.where(np.abs(values) < _FLOAT_EXACT_LIMIT if len(self.odd_rows) else finite, values, 0.0)
        scaled *= 1000.0
        milli = np.rint(scaled, out=scaled).astype(np.int64)
        tens, units = split(np.abs(milli) if self.signed else milli, _UNITS)
        # unknown: nothing shows left of the units piece, which is "null"
        pieces = _group_pieces(tens, self.groups)
        pieces.append((self.units_table, 6, np.where(finite, units, _NULL)))
        return [_sign_piece(milli < 0), *pieces] if self.signed else pieces

    def write(self, rows: slice | np.ndarray, out: np.ndarray) -> None:  # noqa: D102 - as _Slot's
        super().write(rows, out)
        if not len(self.odd_rows):
            return
        wanted = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
        at = np.minimum(np.searchsorted(self.odd_rows, wanted), len(self.odd_rows) - 1)
        hits = np.flatnonzero(self.odd_rows[at] == wanted)
        for k, odd in zip(hits.tolist(), at[hits].tolist()):
            text = self.odd_texts[odd]
            out[k] = 0
            out[k, self.width - len(text) :] = np.frombuffer(text, dtype=np.uint8)


_FLOAT_EXACT_LIMIT = 1e15  # |x| * 1000 stays an exact int64 below this
_CHUNK_ROWS = 8_192  # rows formatted at a time: the byte matrix stays in cache


def encode_texts(texts: Sequence[str]) -> tuple[bytes, np.ndarray]:
    """All of ``texts`` as one UTF-8 buffer, and each one's length in bytes (one join, one encode).

    Parameters
    ----------
    texts : sequence of str

    Returns
    -------
    data : bytes
    lengths : ndarray of int64

    Examples
    --------
    >>> encode_texts(["ab", "é"])
    (b'ab\\xc3\\xa9', array([2, 2]))
    """
    joined = "".join(texts)
    if joined.isascii():
        return joined.encode("ascii"), np.fromiter(map(len, texts), np.int64, len(texts))
    encoded = list(map(str.encode, texts))
    return b"".join(encoded), np.fromiter(map(len, encoded), np.int64, len(texts))


def copy_rows(matrix: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = matrix[rows]`` for byte matrices, each row moved as one item (twice as fast as byte columns).

    Parameters
    ----------
    matrix : ndarray of uint8
        C-contiguous, ``(n, w)``.
    rows : array of int
    out : ndarray of uint8
        ``(len(rows), w)``, its rows contiguous (a run of columns of a larger matrix will do).

    Examples
    --------
    >>> out = np.zeros((2, 3), dtype=np.uint8)
    >>> copy_rows(np.arange(6, dtype=np.uint8).reshape(2, 3), np.array([1, 1]), out)
    >>> out.tolist()
    [[3, 4, 5], [3, 4, 5]]
    """
    width = matrix.shape[1]
    if width:
        out.view(f"V{width}")[:, 0] = matrix.view(f"V{width}")[:, 0][rows]


def _fill_left(region: np.ndarray, data: bytes, lengths: np.ndarray) -> None:
    """Texts ``data`` (back to back, ``lengths`` bytes each) left-aligned in the rows of ``region``, NUL-padded."""
    width = region.shape[1]
    flat = np.frombuffer(data, dtype=np.uint8)
    if len(lengths) and int(lengths.min()) == width:
        region[...] = flat.reshape(-1, width)
        return
    region[...] = 0
    # a boolean mask fills in row-major order: the buffer's order
    region[np.arange(width) < lengths[:, None]] = flat


class PayloadRows(Sequence[str]):
    """A cycle's payloads as a sequence of str, formatted from the columns in bulk when read.

    ``payloads + more`` appends plain payload strings (the job's ended
    requests). :meth:`write_run` is the bulk path: a run of rows, in row
    order, written into a NUL-padded byte matrix the caller owns (the packed
    Redis layout stores the rows so, NULs and all, and its reader drops them
    from the one row it returns), without a Python object per request.

    Parameters
    ----------
    head : bytes
        What every formatted row starts with (``[version,cycle_time,``).
    slots : list
        One column formatter per field after the head, in payload order.
    n : int
        Rows of the columns.
    extra : sequence of str, default ()
        Plain payloads after the formatted rows.

    Examples
    --------
    >>> rows = PayloadRows(b"[", [_IntSlot(np.array([7, -12]), b"]")], 2, ["{}"])
    >>> list(rows), len(rows), rows[1], ["x"] + rows
    (['[7]', '[-12]', '{}'], 3, '[-12]', ['x', '[7]', '[-12]', '{}'])
    >>> out = np.zeros((2, rows.row_width()), dtype=np.uint8)
    >>> rows.write_run(1, 3, out)
    >>> out.tobytes().translate(None, b"\\0")
    b'\\t[-12]\\t{}'
    """

    def __init__(self, head: bytes, slots: list[Any], n: int, extra: Sequence[str] = ()):
        self.head, self.slots, self.n, self.extra = head, slots, n, list(extra)
        self._extra_bytes = encode_texts(self.extra)[1]
        # a tab before every payload: one to split on (tolist), and the first byte of a packed row
        self._head = np.frombuffer(b"\t" + head, dtype=np.uint8)
        self._starts = np.cumsum([len(self._head)] + [slot.width for slot in slots]).tolist()
        self._width = self._starts[-1]

    def __len__(self) -> int:
        return self.n + len(self.extra)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.tolist()[index]
        index = range(len(self))[index]  # negative indexes, and IndexError
        if index >= self.n:
            return self.extra[index - self.n]
        one = np.empty((1, self._starts[-1]), dtype=np.uint8)
        self._format(np.array([index]), one)  # one row: not the whole matrix
        return one.tobytes().translate(None, b"\0")[1:].decode("ascii")

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def __add__(self, other: Sequence[str]) -> "PayloadRows":
        return PayloadRows(self.head, self.slots, self.n, self.extra + list(other))

    def __radd__(self, other: Sequence[str]) -> list[str]:
        return list(other) + self.tolist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PayloadRows, list, tuple)):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PayloadRows({len(self)} payloads)"

    def tolist(self) -> list[str]:
        """Every payload as str, in order (one decode and one split for the formatted rows).

        Returns
        -------
        list of str
        """
        formatted = self._formatted
        data = b"".join(formatted[start : start + _CHUNK_ROWS].tobytes().translate(None, b"\0")
                        for start in range(0, self.n, _CHUNK_ROWS))
        return data.decode("ascii").split("\t")[1:] + self.extra

    def row_width(self) -> int:
        """Bytes per row that :meth:`write_run` writes: ``"\\tPAYLOAD"`` of the widest row, NULs included.

        Returns
        -------
        int
        """
        return max(self._width if self.n else 0, 1 + int(self._extra_bytes.max(initial=-1)))

    def write_run(self, start: int, stop: int, out: np.ndarray) -> None:
        """Write ``"\\tPAYLOAD"`` of rows ``start:stop`` into the rows of ``out``, NUL-padded.

        The NULs are anywhere in the row (each column is right-aligned in its
        slot); a payload is its row without them and without the tab.

        Parameters
        ----------
        start, stop : int
            The run of rows (those past ``n`` are :attr:`extra`'s).
        out : ndarray of uint8
            ``(stop - start, w)``, C-contiguous, ``w >= row_width()``; every byte is written.
        """
        own = max(0, min(stop, self.n) - start)
        if own:
            self._format(slice(start, start + own), out[:own, : self._width])
            out[:own, self._width :] = 0
        if own < stop - start:
            data, lengths = encode_texts(self.extra[max(start, self.n) - self.n : stop - self.n])
            out[own:, 0] = ord("\t")
            _fill_left(out[own:, 1:], data, lengths)

    def _format(self, rows: slice | np.ndarray, out: np.ndarray) -> None:
        """Rows ``rows`` (formatted ones) into ``out`` straight from the columns."""
        out[:, : len(self._head)] = self._head
        for slot, begin, stop in zip(self.slots, self._starts[:-1], self._starts[1:]):
            slot.write(rows, out[:, begin:stop])

    @functools.cached_property
    def _formatted(self) -> np.ndarray:
        """Every formatted row in its own order, a few thousand at a time: a NUL-padded byte matrix.

        For :meth:`tolist`; the packed layout formats a run at a time instead (:meth:`write_run`).
        """
        matrix = np.empty((self.n, self._width), dtype=np.uint8)
        for start in range(0, self.n, _CHUNK_ROWS):
            rows = slice(start, min(start + _CHUNK_ROWS, self.n))
            self._format(rows, matrix[rows])
        return matrix


def decode_payload(payload: str | bytes) -> dict[str, Any]:
    """The published figures of one request, by name (``None``: unknown).

    Parameters
    ----------
    payload : str or bytes
        One payload as :func:`encode_payloads` made it.

    Returns
    -------
    dict
        :data:`PAYLOAD_FIELDS` to values; ``gentype`` as its name, flags as bool.

    Examples
    --------
    >>> got = decode_payload("[1,100.0,1,3,6,1,2,41.6,null,4,50.0,0,1,0,0,0]")
    >>> got["gentype"], got["queue_position"], got["ahead_wait"], got["is_possible"]
    ('image', 2, None, True)
    """
    values = json.loads(payload)
    out = dict(zip(PAYLOAD_FIELDS, values))
    out["gentype"] = GENTYPES[out["gentype"]]
    # An older payload holds a prefix of the fields: what it lacks stays absent.
    for name in _BOOL:
        if name in out:
            out[name] = bool(out[name])
    for name in EVIDENCE_FIELDS:
        if name in out:
            out[name] = None if out[name] < 0 else EVIDENCE[out[name]]
    return out
