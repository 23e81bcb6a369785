"""The bulk payload encoder and the packed status against plain one-request-at-a-time builds, byte for byte."""

from __future__ import annotations

import math
import tracemalloc
from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vecsched.core.result import BOOL_FIELDS, FLOAT_FIELDS, INT_FIELDS
from vecsched.core.stall import EVIDENCE
from vecsched.service.payload import PAYLOAD_FIELDS, PAYLOAD_VERSION, REQUEST_FIELDS, encode_payloads
from vecsched.service.store.buckets import id_hash
from vecsched.service.store.packed import HEADER, MAGIC, PER_BUCKET, pack_status

_FLOATS = set(FLOAT_FIELDS + REQUEST_FIELDS)


def plain_float(x: float) -> str:
    """One float as the payload spells it: milliseconds, trailing zeros trimmed; null if not finite."""
    if not math.isfinite(x):
        return "null"
    if abs(x) >= 1e15:  # beyond exact milliseconds in a double
        return repr(round(x, 3))
    milli = round(x * 1000)  # half to even, as np.rint
    whole, fraction = divmod(abs(milli), 1000)
    return ("-" if milli < 0 else "") + f"{whole}." + (f"{fraction:03d}".rstrip("0") or "0")


def plain_payload(columns: dict, k: int, cycle_time: float) -> str:
    """Request ``k``'s payload built field by field in Python: the reference for the bulk encoder."""
    parts = [str(PAYLOAD_VERSION), repr(float(cycle_time))]
    for name in PAYLOAD_FIELDS[2:]:
        value = columns[name][k]
        parts.append(plain_float(float(value)) if name in _FLOATS else str(int(value)))
    return "[" + ",".join(parts) + "]"


def plain_packed_head(ids: list[str], width: int) -> bytes:
    """The packed status up to its rows (header, offsets, index), built entry by entry, for rows ``width`` wide."""
    n_buckets = max(1, -(-len(ids) // PER_BUCKET))
    row_digits = len(str(max(len(ids) - 1, 0)))
    buckets: list[list[bytes]] = [[] for _ in range(n_buckets)]
    for k, rid in enumerate(ids):
        buckets[id_hash(rid) % n_buckets].append(f"\n{rid}\t{k:0{row_digits}d}".encode())
    index, offsets = b"", [0]
    for entries in buckets:
        index += b"".join(entries)
        offsets.append(len(index))
    digits = len(str(len(index)))
    at_index = HEADER + len(offsets) * digits
    header = b"%s %d %d %d %d %d %d" % (MAGIC, n_buckets, digits, row_digits, width, at_index, at_index + len(index))
    return header.ljust(HEADER) + b"".join(b"%0*d" % (digits, o) for o in offsets) + index


def assert_packed_plainly(ids: list[str], payloads, expected: list[str]) -> None:
    """``pack_status(ids, payloads)``: its head byte for byte, each row ``"\\t" + expected[k]`` once NULs go."""
    size, pieces = pack_status(ids, payloads)
    data = b"".join(pieces)
    width = int(data[:HEADER].split()[4])
    head = plain_packed_head(ids, width)
    assert data[: len(head)] == head
    assert size == len(data) == len(head) + len(ids) * width
    rows = [data[len(head) + k * width : len(head) + (k + 1) * width] for k in range(len(ids))]
    assert [row.replace(b"\0", b"").decode() for row in rows] == ["\t" + p for p in expected]


_id = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\t\x00"), min_size=1, max_size=40)
_odd_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e6, max_value=1e6),
    st.floats(min_value=0, max_value=1e5),
    st.sampled_from([0.0, -0.0, 0.0005, -0.0005, 0.0015, 2.675, 9999.9995, 10.0, 1e15, -1e15, 999999999999999.9, 1e16]),
)
_ints = st.one_of(st.integers(0, 20), st.integers(0, 10**7), st.integers(-(10**12), 10**12))


@st.composite
def cycles(draw) -> tuple[SimpleNamespace, SimpleNamespace, float]:
    """Random estimates of 1-40 requests: odd ids, nulls, fallback rows, both gentypes, big and negative numbers."""
    n = draw(st.integers(min_value=1, max_value=40))
    ids = draw(st.lists(_id, min_size=n, max_size=n, unique=True))
    columns: dict[str, np.ndarray] = {}
    for name in INT_FIELDS:
        columns[name] = np.array(draw(st.lists(draw(st.sampled_from([_ints, st.integers(0, 5000)])),
                                               min_size=n, max_size=n)), dtype=np.int64)
    for name in FLOAT_FIELDS:
        columns[name] = np.array(draw(st.lists(_odd_floats, min_size=n, max_size=n)), dtype=np.float64)
    for name in BOOL_FIELDS:  # fallback and is_possible: both values, rows of each kind
        columns[name] = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    columns["gentype"] = np.array(draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n)), dtype=np.int8)
    columns["stall_evidence"] = np.array(draw(st.lists(st.integers(-1, len(EVIDENCE) - 1), min_size=n, max_size=n)),
                                         dtype=np.int8)
    # the snapshot's kudos, picked by request_index (requests not in the estimates too)
    kudos = np.array(draw(st.lists(_odd_floats, min_size=n + 2, max_size=n + 2)), dtype=np.float64)
    index = np.array(draw(st.permutations(range(n + 2)))[:n])
    rid = np.empty(n, dtype=object)
    rid[:] = ids
    estimates = SimpleNamespace(request_id=rid, columns=columns, request_index=index)
    return estimates, SimpleNamespace(kudos=kudos), draw(st.floats(min_value=0, max_value=4e9))


@settings(max_examples=300, deadline=None)
@given(cycles())
def test_bulk_payloads_equal_the_plain_encoding_byte_for_byte(cycle) -> None:
    estimates, requests, cycle_time = cycle
    ids, payloads = encode_payloads(estimates, cycle_time, requests)
    columns = {**estimates.columns, "kudos": requests.kudos[estimates.request_index]}
    plain = [plain_payload(columns, k, cycle_time) for k in range(len(ids))]
    assert list(payloads) == plain
    assert [payloads[k] for k in range(len(ids))] == plain and payloads[-1] == plain[-1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cycles(), st.lists(st.sampled_from(['{"ended":"done"}', '{"ended":"faulted"}']), max_size=5))
def test_packed_status_equals_the_plain_layout(cycle, ended) -> None:
    """Rows formatted a run at a time straight from the columns, ended requests' plain payloads appended."""
    estimates, requests, cycle_time = cycle
    ids, payloads = encode_payloads(estimates, cycle_time, requests)
    ended_ids = [f"ended-{k}" for k in range(len(ended))]
    ended_ids = [i for i in ended_ids if i not in ids]
    ended = ended[: len(ended_ids)]
    columns = {**estimates.columns, "kudos": requests.kudos[estimates.request_index]}
    expected = [plain_payload(columns, k, cycle_time) for k in range(len(ids))] + ended
    assert_packed_plainly(ids + ended_ids, payloads + ended, expected)


def test_packed_status_spans_chunks() -> None:
    """Enough requests for several chunks of entries and rows, ids of many lengths."""
    n = 40_000
    rng = np.random.default_rng(4)
    ids = [f"req-{k:x}-{'x' * int(rng.integers(0, 30))}" for k in range(n)]
    payloads = [f"[{k},{k % 7}.5]" for k in range(n)]
    assert_packed_plainly(ids, payloads, payloads)
    uniform = [f"{k:08d}-4c1e" for k in range(n)]  # one length: entries straight from the ids' buffer
    assert_packed_plainly(uniform, payloads, payloads)


def _peak_memory(ids: list[str]) -> int:
    """Peak traced bytes of encoding and packing a cycle of ``ids`` (every figure 0 or 12.5), pieces not kept."""
    n = len(ids)
    columns = {f: np.zeros(n, dtype=np.int64) for f in INT_FIELDS}
    columns.update({f: np.zeros(n, dtype=bool) for f in BOOL_FIELDS})
    columns.update({f: np.full(n, 12.5) for f in FLOAT_FIELDS})
    columns["gentype"] = np.zeros(n, dtype=np.int8)
    columns["stall_evidence"] = np.full(n, -1, dtype=np.int8)
    rid = np.empty(n, dtype=object)
    rid[:] = ids
    estimates = SimpleNamespace(request_id=rid, columns=columns)
    tracemalloc.start()
    try:
        for _ in pack_status(*encode_payloads(estimates, 1.0))[1]:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_follow_the_longest_id() -> None:
    """One 256-byte id among short ones costs a few chunks' worth, however many requests:
    nothing is padded to the longest id across all requests (that would double with them)."""
    extra = []
    for n in (60_000, 120_000):
        short = [f"{k:012d}" for k in range(n)]
        extra.append(_peak_memory(short[:-1] + ["L" * 256]) - _peak_memory(short))
    assert extra[1] < 1.2 * extra[0] + 2**20, extra
    assert extra[1] < 120_000 * 256 / 4, extra
