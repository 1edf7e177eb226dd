"""Prefix caching: time to first token for requests sharing a 1,200-token system prompt.

Each request runs alone (TTFT without queueing), cache on versus off, same engine settings, same
run. The first request on the cached engine is a cold miss that fills the cache; it is reported
separately. Greedy outputs of every request are compared token for token across the two engines.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.harness import make_engine, one_thread
from bench.workloads import Request, shared_prefix
from kvscale_engine.engine.checkpoint import write_tiny_checkpoint
from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.model_config import NAMED_ARCHS
from kvscale_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Setup:
    arch: str
    requests: int
    prefix_len: int
    suffix_len: int
    max_tokens: int


FULL = Setup("llama-bench-cpu", 9, 1200, 24, 16)
QUICK = Setup("llama-tiny", 3, 100, 8, 4)


def run(quick: bool = False) -> dict[str, Any]:
    with one_thread():
        return _run(QUICK if quick else FULL)


def _run(p: Setup) -> dict[str, Any]:
    shape = {k: v for k, v in NAMED_ARCHS[p.arch].items() if k != "model_type"}
    requests = shared_prefix(
        p.requests, p.prefix_len, p.suffix_len, p.max_tokens, shape["vocab_size"]
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(tmp, seed=0, **shape)
        settings: dict[str, Any] = {
            "max_model_len": 2048,
            "num_kv_blocks": 512,
            "max_num_batched_tokens": 2048,
        }
        on = make_engine(path, enable_prefix_caching=True, **settings)
        off = make_engine(path, enable_prefix_caching=False, **settings)
        _warm_up(on)
        _warm_up(off)
        ttft_on, out_on = _sequential(on, requests)
        ttft_off, out_off = _sequential(off, requests)
    warm_on, warm_off = statistics.median(ttft_on[1:]), statistics.median(ttft_off[1:])
    stats = on.stats()
    return {
        "ttft_ratio": round(warm_off / warm_on, 2),
        "token_mismatches": sum(
            sum(x != y for x, y in zip(a, b, strict=True)) + abs(len(a) - len(b))
            for a, b in zip(out_on, out_off, strict=True)
        ),
        "target": "ttft_ratio >= 5 and token_mismatches == 0",
        "ttft_ms_cache_on_median": round(1000 * warm_on, 2),
        "ttft_ms_cache_off_median": round(1000 * warm_off, 2),
        "ttft_ms_cache_on_cold_first_request": round(1000 * ttft_on[0], 2),
        "ttft_ms_cache_on": [round(1000 * t, 2) for t in ttft_on],
        "ttft_ms_cache_off": [round(1000 * t, 2) for t in ttft_off],
        "prefix_cache_hit_rate": round(stats.prefix_cache_hit_rate, 4),
        "prefix_cache_hits_tokens": stats.prefix_cache_hits,
        "workload": asdict(p),
        "model": {"arch": p.arch, **shape, "dtype": "float32"},
    }


def _sequential(engine: LLMEngine, requests: list[Request]) -> tuple[list[float], list[list[int]]]:
    ttfts: list[float] = []
    outputs: list[list[int]] = []
    for i, r in enumerate(requests):
        start = time.perf_counter()
        engine.add_request(
            str(i), r.prompt, SamplingParams(temperature=0.0, max_tokens=r.max_tokens)
        )
        first: float | None = None
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                if first is None and out.new_token_ids:
                    first = time.perf_counter() - start
                tokens = out.output_token_ids
        assert first is not None
        ttfts.append(first)
        outputs.append(tokens)
    return ttfts, outputs


def _warm_up(engine: LLMEngine) -> None:
    engine.add_request("warm-up", [7, 8, 9, 10], SamplingParams(temperature=0.0, max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
