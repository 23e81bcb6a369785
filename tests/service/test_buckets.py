"""Bucketed payloads in the status hash, on the real Redis."""

from __future__ import annotations

import os

import redis as redis_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vecsched.service.store.base import Cycle
from vecsched.service.store.redis import RedisStore
from vecsched.service.store.buckets import BUCKET_SIZE, bucket_fields, id_hash, id_hashes

# Request ids as the horde has them, and odd ones: unicode, separators, varied lengths.
REDIS_BASE = os.environ.get("VECSCHED_TEST_REDIS", "redis://127.0.0.1:6379/0")

_ids = st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=60, unique=True)


@given(_ids)
def test_bulk_hashes_equal_the_scalar_hash(ids) -> None:
    assert [int(h) for h in id_hashes(ids)] == [id_hash(i) for i in ids]


@given(_ids)
def test_every_request_lands_in_its_hash_bucket_once(ids) -> None:
    payloads = [f"[{k},null]" for k in range(len(ids))]
    got = bucket_fields(ids, payloads)
    if any(c in i for i in ids for c in "\n\t\x00"):
        assert got is None
        return
    names, values = got
    assert names[0] == b"#"
    n_buckets = int(values[0])
    assert n_buckets == -(-len(ids) // BUCKET_SIZE)
    seen = {}
    for name, blob in zip(names[1:], values[1:]):
        for entry in blob.decode("utf-8").split("\n")[1:]:
            rid, payload = entry.split("\t")
            assert id_hash(rid) % n_buckets == int(name)
            seen[rid] = payload
    assert seen == dict(zip(ids, payloads))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=_ids)
def test_bucketed_cycle_reads_back_every_request(redis_prefix, ids) -> None:
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


def test_a_failed_write_raises_and_never_switches(redis_prefix) -> None:
    store = RedisStore(REDIS_BASE, prefix=redis_prefix)
    try:
        assert store.publish(Cycle(100.0, 5.0, ["a"], ["[1]"]))
        # The next cycle's status key already holds a string: its HSET fails.
        later = Cycle(200.0, 5.0, ["a", "b"], ["[3]", "[4]"])
        store.client.set(f"{redis_prefix}:c:{later.id}:s", "not a hash")
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
