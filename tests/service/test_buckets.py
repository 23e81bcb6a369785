"""The status layouts on the real Redis: the packed string, one field per request, the older bucketed hash."""

from __future__ import annotations

import os

import redis as redis_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vecsched.service.store.base import Cycle
from vecsched.service.store.redis import RedisStore
from vecsched.service.store.buckets import id_hash, id_hashes
from vecsched.service.store.packed import HEADER, PER_BUCKET, pack_status

# Request ids as the horde has them, and odd ones: unicode, separators, varied lengths.
REDIS_BASE = os.environ.get("VECSCHED_TEST_REDIS", "redis://127.0.0.1:6379/0")

_ids = st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=60, unique=True)


@given(_ids)
def test_bulk_hashes_equal_the_scalar_hash(ids) -> None:
    assert [int(h) for h in id_hashes(ids)] == [id_hash(i) for i in ids]


@given(_ids)
def test_every_request_lands_in_its_hash_bucket_once(ids) -> None:
    payloads = [f"[{k},null]" for k in range(len(ids))]
    got = pack_status(ids, payloads)
    if any(c in i for i in ids for c in "\n\t\x00"):
        assert got is None
        return
    size, pieces = got
    data = b"".join(pieces)
    assert len(data) == size
    _, n_buckets, offset_digits, row_digits, width, at_index, at_rows = data[:HEADER].split()
    n_buckets, offset_digits, row_digits, width = int(n_buckets), int(offset_digits), int(row_digits), int(width)
    assert n_buckets == -(-len(ids) // PER_BUCKET)
    offsets = [int(data[HEADER + b * offset_digits : HEADER + (b + 1) * offset_digits]) for b in range(n_buckets + 1)]
    index = data[int(at_index) : int(at_rows)]
    seen = {}
    for b in range(n_buckets):
        for entry in index[offsets[b] : offsets[b + 1]].decode("utf-8").split("\n")[1:]:
            rid, row = entry.split("\t")
            assert id_hash(rid) % n_buckets == b and len(row) == row_digits
            at = int(at_rows) + int(row) * width
            seen[rid] = data[at : at + width].replace(b"\0", b"").decode()
    assert seen == {rid: "\t" + payload for rid, payload in zip(ids, payloads)}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=_ids)
def test_packed_cycle_reads_back_every_request(redis_prefix, ids) -> None:
    """Packed, or one field per request when an id holds a separator: every read the same."""
    store = RedisStore(REDIS_BASE, prefix=redis_prefix, chunk=7)
    try:
        payloads = [f"[1,{k}.5,\"x\"]" for k in range(len(ids))]
        assert store.publish(Cycle(100.0, 5.0, ids, payloads))
        for rid, payload in zip(ids, payloads):
            assert store.read_status(rid).value == payload
        assert store.read_status("never-" + ids[0]).value is None
        assert store.payloads(store.read_current().cycle_id) == dict(zip(ids, payloads))
        for rid in ids:  # an id that is another's prefix or suffix must not match it
            assert store.read_status(rid[:-1] or "z").value in (None, *[p for r, p in zip(ids, payloads) if r == (rid[:-1] or "z")])
    finally:
        store.drop_all()
        store.close()


def test_unbucketed_layout_reads_the_same(redis_prefix) -> None:
    store = RedisStore(REDIS_BASE, prefix=redis_prefix, bucketed=False)
    try:
        assert store.publish(Cycle(100.0, 5.0, ["a", "b"], ["[1]", "[2]"]))
        assert store.client.hget(f"{redis_prefix}:c:{store.read_current().cycle_id}:s", "a") == b"[1]"
        assert store.read_status("b").value == "[2]" and store.read_status("c").value is None
        assert store.payloads(store.read_current().cycle_id) == {"a": "[1]", "b": "[2]"}
    finally:
        store.drop_all()
        store.close()


def test_a_cycle_in_the_older_bucketed_hash_reads_back(redis_prefix) -> None:
    """A cycle published before the packed layout (field ``#``: the bucket count) still reads."""
    store = RedisStore(REDIS_BASE, prefix=redis_prefix)
    try:
        ids, payloads = [f"r{k}" for k in range(40)], [f"[{k},1.5]" for k in range(40)]
        fields: dict[str, str] = {"#": "3"}
        for rid, payload in zip(ids, payloads):
            name = str(id_hash(rid) % 3)
            fields[name] = fields.get(name, "") + f"\n{rid}\t{payload}"
        cycle_id = "100.0|5.0|0a1b2c3d"
        store.client.hset(f"{redis_prefix}:c:{cycle_id}:s", mapping=fields)
        store.client.set(f"{redis_prefix}:current", cycle_id)
        for rid, payload in zip(ids, payloads):
            assert store.read_status(rid).value == payload
        assert store.read_status("r40").value is None and store.read_status("r4").value == "[4,1.5]"
        assert store.payloads(cycle_id) == dict(zip(ids, payloads))
    finally:
        store.drop_all()
        store.close()


def test_a_failed_write_raises_and_never_switches(redis_prefix) -> None:
    class FailsAfterStatus(RedisStore):
        """An error reply among the cycle's writes, after the whole status string was sent."""

        def _status_commands(self, conn, cycle, key, ttl):
            yield from super()._status_commands(conn, cycle, key, ttl)
            yield 1, conn.pack_command("HSET", key, "x", "1")  # WRONGTYPE: the key holds a string

    store = FailsAfterStatus(REDIS_BASE, prefix=redis_prefix)
    try:
        good = RedisStore(REDIS_BASE, prefix=redis_prefix)
        assert good.publish(Cycle(100.0, 5.0, ["a"], ["[1]"]))
        good.close()
        later = Cycle(200.0, 5.0, ["a", "b"], ["[3]", "[4]"])
        try:
            store.publish(later)
        except redis_lib.ResponseError:
            pass
        else:
            raise AssertionError("HSET on a string must fail")
        assert store.read_status("a").value == "[1]"
        assert store.read_current().cycle_id != later.id
        assert store.client.ping()
    finally:
        store.drop_all()
        store.close()


def test_long_ids_hash_alike_in_the_read_script(redis_prefix) -> None:
    """The script hashes an id 64 bytes at a time: ids of 63 to 2,000 bytes, packed and one field each."""
    store = RedisStore(REDIS_BASE, prefix=redis_prefix)
    try:
        ids = ["é" * 40, "x" * 63, "y" * 64, "z" * 65, "w" * 2000] + [f"r{k}" for k in range(30)]
        payloads = [f"[{k}]" for k in range(len(ids))]
        for odd in ([], ["a\tb"]):  # packed; a tab in an id: one field per request
            assert store.publish(Cycle(100.0 + len(odd), 5.0, ids + odd, payloads + ["[-1]"] * len(odd)))
            for rid, payload in zip(ids, payloads):
                assert store.read_status(rid).value == payload
            assert store.read_status("x" * 64).value is None
    finally:
        store.drop_all()
        store.close()


def test_a_payload_holding_nul_reads_back_whole(redis_prefix) -> None:
    """Packed rows lose their NUL padding in the reader; a payload of the per-request layout keeps its NULs."""
    store = RedisStore(REDIS_BASE, prefix=redis_prefix)
    try:
        assert store.publish(Cycle(100.0, 5.0, ["a", "b"], ["[1]", "[\x00]"]))
        assert store.read_status("b").value == "[\x00]" and store.read_status("a").value == "[1]"
    finally:
        store.drop_all()
        store.close()
