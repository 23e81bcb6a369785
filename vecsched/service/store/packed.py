"""The status of a whole cycle as one Redis string: padded payload rows and an id index.

Redis and redis-py pay per hash field and per argument, and a hash of
bucketed entries (:mod:`vecsched.service.store.buckets`) still made this
process gather every formatted row into bucket order and drop its NULs, and
Redis copy each field out of its query buffer. Here the cycle is one string,
sent as one ``SET`` whose single bulk argument Redis reads straight into the
value, and made in the order it is sent, a few thousand rows at a time:

- a header of :data:`HEADER` bytes: :data:`MAGIC`, then the bucket count B,
  the digits of an offset, the digits of a row number, the row width W, and
  where the index and the rows start, space-separated;
- B + 1 offsets, zero-padded decimal: bucket ``b``'s entries are the index
  bytes from offset ``b`` up to offset ``b + 1``;
- the index: ``"\\nID\\tROW"`` per request (ROW zero-padded decimal), grouped by
  bucket ``id_hash(id) % B`` (:func:`~vecsched.service.store.buckets.id_hash`);
- the rows, in the cycle's own order, W bytes each: ``"\\tPAYLOAD"`` with NULs
  anywhere in it (each column right-aligned in its slot,
  :meth:`~vecsched.service.payload.PayloadRows.write_run`).

A status read is still one ``EVALSHA``: the script reads the header, the two
offsets, the bucket's few entries and the one row with ``GETRANGE``; the
reader drops that row's NULs (in Lua they cost a quarter of the read's Redis time). Ids or payloads holding a newline, tab or NUL could not be
found again: :func:`pack_status` says None and the store writes one hash
field per request instead.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from vecsched.service.payload import PayloadRows, write_decimal
from vecsched.service.store.buckets import _Ids

MAGIC = b"vecsched-packed/1"
HEADER = 64  # bytes; the header's numbers are space-padded to it
PER_BUCKET = 8  # requests per index bucket on average: a read scans about this many entries
_CHUNK = 8192  # index entries or rows made at a time (whole rows: a megabyte or so)


class _Index:
    """Which requests each bucket holds, in bucket order, and where each bucket's entries start."""

    def __init__(self, ids: _Ids):
        n = len(ids.lengths)
        self.ids = ids
        self.n_buckets = max(1, -(-n // PER_BUCKET))
        # small integers sort by radix: far cheaper than a comparison sort
        bucket = (ids.hashes() % self.n_buckets).astype(np.uint16 if self.n_buckets <= 1 << 16 else np.uint32)
        self.order = np.argsort(bucket, kind="stable")
        self.row_digits = len(str(max(n - 1, 0)))
        ends = np.cumsum((2 + self.row_digits) + ids.lengths[self.order])
        first_entry = np.searchsorted(bucket[self.order], np.arange(self.n_buckets + 1))
        self.offsets = np.r_[0, ends][first_entry]
        self.size = int(self.offsets[-1])
        self.offset_digits = len(str(self.size))

    def entries(self, first: int, stop: int) -> bytes | memoryview:
        """Entries ``first:stop`` (in bucket order) back to back: ``"\\nID\\tROW"`` each."""
        rows = self.order[first:stop]
        longest = int(self.ids.lengths[rows].max(initial=0))
        matrix = np.empty((len(rows), 2 + longest + self.row_digits), dtype=np.uint8)
        matrix[:, 0] = ord("\n")
        self.ids.write(rows, matrix[:, 1 : 1 + longest])  # NUL-padded unless every id is as long
        matrix[:, 1 + longest] = ord("\t")
        write_decimal(rows, matrix[:, 2 + longest :])
        if self.ids.uniform:
            return memoryview(matrix.reshape(-1))
        return matrix.tobytes().translate(None, b"\0")


def pack_status(ids: Sequence[str], payloads: Sequence[str]) -> tuple[int, Iterator[bytes | memoryview]] | None:
    """A cycle's status string: its size, and its bytes lazily, a few thousand requests at a time.

    Parameters
    ----------
    ids : sequence of str
    payloads : sequence of str
        Aligned with ``ids``; a :class:`PayloadRows` is formatted straight
        into the rows, never turned into str.

    Returns
    -------
    (size, pieces) or None
        None when an id or payload holds a newline, tab or NUL.

    Raises
    ------
    ValueError
        When there are not as many payloads as ids.

    Examples
    --------
    >>> size, pieces = pack_status(["r1", "r2"], ["[1]", "[22]"])
    >>> data = b"".join(pieces)
    >>> size == len(data), data[:HEADER].split()
    (True, [b'vecsched-packed/1', b'1', b'2', b'1', b'5', b'68', b'78'])
    >>> data[HEADER:]
    b'0010\\nr1\\t0\\nr2\\t1\\t[1]\\x00\\t[22]'
    >>> unpack_status(data) == {"r1": "[1]", "r2": "[22]"}
    True
    """
    n = len(ids)
    if len(payloads) != n:
        raise ValueError(f"{len(payloads)} payloads for {n} request ids")
    rows = payloads if isinstance(payloads, PayloadRows) else PayloadRows(b"", [], 0, payloads)
    ids = _Ids(ids)
    extra = "".join(rows.extra).encode()
    if any(c in text for text in (ids.data, extra) for c in (b"\n", b"\t", b"\x00")):
        return None
    index = _Index(ids)
    width = rows.row_width()
    at_index = HEADER + (index.n_buckets + 1) * index.offset_digits
    at_rows = at_index + index.size
    header = b"%s %d %d %d %d %d %d" % (MAGIC, index.n_buckets, index.offset_digits, index.row_digits, width,
                                        at_index, at_rows)

    def pieces() -> Iterator[bytes | memoryview]:
        offsets = np.empty((len(index.offsets), index.offset_digits), dtype=np.uint8)
        write_decimal(index.offsets, offsets)
        yield header.ljust(HEADER) + offsets.tobytes()
        for start in range(0, n, _CHUNK):
            yield index.entries(start, min(start + _CHUNK, n))
        for start in range(0, n, _CHUNK):
            stop = min(start + _CHUNK, n)
            matrix = np.empty((stop - start, width), dtype=np.uint8)  # fresh: a consumer may keep each piece
            rows.write_run(start, stop, matrix)
            yield memoryview(matrix.reshape(-1))

    return at_rows + n * width, pieces()


def unpack_status(data: bytes) -> dict[str, str]:
    """Request id to payload from a whole status string (the layout :func:`pack_status` writes).

    Parameters
    ----------
    data : bytes

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        When ``data`` is not a packed status.

    Examples
    --------
    >>> unpack_status(b"".join(pack_status(["a"], ["[1]"])[1]))
    {'a': '[1]'}
    """
    fields = data[:HEADER].split()
    if not fields or fields[0] != MAGIC:
        raise ValueError("not a packed status: " + repr(data[:HEADER]))
    at_index, at_rows = int(fields[5]), int(fields[6])
    # each row is a tab, its payload, and NULs anywhere: the payloads in row order
    payloads = data[at_rows:].translate(None, b"\0").decode("utf-8").split("\t")[1:]
    entries = (entry.partition("\t") for entry in data[at_index:at_rows].decode("utf-8").split("\n")[1:])
    return {rid: payloads[int(row)] for rid, _, row in entries}
