"""`make profile` / `python -m bench profile`: measure the real kvscale engine into a sim profile.

Sweeps the engine on this machine (CPU here, the GPU where there is one) and writes a profile
JSON that `kvscale simulate --profile` and `kvscale plan --profile` read:
- prefill tokens/s by prompt length: one prompt per step, prefix caching off, median of repeats;
- decode step time by batch size and context: that many sequences with prompts of that length,
  timed per step once all are decoding, median;
- KV token capacity: the blocks the engine allocated times the block size;
- start-up time: fresh processes that import the engine, build it, and run a first prefill.
Torch runs on one thread (here and in the start-up processes), so other jobs on a shared machine
move the timings least; the profile is of a one-thread replica.
Every number in the written profile's `sources` says what ran.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import one_thread
from bench.machine import describe
from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.model_config import ModelConfig
from kvscale_engine.sampling_params import SamplingParams

OUT = Path(__file__).parents[1] / "operator" / "kvscale" / "profiles"
FULL = {
    "arch": "llama-bench-cpu",
    "prefill": (64, 256, 1024),
    "batch": (1, 4, 16, 64),
    "context": (128, 512),
    "repeats": 3,
    "startups": 3,
}
QUICK = {
    "arch": "llama-tiny",
    "prefill": (32, 128),
    "batch": (1, 4),
    "context": (32, 64),
    "repeats": 2,
    "startups": 1,
}
MAX_LEN = 2048

_STARTUP = """
import time, sys
t0 = time.perf_counter()
from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.sampling_params import SamplingParams
t1 = time.perf_counter()
engine = LLMEngine(EngineConfig(model=sys.argv[1], max_model_len=int(sys.argv[2]), device="cpu"))
t2 = time.perf_counter()
engine.add_request("0", list(range(1, 129)), SamplingParams(max_tokens=1, ignore_eos=True))
while engine.has_unfinished_requests():
    engine.step()
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def run(quick: bool = False) -> dict[str, Any]:
    with one_thread():  # a co-runner on a shared box moves one thread's timings least
        return _run(QUICK if quick else FULL, quick)


def _run(p: dict[str, Any], quick: bool) -> dict[str, Any]:
    model = f"dummy:{p['arch']}"
    shape = ModelConfig.from_source(p["arch"])
    prefill = _prefill(model, p["prefill"], p["repeats"])
    decode, kv_tokens = _decode(model, p["batch"], p["context"], p["repeats"])
    startups = [_startup(model) for _ in range(p["startups"])]
    profile = _profile(p, shape, prefill, decode, kv_tokens, startups)
    name = f"cpu-kvscale-{p['arch']}" + ("-quick" if quick else "")
    path = Path(os.environ.get("KVSCALE_PROFILE_OUT", OUT)) / f"{name}.json"
    profile["name"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=2) + "\n")
    return {"profile_path": str(path), "profile": profile}


def _engine(model: str, budget: int, seqs: int) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=model,
            max_model_len=MAX_LEN,
            device="cpu",
            max_num_batched_tokens=budget,
            max_num_seqs=seqs,
            enable_prefix_caching=False,
        )
    )


def _prefill(model: str, sizes: tuple[int, ...], repeats: int) -> dict[int, float]:
    engine = _engine(model, max(sizes), 8)
    out: dict[int, float] = {}
    for n in sizes:
        times = []
        for r in range(repeats + 1):  # the first run warms up
            engine.add_request(f"p{n}-{r}", [1 + (i * 7 + r) % 200 for i in range(n)],
                               SamplingParams(max_tokens=1, ignore_eos=True))  # fmt: skip
            start = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            times.append(time.perf_counter() - start)
        out[n] = n / statistics.median(times[1:])
    return out


def _decode(
    model: str, batches: tuple[int, ...], contexts: tuple[int, ...], repeats: int
) -> tuple[dict[tuple[int, int], float], int]:
    engine = _engine(model, max(batches) * max(contexts), max(batches))
    kv_tokens = engine.stats().num_total_blocks * engine.config.block_size
    out: dict[tuple[int, int], float] = {}
    for ctx in contexts:
        for b in batches:
            ids = [f"d{b}-{ctx}-{i}" for i in range(b)]
            for i, rid in enumerate(ids):
                prompt = [1 + (i * 13 + k) % 200 for k in range(ctx)]
                engine.add_request(
                    rid, prompt, SamplingParams(max_tokens=repeats + 8, ignore_eos=True)
                )
            engine.step()  # prefill all of them (the budget holds them)
            times = []
            for _ in range(repeats + 2):
                start = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - start)
            out[(b, ctx)] = statistics.median(times[1:])
            for rid in ids:
                engine.abort_request(rid)
            while engine.has_unfinished_requests():
                engine.step()
    return out, kv_tokens


def _startup(model: str) -> tuple[float, float, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    text = subprocess.run(
        [sys.executable, "-c", _STARTUP, model, str(MAX_LEN)],
        check=True, capture_output=True, text=True, env=env,
    ).stdout  # fmt: skip
    imports, build, first = (float(x) for x in text.split())
    return imports, build, first


def _profile(
    p: dict[str, Any],
    shape: ModelConfig,
    prefill: dict[int, float],
    decode: dict[tuple[int, int], float],
    kv_tokens: int,
    startups: list[tuple[float, float, float]],
) -> dict[str, Any]:
    batches, contexts = p["batch"], p["context"]
    table = [[round(decode[(b, c)], 5) for c in contexts] for b in batches]
    kv_bytes = shape.kv_bytes_per_token * 4  # float32 on CPU
    top = batches[-1]
    slope = (decode[(top, contexts[-1])] - decode[(top, contexts[0])]) / (
        top * (contexts[-1] - contexts[0])
    )
    bandwidth = kv_bytes / slope if slope > 0 else 20e9
    totals = [sum(s) for s in startups]
    sigma = statistics.pstdev(math.log(t) for t in totals) if len(totals) > 1 else 0.0
    machine = describe()
    parts = [tuple(round(x, 2) for x in s) for s in startups]
    return {
        "name": "",
        "gpu": f"cpu: {machine['cpu']} ({machine['torch_threads']} torch threads)",
        "engine": "kvscale (eager, float32, CPU)",
        "model": f"{p['arch']} (dummy weights), maxModelLen {MAX_LEN}",
        "gpus_per_replica": 1,
        "kv_tokens": kv_tokens,
        "kv_bytes_per_token": kv_bytes,
        "memory_bytes_per_s": round(bandwidth, -6),
        "prefill": {
            "tokens_in_step": list(prefill),
            "tokens_per_s": [round(v, 1) for v in prefill.values()],
        },
        "decode": {"batch": list(batches), "context": list(contexts), "step_s": table},
        "startup": {"median_s": round(statistics.median(totals), 2), "sigma": round(sigma, 3)},
        "sources": {
            "prefill": f"Measured by bench/profile.py: one prompt per step of each length, prefix "
            f"caching off, median of {p['repeats']} after a warm-up, on {machine['cpu']}.",
            "decode": f"Measured: decode step medians with batch x context sequences all "
            f"decoding, {p['repeats']} steps each.",
            "context": "Beyond the largest measured context: KV bytes/token over the bandwidth "
            "implied by the measured context slope at the largest batch.",
            "kv_tokens": "Measured: blocks the engine allocated x block size.",
            "startup": f"Measured: {len(totals)} fresh processes; imports + engine construction "
            f"+ first 128-token prefill; parts (s): {parts}.",
            "measured_at": machine["date_utc"],
            "load_average_at_start": str(machine["load_average_at_start"]),
        },
    }
