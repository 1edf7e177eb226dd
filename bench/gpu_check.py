"""GPU throughput check: dummy Llama-3-8B shape in bf16, decode step time, kvscale vs HF static.

First the decode step: a batch of 1/8/32/128 sequences with 512-token prompts, prefilled, then the
median wall time of a decode step with CUDA graphs on and off (--enforce-eager), both with the
Triton paged-decode kernel, and batch 1's ratio to the floor of reading the weights once (3.35 ms
for 16.06 GB at 4.8 TB/s on an H200).

Run by `bench/gpu_check.sh` (which first runs the correctness tier on CUDA); writes
bench/results/gpu.json. The KV pool is sized by the real memory budget (profiling pass), not by an
override, so this also checks the budget path. Both sides are warmed up first (kernels, the
FlexAttention compile, cuBLAS handles), HF's static batch size is swept up to 256, and every phase
stops early when the deadline nears, recording what it skipped.

`python -m bench.gpu_check --cpu-smoke` runs the same code on the CPU with a tiny model and
workload (fp32, a few seconds), so the path can be checked without a GPU; it prints its result
and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.harness import RunResult, make_engine, run_hf_static, run_kvscale
from bench.machine import describe
from bench.workloads import Request, anyscale
from kvscale_engine.model_config import NAMED_ARCHS
from kvscale_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Setup:
    arch: str
    device: str
    dtype: torch.dtype
    requests: int
    prompt_len: int
    mean_output: int
    cap: int
    hf_sweep: tuple[int, ...]
    sweep_seconds: float  # per batch size: whole batches until this much time has passed
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    deadline_s: float
    backends: tuple[str, ...]
    decode_batches: tuple[int, ...]
    decode_steps: int  # timed decode steps per batch size
    floor_ms: float | None  # weights read once at the memory's bandwidth


DECODE_PROMPT = 512


GPU = Setup("llama-3-8b", "cuda", torch.bfloat16, 256, 512, 128, 512, (16, 32, 64, 128, 256),
            25.0, 256, 2048, 8192, 190.0, ("flex", "reference"), (1, 8, 32, 128), 30,
            3.35)  # fmt: skip
CPU_SMOKE = Setup("llama-tiny", "cpu", torch.float32, 24, 16, 8, 16, (4, 8, 16, 32), 5.0, 32,
                  256, 512, 120.0, ("reference",), (1, 4), 5, None)  # fmt: skip
WARMUP_REQUESTS = 8


def run(p: Setup = GPU) -> dict[str, Any]:
    """Every phase records an error instead of ending the run, so one GPU session tells all."""
    start = time.perf_counter()
    left = lambda: p.deadline_s - (time.perf_counter() - start)  # noqa: E731
    vocab = int(NAMED_ARCHS[p.arch]["vocab_size"])
    requests = anyscale(p.requests, p.prompt_len, p.mean_output, p.cap, vocab, seed=0)
    warmup = anyscale(WARMUP_REQUESTS, p.prompt_len, 16, 16, vocab, seed=1)
    result: dict[str, Any] = {
        "model": f"dummy:{p.arch} {str(p.dtype).removeprefix('torch.')} on {p.device}",
        "workload": {k: getattr(p, k) for k in ("requests", "prompt_len", "mean_output", "cap")},
    }
    try:
        result["decode_step_ms"] = _decode_steps(p, left)
    except Exception as error:  # report it; the throughput phases still run
        result["decode_step_error"] = repr(error)[:2000]
        _empty_cache(p)
    continuous = None
    for backend in p.backends:
        try:
            continuous = _run_kvscale(p, backend, warmup, requests, result)
            break
        except Exception as error:  # report it and try the other attention path
            result[f"kvscale_{backend}_error"] = repr(error)[:2000]
            _empty_cache(p)
    try:
        hf_model = _hf_model(p)
        run_hf_static(hf_model, warmup, len(warmup))  # warm-up: kernels and cuBLAS handles
        sweep = _sweep(p, hf_model, requests, left)
        result["hf_batch_size_sweep"] = {str(b): round(r.tokens_per_s, 1) for b, r in sweep.items()}
        best_b = max(sweep, key=lambda b: sweep[b].tokens_per_s)
        hf = run_hf_static(hf_model, requests, best_b)
        result["hf_static"] = {**hf.summary(), "batch_size": best_b}
        if continuous is not None:
            result["continuous_vs_hf_static"] = round(continuous.tokens_per_s / hf.tokens_per_s, 2)
            result["processed_tokens_ratio_hf_static_vs_continuous"] = round(
                hf.processed_tokens / continuous.processed_tokens, 2
            )
    except Exception as error:  # report it; the JSON is written either way
        result["hf_error"] = repr(error)[:2000]
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def _decode_steps(p: Setup, left: Any) -> dict[str, Any]:
    """Median decode step per batch size, graphs on and off; on the CPU both run eager."""
    out: dict[str, Any] = {}
    for graphs in (True, False):
        engine = _engine(p, "auto", enforce_eager=not graphs)
        runner = engine.model_runner
        key = "graphs" if graphs else "eager"
        out[key] = {"captured_sizes": len(runner.graph_plan.sizes) if runner.graph_plan else 0}
        out[key]["paged_decode_kernel"] = runner.paged_decode
        for batch in p.decode_batches:
            if left() < 30:
                out[key][str(batch)] = "skipped: deadline"
                continue
            out[key][str(batch)] = _median_decode_ms(p, engine, batch)
        del engine, runner
        _empty_cache(p)
    if p.floor_ms is not None and isinstance(out["graphs"].get("1"), float):
        out["batch_1_graphs_vs_floor"] = round(out["graphs"]["1"] / p.floor_ms, 2)
    return out


def _median_decode_ms(p: Setup, engine: Any, batch: int) -> float:
    vocab = int(NAMED_ARCHS[p.arch]["vocab_size"])
    prompt_len = min(DECODE_PROMPT, p.max_model_len // 2)
    prompts = anyscale(batch, prompt_len, 8, 8, vocab, seed=batch)
    params = SamplingParams(temperature=0.0, max_tokens=p.decode_steps + 8, ignore_eos=True)
    ids = [f"decode-{batch}-{i}" for i in range(batch)]
    for rid, r in zip(ids, prompts, strict=True):
        engine.add_request(rid, r.prompt, params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or (
        engine.scheduler.waiting
    ):
        engine.step()  # prefill (and the decodes that share its steps)
    for _ in range(2):
        engine.step()  # warm-up: the first replay of this bucket
    times = []
    for _ in range(p.decode_steps):
        start = time.perf_counter()
        engine.step()  # returns after the sampled ids are read back: the step is done
        times.append(time.perf_counter() - start)
    for rid in ids:
        engine.abort_request(rid)
    return round(statistics.median(times) * 1000, 3)


def _engine(p: Setup, backend: str, **settings: Any) -> Any:
    return make_engine(
        f"dummy:{p.arch}", max_model_len=p.max_model_len, max_num_seqs=p.max_num_seqs,
        max_num_batched_tokens=p.max_num_batched_tokens, memory_fraction=0.85,
        attention_backend=backend, device=p.device,
        dtype=str(p.dtype).removeprefix("torch."), **settings,
    )  # fmt: skip


def _sweep(p: Setup, model: Any, requests: list[Request], left: Any) -> dict[int, RunResult]:
    """Each batch size on whole batches of the workload, until its time share is used."""
    sweep: dict[int, RunResult] = {}
    for b in p.hf_sweep:
        if sweep and left() < 2 * p.sweep_seconds:
            break  # keep the time for the full run at the best size so far
        done: list[RunResult] = []
        for lo in range(0, len(requests), b):
            done.append(run_hf_static(model, requests[lo : lo + b], b))
            if sum(r.seconds for r in done) > p.sweep_seconds:
                break
        sweep[b] = _merge(done)
    return sweep


def _merge(runs: list[RunResult]) -> RunResult:
    return RunResult(
        sum(r.seconds for r in runs), sum(r.cpu_seconds for r in runs),
        sum(r.output_tokens for r in runs), sum(r.processed_tokens for r in runs),
        sum(r.steps for r in runs), 0, [o for r in runs for o in r.outputs],
        max(r.max_batch for r in runs),
    )  # fmt: skip


def _run_kvscale(
    p: Setup, backend: str, warmup: list[Request], requests: list[Request], result: dict[str, Any]
) -> RunResult:
    engine = _engine(p, backend)
    budget = engine.model_runner.budget
    if budget is not None:
        result["kv_blocks"] = engine.block_manager.num_total_blocks
        result["budget_gib"] = {
            "total": budget.total_bytes / 2**30, "weights": budget.weight_bytes / 2**30,
            "activation_peak": budget.activation_bytes / 2**30, "kv": budget.kv_bytes / 2**30,
        }  # fmt: skip
    warm = run_kvscale(engine, warmup)
    result["kvscale_warmup_s"] = round(warm.seconds, 2)
    run = run_kvscale(engine, requests)
    graphs = engine.model_runner.graphs is not None
    result["kvscale_continuous"] = {**run.summary(), "attention": backend, "cuda_graphs": graphs}
    del engine
    _empty_cache(p)
    return run


def _hf_model(p: Setup) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    shape = {k: v for k, v in NAMED_ARCHS[p.arch].items() if k != "model_type"}
    with torch.device(p.device):
        config = LlamaConfig(**shape)
        model: Any = AutoModelForCausalLM.from_config(config, dtype=p.dtype)  # type: ignore[no-untyped-call]
    return model.eval()


def _empty_cache(p: Setup) -> None:
    if p.device == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny run on the CPU")
    args = parser.parse_args()
    if args.cpu_smoke:
        print(json.dumps(run(CPU_SMOKE), indent=2))
        return
    out = Path(__file__).parent / "results" / "gpu.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    result = previous | {"throughput": run(GPU), "machine": describe()}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["throughput"], indent=2))


if __name__ == "__main__":
    main()
