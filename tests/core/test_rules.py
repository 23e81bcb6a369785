"""The one image option table (rules.IMAGE_OPTIONS) against the scalar reference's own copy."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from vecsched import reference
from vecsched.core import rules
from vecsched.core.arrays import request_arrays, worker_arrays
from vecsched.snapshot.schema import CHAT_MODES, GENTYPES, SOURCE_PROCESSING
from vecsched.synthetic import horde

# Options on at shares high enough that every one is used in a few hundred requests.
_SHAPE = dict(
    text_request_share=0.0,
    text_share=0.0,
    img2img_share=0.3,
    inpainting_share=0.4,
    lora_share=0.4,
    ti_share=0.3,
    controlnet_share=0.2,
    post_processing_share=0.3,
    hires_fix_share=0.3,
    tiling_share=0.2,
    transparent_share=0.2,
    extra_source_images_share=0.2,
)


def _bits_to_capabilities(bits: int) -> set[str]:
    return {o.capability for o in rules.IMAGE_OPTIONS if bits & int(rules.OPTION_BIT[o.name])}


def test_request_option_bits_match_the_reference_options_array_and_scalar():
    snap = horde(workers=60, requests=800, seed=4, **_SHAPE)
    rq = request_arrays(snap, np.zeros(len(snap.requests), np.int64), pd.Index(snap.workers.id))
    rows = {r["id"]: r for r in reference.prepare(snap).requests}
    used_any = 0
    for k, rid in enumerate(rq.ids.tolist()):
        row = rows[rid]
        expected = {capability for _, _, capability in reference.image_options(row)}
        assert _bits_to_capabilities(int(rq.need_bits[k])) == expected, rid
        # The scalar path the simulator takes reads the same table.
        one = SimpleNamespace(**{**row, "source_processing": SOURCE_PROCESSING.index(row["source_processing"])})
        used = rules.image_options_used(one)
        assert sum(int(bit) for name, bit in rules.OPTION_BIT.items() if used[name]) == int(rq.need_bits[k])
        used_any |= int(rq.need_bits[k])
    assert used_any == (1 << len(rules.IMAGE_OPTIONS)) - 1  # every option was exercised


def test_worker_option_bits_match_the_reference_allow_flags_and_capabilities():
    snap = horde(workers=300, requests=50, seed=9, **_SHAPE)
    wk = worker_arrays(snap, np.zeros(len(snap.workers), np.int64))
    workers = reference.prepare(snap).workers
    served_any = 0
    for k, worker in enumerate(workers):
        assert worker["gentype"] == GENTYPES[int(wk.gentype[k])] and worker["chat_mode"] in CHAT_MODES
        caps = reference.bridge_capabilities(worker["bridge_agent"])
        paints = bool(set(worker["models"]) & reference.inpainting_models())
        for option in rules.IMAGE_OPTIONS:
            ok = option.capability in caps and (option.allow is None or bool(worker[option.allow]))
            ok = ok and (paints or not option.needs_inpainting_model)
            assert bool(int(wk.has_bits[k]) & int(rules.OPTION_BIT[option.name])) == ok, (worker["id"], option.name)
        served_any |= int(wk.has_bits[k])
    assert served_any == (1 << len(rules.IMAGE_OPTIONS)) - 1


def test_bridge_agents_parse_to_name_and_leading_version_whatever_repeats_or_is_missing():
    # Parsed once per distinct string: repeats, None, NaN and a string beside its twin
    # must each get what parsing it alone gives.
    parse_bridge_agents = rules.parse_bridge_agents
    agents = np.array(["AI Horde Worker reGen:9.1.0:https://x", None, "kobold:5-beta", "kobold", "",
                       "AI Horde Worker reGen:9.1.0:https://x", float("nan"), "a:b:c:d", "kobold:5-beta"],
                      dtype=object)
    names, versions = parse_bridge_agents(agents)
    assert names.tolist() == ["AI Horde Worker reGen", "", "kobold", "kobold", "", "AI Horde Worker reGen", "",
                              "a", "kobold"]
    assert versions.tolist() == [9, 0, 5, 0, 0, 9, 0, 0, 5]
    alone = [parse_bridge_agents(agents[k : k + 1]) for k in range(len(agents))]
    assert [n[0] for n, _ in alone] == names.tolist() and [v[0] for _, v in alone] == versions.tolist()


def test_bridge_versions_are_read_as_the_scalar_reference_reads_them():
    # Any digits (not only ASCII), however many, leading zeros included: the capability a
    # version grants (capped at 9) must be the reference's.
    agents = np.array(["AI Horde Worker reGen:٣:u", "AI Horde Worker reGen:0000000000012:u",
                       "AI Horde Worker reGen:123456789012345678901234:u", "x:7.5", "x::8", "x"], dtype=object)
    names, versions = rules.parse_bridge_agents(agents)
    assert names.tolist() == [reference.bridge_name(a) for a in agents]
    assert np.minimum(versions, 9).tolist() == [min(reference.bridge_version(a), 9) for a in agents]
