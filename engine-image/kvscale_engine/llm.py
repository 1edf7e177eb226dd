"""Offline API: `LLM(model=...).generate(prompts, params)` runs the engine to completion."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.engine.outputs import RequestOutput
from kvscale_engine.sampling_params import SamplingParams

Prompt = str | list[int]


@dataclass(frozen=True)
class Completion:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    num_cached_tokens: int


class LLM:
    def __init__(self, model: str, **config: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **config))

    def generate(
        self, prompts: Seq[Prompt], params: SamplingParams | Seq[SamplingParams] | None = None
    ) -> list[Completion]:
        params_list = _per_prompt(params or SamplingParams(), len(prompts))
        token_prompts = [self._tokens(p) for p in prompts]
        for index, (tokens, p) in enumerate(zip(token_prompts, params_list, strict=True)):
            self.engine.add_request(str(index), tokens, p)
        finals: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            finals |= {o.request_id: o for o in self.engine.step() if o.finished}
        return [_completion(t, finals[str(i)]) for i, t in enumerate(token_prompts)]

    def _tokens(self, prompt: Prompt) -> list[int]:
        return self.engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)


def _per_prompt(params: SamplingParams | Seq[SamplingParams], count: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * count
    if len(params) != count:
        raise ValueError(f"got {len(params)} sampling params for {count} prompts")
    return list(params)


def _completion(prompt: list[int], out: RequestOutput) -> Completion:
    return Completion(
        prompt, out.output_token_ids, out.text, out.finish_reason, out.num_cached_tokens
    )
