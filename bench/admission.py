"""Admission control under a 3x overload burst: p99 TTFT of admitted requests vs the SLO.

1. Calibrate: a closed loop at the concurrency limit measures capacity (req/s) and the TTFT a
   request sees when the batch is full.
2. Set the SLO to a few times that TTFT, and the class's maximum queue wait to the SLO minus
   the full-batch TTFT: what an operator would configure.
3. Burst: Poisson arrivals at 3x capacity, the same schedule twice, against a server with
   admission control and against one without (every request enters the engine's queue).
Client-side numbers, measured with the load-test client on the same machine.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.serving import engine_server
from kvscale.tools import loadtest
from kvscale.tools.client import RequestRecord, Target
from kvscale.tools.workload import PlannedRequest, gamma_arrivals
from kvscale_engine.checkpoint import write_tiny_checkpoint
from kvscale_engine.model_config import NAMED_ARCHS

FULL: dict[str, Any] = {
    "arch": "llama-bench-cpu", "limit": 16, "prompt_len": 64, "output_len": 32,
    "calibration_requests": 128, "burst_s": 20.0, "overload": 3.0, "slo_factor": 4.0,
}  # fmt: skip
QUICK: dict[str, Any] = {
    "arch": "llama-tiny", "limit": 4, "prompt_len": 16, "output_len": 8,
    "calibration_requests": 32, "burst_s": 3.0, "overload": 3.0, "slo_factor": 4.0,
}  # fmt: skip
CLASS = "interactive"


def _requests(
    arrivals: list[float], p: dict[str, Any], vocab: int, seed: int
) -> list[PlannedRequest]:
    rng = random.Random(seed)
    return [
        PlannedRequest(
            i,
            at,
            [rng.randrange(5, vocab) for _ in range(p["prompt_len"])],
            p["prompt_len"],
            p["output_len"],
            CLASS,
        )
        for i, at in enumerate(arrivals)
    ]


def _load(url: str, requests: list[PlannedRequest], limit: int | None) -> loadtest.LoadTestResult:
    cfg = loadtest.LoadTestConfig(
        target=Target(url, "bench", ignore_eos=True), requests=requests,
        max_concurrency=limit, metrics_url=f"{url}/metrics", progress=False,
    )  # fmt: skip
    return asyncio.run(loadtest.run(cfg))


def _p(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _ttfts(records: list[RequestRecord]) -> list[float]:
    return [r.ttft_s for r in records if r.ok and r.ttft_s is not None]


def _burst_summary(result: loadtest.LoadTestResult, slo_s: float) -> dict[str, Any]:
    records = result.records
    reasons = result.after.get("kvscale:admission_rejections_total", {})
    by_reason: dict[str, float] = {}
    for labels, value in reasons.items():
        reason = dict(labels).get("reason", "?")
        by_reason[reason] = by_reason.get(reason, 0.0) + value
    ttfts = _ttfts(records)
    refused = [r.e2e_s for r in records if r.refused]
    return {
        "requests": len(records),
        "completed": len(ttfts),
        "refused": len(refused),
        "errors": sum(1 for r in records if not r.ok and not r.refused),
        "p50_ttft_s": _p(ttfts, 50),
        "p99_ttft_s": _p(ttfts, 99),
        "max_ttft_s": max(ttfts) if ttfts else None,
        "p99_refusal_s": _p(refused, 99),
        "server_rejections_by_reason": {k: v for k, v in sorted(by_reason.items()) if v},
        "slo_attainment_completed": sum(t <= slo_s for t in ttfts) / len(ttfts) if ttfts else None,
        "goodput_req_per_s": sum(t <= slo_s for t in ttfts) / result.duration_s,
        "duration_s": result.duration_s,
    }


def run(quick: bool = False) -> dict[str, Any]:
    p = QUICK if quick else FULL
    shape = {k: v for k, v in NAMED_ARCHS[str(p["arch"])].items() if k != "model_type"}
    vocab = int(shape["vocab_size"])
    limit = int(p["limit"])
    engine_flags = ["--max-model-len=512", "--num-kv-blocks=2048", f"--max-num-seqs={limit}",
                    "--max-num-batched-tokens=1024"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp), seed=0, **shape)
        with engine_server(path, *engine_flags, "--no-admission") as url:
            # calibration: capacity with the engine's queue always full, then the TTFT a
            # request sees in a full batch with no queue (a closed loop at the limit)
            n_cal = int(p["calibration_requests"])
            cal = _load(url, _requests([0.0] * n_cal, p, vocab, seed=1), None)
            capacity = len(_ttfts(cal.records)) / cal.duration_s
            closed = _load(url, _requests([0.0] * n_cal, p, vocab, seed=4), limit)
            full_ttft_p99 = _p(_ttfts(closed.records), 99) or 0.0
            slo_s = math.ceil(p["slo_factor"] * full_ttft_p99 * 10) / 10
            max_wait_s = max(0.05, slo_s - 1.5 * full_ttft_p99)
            rate = p["overload"] * capacity
            arrivals = gamma_arrivals(round(rate * p["burst_s"]), rate, 1.0, random.Random(2))
            burst = _requests(arrivals, p, vocab, seed=3)
            without = _burst_summary(_load(url, burst, None), slo_s)
        classes = [{"name": CLASS, "priority": 10, "maxQueue": 4 * limit,
                    "maxQueueWaitSeconds": round(max_wait_s, 3)}]  # fmt: skip
        admission_flags = ["--traffic-classes", json.dumps(classes), f"--max-concurrency={limit}"]
        with engine_server(path, *engine_flags, *admission_flags) as url:
            with_admission = _burst_summary(_load(url, burst, None), slo_s)
    return {
        "p99_ttft_admitted_s": with_admission["p99_ttft_s"],
        "slo_ttft_s": slo_s,
        "refusal_p99_s": with_admission["p99_refusal_s"],
        "p99_ttft_without_admission_s": without["p99_ttft_s"],
        "target": "p99_ttft_admitted_s <= slo_ttft_s; refusal_p99_s < 0.05",
        "admitted_within_slo": (with_admission["p99_ttft_s"] or math.inf) <= slo_s,
        "with_admission": with_admission,
        "without_admission": without,
        "calibration": {
            "capacity_req_per_s": round(capacity, 2),
            "full_batch_p99_ttft_s": round(full_ttft_p99, 4),
            "capacity_rule": "completed/s with every calibration request sent at once",
            "slo_rule": f"ceil_0.1s({p['slo_factor']} x full-batch p99 TTFT)",
            "max_queue_wait_s": round(max_wait_s, 3),
            "max_queue_wait_rule": "SLO - 1.5 x full-batch p99 TTFT",
        },
        "burst": {
            "arrivals": "poisson",
            "rate_req_per_s": round(rate, 2),
            "seconds": p["burst_s"],
            "requests": len(burst),
        },
        "workload": {k: v for k, v in p.items() if k not in ("slo_factor",)},
    }
