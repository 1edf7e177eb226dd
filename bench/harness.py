"""Run a workload through kvscale or HF transformers and time it; shared by the benchmarks."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.workloads import Request
from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class RunResult:
    seconds: float
    cpu_seconds: float  # this process's CPU time: less sensitive to other load on a shared box
    output_tokens: int
    processed_tokens: int  # token positions run through the model, wasted ones included
    steps: int
    preemptions: int
    outputs: list[list[int]]
    max_batch: int  # the most sequences one step ran: the batch size that actually ran

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "load_average_1m_after": round(os.getloadavg()[0], 2),
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": round(self.tokens_per_s, 1),
            "processed_tokens": self.processed_tokens,
            "steps": self.steps,
            "preemptions": self.preemptions,
            "max_batch_ran": self.max_batch,
        }


def run_kvscale(engine: LLMEngine, requests: list[Request]) -> RunResult:
    """Submit everything at once (an offline batch), step until done. Counts only this run's
    work, whatever the engine ran before (a warm-up)."""
    before = engine.stats()
    start, cpu = time.perf_counter(), time.process_time()
    for i, r in enumerate(requests):
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        engine.add_request(str(i), r.prompt, params)
    outputs: dict[str, list[int]] = {}
    steps = max_batch = 0
    while engine.has_unfinished_requests():
        steps += 1
        step_outputs = engine.step()
        ran = len(engine.scheduler.running) + sum(o.finished for o in step_outputs)
        max_batch = max(max_batch, ran)
        for out in step_outputs:
            if out.finished:
                outputs[out.request_id] = out.output_token_ids
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    ordered = [outputs[str(i)] for i in range(len(requests))]
    stats = engine.stats()
    return RunResult(
        seconds,
        cpu,
        sum(map(len, ordered)),
        stats.computed_tokens - before.computed_tokens,
        steps,
        stats.num_preemptions - before.num_preemptions,
        ordered,
        max_batch,
    )


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread: other jobs on a shared box then barely move this process's CPU time."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def make_engine(model: str | Path, **settings: Any) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), **settings))


@torch.inference_mode()
def run_hf_static(model: Any, requests: list[Request], batch_size: int) -> RunResult:
    """HF `generate()` on static batches: each batch runs until its longest request is done."""
    model.generation_config.eos_token_id = None  # EOS ignored, as for kvscale
    start, cpu = time.perf_counter(), time.process_time()
    outputs: list[list[int]] = []
    steps = processed = 0
    for lo in range(0, len(requests), batch_size):
        batch = requests[lo : lo + batch_size]
        longest = max(r.max_tokens for r in batch)
        # fixed-length prompts: no padding; inputs live where the model does
        ids = torch.tensor([r.prompt for r in batch], device=model.device)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=longest,
            do_sample=False,
            pad_token_id=0,
        )
        steps += longest
        processed += len(batch) * (len(batch[0].prompt) + longest)
        prompt_len = ids.shape[1]
        outputs += [
            row[prompt_len : prompt_len + r.max_tokens].tolist()
            for row, r in zip(out, batch, strict=True)
        ]
        _sync(model.device)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    most = min(batch_size, len(requests))
    return RunResult(seconds, cpu, sum(map(len, outputs)), processed, steps, 0, outputs, most)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
