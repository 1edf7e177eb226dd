"""Deferred work on one engine: the preemptions interactive arrivals cause it, what of it still
gets done, and what a deferred backlog costs interactive latency.

One `kvscale-engine serve` process, two traffic classes: `chat` (interactive) and `batch`
(deferrable: `deadlineSeconds`, so the engine runs it below every interactive class and an
interactive arrival that cannot start preempts it). A calibration measures the capacity (chat
requests/s with every calibration request sent at once); Poisson chat arrivals at a share of it
then run twice, the same schedule: on an idle engine, and with a deferred backlog sent to the
engine at the start (a short lead before the first chat arrival), large enough to keep it busy
until the last chat request finished; what is left of the backlog is then cancelled (the engine
aborts it). `--max-concurrency` is above everything sent, so admission control queues and refuses
nothing: the backlog goes straight into the engine's scheduler, as when a router releases it.

Reported, over the chat window (first to last chat request): preemptions of deferred work (the
`kvscale_engine_preemptions_total{traffic_class="batch"}` delta) per interactive request and per
second; deferred requests completed and deferred output tokens/s; interactive p50/p99 TTFT and ITL
with and without the backlog, and their ratio; interactive requests refused or failed (0 expected).

The KV pool is deliberately small: it holds exactly `max_num_seqs` deferred sequences at full
length. The running backlog therefore fills the engine (every sequence slot and the pool), so an
interactive arrival cannot start without preempting deferred work, while deferred sequences never
run out of blocks among themselves: every batch preemption is one an interactive arrival caused.
The figure is a property of this pool size and of the load (both recorded): with headroom in the
pool and the sequence slots, an interactive request joins the running batch and preempts nothing.

The engine runs PyTorch on one thread; the client runs on the same machine.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.serving import engine_server
from kvscale.tools import loadtest
from kvscale.tools.client import RequestRecord, Target, send
from kvscale.tools.promtext import parse_prometheus_text, total
from kvscale.tools.report import Samples
from kvscale.tools.workload import PlannedRequest, gamma_arrivals
from kvscale_engine.engine.checkpoint import write_tiny_checkpoint
from kvscale_engine.model_config import NAMED_ARCHS

CLASSES: list[dict[str, Any]] = [
    {"name": "chat", "priority": 10, "maxQueueWaitSeconds": 30},
    {"name": "batch", "priority": 0, "deadlineSeconds": 3600},
]
FULL: dict[str, Any] = {
    "arch": "llama-bench-cpu", "max_num_seqs": 8, "block_size": 16,
    "chat_prompt_len": 64, "chat_output_len": 32, "batch_prompt_len": 192, "batch_output_len": 320,
    "calibration_requests": 64, "load_share": 0.5, "window_s": 60.0, "lead_s": 2.0,
}  # fmt: skip
QUICK: dict[str, Any] = {
    "arch": "llama-tiny", "max_num_seqs": 4, "block_size": 16,
    "chat_prompt_len": 16, "chat_output_len": 8, "batch_prompt_len": 32, "batch_output_len": 96,
    "calibration_requests": 16, "load_share": 0.5, "window_s": 4.0, "lead_s": 0.5,
}  # fmt: skip
TORCH_THREADS = 1
PREEMPTIONS = "kvscale_engine_preemptions_total"
GENERATED = "vllm:generation_tokens_total"


def run(quick: bool = False) -> dict[str, Any]:
    p = QUICK if quick else FULL
    shape = {k: v for k, v in NAMED_ARCHS[str(p["arch"])].items() if k != "model_type"}
    vocab = int(shape["vocab_size"])
    batch_len = p["batch_prompt_len"] + p["batch_output_len"]
    engine = {
        "max_model_len": batch_len,
        "block_size": p["block_size"],
        # exactly max_num_seqs deferred sequences at full length (the module docstring says why)
        "num_kv_blocks": p["max_num_seqs"] * math.ceil(batch_len / p["block_size"]),
        "max_num_seqs": p["max_num_seqs"],
        "max_num_batched_tokens": 4 * batch_len,
        "max_concurrency": 1 << 16,  # admission queues nothing: the backlog enters the engine
    }
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in engine.items()]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp), seed=0, **shape)
        classes = ["--traffic-classes", json.dumps(CLASSES)]
        with engine_server(path, *flags, *classes, torch_threads=TORCH_THREADS) as url:
            return _measure(url, p, vocab) | {
                "engine": engine | {"torch_threads": TORCH_THREADS},
                "traffic_classes": CLASSES,
                "workload": p,
                "load_average_at_end": os.getloadavg(),
            }


def _measure(url: str, p: dict[str, Any], vocab: int) -> dict[str, Any]:
    rng = random.Random(0)
    chat_shape = ("chat", p["chat_prompt_len"], p["chat_output_len"])
    asyncio.run(_window(url, _requests([0.0], chat_shape, vocab, rng), [], 0.0))  # warm-up
    n_cal = int(p["calibration_requests"])
    cal = asyncio.run(_window(url, _requests([0.0] * n_cal, chat_shape, vocab, rng), [], 0.0))
    capacity = cal["interactive"]["completed"] / cal["interactive"]["duration_s"]
    rate = p["load_share"] * capacity
    arrivals = gamma_arrivals(round(rate * p["window_s"]), rate, 1.0, random.Random(1))
    chat = _requests(arrivals, chat_shape, vocab, rng)
    # deferred tokens for three times the window at the calibrated token rate, on top of the
    # sequences that fill the engine: the backlog outlasts the chat window
    tokens = 3 * (p["window_s"] + p["lead_s"]) * capacity * p["chat_output_len"]
    n_batch = p["max_num_seqs"] + math.ceil(tokens / p["batch_output_len"])
    batch_shape = ("batch", p["batch_prompt_len"], p["batch_output_len"])
    backlog = _requests([0.0] * n_batch, batch_shape, vocab, rng)
    without = asyncio.run(_window(url, chat, [], 0.0))
    with_backlog = asyncio.run(_window(url, chat, backlog, p["lead_s"]))
    inter, alone = with_backlog["interactive"], without["interactive"]
    preempted = with_backlog["deferred"]["preempted"]
    return {
        "preemptions_per_interactive_request": round(preempted / len(chat), 3),
        "preemptions_per_s": round(preempted / with_backlog["window_s"], 3),
        "deferred_completed": with_backlog["deferred"]["completed"],
        "deferred_output_tokens_per_s": with_backlog["deferred"]["output_tokens_per_s"],
        "interactive_refused_or_failed": sum(
            r["interactive"]["refused"] + r["interactive"]["failed"]
            for r in (without, with_backlog)
        ),
        "ratio_with_to_without_backlog": {
            key: _ratio(inter[key], alone[key])
            for key in ("p50_ttft_s", "p99_ttft_s", "p50_itl_s", "p99_itl_s")
        },
        "with_backlog": with_backlog,
        "without_backlog": without,
        "calibration": {
            "capacity_req_per_s": round(capacity, 2),
            "capacity_rule": "chat requests completed/s, every calibration request sent at once",
        },
        "load": {
            "arrivals": "poisson",
            "interactive_rate_req_per_s": round(rate, 3),
            "share_of_capacity": p["load_share"],
            "interactive_requests": len(chat),
            "deferred_backlog_requests": n_batch,
            "backlog_lead_s": p["lead_s"],
        },
    }


def _requests(
    arrivals: list[float], shape: tuple[str, int, int], vocab: int, rng: random.Random
) -> list[PlannedRequest]:
    cls, prompt_len, output_len = shape
    return [
        PlannedRequest(i, at, _tokens(rng, prompt_len, vocab), prompt_len, output_len, cls)
        for i, at in enumerate(arrivals)
    ]


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(5, vocab) for _ in range(n)]


async def _window(
    url: str, chat: list[PlannedRequest], backlog: list[PlannedRequest], lead_s: float
) -> dict[str, Any]:
    """Send the backlog, wait `lead_s`, run the chat schedule; the backlog's rest is cancelled."""
    target = Target(url, "bench", ignore_eos=True)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600, connect=30)) as client:
        t0 = time.perf_counter()
        deferred = [asyncio.create_task(send(client, target, r, t0)) for r in backlog]
        await asyncio.sleep(lead_s)
        before = await _scrape(client, url)
        start = time.perf_counter() - t0
        cfg = loadtest.LoadTestConfig(target=target, requests=chat, progress=False)
        result = await loadtest.run(cfg)
        after = await _scrape(client, url)
        done = [t.result() for t in deferred if t.done()]
        for task in deferred:
            task.cancel()
        await asyncio.gather(*deferred, return_exceptions=True)
    chat_tokens = sum(r.output_tokens for r in result.records)
    deferred_tokens = _delta(before, after, GENERATED) - chat_tokens
    return {
        "window_s": round(result.duration_s, 3),
        "interactive": _latency(result.records) | {"duration_s": result.duration_s},
        "deferred": {
            "sent": len(backlog),
            "completed": sum(r.ok and r.end_s >= start for r in done),
            "failed": sum(not r.ok for r in done),
            "left_at_end": len(backlog) - len(done),
            "output_tokens": deferred_tokens,
            "output_tokens_per_s": round(deferred_tokens / result.duration_s, 1),
            "preempted": _delta(before, after, PREEMPTIONS, traffic_class="batch"),
        },
        "interactive_preempted": _delta(before, after, PREEMPTIONS, traffic_class="chat"),
    }


def _latency(records: list[RequestRecord]) -> dict[str, Any]:
    ttfts = [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
    itls = [itl for r in records if r.ok for itl in r.itls_s]
    return {
        "requests": len(records),
        "completed": len(ttfts),
        "refused": sum(r.refused for r in records),
        "failed": sum(not r.ok and not r.refused for r in records),
        "output_tokens": sum(r.output_tokens for r in records),
        "p50_ttft_s": _p(ttfts, 50),
        "p99_ttft_s": _p(ttfts, 99),
        "p50_itl_s": _p(itls, 50),
        "p99_itl_s": _p(itls, 99),
    }


async def _scrape(client: httpx.AsyncClient, url: str) -> Samples:
    resp = await client.get(f"{url}/metrics", timeout=30)
    resp.raise_for_status()
    return parse_prometheus_text(resp.text)


def _delta(before: Samples, after: Samples, name: str, **match: str) -> float:
    """A counter's increase, summed over the series whose labels include `match`."""
    return (total(after, name, **match) or 0.0) - (total(before, name, **match) or 0.0)


def _p(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None
