"""Many requests per Redis hash field: the status hash's bucketed layout.

Redis spends about a microsecond per hash field it inserts, and redis-py packs
every argument of a command in Python; with one field per request both grow
with the queue. Fields of about :data:`BUCKET_SIZE` requests each cut both by
that factor, while a status read stays one ``EVALSHA`` (the read script
computes the same id hash as :func:`id_hashes`).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from vecsched.service.payload import PayloadRows, encode_texts


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
    texts = np.empty(len(ids), dtype=object)
    texts[:] = list(ids)
    return _hashes(texts, *encode_texts(texts.tolist()))


Chunk = tuple[np.ndarray, np.ndarray, bytes]
"""Whole buckets: their numbers, where each one's value ends in the buffer, the buffer."""

_CHUNK_ENTRIES = 8192  # about this many requests formatted at a time (whole buckets)
_HASH_ROWS = 8192  # rows per product: the float copy of the id bytes stays small


def _hashes(ids: np.ndarray, data: bytes, lengths: np.ndarray) -> np.ndarray:
    """The polynomial of each id's UTF-8 bytes (``data``, ``lengths`` per id), modulo HASH_MODULUS.

    Ids of one length are one dense byte matrix (no padding to the longest): its
    rows are summed with the powers of 31 in one float product, exact since each
    term is below 255 * 1e6 and a row of at most 256 of them below 2**53.
    """
    out = np.zeros(len(ids), dtype=np.int64)
    if not len(ids):
        return out
    if int(lengths.max()) * 255 * HASH_MODULUS >= 2**53:
        raise ValueError(f"ids of {int(lengths.max())} bytes are too long to hash in one product")
    if int(lengths.min()) == int(lengths.max()):
        by_length = np.arange(len(ids))
    else:
        by_length = np.argsort(lengths, kind="stable")
        data = encode_texts(ids[by_length].tolist())[0]
    flat = np.frombuffer(data, dtype=np.uint8)
    sorted_lengths = lengths[by_length]
    firsts = np.flatnonzero(np.r_[True, sorted_lengths[1:] != sorted_lengths[:-1]])
    offsets = np.r_[0, np.cumsum(sorted_lengths)]
    for first, stop in zip(firsts.tolist(), np.r_[firsts[1:], len(ids)].tolist()):
        width = int(sorted_lengths[first])
        if not width:
            continue  # the empty id hashes to 0
        powers = np.array([pow(31, width - 1 - k, HASH_MODULUS) for k in range(width)], dtype=np.float64)
        block, block_rows = flat[offsets[first] : offsets[stop]].reshape(-1, width), by_length[first:stop]
        for start in range(0, len(block), _HASH_ROWS):
            part = slice(start, start + _HASH_ROWS)
            out[block_rows[part]] = (block[part] @ powers).astype(np.int64) % HASH_MODULUS
    return out


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
    time (:meth:`PayloadRows.format_rows`, which formats payloads straight from
    their columns). Returns None when an id or payload holds a newline, tab or
    NUL (they could not be found again): publish one field per request then.

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
    n = len(ids)
    if len(payloads) != n:
        raise ValueError(f"{len(payloads)} payloads for {n} request ids")
    rows = payloads if isinstance(payloads, PayloadRows) else PayloadRows(b"", [], 0, payloads)
    texts = np.empty(n, dtype=object)
    texts[:] = list(ids)
    data, lengths = encode_texts(texts.tolist())
    if any(c in text for text in (data, "".join(rows.extra).encode()) for c in (b"\n", b"\t", b"\x00")):
        return None
    n_buckets = max(1, -(-n // BUCKET_SIZE))
    bucket = _hashes(texts, data, lengths) % n_buckets
    # Small integers sort by radix: far cheaper than a comparison sort.
    bucket = bucket.astype(np.uint16 if n_buckets <= 1 << 16 else np.uint32)
    order = np.argsort(bucket, kind="stable")
    sorted_bucket = bucket[order]
    last = np.flatnonzero(np.r_[sorted_bucket[1:] != sorted_bucket[:-1], True]) if n else np.zeros(0, np.int64)

    def chunks() -> Iterator[Chunk]:
        cuts = (last[np.searchsorted(last, np.arange(_CHUNK_ENTRIES, n, _CHUNK_ENTRIES))] + 1).tolist()
        for start, stop in zip([0, *cuts], [*cuts, n]):
            if start < stop:
                entries, sizes = rows.format_rows(order[start:stop], keys=(texts, lengths))
                ends = last[(last >= start) & (last < stop)]
                yield sorted_bucket[ends], np.cumsum(sizes)[ends - start], entries

    return n_buckets, chunks()


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
