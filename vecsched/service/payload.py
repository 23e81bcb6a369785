"""A cycle's per-request payloads: one short JSON array per request, encoded in bulk.

A payload is a short JSON array (:data:`PAYLOAD_FIELDS`), about 60 bytes, that
carries its cycle time. Encoding works on whole columns at once (digits from
byte tables), never field by field in Python.
"""

from __future__ import annotations

import json
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
) -> tuple[list[str], list[str]]:
    """Request ids and compact JSON payloads for every request of ``estimates``.

    Floats are kept to the millisecond; unknown (NaN, and the infinities JSON
    cannot carry) is ``null``. The payloads are built column-wise as one ASCII
    byte matrix (see :func:`_ascii_rows`), so the cost per request is NumPy's,
    not the interpreter's: 300,000 requests encode in a fraction of a second.

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
    ids, payloads : list of str
        Aligned: ``payloads[k]`` is the JSON array of ``ids[k]``.

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
    cols = estimates.columns
    # map() calls str from C: no interpreter step per request.
    ids = list(map(str, np.asarray(estimates.request_id, dtype=object).tolist()))
    n = len(ids)
    if n == 0:
        return ids, []
    blocks: list[np.ndarray] = []
    cols = {**cols, **_request_columns(estimates, requests, n)}
    for name in PAYLOAD_FIELDS[2:]:
        values = np.asarray(cols[name])
        if len(values) != n:
            raise ValueError(f"column {name!r} has {len(values)} values for {n} requests")
        if name in _FLOAT:
            blocks.append(_float_block(values.astype(np.float64)))
        else:
            blocks.append(_int_block(values.astype(np.int64)))
    head = f"[{PAYLOAD_VERSION},{float(cycle_time)!r},"
    return ids, _ascii_rows(blocks, head, "]")


def _request_columns(estimates: Any, requests: Any, n: int) -> dict[str, np.ndarray]:
    if requests is None:
        return {name: np.zeros(n) for name in REQUEST_FIELDS}
    rows = np.asarray(estimates.request_index)
    return {name: np.asarray(getattr(requests, name))[rows] for name in REQUEST_FIELDS}


_TRIPLES = np.array([list(f"{k:03d}".encode()) for k in range(1000)], dtype=np.uint8)

_FLOAT_EXACT_LIMIT = 1e15  # |x| * 1000 stays an exact int64 below this


def _digits(magnitude: np.ndarray, negative: np.ndarray | None = None) -> np.ndarray:
    """Decimal ASCII of non-negative int64 ``magnitude``, with '-' where ``negative``."""
    n = len(magnitude)
    top = int(magnitude.max())
    chunks = max(1, -(-len(str(top)) // 3))
    width = 3 * chunks
    out = np.empty((n, width), dtype=np.uint8)
    rest = magnitude
    # Three digits per table lookup: integer division is the slow step, so do few.
    for k in range(chunks):
        if k < chunks - 1:
            rest, low = np.divmod(rest, 1000)
        else:
            low = rest
        np.take(_TRIPLES, low, axis=0, out=out[:, width - 3 * (k + 1) : width - 3 * k])
    # Leading zeros become padding; the units digit always shows, so 0 prints "0".
    threshold = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    threshold[-1] = 0
    shown = magnitude[:, None] >= threshold
    out *= shown
    if negative is not None and negative.any():
        out = np.hstack([np.zeros((n, 1), dtype=np.uint8), out])
        rows = np.flatnonzero(negative)
        # the sign goes just left of the first shown digit
        out[rows, width - shown[rows].sum(axis=1)] = ord("-")
    return out


def _int_block(values: np.ndarray) -> np.ndarray:
    negative = values < 0
    return _digits(np.abs(values), negative)


def _float_block(values: np.ndarray) -> np.ndarray:
    """Floats rounded to 3 decimals, as ``int.frac`` with trailing zeros trimmed (``12.4``, ``0.0``)."""
    n = len(values)
    finite = np.isfinite(values)
    exact = finite & (np.abs(np.where(finite, values, 0.0)) < _FLOAT_EXACT_LIMIT)
    # rint(x * 1000) is what np.round(x, 3) rounds; m / 1000 parses back to the same double.
    milli = np.rint(np.where(exact, values, 0.0) * 1000.0).astype(np.int64)
    magnitude = np.abs(milli)
    whole, frac = np.divmod(magnitude, 1000)
    whole_ascii = _digits(whole, milli < 0)
    body = np.empty((n, whole_ascii.shape[1] + 4), dtype=np.uint8)
    body[:, :-4] = whole_ascii
    body[:, -4] = ord(".")
    np.take(_TRIPLES, frac, axis=0, out=body[:, -3:])
    # trailing zeros of the fraction go, one digit always stays: 12.4, 0.0, 0.125
    body[:, -1] *= body[:, -1] != ord("0")
    body[:, -2] *= (body[:, -2] != ord("0")) | (body[:, -1] != 0)
    if not exact.all():
        width = max(body.shape[1], 4)
        if width > body.shape[1]:
            body = np.hstack([np.zeros((n, width - body.shape[1]), dtype=np.uint8), body])
        # Unknown, or infinite (no JSON form): null, right-aligned like the numbers.
        body[~finite] = 0
        body[~finite, width - 4 :] = np.frombuffer(b"null", dtype=np.uint8)
        odd = np.flatnonzero(finite & ~exact)
        if len(odd):
            # Beyond exact milliseconds (weeks of wait are far below): rare, done one by one.
            # round(), not np.round(): x * 1000 would overflow near the top of the range
            texts = [repr(round(v, 3)).encode("ascii") for v in values[odd].tolist()]
            grow = max(map(len, texts)) - width
            if grow > 0:
                body = np.hstack([np.zeros((n, grow), dtype=np.uint8), body])
                width += grow
            body[odd] = 0
            for row, text in zip(odd.tolist(), texts):
                body[row, width - len(text) :] = np.frombuffer(text, dtype=np.uint8)
    return body


def _ascii_rows(blocks: list[np.ndarray], head: str, tail: str) -> list[str]:
    """``head + ",".join(block row texts) + tail`` for every row, without a per-row step."""
    n = len(blocks[0])
    head_b, tail_b = head.encode("ascii"), (tail + "\n").encode("ascii")
    width = len(head_b) + sum(b.shape[1] for b in blocks) + len(blocks) - 1 + len(tail_b)
    # Column-major: each block column is one contiguous write; ravel() below
    # does the single transpose to row order.
    matrix = np.empty((n, width), dtype=np.uint8, order="F")
    at = 0
    for k, block in enumerate(blocks):
        if k:
            matrix[:, at] = ord(",")
            at += 1
        else:
            matrix[:, : len(head_b)] = np.frombuffer(head_b, dtype=np.uint8)
            at = len(head_b)
        matrix[:, at : at + block.shape[1]] = block
        at += block.shape[1]
    matrix[:, at:] = np.frombuffer(tail_b, dtype=np.uint8)
    flat = matrix.ravel()
    rows = flat[flat != 0].tobytes().decode("ascii").split("\n")
    rows.pop()  # after the last newline
    return rows


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
