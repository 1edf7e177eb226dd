"""Helpers for the engine tier: HF reference outputs, prompts, running the engine to the end.

Every comparison is greedy, fp32, on CPU, token for token against `transformers` `generate()`.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.engine.outputs import RequestOutput
from kvscale_engine.engine.scheduler import ScheduledBatch
from kvscale_engine.layers.attention import PagedAttention, SeqSpan, build_metadata
from kvscale_engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
CPU = torch.device("cpu")
HFGreedy = Callable[[list[int], int], list[int]]


class HFReference:
    """Greedy continuations from transformers, one prompt at a time (no padding effects)."""

    def __init__(self, path: Path) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.eos = int(self.model.generation_config.eos_token_id)
        self.memo: dict[tuple[tuple[int, ...], int], list[int]] = {}

    @torch.inference_mode()
    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(prompt), max_new_tokens)
        if key not in self.memo:
            ids = torch.tensor([prompt])
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=self.eos,
                pad_token_id=self.eos,
            )
            self.memo[key] = out[0, len(prompt) :].tolist()
        return self.memo[key]


def random_prompts(count: int, lengths: tuple[int, int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 500) for _ in range(rng.randint(*lengths))] for _ in range(count)]


def run_to_completion(
    engine: LLMEngine,
    prompts: list[list[int]],
    params: SamplingParams = GREEDY,
    on_step: Callable[[LLMEngine], None] | None = None,
) -> dict[str, RequestOutput]:
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, params)
    finals: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        if on_step is not None:
            on_step(engine)
    return finals


def record_batches(engine: LLMEngine) -> list[ScheduledBatch]:
    """Keep every batch the scheduler hands out (the test inspects chunking and budgets)."""
    batches: list[ScheduledBatch] = []
    schedule = engine.scheduler.schedule

    def recording() -> ScheduledBatch:
        batch = schedule()
        batches.append(batch)
        return batch

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    return batches


def assert_matches_hf(
    hf: HFReference, prompts: list[list[int]], finals: dict[str, RequestOutput], max_tokens: int
) -> None:
    for index, prompt in enumerate(prompts):
        expected = hf.greedy(prompt, max_tokens)
        got = finals[str(index)].output_token_ids
        assert got == expected, f"request {index} (prompt of {len(prompt)} tokens) diverged"
        # one token would only compare the prefill; decoding from the paged cache must agree too
        assert len(got) > 1, f"request {index} stopped after {len(got)} token(s)"


def assert_decode_matches_reference(
    kernel: Callable[..., torch.Tensor],
    lens: list[int],
    block_size: int,
    group: int,
    head_dim: int,
    window: int | None,
    dtype: torch.dtype = torch.float32,
    device: torch.device = CPU,
    tol: float = 1e-5,
    kv_heads: int = 2,
) -> None:
    """A paged decode kernel (paged_decode's signature) against the reference decode (gathered
    SDPA): one decode row per context length in `lens`, its blocks scattered out of order."""
    torch.manual_seed(0)
    rng = random.Random(block_size * 10 + group)
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 3
    free = list(range(num_blocks))
    rng.shuffle(free)  # scattered, out-of-order blocks
    tables = [[free.pop() for _ in range(n)] for n in need]
    spans = [SeqSpan(n - 1, 1, t) for n, t in zip(lens, tables, strict=True)]
    heads = kv_heads * group
    shape = (num_blocks * block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, device=device).to(dtype)
    v_cache = torch.randn(shape, device=device).to(dtype)
    q = torch.randn(len(lens), heads, head_dim, device=device).to(dtype)
    k = torch.randn(len(lens), kv_heads, head_dim, device=device).to(dtype)
    v = torch.randn(len(lens), kv_heads, head_dim, device=device).to(dtype)
    attn = PagedAttention(heads, kv_heads, head_dim)

    ref_meta = build_metadata(spans, block_size, window, device)
    ref_cache = (k_cache.clone(), v_cache.clone())
    expected = attn(q, k, v, ref_cache, ref_meta)

    meta = build_metadata(spans, block_size, window, device, paged_decode=True)
    assert not meta.decode_groups and meta.decode_block_tables is not None
    attn.decode_fn = functools.partial(kernel, block_size=block_size, window=window)
    got = attn(q, k, v, (k_cache, v_cache), meta)

    assert torch.equal(k_cache, ref_cache[0]) and torch.equal(v_cache, ref_cache[1])
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
