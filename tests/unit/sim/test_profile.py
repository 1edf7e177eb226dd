"""Engine profiles: shipped files load, tables interpolate, bad files fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sim_helpers import profile

from kvscale.sim.profile import EngineProfile, ProfileError, load_profile, shipped


def test_shipped_profiles_load_and_name_their_sources() -> None:
    names = shipped()
    assert {"h200-kvscale-eager", "h200-vllm-like"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.name == name
        assert {"prefill", "decode", "kv_tokens", "startup"} <= set(p.sources)


def test_h200_profile_holds_the_measured_figures() -> None:
    p = load_profile("h200-kvscale-eager")
    steps = p.decode_step(np.array([1.0, 8.0, 32.0, 128.0]), np.full(4, 512.0))
    assert steps.tolist() == pytest.approx([0.072, 0.059, 0.062, 0.065])
    assert p.prefill_rate(np.array([1024.0, 4096.0])).tolist() == pytest.approx([25800, 32100])
    assert p.kv_tokens == 901_008
    assert p.startup.median_s == 61.0


def test_decode_step_grows_with_batch_beyond_the_table_and_with_context() -> None:
    p = profile()
    base = p.decode_step(np.array([101.0]), np.array([512.0]))[0]
    more = p.decode_step(np.array([201.0]), np.array([512.0]))[0]
    longer = p.decode_step(np.array([101.0]), np.array([4512.0]))[0]
    assert base == pytest.approx(0.030)
    assert more == pytest.approx(0.040)  # the last segment's slope, 0.1 ms per sequence
    assert longer == pytest.approx(0.030 + 101 * 4000 * 1000 / 1e12)


def test_round_trip_through_json(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile().to_dict()))
    assert load_profile(str(path)) == profile()


def test_bad_profiles_fail_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="unknown profile"):
        load_profile("no-such-profile")
    bad = profile().to_dict()
    bad["decode"]["step_s"] = [[0.02]]  # one row for two batch sizes
    with pytest.raises(ProfileError, match="one decode row per batch"):
        EngineProfile.from_dict(bad)
    del bad["kv_tokens"]
    with pytest.raises(ProfileError, match="malformed"):
        EngineProfile.from_dict(bad)
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="not JSON"):
        load_profile(str(path))


def test_a_table_with_context_columns_interpolates_in_both() -> None:
    raw = profile().to_dict()
    raw["decode"] = {
        "batch": [1, 11],
        "context": [100, 1100],
        "step_s": [[0.01, 0.02], [0.03, 0.05]],
    }
    p = EngineProfile.from_dict(raw)
    got = p.decode_step(np.array([1.0, 6.0, 6.0]), np.array([100.0, 100.0, 600.0]))
    assert got.tolist() == pytest.approx([0.01, 0.02, (0.02 + 0.035) / 2])
