"""Many requests per Redis hash field: the status hash's bucketed layout.

Redis spends about a microsecond per hash field it inserts, and redis-py packs
every argument of a command in Python; with one field per request both grow
with the queue. Fields of about :data:`BUCKET_SIZE` requests each cut both by
that factor, while a status read stays one ``EVALSHA`` (the read script
computes the same id hash as :func:`id_hashes`).

The hash is written as ``HSET`` commands whose wire bytes (RESP) are made here
in NumPy (:func:`bucket_commands`): each bucket's ``$length`` framing is one
more NUL-padded region in the byte matrix its entries are formatted in.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from vecsched.service.payload import PayloadRows, copy_rows, encode_texts


# -- buckets: many requests per hash field ------------------------------------------
#
# Redis spends about a microsecond per hash field it inserts, on a quiet core;
# a cycle of 300,000 requests is then most of a second of server time. Fields
# holding BUCKET_SIZE requests each cut that by as much, and a status read
# still costs one HGET and one plain string search inside the read script.

BUCKET_SIZE = 16
HASH_MODULUS = 1_000_003  # prime; h * 31 + 255 stays exact in Lua's doubles
BUCKETS_FIELD = "#"  # holds the bucket count; bucket fields are "0", "1", ...


def id_hash(request_id: str) -> int:
    """The hash the read script computes (bytes of the UTF-8 id, ``h = (h * 31 + b) % HASH_MODULUS``).

    Examples
    --------
    >>> id_hash("ab") == (97 * 31 + 98) % HASH_MODULUS
    True
    """
    h = 0
    for b in request_id.encode("utf-8"):
        h = (h * 31 + b) % HASH_MODULUS
    return h


def id_hashes(ids: Sequence[str]) -> np.ndarray:
    """:func:`id_hash` of every id, as one integer product per id length over the ids' bytes.

    Examples
    --------
    >>> [int(h) for h in id_hashes(["ab", "abc"])] == [id_hash("ab"), id_hash("abc")]
    True
    """
    return _Ids(ids).hashes()


Chunk = tuple[np.ndarray, np.ndarray, bytes]
"""Whole buckets: their numbers, where each one's value ends in the buffer, the buffer."""

_CHUNK_ENTRIES = 8192  # about this many requests formatted at a time (whole buckets)
_HASH_ROWS = 8192  # rows per product: the float copy of the id bytes stays small


class _Ids:
    """The ids' UTF-8 bytes as one dense matrix per id length: nothing is padded to the longest id.

    Ids of one length (horde ids are UUIDs) are one matrix over the ids' own
    buffer; otherwise the ids are re-encoded sorted by length, once.
    """

    def __init__(self, ids: Sequence[str]):
        ids = ids if isinstance(ids, list) else list(ids)
        data, self.lengths = encode_texts(ids)
        n = len(ids)
        self.uniform = not n or int(self.lengths.min()) == int(self.lengths.max())
        # sorted position -> row (None: the identity), and row -> sorted position
        self.by_length: np.ndarray | None = None
        self.rank: np.ndarray | None = None
        sorted_lengths = self.lengths
        if not self.uniform:
            texts = np.empty(n, dtype=object)
            texts[:] = ids
            self.by_length = np.argsort(self.lengths, kind="stable")
            data = encode_texts(texts[self.by_length].tolist())[0]
            self.rank = np.empty(n, dtype=np.int64)
            self.rank[self.by_length] = np.arange(n)
            sorted_lengths = self.lengths[self.by_length]
        self.data = data
        flat = np.frombuffer(data, dtype=np.uint8)
        firsts = np.flatnonzero(np.r_[True, sorted_lengths[1:] != sorted_lengths[:-1]]).tolist() if n else []
        self.blocks: dict[int, tuple[int, np.ndarray]] = {}  # width -> (first sorted position, matrix)
        at = 0
        for first, stop in zip(firsts, [*firsts[1:], n]):
            width = int(sorted_lengths[first])
            self.blocks[width] = first, flat[at : at + width * (stop - first)].reshape(-1, max(width, 1))
            at += width * (stop - first)

    def hashes(self) -> np.ndarray:
        """The polynomial of each id's bytes modulo HASH_MODULUS, one float product per length.

        Exact: each term is below 255 * 1e6 and a row of at most 256 of them below 2**53.
        """
        out = np.zeros(len(self.lengths), dtype=np.int64)
        if len(out) and int(self.lengths.max()) * 255 * HASH_MODULUS >= 2**53:
            raise ValueError(f"ids of {int(self.lengths.max())} bytes are too long to hash in one product")
        for width, (first, block) in self.blocks.items():
            if not width:
                continue  # the empty id hashes to 0
            powers = np.array([pow(31, width - 1 - k, HASH_MODULUS) for k in range(width)], dtype=np.float64)
            for start in range(0, len(block), _HASH_ROWS):
                stop = min(start + _HASH_ROWS, len(block))
                rows = slice(first + start, first + stop) if self.by_length is None else \
                    self.by_length[first + start : first + stop]
                out[rows] = (block[start:stop] @ powers).astype(np.int64) % HASH_MODULUS
        return out

    def write(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Ids ``rows`` left-aligned in the rows of ``out`` (as wide as the longest of them), NUL-padded."""
        if self.uniform:
            if out.shape[1]:
                copy_rows(next(iter(self.blocks.values()))[1], rows, out)
            return
        out[...] = 0
        lengths, ranks = self.lengths[rows], self.rank[rows]
        by_length = np.argsort(lengths, kind="stable")
        sorted_lengths = lengths[by_length]
        cuts = (np.flatnonzero(sorted_lengths[1:] != sorted_lengths[:-1]) + 1).tolist()
        for start, stop in zip([0, *cuts], [*cuts, len(rows)]):
            width = int(sorted_lengths[start])
            if width:
                first, block = self.blocks[width]
                picked = by_length[start:stop]
                moved = np.empty((len(picked), width), dtype=np.uint8)
                copy_rows(block, ranks[picked] - first, moved)
                out[picked, :width] = moved


class _Plan:
    """Which requests go to which bucket, in bucket order; each entry's and bucket's size; chunks of buckets."""

    def __init__(self, ids: Sequence[str], payloads: Sequence[str]):
        n = len(ids)
        if len(payloads) != n:
            raise ValueError(f"{len(payloads)} payloads for {n} request ids")
        self.rows = payloads if isinstance(payloads, PayloadRows) else PayloadRows(b"", [], 0, payloads)
        self.ids = _Ids(ids)
        extra = "".join(self.rows.extra).encode()
        self.separated = not any(c in text for text in (self.ids.data, extra) for c in (b"\n", b"\t", b"\x00"))
        self.n_buckets = max(1, -(-n // BUCKET_SIZE))
        if not self.separated:
            return
        # Small integers sort by radix: far cheaper than a comparison sort.
        bucket = (self.ids.hashes() % self.n_buckets).astype(np.uint16 if self.n_buckets <= 1 << 16 else np.uint32)
        self.order = np.argsort(bucket, kind="stable")
        sorted_bucket = bucket[self.order]
        # each non-empty bucket's entries: order[starts[j] : starts[j + 1]]
        starts = np.flatnonzero(np.r_[True, sorted_bucket[1:] != sorted_bucket[:-1]]) if n else np.zeros(0, int)
        self.buckets = sorted_bucket[starts].astype(np.int64)
        self.starts = np.r_[starts, n]
        # "\n" + id + "\t" + payload, in bucket order; a bucket's value is its entries back to back
        self.sizes = 1 + self.ids.lengths[self.order] + self.rows.lengths()[self.order]
        self.value_sizes = np.add.reduceat(self.sizes, starts) if n else np.zeros(0, np.int64)

    def cuts(self, fields: int) -> list[int]:
        """Bucket indexes where a chunk ends: about _CHUNK_ENTRIES entries each, and every ``fields`` buckets."""
        by_entries = np.searchsorted(self.starts, np.arange(_CHUNK_ENTRIES, self.starts[-1], _CHUNK_ENTRIES))
        by_fields = np.arange(fields, len(self.buckets), fields)
        return [cut for cut in np.unique(np.r_[by_entries, by_fields, len(self.buckets)]).tolist() if cut]

    def entries(self, first: int, stop: int, framing: np.ndarray | None = None) -> bytearray:
        """Buckets ``first:stop``'s entries ``"\\nID\\tPAYLOAD"`` back to back, each bucket's ``framing`` row first.

        The entries are the rows of a NUL-padded byte matrix, each row with
        room for a framing in front of it (filled on a bucket's first entry);
        one pass drops the NULs.
        """
        rows = self.order[self.starts[first] : self.starts[stop]]
        room = framing.shape[1] if framing is not None else 0
        at = room + 1 + int(self.ids.lengths[rows].max(initial=0))
        width = at + self.rows.width(rows)
        buffer = bytearray(len(rows) * width)  # zeroed: the framing room stays NUL where unused
        matrix = np.frombuffer(buffer, dtype=np.uint8).reshape(len(rows), width)
        matrix[:, room] = ord("\n")
        self.ids.write(rows, matrix[:, room + 1 : at])
        self.rows.write_rows(rows, matrix[:, at:])
        if framing is not None:
            matrix[self.starts[first:stop] - self.starts[first], :room] = framing
        return buffer.translate(None, b"\0")


def _decimal(values: np.ndarray) -> np.ndarray:
    """Non-negative integers as decimal text, right-aligned and NUL-padded, one row each."""
    width = len(str(int(values.max(initial=0))))
    out = np.zeros((len(values), width), dtype=np.uint8)
    rest = values.astype(np.int64)
    for column in range(width - 1, -1, -1):
        shown = (rest > 0) | (column == width - 1)  # the value reaches this digit (the units always show)
        rest, digit = np.divmod(rest, 10)
        out[:, column] = np.where(shown, digit + ord("0"), 0)
    return out


def _framing(buckets: np.ndarray, sizes: np.ndarray, leads: np.ndarray) -> np.ndarray:
    """RESP framing before each bucket's value in an HSET: ``[\\r\\n]$len\\r\\nNAME\\r\\n$size\\r\\n``.

    ``leads`` says which fields follow another of the same command (their
    ``\\r\\n`` ends the previous value). Rows are NUL-padded.
    """
    names = _decimal(buckets)
    name_lengths = _decimal(np.count_nonzero(names, axis=1))

    def text(value: bytes) -> np.ndarray:
        return np.broadcast_to(np.frombuffer(value, dtype=np.uint8), (len(buckets), len(value)))

    lead = text(b"\r\n") * leads[:, None].astype(np.uint8)
    return np.hstack([lead, text(b"$"), name_lengths, text(b"\r\n"), names, text(b"\r\n$"), _decimal(sizes),
                      text(b"\r\n")])


def bucket_fields(ids: Sequence[str], payloads: Sequence[str]) -> tuple[list[bytes], list[bytes]] | None:
    """Hash fields and values holding every (id, payload) pair, about BUCKET_SIZE to a field.

    The fields of :func:`bucket_chunks`, each value cut from its chunk.

    Parameters
    ----------
    ids : sequence of str
    payloads : sequence of str
        Aligned with ``ids``; a :class:`PayloadRows` is never turned into str.

    Returns
    -------
    names, values : list of bytes, or None
        Field ``#`` (the bucket count) first, then each non-empty bucket's;
        None when an id or payload holds a newline, tab or NUL.

    Examples
    --------
    >>> names, values = bucket_fields(["r1", "r2"], ["[1]", "[2]"])
    >>> names[0], sorted(b"".join(values[1:]).split(b"\\n")[1:])
    (b'#', [b'r1\\t[1]', b'r2\\t[2]'])
    """
    got = bucket_chunks(ids, payloads)
    if got is None:
        return None
    n_buckets, chunks = got
    names, values = [BUCKETS_FIELD.encode()], [str(n_buckets).encode()]
    for buckets, ends, entries in chunks:
        names.extend(map(str.encode, map(str, buckets.tolist())))
        stops = ends.tolist()
        # map() slices from C: no interpreter step per bucket either
        values.extend(map(entries.__getitem__, map(slice, [0, *stops[:-1]], stops)))
    return names, values


def bucket_chunks(ids: Sequence[str], payloads: Sequence[str]) -> tuple[int, Iterator[Chunk]] | None:
    """The bucketed status hash as chunks of whole buckets, each one bytes buffer.

    A bucket's value is ``"\\nID\\tPAYLOAD"`` repeated (UTF-8). The entries are
    written in bucket order, a few thousand at a time and whole buckets each
    time (:meth:`PayloadRows.write_rows` formats payloads straight from their
    columns). Returns None when an id or payload holds a newline, tab or NUL
    (they could not be found again): publish one field per request then.

    Parameters
    ----------
    ids : sequence of str
    payloads : sequence of str
        Aligned with ``ids``; a :class:`PayloadRows` is never turned into str.

    Returns
    -------
    (n_buckets, chunks) or None
        The bucket count (field ``#``) and, lazily, per chunk: the bucket
        numbers (ascending), where each one's value ends in the buffer, and
        the buffer.

    Examples
    --------
    >>> n_buckets, chunks = bucket_chunks(["r1", "r2", "r3"], ["[1]", "[2]", "[3]"])
    >>> [(b.tolist(), e.tolist(), data) for b, e, data in chunks]
    [([0], [21], b'\\nr1\\t[1]\\nr2\\t[2]\\nr3\\t[3]')]
    """
    plan = _Plan(ids, payloads)
    if not plan.separated:
        return None

    def chunks() -> Iterator[Chunk]:
        cuts = plan.cuts(len(plan.buckets) + 1)
        for first, stop in zip([0, *cuts], cuts):
            ends = np.cumsum(plan.value_sizes[first:stop])
            yield plan.buckets[first:stop], ends, bytes(plan.entries(first, stop))

    return plan.n_buckets, chunks()


def bucket_commands(key: bytes, ids: Sequence[str], payloads: Sequence[str],
                    fields: int) -> tuple[int, int, Iterator[bytes]] | None:
    """The bucket fields of the status hash as ``HSET`` commands on the wire (RESP), made in NumPy.

    The same fields and values as :func:`bucket_fields` but field ``#``; each
    command sets ``fields`` buckets (the last one fewer), and its bytes come
    a few thousand entries at a time, ready for redis-py's
    ``Connection.send_packed_command``.

    Parameters
    ----------
    key : bytes
        The status hash's key.
    ids : sequence of str
    payloads : sequence of str
        Aligned with ``ids``; a :class:`PayloadRows` is never turned into str.
    fields : int
        Hash fields per ``HSET``.

    Returns
    -------
    (n_buckets, n_commands, pieces) or None
        The bucket count (field ``#``'s value), how many ``HSET`` commands
        (replies) the pieces hold and, lazily, the pieces; None when an id or
        payload holds a newline, tab or NUL.

    Examples
    --------
    >>> n_buckets, n_commands, pieces = bucket_commands(b"k", ["r1", "r2"], ["[1]", "[2]"], 10)
    >>> n_buckets, n_commands, b"".join(pieces)
    (1, 1, b'*4\\r\\n$4\\r\\nHSET\\r\\n$1\\r\\nk\\r\\n$1\\r\\n0\\r\\n$14\\r\\n\\nr1\\t[1]\\nr2\\t[2]\\r\\n')
    """
    plan = _Plan(ids, payloads)
    if not plan.separated:
        return None
    n_fields = len(plan.buckets)
    n_commands = -(-n_fields // fields)

    def pieces() -> Iterator[bytes]:
        framing = _framing(plan.buckets, plan.value_sizes, np.arange(n_fields) % fields != 0)
        cuts = plan.cuts(fields)
        for first, stop in zip([0, *cuts], cuts):
            if first % fields == 0:  # a command starts: "*count", HSET and the key
                count = min(fields, n_fields - first)
                yield b"%s*%d\r\n$4\r\nHSET\r\n$%d\r\n%s\r\n" % (b"\r\n" if first else b"", 2 + 2 * count,
                                                                 len(key), key)
            yield plan.entries(first, stop, framing[first:stop])
        if n_fields:
            yield b"\r\n"

    return plan.n_buckets, n_commands, pieces()


def unbucket(fields: dict[bytes, bytes]) -> dict[str, str]:
    """Request id to payload from a whole status hash (``HGETALL``), in either layout.

    Examples
    --------
    >>> names, values = bucket_fields(["r1", "r2"], ["[1]", "[2]"])
    >>> unbucket(dict(zip(names, values))) == {"r1": "[1]", "r2": "[2]"}
    True
    >>> unbucket({b"r1": b"[1]"})
    {'r1': '[1]'}
    """
    if BUCKETS_FIELD.encode() not in fields:
        return {k.decode("utf-8"): v.decode("utf-8") for k, v in fields.items()}
    out: dict[str, str] = {}
    for name, blob in fields.items():
        if name == BUCKETS_FIELD.encode():
            continue
        for entry in blob.decode("utf-8").split("\n")[1:]:
            rid, _, payload = entry.partition("\t")
            out[rid] = payload
    return out
