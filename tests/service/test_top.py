"""``vecsched top``, the prospective answer's reason and rounding, and the image wait on ``run``."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from vecsched.cli import main
from vecsched.service.job import run_cycle
from vecsched.service.payload import encode_payloads
from vecsched.service.store.base import Cycle
from vecsched.service.store.sql import SQLStore
from vecsched.service.read import clear_state_cache, prospective
from vecsched.service.top import current_payloads, top_frame
from vecsched.synthetic import horde


def _publish(store, est, t: float) -> None:
    ids, payloads = encode_payloads(est, t)
    store.publish(Cycle(t, 5.0, ids + ["gone"], payloads + ['{"ended":"done"}']))


@pytest.fixture(params=["sql", "redis"])
def store(request, tmp_path: Path):
    if request.param == "redis":
        return request.getfixturevalue("redis_store")
    return SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")


def test_top_orders_by_wait_unknown_last(store, make_estimates) -> None:
    now = time.time()
    est = make_estimates(now, ["a", "b", "c", "d"], wait_time=[5.0, math.nan, 90.0, 30.0],
                         gentype=[0, 0, 1, 0], queue_position=[1, 0, 7, 3])
    _publish(store, est, now)
    reading, payloads = current_payloads(store)
    assert reading.time == now and set(payloads) == {"a", "b", "c", "d", "gone"}
    assert list(top_frame(payloads).index) == ["c", "d", "a", "b"]  # ended requests are not listed
    assert list(top_frame(payloads, gentype="text").index) == ["d", "a", "b"]
    assert list(top_frame(payloads, limit=2).index) == ["c", "d"]
    frame = top_frame(payloads)
    assert list(frame.columns[:5]) == ["gentype", "queue_position", "wait_time", "eligible_workers", "fallback"]


def test_top_cli_table_and_json(tmp_path: Path, capsys, make_estimates) -> None:
    url = f"sqlite:///{tmp_path / 'pub.sqlite'}"
    now = time.time()
    _publish(SQLStore(url), make_estimates(now, ["a", "b"], wait_time=[5.0, math.nan]), now)
    assert main(["top", "--db", url]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("cycle ") and "wait_time" in table[1]
    assert table[-2].startswith("a ") and table[-1].startswith("b ") and "unknown" in table[-1]
    assert main(["top", "--db", url, "--json", "-n", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == [{
        "id": "a", "gentype": "text", "queue_position": 1, "wait_time": 5.0, "eligible_workers": 2,
        "fallback": False}]


def test_top_before_any_cycle(tmp_path: Path, capsys) -> None:
    assert main(["db", "init", "--db", f"sqlite:///{tmp_path / 'e.sqlite'}"]) == 0
    assert main(["top", "--db", f"sqlite:///{tmp_path / 'e.sqlite'}"]) == 1
    assert "no cycle was published yet" in capsys.readouterr().err


@pytest.fixture
def published(tmp_path: Path):
    clear_state_cache()
    store = SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")
    snap = horde(workers=60, requests=400, seed=4)
    assert run_cycle(lambda now: snap, store, lambda: snap.now).ok
    return store, snap


def test_prospective_says_why_it_is_empty(published) -> None:
    store, snap = published
    nobody = prospective({"gentype": "text", "models": ["no/such-model"]}, store=store, now=snap.now)
    assert nobody["eligible_workers"] == 0 and nobody["reason"] == "no online text worker serves no/such-model"
    model = snap.model_lists("workers")[0][0]
    gentype = snap.to_dict()["workers"][0]["gentype"]
    gated = prospective({"gentype": gentype, "models": [model], "worker_ids": ["nobody"]},
                        store=store, now=snap.now)
    assert gated["eligible_workers"] == 0
    assert gated["reason"] == "no online worker that serves the model passes the request's other gates"
    fine = prospective({"gentype": gentype, "models": [model]}, store=store, now=snap.now)
    assert fine["eligible_workers"] > 0 and "reason" not in fine


def test_prospective_rounds_ahead_wait_to_3_decimals(published) -> None:
    store, snap = published
    waits = []
    for model in {m for ms in snap.model_lists("workers") for m in ms}:
        got = prospective({"gentype": "text", "models": [model]}, store=store, now=snap.now)
        if got.get("ahead_wait") is not None:
            waits.append(got["ahead_wait"])
    assert waits and any(w != int(w) for w in waits)
    assert all(w == round(w, 3) for w in waits)


@pytest.mark.parametrize("how", ["flag", "env", "off"])
def test_run_takes_the_eligible_image_wait(tmp_path: Path, monkeypatch, how: str) -> None:
    clear_state_cache()
    monkeypatch.delenv("VECSCHED_ELIGIBLE_IMAGE_WAIT", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    src = tmp_path / "now.json"
    snap = horde(workers=60, requests=400, seed=4, now=time.time())
    snap.to_json(src)
    assert main(["db", "load", str(src), "--db", url]) == 0
    argv = ["run", "--once", "--db", url]
    if how == "flag":
        argv.append("--eligible-image-wait")
    elif how == "env":
        monkeypatch.setenv("VECSCHED_ELIGIBLE_IMAGE_WAIT", "1")
    assert main(argv) == 0
    image_models = [m for g, ms in zip(snap.to_dict()["workers"], snap.model_lists("workers"))
                    if g["gentype"] == "image" for m in ms]
    got = prospective({"gentype": "image", "models": [image_models[0]]}, store=SQLStore(url))
    assert got["eligible_workers"] > 0
    # horde-wide image waits leave the eligibility-aware ahead_wait out
    assert (got["ahead_wait"] is not None) == (how != "off")
