"""Throughput on the Anyscale workload shape: kvscale continuous vs kvscale static vs HF static.

Same checkpoint, same requests, same run. HF transformers `generate()` runs static batches (each
runs until its longest request ends, since a batch cannot release a row); its best batch size is
picked by a sweep over the first requests, then it runs the whole workload. kvscale static uses the
same batch size, and a token budget that prefills a whole batch in one step (so it really runs
batches of that size: `max_batch_ran` records what ran). EOS is ignored everywhere so every request
emits its drawn length. Every system runs warm: HF's measured run follows its sweep, and each
kvscale engine first runs as many requests of the same shape, with other prompts, so that its
prefix cache has nothing to give the measured run (a first run in a process is slower: the
activations' memory comes from the OS and oneDNN builds a kernel for each new batch shape). The
prompt is shorter than Anyscale's 512 tokens: on a CPU a prefill token costs about as much as a
decode token (both are compute-bound), so a long fixed prompt would only add the same cost to
every system.

Each ratio is reported by wall time and by this process's CPU time (`python -m bench` runs torch
on one thread, so other jobs on a shared box barely move the CPU time). `processed_tokens` counts
the token positions each system pushed through the model (prompt + generated, including rows of a
static batch that already finished); on a CPU, where a forward costs about the same per token at
any batch size, their ratio is the ceiling for what continuous batching can gain here.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from bench.harness import make_engine, one_thread, run_hf_static, run_kvscale
from bench.workloads import anyscale
from kvscale_engine.engine.checkpoint import write_tiny_checkpoint
from kvscale_engine.model_config import NAMED_ARCHS


@dataclass(frozen=True)
class Setup:
    arch: str
    requests: int
    prompt_len: int
    mean_output: int
    cap: int
    hf_batch_sizes: tuple[int, ...]
    calibration_requests: int
    max_num_seqs: int


FULL = Setup("llama-bench-cpu", 512, 32, 32, 128, (16, 32, 64, 128, 256), 256, 128)
QUICK = Setup("llama-tiny", 24, 16, 8, 32, (4, 12), 12, 12)
ENGINE = {"max_model_len": 512, "num_kv_blocks": 4096, "max_num_batched_tokens": 2048}


def run(quick: bool = False) -> dict[str, Any]:
    with one_thread():
        return _run(QUICK if quick else FULL)


def _run(p: Setup) -> dict[str, Any]:
    shape = {k: v for k, v in NAMED_ARCHS[p.arch].items() if k != "model_type"}
    vocab = shape["vocab_size"]
    requests = anyscale(p.requests, p.prompt_len, p.mean_output, p.cap, vocab)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(tmp, seed=0, **shape)
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # type: ignore[no-untyped-call]
        sample = requests[: p.calibration_requests]
        sweep = {b: run_hf_static(hf_model, sample, b) for b in p.hf_batch_sizes}
        best_b = max(sweep, key=lambda b: sweep[b].tokens_per_s)
        hf = run_hf_static(hf_model, requests, best_b)
        max_seqs = max(p.max_num_seqs, best_b)  # never fewer rows than HF's best batch
        # as many requests as the sweep's, of the same shape, other prompts: nothing for the
        # prefix cache to find in the measured run
        warmup = anyscale(len(sample), p.prompt_len, p.mean_output, p.cap, vocab, seed=1)
        engine = make_engine(path, max_num_seqs=max_seqs, **ENGINE)
        run_kvscale(engine, warmup)  # warm, as the sweep warmed HF
        continuous = run_kvscale(engine, requests)
        static_budget = max(ENGINE["max_num_batched_tokens"], best_b * p.prompt_len)
        static_engine = make_engine(
            path,
            max_num_seqs=best_b,
            scheduling="static",
            **(ENGINE | {"max_num_batched_tokens": static_budget}),
        )
        run_kvscale(static_engine, warmup)
        static = run_kvscale(static_engine, requests)
    uncached = sum(len(r.prompt) + r.max_tokens - 1 for r in requests)  # the last token is not fed
    for run_ in (continuous, static):
        if run_.processed_tokens != uncached:
            raise RuntimeError(
                f"kvscale processed {run_.processed_tokens} token positions, not the workload's "
                f"{uncached}: a warm-up left prefixes in the cache, or the counting is off"
            )
    mismatches = sum(a != b for a, b in zip(continuous.outputs, hf.outputs, strict=True))
    ceiling = hf.processed_tokens / continuous.processed_tokens
    return {
        "continuous_vs_hf_static": round(continuous.tokens_per_s / hf.tokens_per_s, 2),
        # on a CPU a forward costs about the same per token at any batch size, so the work a
        # static batch spends on finished rows is all continuous batching can save: the bound
        "processed_tokens_ratio_hf_static_vs_continuous": round(ceiling, 2),
        "continuous_vs_hf_static_of_ceiling": round(
            continuous.tokens_per_s / hf.tokens_per_s / ceiling, 2
        ),
        "continuous_vs_kvscale_static": round(continuous.tokens_per_s / static.tokens_per_s, 2),
        "kvscale_static_vs_hf_static": round(static.tokens_per_s / hf.tokens_per_s, 2),
        # torch runs on one thread: CPU time is the work done, whatever else the machine runs
        "continuous_vs_hf_static_by_cpu_time": round(hf.cpu_seconds / continuous.cpu_seconds, 2),
        "continuous_vs_kvscale_static_by_cpu_time": round(
            static.cpu_seconds / continuous.cpu_seconds, 2
        ),
        "target": "continuous_vs_hf_static >= 5",
        "torch_threads": torch.get_num_threads(),
        "warmup_requests": len(sample),  # each system's, before its measured run
        "kvscale_continuous": {**continuous.summary(), "max_num_seqs": max_seqs},
        "kvscale_static": {
            **static.summary(),
            "batch_size": best_b,
            "max_num_batched_tokens": static_budget,
        },
        "hf_static": {**hf.summary(), "batch_size": best_b},
        "hf_batch_size_sweep": {
            "requests": len(sample),
            "output_tokens_per_s": {str(b): round(r.tokens_per_s, 1) for b, r in sweep.items()},
        },
        "greedy_output_mismatches_vs_hf": mismatches,
        "workload": asdict(p) | {"output_tokens": sum(r.max_tokens for r in requests)},
        "engine": ENGINE,
        "model": {"arch": p.arch, **shape, "params": _params(shape), "dtype": "float32"},
    }


def _params(shape: dict[str, Any]) -> int:
    from kvscale_engine.engine.weights import param_shapes
    from kvscale_engine.model_config import ModelConfig

    cfg = ModelConfig.from_dict({"model_type": "llama", **shape})
    return sum(math.prod(s) for s in param_shapes(cfg).values())
