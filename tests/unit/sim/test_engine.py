"""The per-step engine model: conservation, limits, latency arithmetic, refusals, preemption."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import batch, limits, profile

from kvscale.sim.engine import Engines


def run(engines: Engines, steps: int, arrivals: int, **shape: int) -> dict[str, float]:
    seen = {"in": 0.0, "done": 0.0, "refused": 0.0, "ttft": 0.0, "first": 0.0}
    for k in range(steps):
        b = batch(arrivals, float(k), **shape) if arrivals else batch(0, float(k))
        engines.add(b, np.zeros(len(b), dtype=np.int64))
        out = engines.step(float(k), 1.0)
        seen["in"] += len(b)
        seen["done"] += len(out.done_at)
        seen["refused"] += len(out.refused_at)
        seen["first"] += len(out.ttft)
        seen["ttft"] = max(seen["ttft"], float(out.ttft.max(initial=0.0)))
        running, _, kv, _ = engines.gauges()
        assert running[0] <= engines.limits.max_num_seqs
        assert kv[0] <= 1.0
    return seen


def test_every_request_is_done_refused_or_still_inside() -> None:
    e = Engines(profile(), limits(), 1)
    seen = run(e, 60, 8)
    inside = len(e.rep)
    assert seen["in"] == seen["done"] + seen["refused"] + inside
    assert seen["done"] > 0


def test_light_load_ttft_is_about_one_prefill() -> None:
    e = Engines(profile(), limits(), 1)
    e.add(batch(1, 0.0, inp=1000, out=10), np.zeros(1, dtype=np.int64))
    out = e.step(0.0, 1.0)
    # 1,000 prompt tokens at 10k tokens/s, plus nothing queued ahead
    assert out.ttft.tolist() == pytest.approx([0.1], abs=0.03)


def test_decode_speed_follows_the_step_time() -> None:
    e = Engines(profile(), limits(), 1)
    e.add(batch(1, 0.0, inp=100, out=1000), np.zeros(1, dtype=np.int64))
    e.step(0.0, 1.0)
    before = float(e.gen[0])
    e.step(1.0, 1.0)
    # one sequence decoding: 20 ms steps, 50 tokens a second
    assert float(e.gen[0]) - before == pytest.approx(50, abs=1)


def test_batch_limit_keeps_the_rest_waiting_first_come_first_served() -> None:
    e = Engines(profile(), limits(seqs=4), 1)
    e.add(batch(10, 0.0, inp=100, out=1000), np.zeros(10, dtype=np.int64))
    e.step(0.0, 1.0)
    running, waiting, _, _ = e.gauges()
    assert (running[0], waiting[0]) == (4, 6)
    assert sorted(e.seq[e.running].tolist()) == [0, 1, 2, 3]


def test_a_prompt_queue_beyond_one_step_of_prefill_waits() -> None:
    e = Engines(profile(), limits(seqs=256), 1)
    e.add(batch(100, 0.0, inp=2000, out=10), np.zeros(100, dtype=np.int64))
    e.step(0.0, 1.0)
    _, waiting, _, _ = e.gauges()
    # 10k prefill tokens/s: about 5 of the 2,000-token prompts start in a second
    assert 85 <= waiting[0] <= 96


def test_requests_waiting_past_the_queue_limit_are_refused() -> None:
    e = Engines(profile(), limits(seqs=1, wait=5.0), 1)
    seen = run(e, 20, 3, inp=100, out=1000)
    assert seen["refused"] > 0
    assert seen["in"] == seen["done"] + seen["refused"] + len(e.rep)


def test_too_long_requests_are_refused_at_once() -> None:
    e = Engines(profile(), limits(), 1)
    e.add(batch(1, 0.0, inp=9000, out=10), np.zeros(1, dtype=np.int64))
    assert len(e.step(0.0, 1.0).refused_at) == 1


def test_kv_overflow_preempts_the_newest() -> None:
    e = Engines(profile(kv_tokens=3000), limits(seqs=8, kv=3000), 1)
    e.add(batch(2, 0.0, inp=1000, out=2000), np.zeros(2, dtype=np.int64))
    for k in range(30):
        e.step(float(k), 1.0)
    assert e.counters["preemptions"][0] >= 1
    _, _, kv, _ = e.gauges()
    assert kv[0] <= 1.0


def test_counters_and_histograms_count_what_happened() -> None:
    e = Engines(profile(), limits(), 2)
    seen = run(e, 30, 4, inp=300, out=20)
    assert e.counters["successes"].sum() == seen["done"]
    assert e.ttft_hist.sum() == seen["first"]
    assert e.counters["prompt_tokens"].sum() == pytest.approx(seen["first"] * 300)
