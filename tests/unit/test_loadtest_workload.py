"""Load-test workloads: traces (the committed sample), length policy, arrivals, prompts, mix."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest

from kvscale.tools.workload import (
    gamma_arrivals,
    parse_class_mix,
    plan,
    replay_arrivals,
    text_prompt,
    token_prompt,
)
from kvscale.traces import (
    LengthPolicy,
    TraceError,
    TraceRequest,
    default_traces_dir,
    load_trace,
    select,
    synthetic,
)


@pytest.mark.parametrize(
    ("name", "rows", "span_s"),
    [("azure-conv", 300, 84.03), ("azure-code", 300, 216.84), ("mooncake", 300, 102.0)],
)
def test_traces_load_from_the_sample(name: str, rows: int, span_s: float) -> None:
    assert default_traces_dir().parts[-3:] == ("tests", "data", "traces")  # tests/conftest.py
    trace = load_trace(name, default_traces_dir())
    assert len(trace) == rows
    times = [r.arrival_s or 0.0 for r in trace]
    assert times == sorted(times) and times[0] == 0.0
    assert times[-1] == pytest.approx(span_s, abs=0.01)
    assert all(r.input_len >= 1 and r.output_len >= 1 for r in trace)


def test_mooncake_rows_carry_prefix_blocks() -> None:
    trace = load_trace("mooncake", default_traces_dir())
    assert trace[0].prefix_blocks[:3] == (0, 1, 2)
    assert trace[1].prefix_blocks[0] == 0  # shares the first block with request 0


def test_missing_trace_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCALE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(TraceError, match=r"not found in .*nowhere, and could not download"):
        load_trace("azure-conv", tmp_path / "nowhere")
    with pytest.raises(TraceError, match="unknown trace"):
        load_trace("sharegpt", default_traces_dir())


def test_length_policy_scales_then_caps() -> None:
    policy = LengthPolicy(input_scale=0.1, output_scale=2.0, max_input_len=50, max_output_len=30)
    out = policy.apply(TraceRequest(0.0, 1000, 10, (1, 2)))
    assert (out.input_len, out.output_len, out.block_tokens) == (50, 20, 51)
    assert policy.apply(TraceRequest(0.0, 3, 1)).input_len == 1  # never below one token
    with pytest.raises(TraceError):
        LengthPolicy(input_scale=0)


def test_select_takes_a_replay_window_or_a_seeded_sample() -> None:
    rows = [TraceRequest(float(i), 10, 10) for i in range(100)]
    window = select(rows, 5, 42.0, random.Random(0))
    assert [r.arrival_s for r in window] == [42.0, 43.0, 44.0, 45.0, 46.0]
    sample = select(rows, 10, None, random.Random(1))
    assert sample == select(rows, 10, None, random.Random(1)) and len(set(map(id, sample))) == 10
    assert len(select(rows, 250, None, random.Random(0))) == 250  # resampled past the trace


def test_synthetic_lengths() -> None:
    fixed = synthetic("fixed", 5, 100, 20, 0.5, random.Random(0))
    assert {(r.input_len, r.output_len) for r in fixed} == {(100, 20)}
    spread = synthetic("random", 500, 100, 20, 0.5, random.Random(0))
    assert min(r.input_len for r in spread) >= 50 and max(r.input_len for r in spread) <= 150
    assert len({r.input_len for r in spread}) > 20


def test_poisson_and_gamma_arrivals_keep_the_rate_and_set_burstiness() -> None:
    rng = random.Random(3)
    poisson = gamma_arrivals(5000, 10.0, 1.0, rng)
    bursty = gamma_arrivals(5000, 10.0, 0.25, rng)
    for offsets in (poisson, bursty):
        assert offsets[0] == 0.0 and offsets == sorted(offsets)
        assert len(offsets) / offsets[-1] == pytest.approx(10.0, rel=0.1)

    def cv(offsets: list[float]) -> float:
        gaps = [b - a for a, b in itertools.pairwise(offsets)]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)

    assert cv(poisson) == pytest.approx(1.0, abs=0.1)
    assert cv(bursty) == pytest.approx(2.0, abs=0.25)  # CV = 1/sqrt(shape)
    assert gamma_arrivals(3, float("inf"), 1.0, rng) == [0.0, 0.0, 0.0]


def test_replay_compresses_time_and_jitters_within_a_tick() -> None:
    rows = [TraceRequest(t, 1, 1) for t in (100.0, 103.0, 103.0, 160.0)]
    assert replay_arrivals(rows, 10.0, 0.0, random.Random(0)) == pytest.approx([0.0, 0.3, 0.3, 6.0])
    jittered = replay_arrivals(rows, 1.0, 3.0, random.Random(0))
    assert len(set(jittered)) == 4 and max(jittered) < 63.0
    with pytest.raises(TraceError):
        replay_arrivals([TraceRequest(None, 1, 1)], 1.0, 0.0, random.Random(0))


def test_prefix_blocks_become_identical_token_prefixes() -> None:
    a = TraceRequest(0.0, 40, 1, (7, 8), block_tokens=16)
    b = TraceRequest(0.0, 40, 1, (7, 9), block_tokens=16)
    rng = random.Random(0)
    ids_a, ids_b = token_prompt(a, (10, 500), 0, rng), token_prompt(b, (10, 500), 0, rng)
    assert len(ids_a) == len(ids_b) == 40
    assert ids_a[:16] == ids_b[:16] and ids_a[16:32] != ids_b[16:32]
    assert all(10 <= t < 500 for t in ids_a)
    short = token_prompt(TraceRequest(0.0, 5, 1, (7,), block_tokens=16), (10, 500), 0, rng)
    assert short == ids_a[:5]
    assert len(text_prompt(a, 0, rng).split()) == 40


def test_plan_and_class_mix() -> None:
    rows = [TraceRequest(None, 8, 4) for _ in range(400)]
    mix = parse_class_mix("interactive:3,batch:1")
    planned = plan(rows, [0.0] * 400, prompt_format="ids", vocab=(10, 20), classes=mix, seed=1)
    share = sum(p.traffic_class == "interactive" for p in planned) / 400
    assert share == pytest.approx(0.75, abs=0.07)
    assert [p.index for p in planned] == list(range(400))
    assert parse_class_mix(None) == [] and parse_class_mix("solo") == [("solo", 1.0)]
    for bad in ("a:0", ":1", "a:x"):
        with pytest.raises(TraceError):
            parse_class_mix(bad)
