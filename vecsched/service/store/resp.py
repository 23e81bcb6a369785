"""Redis commands packed in bulk: one HSET per chunk of fields, encoded without a step per field.

redis-py packs each argument of a command in Python (a length, a few
concatenations, an encode); for 300,000 requests that is most of a
publication. Here a chunk's fields become one RESP command from a handful of
C-level joins: lengths come from ``map(len, ...)`` and a table of ``$n``
headers, and the whole chunk is one ``"\\r\\n".join`` and one ``encode``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

# "$n" headers for bulk strings of n bytes, grown on demand.
_HEADERS: list[str] = []


def _headers(longest: int) -> list[str]:
    if len(_HEADERS) <= longest:
        _HEADERS.extend(f"${k}" for k in range(len(_HEADERS), max(longest + 1, 2 * len(_HEADERS), 256)))
    return _HEADERS


def pack_command(*args: str | bytes | int) -> bytes:
    """One RESP command (an array of bulk strings).

    Examples
    --------
    >>> pack_command("SET", "k", 5)
    b'*3\\r\\n$3\\r\\nSET\\r\\n$1\\r\\nk\\r\\n$1\\r\\n5\\r\\n'
    """
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def pack_hset(key: str, fields: Sequence[str], values: Sequence[str] | Sequence[bytes]) -> bytes:
    """``HSET key field value [field value ...]`` as one RESP command.

    Text is UTF-8 on the wire. ASCII text (request ids and payloads are) is
    packed with C-level joins only; other text, and bytes values, take one
    small step per field.

    Examples
    --------
    >>> pack_hset("h", ["a", "bc"], ["1", "[2]"])
    b'*6\\r\\n$4\\r\\nHSET\\r\\n$1\\r\\nh\\r\\n$1\\r\\na\\r\\n$1\\r\\n1\\r\\n$2\\r\\nbc\\r\\n$3\\r\\n[2]\\r\\n'
    >>> pack_hset("h", ["a"], [b"1"]) == pack_hset("h", ["a"], ["1"])
    True
    """
    if len(fields) != len(values):
        raise ValueError(f"{len(fields)} fields for {len(values)} values")
    head = pack_command("HSET", key)
    head = b"*%d\r\n" % (2 + 2 * len(fields)) + head[head.index(b"\r\n") + 2 :]
    if not fields:
        return head
    flat: list[Any] = [None] * (4 * len(fields))
    flat[1::4] = fields
    flat[3::4] = values
    if not isinstance(values[0], bytes) and "".join(flat[1::2]).isascii():
        lengths_f = list(map(len, fields))
        lengths_v = list(map(len, values))
        headers = _headers(max(max(lengths_f), max(lengths_v)))
        flat[0::4] = map(headers.__getitem__, lengths_f)
        flat[2::4] = map(headers.__getitem__, lengths_v)
        return head + ("\r\n".join(flat) + "\r\n").encode("ascii")
    out = [head]
    for item in flat[1::2]:
        data = item if isinstance(item, bytes) else item.encode("utf-8")
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def send_commands(client: Any, commands: list[bytes]) -> list[Any]:
    """Send packed commands on one connection and read every reply (a pipeline of raw bytes).

    Every reply is read before an error is raised, so the connection stays in
    step; a failure mid-way drops the connection instead of returning it.
    """
    pool = client.connection_pool
    try:
        conn = pool.get_connection()
    except TypeError:  # redis-py before 5.3 wants a command name
        conn = pool.get_connection("HSET")
    replies: list[Any] = []
    try:
        conn.send_packed_command(commands)
        error: Exception | None = None
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except Exception as exc:  # a Redis error reply: keep reading the others
                if not _is_reply_error(exc):
                    raise
                error = error or exc
                replies.append(exc)
        if error is not None:
            raise error
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    return replies


def _is_reply_error(exc: Exception) -> bool:
    import redis

    return isinstance(exc, redis.ResponseError)


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
