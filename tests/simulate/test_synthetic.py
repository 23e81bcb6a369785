"""Synthetic hordes: seeded, valid row by row, and shaped as their options say."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vecsched import load_snapshot
from vecsched.snapshot.schema import CHAT_NONE, IMAGE, JOB_PROCESSING, TEXT
from vecsched.core.rules import IMAGE_BRIDGE, ONLINE_WINDOW_SECONDS, parse_bridge_agents
from vecsched.cli import main as cli_main
from vecsched.synthetic import DEFAULT_NOW, REQUEST_LIFETIME, SHAPE_DEFAULTS, horde, shape_options

def _reference_names() -> tuple[set[str], set[str]]:
    from importlib import resources

    data = resources.files("vecsched.data")
    with data.joinpath("text_models.csv").open() as fh:
        text = set(pd.read_csv(fh)["name"])
    with data.joinpath("image_models.csv").open() as fh:
        image = set(pd.read_csv(fh)["name"])
    return text, image


@pytest.fixture(scope="module")
def big():
    """A horde large enough for shares to settle near their configured values."""
    return horde(workers=3000, requests=40_000, seed=11)


# -- determinism and sizes ----------------------------------------------------------------


def test_same_inputs_same_snapshot():
    a = horde(workers=40, requests=300, seed=3, chat_share=0.6)
    b = horde(workers=40, requests=300, seed=3, chat_share=0.6)
    assert a.to_dict() == b.to_dict()


def test_other_seed_or_shape_other_snapshot():
    base = horde(workers=40, requests=300, seed=3).to_dict()
    assert horde(workers=40, requests=300, seed=4).to_dict() != base
    assert horde(workers=40, requests=300, seed=3, chat_share=0.9).to_dict() != base


@pytest.mark.parametrize("workers,requests", [(0, 0), (0, 50), (7, 0), (1, 1), (150, 3000)])
def test_sizes(workers, requests):
    snap = horde(workers=workers, requests=requests, seed=1)
    assert len(snap.workers) == workers
    assert len(snap.requests) == requests
    assert snap.rejected == ()
    if workers == 0:
        assert len(snap.jobs) == 0 and len(snap.excluded_pairs) == 0


def test_default_now_and_given_now():
    assert horde(5, 5).now == DEFAULT_NOW
    snap = horde(5, 20, now="2026-01-01T00:00:00Z")
    assert snap.now == pd.Timestamp("2026-01-01T00:00:00Z").timestamp()
    assert (snap.requests.created <= snap.now).all()


# -- validity ------------------------------------------------------------------------------


def _check_valid(snap) -> None:
    """Every column within its valid range and every cross reference resolvable."""
    assert snap.rejected == ()
    now = snap.now
    w, r, j = snap.workers, snap.requests, snap.jobs
    text_names, image_names = _reference_names()

    # workers
    assert ((w.threads >= 1) & (w.threads <= 50)).all()
    assert (np.isnan(w.speed) | (w.speed > 0)).all()
    assert (w.last_check_in <= now).all()
    is_text = w.gentype == TEXT
    assert (w.models.lengths >= 1).all()
    for gentype, names in ((TEXT, text_names), (IMAGE, image_names)):
        rows = w.gentype == gentype
        assert set(snap.model_names[w.models.take(rows).values]) <= names
    assert ((w.max_length[is_text] >= 80) & (w.max_length[is_text] <= 512)).all()
    ctx = w.max_context_length[is_text]
    assert ((ctx >= 1024) & (ctx <= 32768)).all()
    assert ((w.chat_max_length[is_text] >= 80) & (w.chat_max_length[is_text] <= 512)).all()
    none = is_text & (w.chat_mode == CHAT_NONE)
    assert (w.chat_max_length[none] == w.max_length[none]).all()
    assert (w.max_pixels[~is_text] >= 512 * 512).all()
    names, versions = parse_bridge_agents(w.bridge_agent)
    regen = names == IMAGE_BRIDGE
    assert not regen[is_text].any()
    assert ((versions[regen] >= 1) & (versions[regen] <= 9)).all()

    # requests
    rt = r.gentype == TEXT
    assert ((r.n >= 0) & (r.n <= np.where(rt, 4, 8))).all()
    assert (r.jobs >= r.n).all()
    assert np.allclose(r.expiry - r.created, REQUEST_LIFETIME)
    assert (r.created <= now).all() and (r.created >= now - REQUEST_LIFETIME - 600).all()
    assert ((r.max_length[rt] >= 80) & (r.max_length[rt] <= 512)).all()
    assert ((r.max_context_length[rt] >= 1024) & (r.max_context_length[rt] <= 16384)).all()
    assert not r.is_chat[~rt].any() and not r.validated_backends[~rt].any()
    assert ((r.width[~rt] >= 512) & (r.height[~rt] >= 512) & (r.steps[~rt] >= 1)).all()
    assert (r.worker_ids.lengths <= 5).all()
    assert not r.worker_blacklist[r.worker_ids.lengths == 0].any()
    all_names = text_names | image_names
    assert set(snap.model_names[r.models.values]) <= all_names
    for gentype, names in ((TEXT, text_names), (IMAGE, image_names)):
        assert set(snap.model_names[r.models.take(r.gentype == gentype).values]) <= names
    worker_gentype = dict(zip(w.id.tolist(), w.gentype.tolist()))
    target_owner = r.worker_ids.owners()
    for row, wid in zip(target_owner.tolist(), r.worker_ids.values.tolist()):
        assert worker_gentype[wid] == r.gentype[row]

    # jobs: on online, unpaused workers of the request's gentype, started after creation
    request_row = {rid: k for k, rid in enumerate(r.id.tolist())}
    worker_row = {wid: k for k, wid in enumerate(w.id.tolist())}
    for rid, wid, started in zip(j.request_id.tolist(), j.worker_id.tolist(), j.started.tolist()):
        rk, wk = request_row[rid], worker_row[wid]
        assert w.gentype[wk] == r.gentype[rk]
        assert now - w.last_check_in[wk] <= ONLINE_WINDOW_SECONDS and not w.paused[wk]
        assert r.created[rk] <= started <= now
    # excluded pairs name known rows of one gentype
    for wid, rid in zip(snap.excluded_pairs.worker_id.tolist(), snap.excluded_pairs.request_id.tolist()):
        assert w.gentype[worker_row[wid]] == r.gentype[request_row[rid]]


def test_default_horde_is_valid():
    _check_valid(horde())


def test_big_horde_is_valid(big):
    _check_valid(big)


share_option = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=30, deadline=None)
@given(
    workers=st.integers(0, 25),
    requests=st.integers(0, 120),
    seed=st.integers(0, 2**32 - 1),
    text_share=share_option,
    text_request_share=share_option,
    chat_share=share_option,
    targeted_share=share_option,
    unsampled_share=share_option,
    offline_share=share_option,
    jobs_in_flight_share=share_option,
    excluded_pair_share=share_option,
    zero_n_share=share_option,
    zipf_exponent=st.floats(min_value=0.05, max_value=4.0),
    text_model_pool=st.integers(1, 200),
    image_model_pool=st.integers(1, 160),
)
def test_any_shape_gives_valid_rows(workers, requests, seed, **shape):
    _check_valid(horde(workers, requests, seed, **shape))


def test_json_round_trip(tmp_path):
    snap = horde(workers=30, requests=200, seed=5, jobs_in_flight_share=0.3, excluded_pair_share=0.05)
    doc = snap.to_dict()
    assert doc["jobs"] and doc["excluded_pairs"]
    assert load_snapshot(doc).to_dict() == doc
    path = tmp_path / "snap.json"
    snap.to_json(path)
    again = load_snapshot(path)
    assert again.rejected == ()
    assert again.to_dict() == json.loads(json.dumps(doc))


def test_cli_synth_writes_the_same_horde(tmp_path):
    out = tmp_path / "h.json"
    assert cli_main(["synth", "--workers", "20", "--requests", "100", "--seed", "4", "-o", str(out)]) == 0
    assert load_snapshot(out).to_dict() == horde(workers=20, requests=100, seed=4).to_dict()


# -- shape ---------------------------------------------------------------------------------


def test_shares_near_their_defaults(big):
    w, r = big.workers, big.requests
    online = big.now - w.last_check_in <= ONLINE_WINDOW_SECONDS
    rt = r.gentype == TEXT
    d = SHAPE_DEFAULTS
    assert (w.gentype == TEXT).mean() == pytest.approx(d["text_share"], abs=0.03)
    assert np.isnan(w.speed).mean() == pytest.approx(d["unsampled_share"], abs=0.02)
    assert (~online).mean() == pytest.approx(d["offline_share"], abs=0.02)
    assert w.paused.mean() == pytest.approx(d["paused_share"], abs=0.01)
    assert w.maintenance.mean() == pytest.approx(d["maintenance_share"], abs=0.01)
    assert rt.mean() == pytest.approx(d["text_request_share"], abs=0.01)
    assert r.is_chat[rt].mean() == pytest.approx(d["chat_share"], abs=0.02)
    assert (r.models.lengths == 0).mean() == pytest.approx(d["any_model_share"], abs=0.01)
    assert (r.worker_ids.lengths > 0).mean() == pytest.approx(d["targeted_share"], abs=0.005)
    assert (~r.slow_workers).mean() == pytest.approx(d["no_slow_share"], abs=0.01)
    assert (r.n == 0).mean() == pytest.approx(d["zero_n_share"], abs=0.003)
    assert (r.expiry <= big.now).mean() == pytest.approx(d["expired_share"], abs=0.003)
    assert (~r.active).mean() == pytest.approx(d["inactive_share"], abs=0.003)
    with_jobs = np.unique(pd.Index(r.id).get_indexer(big.jobs.request_id))
    assert len(with_jobs) / len(r) == pytest.approx(d["jobs_in_flight_share"] + d["zero_n_share"], abs=0.01)
    assert (big.jobs.state == JOB_PROCESSING).mean() > 0.7
    assert len(big.excluded_pairs) / len(r) == pytest.approx(d["excluded_pair_share"], abs=0.002)


def test_shares_follow_options():
    snap = horde(workers=400, requests=8000, seed=2, text_share=0.9, chat_share=0.8, targeted_share=0.2,
                 any_model_share=0.0, unsampled_share=0.5)  # fmt: skip
    w, r = snap.workers, snap.requests
    assert (w.gentype == TEXT).mean() == pytest.approx(0.9, abs=0.05)
    assert np.isnan(w.speed).mean() == pytest.approx(0.5, abs=0.07)
    assert r.is_chat[r.gentype == TEXT].mean() == pytest.approx(0.8, abs=0.03)
    assert (r.worker_ids.lengths > 0).mean() == pytest.approx(0.2, abs=0.02)
    assert (r.models.lengths == 0).sum() == 0


def test_workers_look_like_volunteers(big):
    w = big.workers
    text, image = w.gentype == TEXT, w.gentype == IMAGE
    lengths = w.models.lengths
    assert (lengths[text] == 1).mean() > 0.75 and (lengths[text] > 1).any()
    assert np.median(lengths[image]) >= 10
    ts = w.speed[text & ~np.isnan(w.speed)]
    assert 1.5 < np.quantile(ts, 0.05) and np.quantile(ts, 0.95) < 70
    assert (ts < 5).mean() > 0.03  # a tail below the speed floors
    ims = w.speed[image & ~np.isnan(w.speed)]
    assert 1e5 < np.quantile(ims, 0.05) and np.quantile(ims, 0.95) < 6e6
    assert (w.threads == 1).mean() > 0.6 and (w.threads > 4).any()
    names, versions = parse_bridge_agents(w.bridge_agent)
    assert (names[image] == IMAGE_BRIDGE).mean() > 0.9
    assert set(np.unique(versions[image & (names == IMAGE_BRIDGE)])) == set(range(1, 10))


def test_model_popularity_is_skewed(big):
    r = big.requests
    single = r.models.take(r.models.lengths == 1).values
    counts = np.sort(np.bincount(single))[::-1]
    counts = counts[counts > 0]
    # Zipf-like: the top model far above the median model.
    assert counts[0] > 10 * np.median(counts)
    flat = horde(workers=3000, requests=40_000, seed=11, zipf_exponent=0.05).requests
    flat_counts = np.bincount(flat.models.take(flat.models.lengths == 1).values)
    assert flat_counts.max() / len(flat) < counts[0] / len(r) / 3


def test_some_requests_name_a_model_nobody_serves(big):
    w, r = big.workers, big.requests
    served = set(w.models.values.tolist())
    named = r.models.values
    unserved_rows = np.unique(r.models.owners()[~np.isin(named, list(served))])
    share = len(unserved_rows) / len(r)
    assert 0.5 * SHAPE_DEFAULTS["unserved_model_share"] < share < 3 * SHAPE_DEFAULTS["unserved_model_share"]


def test_priorities_and_ages_spread(big):
    r = big.requests
    assert (r.extra_priority == 0).mean() > 0.5
    # a long tail of kudos-based priorities
    assert r.extra_priority.max() > 100 * np.median(r.extra_priority[r.extra_priority > 0])
    age = big.now - r.created
    assert (age < 300).mean() > 0.3 and (age > 900).mean() > 0.05


# -- options checking ------------------------------------------------------------------------


def test_shape_options_are_checked():
    with pytest.raises(TypeError, match="unknown shape option 'chat_shar'"):
        horde(5, 5, chat_shar=0.1)
    with pytest.raises(ValueError, match="chat_share"):
        horde(5, 5, chat_share=1.5)
    with pytest.raises(TypeError):
        horde(5, 5, chat_share=True)
    with pytest.raises(ValueError, match="zipf_exponent"):
        horde(5, 5, zipf_exponent=0)
    with pytest.raises(ValueError, match="text_model_pool"):
        horde(5, 5, text_model_pool=0)
    with pytest.raises(TypeError, match="image_model_pool"):
        horde(5, 5, image_model_pool=2.5)
    with pytest.raises(ValueError, match="sum to at most 1"):
        horde(5, 5, any_model_share=0.6, several_models_share=0.6)
    with pytest.raises(ValueError, match="workers"):
        horde(-1, 5)
    assert shape_options() == SHAPE_DEFAULTS


def test_maintenance_owners_send_requests():
    def owner_share(**shape):
        snap = horde(workers=300, requests=6000, seed=8, maintenance_share=0.1, **shape)
        w, r = snap.workers, snap.requests
        owners = np.unique(w.user_id[w.maintenance])
        return np.isin(r.user_id, owners).mean()

    assert owner_share(owner_request_share=0.2) == pytest.approx(0.2, abs=0.03)
    assert owner_share(owner_request_share=0.0) < 0.05
