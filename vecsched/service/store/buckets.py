"""Request-id hashing for the status layouts, and reading the older bucketed status hash.

A status read finds a request's entry by a hash of its id that the read
script computes as well (:func:`id_hash`); :func:`id_hashes` computes it for
every id of a cycle at once. The packed layout
(:mod:`vecsched.service.store.packed`) groups its index by it. Cycles published
before that layout (a status hash whose field ``#`` holds a bucket count B
and field ``str(id_hash(id) % B)`` the ``"\\nID\\tPAYLOAD"`` entries of its
requests) are still read (:func:`unbucket`, and the read script).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vecsched.service.payload import copy_rows, encode_texts

HASH_MODULUS = 1_000_003  # prime; h * 31 + 255 stays exact in Lua's doubles
BUCKETS_FIELD = "#"  # in a bucketed status hash: the bucket count; bucket fields are "0", "1", ...


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


def unbucket(fields: dict[bytes, bytes]) -> dict[str, str]:
    """Request id to payload from a whole status hash (``HGETALL``), in either layout.

    Examples
    --------
    >>> unbucket({b"#": b"2", b"0": b"\\nr2\\t[2]", b"1": b"\\nr1\\t[1]\\nr3\\t[3]"})
    {'r2': '[2]', 'r1': '[1]', 'r3': '[3]'}
    >>> unbucket({b"r1": b"[1]"})
    {'r1': '[1]'}

    A request whose id is ``#`` holds a payload there, never a bucket count
    (the status read's script tells them apart the same way):

    >>> unbucket({b"#": b"[1]", b"r2": b"[2]"})
    {'#': '[1]', 'r2': '[2]'}
    """
    marker = fields.get(BUCKETS_FIELD.encode())
    if marker is None or not marker.isdigit():
        return {k.decode("utf-8"): v.decode("utf-8") for k, v in fields.items()}
    out: dict[str, str] = {}
    for name, blob in fields.items():
        if name == BUCKETS_FIELD.encode():
            continue
        for entry in blob.decode("utf-8").split("\n")[1:]:
            rid, _, payload = entry.partition("\t")
            out[rid] = payload
    return out
