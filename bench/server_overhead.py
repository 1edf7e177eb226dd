"""Server overhead: output tokens/s through HTTP vs the offline engine, same workload, same run.

The offline baseline submits every request to an LLMEngine at once and steps it to the end.
The HTTP runs send the same requests, all at once, to `kvscale-engine serve` (a child process,
same engine settings) with the load-test client: streaming with usage (what users see) and
non-streaming. Output lengths are exact (EOS ignored) so both sides emit the same tokens.

Both engines run PyTorch on one thread: on a GPU host the model does not occupy the CPU cores the
server needs, and on this 2-core machine two OpenMP threads per engine make every run hostage to
whatever else is running (a co-runner slowed 2-thread runs up to 40x, 1-thread runs 2x).

Wall-clock rates swing with whatever else runs on a shared machine, so the same pairs are also
compared by CPU time: the offline process's against the server process's (every thread: the
engine step, HTTP, JSON, SSE), for the same output tokens. That ratio is what the server costs on
top of the engine, whatever the neighbours do; the client's CPU is not counted.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from bench.harness import make_engine, run_kvscale
from bench.serving import EngineProcess, engine_process
from bench.workloads import Request, anyscale
from kvscale.tools import loadtest
from kvscale.tools.client import Target
from kvscale.tools.workload import PlannedRequest
from kvscale_engine.engine.checkpoint import write_tiny_checkpoint
from kvscale_engine.model_config import NAMED_ARCHS

FULL: dict[str, Any] = {
    "arch": "llama-bench-cpu", "requests": 64, "prompt_len": 64, "mean_output": 48, "cap": 128,
    "max_num_seqs": 64, "repeats": 5, "warmup": 4,
}  # fmt: skip
QUICK: dict[str, Any] = {
    "arch": "llama-tiny", "requests": 8, "prompt_len": 16, "mean_output": 8, "cap": 16,
    "max_num_seqs": 8, "repeats": 1, "warmup": 1,
}  # fmt: skip
ENGINE = {"max_model_len": 512, "num_kv_blocks": 2048, "max_num_batched_tokens": 1024}


def _planned(requests: list[Request]) -> list[PlannedRequest]:
    return [
        PlannedRequest(i, 0.0, r.prompt, len(r.prompt), r.max_tokens, None)
        for i, r in enumerate(requests)
    ]


async def _streamed(server: EngineProcess, requests: list[Request]) -> dict[str, Any]:
    cfg = loadtest.LoadTestConfig(
        target=Target(server.url, "bench", ignore_eos=True), requests=_planned(requests),
        metrics_url=None, progress=False,
    )  # fmt: skip
    cpu = server.cpu_seconds()
    result = await loadtest.run(cfg)
    cpu = server.cpu_seconds() - cpu
    done = [r for r in result.records if r.ok]
    assert len(done) == len(requests), "every request should complete"
    tokens = sum(r.output_tokens for r in done)
    return {"seconds": result.duration_s, "output_tokens": tokens, "server_cpu_s": cpu,
            "output_tokens_per_s": tokens / result.duration_s}  # fmt: skip


async def _unstreamed(server: EngineProcess, requests: list[Request]) -> dict[str, Any]:
    url = server.url
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as c:

        async def one(r: Request) -> int:
            body = {"model": "bench", "prompt": r.prompt, "max_tokens": r.max_tokens,
                    "temperature": 0.0, "ignore_eos": True}  # fmt: skip
            resp = await c.post(f"{url}/v1/completions", json=body)
            resp.raise_for_status()
            return int(resp.json()["usage"]["completion_tokens"])

        start, cpu = time.perf_counter(), server.cpu_seconds()
        tokens = sum(await asyncio.gather(*(one(r) for r in requests)))
        seconds, cpu = time.perf_counter() - start, server.cpu_seconds() - cpu
    return {"seconds": seconds, "output_tokens": tokens, "server_cpu_s": cpu,
            "output_tokens_per_s": tokens / seconds}  # fmt: skip


def run(quick: bool = False) -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(QUICK if quick else FULL)
    finally:
        torch.set_num_threads(threads)


def _run(p: dict[str, Any]) -> dict[str, Any]:
    shape = {k: v for k, v in NAMED_ARCHS[str(p["arch"])].items() if k != "model_type"}

    def workload(seed: int) -> list[Request]:
        # fresh prompts for every run: no run hits the prefix cache warmed by another
        return anyscale(p["requests"], p["prompt_len"], p["mean_output"], p["cap"],
                        shape["vocab_size"], seed=seed)  # fmt: skip

    settings = {**ENGINE, "max_num_seqs": p["max_num_seqs"]}
    offline: list[float] = []
    offline_cpu: list[float] = []
    streamed: list[dict[str, Any]] = []
    unstreamed: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp), seed=0, **shape)
        engine = make_engine(path, **settings)
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
        limit = f"--max-concurrency={p['max_num_seqs']}"
        with engine_process(path, *flags, limit, torch_threads=1) as server:
            # interleaved, so that load from elsewhere on the machine hits both sides alike
            # warm-up: a process runs its first few batches several times slower (kernels for
            # new shapes), so both sides get the same number of warm-up runs first
            for seed in range(900, 900 + int(p["warmup"])):
                run_kvscale(engine, workload(seed))
                asyncio.run(_streamed(server, workload(seed)))
            for round_ in range(int(p["repeats"])):
                # each HTTP run right after the offline run of the same prompts
                a, b = workload(2 * round_), workload(2 * round_ + 1)
                for requests, send, into in (
                    (a, _streamed, streamed),
                    (b, _unstreamed, unstreamed),
                ):
                    alone = run_kvscale(engine, requests)
                    offline.append(alone.tokens_per_s)
                    offline_cpu.append(alone.cpu_seconds)
                    into.append(
                        asyncio.run(send(server, requests))
                        | {"offline": offline[-1], "offline_cpu_s": alone.cpu_seconds}
                    )
    stream_ratio = statistics.median(r["output_tokens_per_s"] / r["offline"] for r in streamed)
    plain_ratio = statistics.median(r["output_tokens_per_s"] / r["offline"] for r in unstreamed)
    stream_cpu = statistics.median(r["offline_cpu_s"] / r["server_cpu_s"] for r in streamed)
    plain_cpu = statistics.median(r["offline_cpu_s"] / r["server_cpu_s"] for r in unstreamed)
    requests = workload(0)
    return {
        "http_vs_offline": round(stream_ratio, 3),
        "http_unstreamed_vs_offline": round(plain_ratio, 3),
        "http_vs_offline_by_cpu_time": round(stream_cpu, 3),
        "http_unstreamed_vs_offline_by_cpu_time": round(plain_cpu, 3),
        "target": "http_vs_offline >= 0.9 (streaming, usage on, one SSE event per token)",
        "offline_cpu_s": [round(x, 2) for x in offline_cpu],
        "server_cpu_s_streamed": [round(r["server_cpu_s"], 2) for r in streamed],
        "server_cpu_s_unstreamed": [round(r["server_cpu_s"], 2) for r in unstreamed],
        "offline_output_tokens_per_s": [round(x, 1) for x in offline],
        "http_stream_output_tokens_per_s": [round(r["output_tokens_per_s"], 1) for r in streamed],
        "http_unstreamed_output_tokens_per_s": [
            round(r["output_tokens_per_s"], 1) for r in unstreamed
        ],
        "workload": {k: v for k, v in p.items() if k not in ("repeats", "warmup")}
        | {"output_tokens": sum(r.max_tokens for r in requests), "arrivals": "all at once"},
        "warmup_runs_per_side": p["warmup"],
        "engine": settings | {"torch_threads": 1},
        "notes": "each round: workload A offline then streamed over HTTP, workload B offline "
        "then unstreamed; fresh prompts every run (no cross-run prefix hits); ratios per pair, "
        "medians over rounds; the load-test client and the server share the machine's CPUs",
    }
