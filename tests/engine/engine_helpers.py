"""Helpers for the engine tier: HF reference outputs, prompts, running the engine to the end.

Every comparison is greedy, fp32, on CPU, token for token against `transformers` `generate()`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.engine.outputs import RequestOutput
from kvscale_engine.engine.scheduler import ScheduledBatch
from kvscale_engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
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
