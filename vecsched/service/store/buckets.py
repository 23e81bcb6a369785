"""Many requests per Redis hash field: the status hash's bucketed layout.

Redis spends about a microsecond per hash field it inserts, and redis-py packs
every argument of a command in Python; with one field per request both grow
with the queue. Fields of about :data:`BUCKET_SIZE` requests each cut both by
that factor, while a status read stays one ``EVALSHA`` (the read script
computes the same id hash as :func:`id_hashes`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


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
    """:func:`id_hash` of every id, as one integer product over the ids' bytes.

    Examples
    --------
    >>> [int(h) for h in id_hashes(["ab", "abc"])] == [id_hash("ab"), id_hash("abc")]
    True
    """
    return _hashes(*_matrix(*_encode(ids)))


def _hashes(raw: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The polynomial of each left-aligned row of ``raw``.

    It is summed with the powers of 31 of a full-width row, then shifted back
    by the inverse power for each shorter row (the modulus is prime).
    """
    n, width = raw.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    powers = np.array([pow(31, width - 1 - k, HASH_MODULUS) for k in range(width)], dtype=np.float64)
    # Each term is below 255 * 1e6 and a row of them below 2**53: exact in a float product.
    if width * 255 * HASH_MODULUS >= 2**53:
        raise ValueError(f"ids of {width} bytes are too long to hash in one product")
    full = (raw @ powers).astype(np.int64) % HASH_MODULUS
    inverse = pow(31, -1, HASH_MODULUS)
    shift = np.array([pow(inverse, k, HASH_MODULUS) for k in range(width + 1)], dtype=np.int64)
    return full * shift[width - lengths] % HASH_MODULUS


def _encode(texts: Sequence[str]) -> tuple[bytes, np.ndarray]:
    """All of ``texts`` as one UTF-8 buffer, and each one's length in bytes (one join, one encode)."""
    joined = "".join(texts)
    if joined.isascii():
        return joined.encode("ascii"), np.fromiter(map(len, texts), np.int64, len(texts))
    encoded = [t.encode("utf-8") for t in texts]
    return b"".join(encoded), np.fromiter(map(len, encoded), np.int64, len(texts))


def _matrix(data: bytes, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The texts of ``data`` as left-aligned, zero-padded rows, and their lengths."""
    n = len(lengths)
    width = int(lengths.max()) if n else 0
    buffer = np.frombuffer(data, dtype=np.uint8)
    if n and int(lengths.min()) == width:
        return buffer.reshape(n, width), lengths
    matrix = np.zeros((n, width), dtype=np.uint8)
    # A boolean mask fills in row-major order: the buffer's order.
    matrix[np.arange(width) < lengths[:, None]] = buffer
    return matrix, lengths


def bucket_fields(ids: Sequence[str], payloads: Sequence[str]) -> tuple[list[str], list[bytes]] | None:
    """Hash fields and values holding every (id, payload) pair, about BUCKET_SIZE to a field.

    A bucket's value is ``"\\nID\\tPAYLOAD"`` repeated (UTF-8), built as one
    byte matrix in bucket order with the padding dropped at once. Returns None
    when an id or payload holds a newline, tab or NUL (they could not be found
    again): publish one field per request then.

    Examples
    --------
    >>> names, values = bucket_fields(["r1", "r2"], ["[1]", "[2]"])
    >>> names[0], sorted(b"".join(values[1:]).split(b"\\n")[1:])
    ('#', [b'r1\\t[1]', b'r2\\t[2]'])
    """
    n = len(ids)
    encoded = _encode(ids), _encode(payloads)
    if any(c in data for data, _ in encoded for c in (b"\n", b"\t", b"\x00")):
        return None
    (id_bytes, id_lengths), (payload_bytes, payload_lengths) = (_matrix(*e) for e in encoded)
    n_buckets = max(1, -(-n // BUCKET_SIZE))
    bucket = _hashes(id_bytes, id_lengths) % n_buckets
    # Small integers sort by radix: far cheaper than a comparison sort.
    bucket = bucket.astype(np.uint16 if n_buckets <= 1 << 16 else np.uint32)
    order = np.argsort(bucket, kind="stable")
    wi, wp = id_bytes.shape[1], payload_bytes.shape[1]
    matrix = np.empty((n, wi + wp + 2), dtype=np.uint8)
    matrix[:, 0] = ord("\n")
    np.take(id_bytes, order, axis=0, out=matrix[:, 1 : wi + 1])
    matrix[:, wi + 1] = ord("\t")
    np.take(payload_bytes, order, axis=0, out=matrix[:, wi + 2 :])
    flat = matrix.ravel()
    entries = flat[flat != 0].tobytes()
    ends = np.cumsum((2 + id_lengths + payload_lengths)[order])
    sorted_bucket = bucket[order]
    present = np.flatnonzero(np.r_[sorted_bucket[1:] != sorted_bucket[:-1], True]) if n else np.zeros(0, np.int64)
    stops = ends[present].tolist()
    starts = [0] + stops[:-1]
    names = [BUCKETS_FIELD] + list(map(str, sorted_bucket[present].tolist()))
    values = [str(n_buckets).encode()] + [entries[a:b] for a, b in zip(starts, stops)]
    return names, values


def unbucket(fields: dict[bytes, bytes]) -> dict[str, str]:
    """Request id to payload from a whole status hash (``HGETALL``), in either layout.

    Examples
    --------
    >>> names, values = bucket_fields(["r1", "r2"], ["[1]", "[2]"])
    >>> unbucket({n.encode(): v for n, v in zip(names, values)}) == {"r1": "[1]", "r2": "[2]"}
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
