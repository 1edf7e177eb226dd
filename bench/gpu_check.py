"""GPU throughput check: dummy Llama-3-8B shape in bf16, kvscale continuous vs HF static.

Run by `bench/gpu_check.sh` (which first runs the correctness tier on CUDA); writes
bench/results/gpu.json. The KV pool is sized by the real memory budget (profiling pass), not by an
override, so this also checks the budget path. Each phase stops early if the deadline nears.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from bench.harness import RunResult, make_engine, run_hf_static, run_kvscale
from bench.machine import describe
from bench.workloads import Request, anyscale
from kvscale_engine.model_config import NAMED_ARCHS

ARCH = "llama-3-8b"
WORKLOAD = {"requests": 256, "prompt_len": 512, "mean_output": 128, "cap": 512}
HF_SWEEP = [16, 64]
CALIBRATION = 64


def run(deadline_s: float = 240.0) -> dict[str, Any]:
    """Every phase records an error instead of ending the run, so one GPU session tells all."""
    start = time.perf_counter()
    requests = anyscale(vocab=NAMED_ARCHS[ARCH]["vocab_size"], seed=0, count=WORKLOAD["requests"],
                        prompt_len=WORKLOAD["prompt_len"], mean_output=WORKLOAD["mean_output"],
                        cap=WORKLOAD["cap"])  # fmt: skip
    result: dict[str, Any] = {"model": f"dummy:{ARCH} bf16", "workload": WORKLOAD}
    continuous = None
    for backend in ("flex", "reference"):
        try:
            continuous = _run_kvscale(backend, requests, result)
            break
        except Exception as error:  # report it and try the other attention path
            result[f"kvscale_{backend}_error"] = repr(error)[:2000]
            torch.cuda.empty_cache()
    try:
        hf_model = _hf_model()
        sweep: dict[int, RunResult] = {}
        for b in HF_SWEEP:
            if sweep and time.perf_counter() - start > deadline_s * 0.6:
                break
            sweep[b] = run_hf_static(hf_model, requests[:CALIBRATION], b)
        best_b = max(sweep, key=lambda b: sweep[b].tokens_per_s)
        result["hf_batch_size_sweep"] = {str(b): round(r.tokens_per_s, 1) for b, r in sweep.items()}
        hf = run_hf_static(hf_model, requests, best_b)
        result["hf_static"] = {**hf.summary(), "batch_size": best_b}
        if continuous is not None:
            result["continuous_vs_hf_static"] = round(continuous.tokens_per_s / hf.tokens_per_s, 2)
    except Exception as error:  # report it; the JSON is written either way
        result["hf_error"] = repr(error)[:2000]
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def _run_kvscale(backend: str, requests: list[Request], result: dict[str, Any]) -> RunResult:
    engine = make_engine(f"dummy:{ARCH}", max_model_len=2048, max_num_seqs=256,
                         max_num_batched_tokens=8192, memory_fraction=0.85,
                         attention_backend=backend)  # fmt: skip
    budget = engine.model_runner.budget
    assert budget is not None
    result["kv_blocks"] = engine.block_manager.num_total_blocks
    result["budget_gib"] = {
        "total": budget.total_bytes / 2**30, "weights": budget.weight_bytes / 2**30,
        "activation_peak": budget.activation_bytes / 2**30, "kv": budget.kv_bytes / 2**30,
    }  # fmt: skip
    run = run_kvscale(engine, requests)
    result["kvscale_continuous"] = {**run.summary(), "attention": backend}
    del engine
    torch.cuda.empty_cache()
    return run


def _hf_model() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {k: v for k, v in NAMED_ARCHS[ARCH].items() if k != "model_type"}
    with torch.device("cuda"):
        model: Any = LlamaForCausalLM(LlamaConfig(**shape))
    return model.to(dtype=torch.bfloat16).eval()


def main() -> None:
    out = Path(__file__).parent / "results" / "gpu.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    result = previous | {"throughput": run(), "machine": describe()}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["throughput"], indent=2))


if __name__ == "__main__":
    main()
