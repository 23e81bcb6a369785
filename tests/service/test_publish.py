"""Cycle publication on the real Redis and SQL: whole cycles only, pointer switch, expiry, faults."""

from __future__ import annotations

import math
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vecsched.service.store.base import Cycle, parse_cycle_id

from vecsched.service.store.redis import RedisStore

from vecsched.service.store.sql import SQLStore

from vecsched.service.payload import decode_payload, encode_payloads
from vecsched.service.store.packed import pack_status


def _cycle(make_estimates, t: float, ids: list[str], mark: int, interval: float = 5.0) -> Cycle:
    """A cycle whose every figure says ``mark``, so a mixed read is visible."""
    est = make_estimates(t, ids, queue_position=mark, eligible_workers=mark, wait_time=float(mark))
    rids, payloads = encode_payloads(est, t)
    return Cycle(t, interval, rids, payloads, horde={"mark": mark}, prospective=b"state-%d" % mark)


@pytest.fixture(params=["redis", "sql"])
def store(request, tmp_path):
    if request.param == "redis":
        return request.getfixturevalue("redis_store")
    return SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")


def test_payload_round_trip(make_estimates) -> None:
    est = make_estimates(1000.5, ["a", "b"], wait_time=[12.3456, float("nan")], gentype=[0, 1],
                         fallback=[True, False], queue_position=[0, 7])
    ids, payloads = encode_payloads(est, 1000.5)
    assert ids == ["a", "b"]
    a, b = (decode_payload(p) for p in payloads)
    assert a["cycle_time"] == 1000.5 and b["cycle_time"] == 1000.5
    assert a["wait_time"] == 12.346 and b["wait_time"] is None
    assert (a["gentype"], b["gentype"]) == ("text", "image")
    assert (a["fallback"], b["fallback"]) == (True, False)
    assert (a["queue_position"], b["queue_position"]) == (0, 7)
    assert all(len(p) < 90 for p in payloads)


def test_payload_carries_each_request_s_kudos_from_the_snapshot(make_estimates) -> None:
    from types import SimpleNamespace

    import numpy as np

    est = make_estimates(10.0, ["a", "b"])
    est = SimpleNamespace(request_id=est.request_id, columns=est.columns, request_index=np.array([2, 0]))
    requests = SimpleNamespace(kudos=np.array([1.5, 99.0, 12.25]))
    _, payloads = encode_payloads(est, 10.0, requests)
    assert [decode_payload(p)["kudos"] for p in payloads] == [12.25, 1.5]
    # without the request table kudos is 0; a version-2 payload has no kudos at all
    assert decode_payload(encode_payloads(est, 10.0)[1][0])["kudos"] == 0.0
    assert "kudos" not in decode_payload("[2,1.0,0,0,0,0,0,null,null,0,null,0,0,0,0,0,0,-1,0,0,0,0,null,null]")


def test_publish_then_read(store, make_estimates) -> None:
    assert store.read_status("r1") is None
    assert store.publish(_cycle(make_estimates, 100.0, ["r1", "r2"], 1))
    got = store.read_status("r2")
    assert got.time == 100.0 and got.interval == 5.0
    assert decode_payload(got.value)["queue_position"] == 1
    assert store.read_status("missing").value is None
    assert store.read_prospective().value == b"state-1"
    assert store.read_meta().value == {"horde": {"mark": 1}, "requests": 2}
    assert store.publish(_cycle(make_estimates, 105.0, ["r2"], 2))
    assert decode_payload(store.read_status("r2").value)["queue_position"] == 2
    assert store.read_status("r1").value is None  # gone with its cycle
    assert store.read_prospective().value == b"state-2"


def test_an_older_cycle_never_replaces_a_newer_one(store, make_estimates) -> None:
    assert store.publish(_cycle(make_estimates, 200.0, ["r"], 2))
    assert not store.publish(_cycle(make_estimates, 150.0, ["r"], 1))
    assert store.read_status("r").time == 200.0


def test_redis_old_cycle_expires_after_grace(redis_store, make_estimates) -> None:
    first = _cycle(make_estimates, 100.0, ["r"], 1)
    redis_store.publish(first)
    keys = [f"{redis_store.prefix}:c:{first.id}:{s}" for s in "smp"]
    assert all(redis_store.client.ttl(k) == -1 for k in keys)  # current: persistent
    redis_store.publish(_cycle(make_estimates, 105.0, ["r"], 2))
    ttls = [redis_store.client.ttl(k) for k in keys]
    assert all(0 < t <= 10 for t in ttls), ttls


def test_redis_unswitched_keys_expire_on_their_own(private_redis, make_estimates) -> None:
    """Redis stops between writing a cycle's keys and switching the pointer: after the
    restart the reader still gets the old cycle, and the orphan keys carry a TTL."""

    class StopsBeforeSwitch(RedisStore):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            inner = self._switch

            def switch(*args, **kwargs):
                if self.stop_now:
                    private_redis.stop()
                return inner(*args, **kwargs)

            self._switch = switch
            self.stop_now = False

    store = StopsBeforeSwitch(private_redis.url, prefix="p")
    store.publish(_cycle(make_estimates, 100.0, ["r1", "r2"], 1))
    store.stop_now = True
    second = _cycle(make_estimates, 105.0, ["r1", "r2", "r3"], 2)
    with pytest.raises(Exception):
        store.publish(second)
    private_redis.start()
    reader = RedisStore(private_redis.url, prefix="p")
    got = reader.read_status("r1")
    assert got.time == 100.0 and decode_payload(got.value)["queue_position"] == 1
    assert reader.read_status("r3").value is None
    orphan = f"p:c:{second.id}:s"
    assert reader.client.exists(orphan) and reader.client.ttl(orphan) > 0


def test_readers_only_ever_see_whole_cycles(store, make_estimates) -> None:
    ids = [f"r{k}" for k in range(3000)]
    cycles = [_cycle(make_estimates, 1000.0 + k, ids, k + 1) for k in range(6)]
    store.publish(cycles[0])
    seen: list[tuple[float, int, float]] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        k = 0
        try:
            while not done.is_set() or k < 50:
                got = store.read_status(ids[(k * 7919) % len(ids)])
                figures = decode_payload(got.value)
                seen.append((got.time, figures["queue_position"], figures["cycle_time"]))
                k += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for cycle in cycles[1:]:
        store.publish(cycle)
    done.set()
    thread.join(timeout=60)
    assert not errors
    assert seen
    for pointer_time, mark, payload_time in seen:
        # the payload belongs to the cycle the pointer names, and says so
        assert payload_time == pointer_time
        assert mark == int(pointer_time - 1000.0) + 1
    # cycle times only move forward for a reader
    times = [s[0] for s in seen]
    assert times == sorted(times)


def test_cycle_id_carries_time_and_interval() -> None:
    c = Cycle(1700000000.123456, 2.5, [], [])
    assert parse_cycle_id(c.id)[:2] == (1700000000.123456, 2.5)
    assert Cycle(1.0, 1.0, [], []).id != Cycle(1.0, 1.0, [], []).id


def test_sql_store_on_postgresql(pg_url, make_estimates) -> None:
    store = SQLStore(pg_url)
    store.publish(_cycle(make_estimates, 10.0, ["a"], 1))
    store.publish(_cycle(make_estimates, 11.0, ["a", "b"], 2))
    assert decode_payload(store.read_status("b").value)["queue_position"] == 2
    assert store.read_prospective().value == b"state-2"
    store.close()


def _interpreter_calls(fn) -> int:
    """Python-level calls (and C calls made from Python code) while ``fn`` runs."""
    count = 0

    def profile(frame, event, arg) -> None:
        nonlocal count
        count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def test_encoding_has_no_per_request_python_step(make_estimates) -> None:
    """The encoder's work per request is NumPy's: ten times the requests, the same
    number of interpreter calls (a per-request loop would add thousands), whether
    the payloads are read as str or written into the packed layout."""

    def est(n: int):
        rng = np.random.default_rng(n)
        wait = rng.exponential(300.0, n)
        wait[::7] = np.nan
        return make_estimates(5.0, [f"r{k}" for k in range(n)], wait_time=wait, ahead_wait=wait / 3,
                              queue_position=rng.integers(0, n, n), gentype=rng.integers(0, 2, n))

    small, large = est(400), est(4000)
    for run in (lambda e: list(encode_payloads(e, 5.0)[1]),  # formatted when read
                lambda e: list(pack_status(*encode_payloads(e, 5.0))[1])):  # formatted a run at a time
        run(small)  # first-call imports and caches out of the count
        grows = _interpreter_calls(lambda: run(large)) - _interpreter_calls(lambda: run(small))
        assert grows < 100, grows


_ints = st.integers(min_value=-(10**12), max_value=10**12)
_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e6, max_value=1e6),
    st.sampled_from([0.0, -0.0, 0.0005, 0.0015, 2.675, 0.1, 1e15, 999999999999999.9, 1e16]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_vectorized_payloads_decode_to_the_rounded_figures(make_estimates, data) -> None:
    """Whatever the numbers, each payload is valid JSON whose values are the request's
    own figures (floats as np.round(x, 3); NaN and the infinities as null)."""
    n = data.draw(st.integers(min_value=1, max_value=12))
    ints = {name: data.draw(st.lists(_ints, min_size=n, max_size=n)) for name in
            ("eligible_workers", "queue_position", "horde_queue_position", "waiting", "restarted")}
    floats = {name: data.draw(st.lists(_floats, min_size=n, max_size=n)) for name in
              ("wait_time", "ahead_wait", "horde_wait_time")}
    cycle_time = data.draw(st.floats(min_value=0, max_value=4e9))
    est = make_estimates(cycle_time, [f"id{k}" for k in range(n)], **ints, **floats)
    ids, payloads = encode_payloads(est, cycle_time)
    assert ids == [f"id{k}" for k in range(n)] and len(payloads) == n
    for k, payload in enumerate(payloads):
        got = decode_payload(payload)
        assert got["cycle_time"] == cycle_time
        for name, values in ints.items():
            assert got[name] == values[k] and type(got[name]) is int, name
        for name, values in floats.items():
            x = values[k]
            if not math.isfinite(x):
                assert got[name] is None, (name, x, payload)
            elif abs(x) < 1e15:
                assert got[name] == float(np.round(x, 3)), (name, x, payload)
            else:  # beyond the millisecond's reach in a double: the value itself
                assert got[name] == pytest.approx(round(x, 3), rel=1e-15), (name, x, payload)


class _ExpiresBeforeSwitch(RedisStore):
    """Lets one of the cycle's keys expire (for real, by TTL) just before the switch."""

    def __init__(self, *args, suffix: str = "s", **kwargs):
        super().__init__(*args, **kwargs)
        inner = self._switch

        def switch(keys, args):
            if self.expire_now:
                key = next(k for k in keys[1:] if k.endswith(":" + suffix))
                self.client.pexpire(key, 1)
                while self.client.exists(key):
                    time.sleep(0.002)
            return inner(keys=keys, args=args)

        self._switch = switch
        self.expire_now = False


@pytest.mark.parametrize("suffix", ["s", "p"])
def test_redis_refuses_to_switch_to_a_cycle_whose_keys_expired(redis_prefix, make_estimates, suffix) -> None:
    store = _ExpiresBeforeSwitch("redis://127.0.0.1:6379/0", prefix=redis_prefix, suffix=suffix)
    try:
        assert store.publish(_cycle(make_estimates, 100.0, ["r1", "r2"], 1))
        store.expire_now = True
        with pytest.raises(Exception, match="expired before the switch"):
            store.publish(_cycle(make_estimates, 105.0, ["r1", "r2"], 2))
        # the last good cycle stays current, its figures whole
        got = store.read_status("r2")
        assert got.time == 100.0 and decode_payload(got.value)["queue_position"] == 1
        assert store.read_prospective().value == b"state-1"
    finally:
        store.drop_all()
        store.close()


def test_redis_cycle_of_no_requests_switches(redis_store) -> None:
    """No requests: no status hash (Redis keeps no empty hash), and the switch is fine."""
    assert redis_store.publish(Cycle(100.0, 5.0, [], [], prospective=b"x"))
    assert redis_store.read_status("r").value is None and redis_store.read_status("r").time == 100.0


def _api_problems(path: str) -> list[str]:
    """Public functions/methods of ``path`` lacking type hints or numpydoc sections."""
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read())
    out: list[str] = []

    def check(fn: ast.FunctionDef, owner: str | None = None) -> None:
        name = f"{owner}.{fn.name}" if owner else fn.name
        args = [a for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
        args += [a for a in (fn.args.vararg, fn.args.kwarg) if a is not None]
        if any(a.annotation is None for a in args):
            out.append(f"{name}: argument without a type hint")
        if fn.name == "__init__":
            return  # documented in the class docstring
        if fn.returns is None:
            out.append(f"{name}: no return type hint")
        doc = ast.get_docstring(fn) or ""
        if not doc:
            out.append(f"{name}: no docstring")
            return
        if args and "Parameters\n----------" not in doc:
            out.append(f"{name}: no Parameters section")
        returns_none = isinstance(fn.returns, ast.Constant) and fn.returns.value is None
        if not returns_none and "Returns\n-------" not in doc:
            out.append(f"{name}: no Returns section")
        if owner is None and "Examples\n--------" not in doc:
            out.append(f"{name}: no Examples section")

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            check(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            if "Examples\n--------" not in (ast.get_docstring(node) or ""):
                out.append(f"class {node.name}: no Examples section")
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and (
                        not sub.name.startswith("_") or sub.name in ("__init__", "__call__")):
                    check(sub, node.name)
    return out


@pytest.mark.parametrize("module", ["service/store/redis", "service/store/sql", "service/store/base", "service/payload", "service/config", "service/read", "service/job",
                                    "service/top", "service/demo", "errors", "cli"])
def test_public_api_has_type_hints_and_numpydoc(module) -> None:
    import vecsched

    path = f"{vecsched.__path__[0]}/{module}.py"
    assert _api_problems(path) == []
