"""Admission control under a 3x overload burst, and the default concurrency limit it derives.

Burst. The SLO and the traffic classes come from the sample endpoint spec
(manifests/samples/tiny-dummy.yaml: `slo.ttftP99Seconds`, `trafficClasses`), rendered to the
engine as the operator renders them, so nothing about the target is tuned by this run. A
calibration run measures only the capacity (req/s with the engine's queue always full); Poisson
arrivals at 3x that capacity then hit a server with admission control and one without (every
request enters the engine's queue), the same schedule twice. Reported side by side: p99 TTFT of
admitted requests, goodput (requests within the SLO per second), the share refused, and how fast
a refusal comes back.

Default concurrency. Without `--max-concurrency`, a replica admits as many requests as fit its KV
pool at the measured request length. The old default reserved `max_model_len` per request (the
contiguous reservation paged KV exists to avoid). Requests with the Azure 2023 conversation
trace's shape (lengths scaled by 1/8 for a CPU), all sent at once, run against both rules.

Engines run PyTorch on one thread. Client-side numbers, measured with the load-test client on
the same machine.
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
import yaml

from bench.serving import engine_server
from bench.workloads import AZURE_CONV, azure_trace
from kvscale.tools import loadtest
from kvscale.tools.client import RequestRecord, Target
from kvscale.tools.workload import PlannedRequest, gamma_arrivals
from kvscale_engine.engine.checkpoint import write_tiny_checkpoint
from kvscale_engine.model_config import NAMED_ARCHS

SAMPLE = Path(__file__).resolve().parents[1] / "manifests" / "samples" / "tiny-dummy.yaml"
FULL: dict[str, Any] = {
    "arch": "llama-bench-cpu", "max_num_seqs": 16, "prompt_len": 64, "output_len": 32,
    "calibration_requests": 128, "burst_s": 20.0, "overload": 3.0,
}  # fmt: skip
QUICK: dict[str, Any] = {
    "arch": "llama-tiny", "max_num_seqs": 4, "prompt_len": 16, "output_len": 8,
    "calibration_requests": 32, "burst_s": 3.0, "overload": 3.0,
}  # fmt: skip
CONCURRENCY_FULL: dict[str, Any] = {
    "arch": "llama-tiny", "requests": 128, "scale": 1 / 8, "max_model_len": 1024,
    "num_kv_blocks": 512, "block_size": 16, "max_num_seqs": 64,
}  # fmt: skip
CONCURRENCY_QUICK: dict[str, Any] = CONCURRENCY_FULL | {"requests": 16, "scale": 1 / 32}
CLASS = "interactive"


def endpoint_spec() -> tuple[float, list[dict[str, Any]]]:
    """The SLO's p99 TTFT and the traffic classes of the sample LLMEndpoint."""
    spec = yaml.safe_load(SAMPLE.read_text())["spec"]
    return float(spec["slo"]["ttftP99Seconds"]), list(spec["trafficClasses"])


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


def _load(
    url: str, requests: list[PlannedRequest], scrape_s: float = 1.0
) -> loadtest.LoadTestResult:
    cfg = loadtest.LoadTestConfig(
        target=Target(url, "bench", ignore_eos=True), requests=requests,
        metrics_url=f"{url}/metrics", scrape_interval_s=scrape_s, progress=False,
    )  # fmt: skip
    return asyncio.run(loadtest.run(cfg))


def _p(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _ttfts(records: list[RequestRecord]) -> list[float]:
    return [r.ttft_s for r in records if r.ok and r.ttft_s is not None]


def _counter(samples: Any, name: str) -> dict[str, float]:
    """A counter's value per `reason` label (summed over the other labels)."""
    by: dict[str, float] = {}
    for labels, value in samples.get(name, {}).items():
        key = dict(labels).get("reason", "")
        by[key] = by.get(key, 0.0) + value
    return by


def _burst_summary(result: loadtest.LoadTestResult, slo_s: float) -> dict[str, Any]:
    records = result.records
    by_reason = _counter(result.after, "kvscale_engine_admission_rejections_total")
    ttfts = _ttfts(records)
    refused = [r.e2e_s for r in records if r.refused]
    within = sum(t <= slo_s for t in ttfts)
    return {
        "requests": len(records),
        "completed": len(ttfts),
        "refused": len(refused),
        "refusal_share": round(len(refused) / len(records), 4),
        "errors": sum(1 for r in records if not r.ok and not r.refused),
        "p50_ttft_s": _p(ttfts, 50),
        "p99_ttft_s": _p(ttfts, 99),
        "max_ttft_s": max(ttfts) if ttfts else None,
        "p99_refusal_s": _p(refused, 99),
        "server_rejections_by_reason": {k: v for k, v in sorted(by_reason.items()) if v},
        "completed_within_slo": within,
        "slo_attainment_completed": within / len(ttfts) if ttfts else None,
        "slo_attainment_all_requests": within / len(records),
        "goodput_req_per_s": round(within / result.duration_s, 3),
        "duration_s": result.duration_s,
    }


def run(quick: bool = False) -> dict[str, Any]:
    p = QUICK if quick else FULL
    slo_s, classes = endpoint_spec()
    burst = _burst(p, slo_s, classes)
    concurrency = _default_concurrency(CONCURRENCY_QUICK if quick else CONCURRENCY_FULL)
    return burst | {"default_concurrency": concurrency}


def _burst(p: dict[str, Any], slo_s: float, classes: list[dict[str, Any]]) -> dict[str, Any]:
    shape = {k: v for k, v in NAMED_ARCHS[str(p["arch"])].items() if k != "model_type"}
    vocab = int(shape["vocab_size"])
    engine_flags = [
        "--max-model-len=512", "--num-kv-blocks=2048", f"--max-num-seqs={p['max_num_seqs']}",
        "--max-num-batched-tokens=1024",
    ]  # fmt: skip
    admission_flags = ["--traffic-classes", json.dumps(classes)]  # as the operator renders them
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp), seed=0, **shape)
        with engine_server(path, *engine_flags, "--no-admission", torch_threads=1) as url:
            # capacity: completed/s with the engine's queue always full
            n_cal = int(p["calibration_requests"])
            cal = _load(url, _requests([0.0] * n_cal, p, vocab, seed=1))
            capacity = len(_ttfts(cal.records)) / cal.duration_s
            rate = p["overload"] * capacity
            arrivals = gamma_arrivals(round(rate * p["burst_s"]), rate, 1.0, random.Random(2))
            burst = _requests(arrivals, p, vocab, seed=3)
            without = _burst_summary(_load(url, burst), slo_s)
        with engine_server(path, *engine_flags, *admission_flags, torch_threads=1) as url:
            with_admission = _burst_summary(_load(url, burst), slo_s)
    p99 = with_admission["p99_ttft_s"]
    return {
        "p99_ttft_admitted_s": p99,
        "slo_ttft_s": slo_s,
        "refusal_share": with_admission["refusal_share"],
        "goodput_req_per_s": with_admission["goodput_req_per_s"],
        "goodput_without_admission_req_per_s": without["goodput_req_per_s"],
        "refusal_p99_s": with_admission["p99_refusal_s"],
        "p99_ttft_without_admission_s": without["p99_ttft_s"],
        "target": "p99_ttft_admitted_s <= slo_ttft_s; refusal_p99_s < 0.05",
        "admitted_within_slo": (p99 if p99 is not None else math.inf) <= slo_s,
        "slo_source": f"{SAMPLE.relative_to(SAMPLE.parents[2])} spec.slo.ttftP99Seconds",
        "traffic_classes": classes,
        "with_admission": with_admission,
        "without_admission": without,
        "calibration": {
            "capacity_req_per_s": round(capacity, 2),
            "capacity_rule": "completed/s with every calibration request sent at once",
        },
        "burst": {
            "arrivals": "poisson",
            "class": CLASS,
            "rate_req_per_s": round(rate, 2),
            "seconds": p["burst_s"],
            "requests": len(burst),
        },
        "workload": p,
        "torch_threads_per_engine": 1,
    }


def _default_concurrency(c: dict[str, Any]) -> dict[str, Any]:
    """Old rule (max_model_len per request) vs the default (measured lengths), same requests."""
    shape = {k: v for k, v in NAMED_ARCHS[str(c["arch"])].items() if k != "model_type"}
    trace = azure_trace(
        c["requests"], c["max_model_len"], int(shape["vocab_size"]), seed=5,
        path=AZURE_CONV, scale=c["scale"],
    )  # fmt: skip
    planned = [
        PlannedRequest(i, 0.0, r.prompt, len(r.prompt), r.max_tokens, "default")
        for i, r in enumerate(trace)
    ]
    # one request first, so both replicas are warm (a cold one queues only one wave)
    warmup = [planned[0]]
    old_limit = c["num_kv_blocks"] // math.ceil(c["max_model_len"] / c["block_size"])
    flags = [
        f"--max-model-len={c['max_model_len']}", f"--num-kv-blocks={c['num_kv_blocks']}",
        f"--block-size={c['block_size']}", f"--max-num-seqs={c['max_num_seqs']}",
        "--traffic-classes", '[{"name": "default", "maxQueue": 4096, "maxQueueWait": 3600}]',
    ]  # fmt: skip
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp), seed=0, **shape)
        for name, extra in (("old_max_model_len_rule", [f"--max-concurrency={old_limit}"]),
                            ("measured_lengths_default", [])):  # fmt: skip
            with engine_server(path, *flags, *extra, torch_threads=1) as url:
                _load(url, warmup)
                runs[name] = _concurrency_summary(_load(url, planned, scrape_s=0.2))
    old, new = runs["old_max_model_len_rule"], runs["measured_lengths_default"]
    return {
        "throughput_ratio": round(new["output_tokens_per_s"] / old["output_tokens_per_s"], 2),
        "peak_in_flight_ratio": round(new["peak_in_flight"] / old["peak_in_flight"], 2),
        "old_limit": old_limit,
        **runs,
        "workload": c
        | {
            "trace": "azure-llm-2023 conv (Splitwise, CC-BY-4.0), lengths scaled",
            "requests_used": len(planned),
            "mean_prompt_tokens": round(sum(r.input_len for r in planned) / len(planned), 1),
            "mean_output_tokens": round(sum(r.output_len for r in planned) / len(planned), 1),
            "arrivals": "one warm-up request, then all at once; max_tokens = the trace's "
            "output length, EOS ignored",
        },
        "notes": "llama-tiny on a CPU: a step costs little more for more rows, as a GPU decode "
        "step does, so the batch the limit allows sets the throughput",
    }


def _concurrency_summary(result: loadtest.LoadTestResult) -> dict[str, Any]:
    done = [r for r in result.records if r.ok]
    tokens = sum(r.output_tokens for r in done)
    in_flight = [
        sum(samples.get("kvscale_engine_admission_in_flight", {}).values())
        for _, samples in result.timeline
    ]
    preemptions = result.after.get("vllm:num_preemptions_total", {})
    return {
        "completed": len(done),
        "refused_or_failed": len(result.records) - len(done),
        "seconds": round(result.duration_s, 2),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / result.duration_s, 1),
        "peak_in_flight": max(in_flight, default=0),
        "p50_ttft_s": _p(_ttfts(result.records), 50),
        "preemptions": sum(preemptions.values()),
    }
