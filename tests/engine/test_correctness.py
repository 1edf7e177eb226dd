"""Greedy outputs equal HF transformers token for token, whatever the engine does internally."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from engine_helpers import (
    GREEDY,
    HFReference,
    assert_matches_hf,
    random_prompts,
    record_batches,
    run_to_completion,
)

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.sampling_params import SamplingParams

MakeEngine = Callable[..., LLMEngine]


def test_single_request(make_engine: MakeEngine, hf_llama: HFReference) -> None:
    prompts = random_prompts(1, (20, 20))
    finals = run_to_completion(make_engine(), prompts)
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)


def test_32_concurrent_mixed_lengths(make_engine: MakeEngine, hf_llama: HFReference) -> None:
    prompts = random_prompts(32, (1, 120), seed=1)
    engine = make_engine()
    peak_running: list[int] = []
    finals = run_to_completion(
        engine, prompts, on_step=lambda e: peak_running.append(len(e.scheduler.running))
    )
    assert max(peak_running) >= 16, "requests should run concurrently"
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)


def test_preemption_under_a_tiny_kv_pool(make_engine: MakeEngine, hf_llama: HFReference) -> None:
    prompts = random_prompts(12, (30, 60), seed=2)
    engine = make_engine(num_kv_blocks=12)
    finals = run_to_completion(engine, prompts)
    assert engine.stats().num_preemptions > 0
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)
    assert engine.block_manager.num_free_blocks == 12


def test_chunked_prefill_with_a_tiny_token_budget(
    make_engine: MakeEngine, hf_llama: HFReference
) -> None:
    prompts = random_prompts(8, (20, 90), seed=3)
    engine = make_engine(max_num_batched_tokens=7)
    batches = record_batches(engine)
    finals = run_to_completion(engine, prompts)
    assert max(b.num_tokens for b in batches) <= 7
    assert any(not item.samples for b in batches for item in b.seqs), "no partial chunk ran"
    mixed = [b for b in batches if {i.samples for i in b.seqs} == {True, False}]
    assert mixed, "decodes should run alongside a prefill chunk"
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)


def test_prefix_caching_on_matches_off(make_engine: MakeEngine, hf_llama: HFReference) -> None:
    shared = random_prompts(1, (70, 70), seed=4)[0]
    prompts = [shared + tail for tail in random_prompts(10, (1, 30), seed=5)]
    cached = make_engine(enable_prefix_caching=True, max_num_seqs=3)
    uncached = make_engine(enable_prefix_caching=False, max_num_seqs=3)
    with_cache = run_to_completion(cached, prompts)
    without_cache = run_to_completion(uncached, prompts)
    assert cached.stats().prefix_cache_hits > 0
    assert uncached.stats().prefix_cache_hits == 0
    assert sum(o.num_cached_tokens for o in with_cache.values()) > 0
    for key, out in with_cache.items():
        assert out.output_token_ids == without_cache[key].output_token_ids
    assert_matches_hf(hf_llama, prompts, with_cache, GREEDY.max_tokens)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["auto", "flex"])
def test_a_wave_shares_a_new_prefix_within_its_first_step(
    make_engine: MakeEngine, hf_llama: HFReference, backend: str
) -> None:
    """Six prompts behind one uncached 64-token prefix, admitted in one step: the first computes
    the prefix and the other five attend over it in that same step (each layer writes every row's
    K/V before any row attends)."""
    shared = random_prompts(1, (64, 64), seed=21)[0]
    prompts = [shared + tail for tail in random_prompts(6, (3, 20), seed=22)]
    engine = make_engine(attention_backend=backend, block_size=16)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, GREEDY)
    finals = {o.request_id: o for o in engine.step() if o.finished}
    stats = engine.stats()
    assert stats.prefix_cache_hits == 5 * 64
    assert stats.computed_tokens == 64 + sum(len(p) - 64 for p in prompts)
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    assert [finals[str(i)].num_cached_tokens for i in range(6)] == [0] + [64] * 5
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)


def test_static_scheduling_matches(make_engine: MakeEngine, hf_llama: HFReference) -> None:
    prompts = random_prompts(10, (5, 60), seed=6)
    finals = run_to_completion(make_engine(scheduling="static", max_num_seqs=4), prompts)
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_path_matches(make_engine: MakeEngine, hf_llama: HFReference) -> None:
    """The CUDA path's masking logic, run eagerly on CPU (compiled only on CUDA)."""
    prompts = random_prompts(4, (10, 40), seed=7)
    finals = run_to_completion(make_engine(attention_backend="flex"), prompts)
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)


def test_everything_at_once_still_matches_hf(
    make_engine: MakeEngine, hf_llama: HFReference
) -> None:
    """Shared prefixes, a tiny pool, a tiny token budget and priorities in one run."""
    shared = random_prompts(1, (40, 40), seed=11)[0]
    prompts = [
        shared[: 16 * (i % 3)] + tail for i, tail in enumerate(random_prompts(16, (5, 50), seed=12))
    ]
    engine = make_engine(num_kv_blocks=14, max_num_batched_tokens=24, max_num_seqs=6)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, GREEDY, priority=index % 3)
    finals = {}
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)


def test_seeded_sampling_survives_preemption(make_engine: MakeEngine) -> None:
    prompts = random_prompts(8, (30, 60), seed=13)
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=3)
    roomy = run_to_completion(make_engine(), prompts, params)
    cramped_engine = make_engine(num_kv_blocks=12)
    cramped = run_to_completion(cramped_engine, prompts, params)
    assert cramped_engine.stats().num_preemptions > 0
    assert {k: v.output_token_ids for k, v in roomy.items()} == {
        k: v.output_token_ids for k, v in cramped.items()
    }


def test_deferred_work_preempted_by_interactive_arrivals_still_matches_hf(
    make_engine: MakeEngine, hf_llama: HFReference
) -> None:
    """Deferred requests fill the pool and the batch; interactive ones arrive and take their place
    (preempting them by recompute); both kinds of output equal HF's."""
    prompts = random_prompts(8, (30, 60), seed=14)
    engine = make_engine(num_kv_blocks=16, max_num_seqs=4)
    for index in range(4):  # deferred work first, below every interactive class
        engine.add_request(str(index), prompts[index], GREEDY, priority=-1,
                           traffic_class="batch", preemptible=True)  # fmt: skip
    finals = {o.request_id: o for _ in range(3) for o in engine.step() if o.finished}
    assert len(engine.scheduler.running) == 4 and not finals
    for index in range(4, 8):
        engine.add_request(str(index), prompts[index], GREEDY, priority=0, traffic_class="chat")
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    stats = engine.stats()
    assert stats.preemptions_by_class.get("batch", 0) > 0  # (chat may run short of blocks too)
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)
