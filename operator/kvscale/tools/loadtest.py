"""`kvscale loadtest`: load any OpenAI-compatible endpoint (ours, the router, vLLM) and report.

Modelled on `vllm bench serve`: request shapes from public traces or synthetic, arrivals Poisson,
gamma (burstiness) or replayed with time scaling, optional max concurrency and traffic classes.
Measures TTFT, ITL, TPOT and E2E on the client; goodput under SLOs; refusals; cost; and reads the
server's /metrics before, during and after. Writes a JSON report and PNG plots. HTTP only: it
imports nothing from the engine.

    kvscale loadtest --base-url http://127.0.0.1:8000 --dataset azure-conv \\
        --max-input-len 400 --max-output-len 64 --num-prompts 200 --request-rate 8 \\
        --slo ttft=500ms,itl=100ms --output-dir results/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from kvscale.tools import tool_parser
from kvscale.tools.client import RequestRecord, Target, send
from kvscale.tools.promtext import parse_prometheus_text
from kvscale.tools.report import (
    Cost,
    Samples,
    Slo,
    format_summary,
    parse_slo,
    server_view,
    summarize,
)
from kvscale.tools.workload import (
    MOONCAKE_TICK_S,
    PlannedRequest,
    gamma_arrivals,
    parse_class_mix,
    plan,
    replay_arrivals,
)
from kvscale.traces import (
    DATASETS,
    SYNTHETIC,
    LengthPolicy,
    TraceError,
    default_traces_dir,
    load_trace,
    select,
    synthetic,
)


@dataclass(frozen=True)
class LoadTestConfig:
    target: Target
    requests: list[PlannedRequest]
    max_concurrency: int | None = None
    metrics_url: str | None = None
    scrape_interval_s: float = 1.0
    request_timeout_s: float = 600.0
    progress: bool = True
    slo: Slo = field(default_factory=Slo)
    cost: Cost = field(default_factory=Cost)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadTestResult:
    records: list[RequestRecord]
    duration_s: float
    before: Samples
    after: Samples
    timeline: list[tuple[float, Samples]]

    def report(self, cfg: LoadTestConfig, detailed: bool = False) -> dict[str, Any]:
        server = server_view(self.before, self.after, self.timeline) if self.after else None
        return summarize(
            self.records, self.duration_s, slo=cfg.slo, cost=cfg.cost, server=server,
            meta=cfg.meta, detailed=detailed,
        )  # fmt: skip


async def _scrape(client: httpx.AsyncClient, url: str | None) -> Samples:
    if not url:
        return {}
    try:
        resp = await client.get(url, timeout=10)
        resp.raise_for_status()
    except httpx.HTTPError:
        return {}
    return parse_prometheus_text(resp.text)


async def _sample_metrics(
    client: httpx.AsyncClient, cfg: LoadTestConfig, t0: float, out: list[tuple[float, Samples]]
) -> None:
    while True:
        samples = await _scrape(client, cfg.metrics_url)
        if samples:
            out.append((time.perf_counter() - t0, samples))
        await asyncio.sleep(cfg.scrape_interval_s)


async def run(cfg: LoadTestConfig) -> LoadTestResult:
    """Send every planned request at its offset; gather records and metric scrapes."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=30.0)
    gate = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    bar = tqdm(total=len(cfg.requests), disable=not cfg.progress, unit="req", file=sys.stderr)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        before = await _scrape(client, cfg.metrics_url)
        timeline: list[tuple[float, Samples]] = []
        t0 = time.perf_counter()
        sampler = asyncio.create_task(_sample_metrics(client, cfg, t0, timeline))

        async def one(req: PlannedRequest) -> RequestRecord:
            if gate is None:
                rec = await send(client, cfg.target, req, t0)
            else:
                async with gate:
                    rec = await send(client, cfg.target, req, t0)
            bar.update(1)
            return rec

        tasks = []
        for req in sorted(cfg.requests, key=lambda r: r.at_s):
            delay = req.at_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(req)))
        records = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - t0
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        after = await _scrape(client, cfg.metrics_url)
    bar.close()
    return LoadTestResult(sorted(records, key=lambda r: r.index), duration, before, after, timeline)


# command line


def add_loadtest_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `loadtest` on the `kvscale` CLI's subparsers; it runs run_loadtest(args)."""
    summary = "load-test an OpenAI-compatible endpoint and write a report and plots"
    p = tool_parser(subparsers, "loadtest", summary, __doc__)
    t = p.add_argument_group("target")
    t.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, no /v1")
    t.add_argument("--endpoint", default="/v1/completions",
                   choices=["/v1/completions", "/v1/chat/completions"])  # fmt: skip
    t.add_argument("--model", help="model name (default: the first of /v1/models)")
    t.add_argument("--metrics-url", help="default: <base-url>/metrics; 'none' to skip")
    t.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="ask for exactly the planned output length (vLLM extension)")  # fmt: skip
    w = p.add_argument_group("workload")
    w.add_argument("--dataset", choices=DATASETS, default="random")
    w.add_argument("--traces-dir", type=Path, default=None,
                   help="default: $KVSCALE_TRACES_DIR, else ~/.cache/kvscale/traces "
                        "(a missing public trace is downloaded there)")  # fmt: skip
    w.add_argument("--num-prompts", type=int, default=100)
    w.add_argument("--input-len", type=int, default=128, help="fixed/random datasets")
    w.add_argument("--output-len", type=int, default=64, help="fixed/random datasets")
    w.add_argument("--range-ratio", type=float, default=0.5, help="random dataset spread")
    w.add_argument("--input-scale", type=float, default=1.0)
    w.add_argument("--output-scale", type=float, default=1.0)
    w.add_argument("--max-input-len", type=int)
    w.add_argument("--max-output-len", type=int)
    w.add_argument("--prompt-format", choices=["ids", "text"], default="ids")
    w.add_argument("--vocab-range", default="10:500", help="token ids LOW:HIGH for id prompts")
    a = p.add_argument_group("arrivals")
    a.add_argument("--arrival", choices=["poisson", "gamma", "replay"], default="poisson")
    a.add_argument("--request-rate", type=float, default=math.inf, help="req/s (inf: all at once)")
    a.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; < 1 is burstier")
    a.add_argument("--time-scale", type=float, default=1.0, help="replay this many times faster")
    a.add_argument("--trace-offset", type=float, default=0.0, help="replay from this trace second")
    a.add_argument("--jitter", type=float, help="replay jitter in s (default: 3 for mooncake)")
    a.add_argument("--max-concurrency", type=int)
    a.add_argument("--classes", help="traffic-class mix, e.g. interactive:0.7,batch:0.3")
    a.add_argument("--class-header", default="x-kvscale-class")
    m = p.add_argument_group("measurement and output")
    m.add_argument("--slo", help="e.g. ttft=500ms,itl=50ms,e2e=10s")
    m.add_argument("--gpu-hour-price", type=float, default=0.0)
    m.add_argument("--replicas", type=int, default=1)
    m.add_argument("--gpus-per-replica", type=int, default=1)
    m.add_argument("--scrape-interval", type=float, default=1.0)
    m.add_argument("--request-timeout", type=float, default=600.0)
    m.add_argument("--output-dir", type=Path, default=Path("loadtest-results"))
    m.add_argument("--result-filename", default="loadtest.json")
    m.add_argument("--label", default=None)
    m.add_argument("--save-detailed", action="store_true", help="per-request arrays in the JSON")
    m.add_argument("--no-plots", action="store_true")
    m.add_argument("--no-progress", action="store_true")
    m.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_loadtest)
    return p


def _vocab(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    try:
        return int(low), int(high)
    except ValueError as exc:
        raise TraceError("--vocab-range must be LOW:HIGH") from exc


def _model(base_url: str, model: str | None) -> str:
    if model:
        return model
    resp = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30)
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


def config_from_args(args: argparse.Namespace) -> LoadTestConfig:
    rng = random.Random(args.seed)
    if args.dataset in SYNTHETIC:
        rows = synthetic(args.dataset, args.num_prompts, args.input_len, args.output_len,
                         args.range_ratio, rng)  # fmt: skip
    else:
        rows = load_trace(args.dataset, args.traces_dir or default_traces_dir())
        window = args.trace_offset if args.arrival == "replay" else None
        rows = select(rows, args.num_prompts, window, rng)
    policy = LengthPolicy(args.input_scale, args.output_scale, args.max_input_len,
                          args.max_output_len)  # fmt: skip
    rows = [policy.apply(r) for r in rows]
    if args.arrival == "replay":
        jitter = args.jitter if args.jitter is not None else (
            MOONCAKE_TICK_S if args.dataset == "mooncake" else 0.0
        )  # fmt: skip
        arrivals = replay_arrivals(rows, args.time_scale, jitter, rng)
    else:
        burstiness = 1.0 if args.arrival == "poisson" else args.burstiness
        arrivals = gamma_arrivals(len(rows), args.request_rate, burstiness, rng)
    requests = plan(
        rows, arrivals, prompt_format=args.prompt_format, vocab=_vocab(args.vocab_range),
        classes=parse_class_mix(args.classes), seed=args.seed,
    )  # fmt: skip
    model = _model(args.base_url, args.model)
    metrics_url = args.metrics_url or args.base_url.rstrip("/") + "/metrics"
    return LoadTestConfig(
        target=Target(
            args.base_url,
            model,
            args.endpoint,
            args.ignore_eos,
            args.class_header,
            keep_text=args.save_detailed,
        ),
        requests=requests,
        max_concurrency=args.max_concurrency,
        metrics_url=None if metrics_url == "none" else metrics_url,
        scrape_interval_s=args.scrape_interval,
        request_timeout_s=args.request_timeout,
        progress=not args.no_progress,
        slo=parse_slo(args.slo),
        cost=Cost(args.gpu_hour_price, args.replicas, args.gpus_per_replica),
        meta={
            "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
            "backend": "openai-chat" if args.endpoint.endswith("chat/completions") else "openai",
            "endpoint_type": "openai",
            "label": args.label,
            "model_id": model,
            "base_url": args.base_url,
            "dataset": args.dataset,
            "num_prompts": len(requests),
            "arrival": args.arrival,
            "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
            "burstiness": args.burstiness,
            "time_scale": args.time_scale,
            "max_concurrency": args.max_concurrency,
            "traffic_classes": args.classes,
        },
    )


def write_outputs(
    result: LoadTestResult, cfg: LoadTestConfig, out_dir: Path, filename: str,
    plots: bool, detailed: bool,
) -> dict[str, Any]:  # fmt: skip
    from kvscale.tools.plots import write_plots  # matplotlib only when plotting

    out_dir.mkdir(parents=True, exist_ok=True)
    report = result.report(cfg, detailed)
    if plots:
        title = cfg.meta.get("label") or cfg.meta.get("dataset") or "loadtest"
        paths = write_plots(result.records, result.timeline, out_dir, str(title))
        report["plots"] = [p.name for p in paths]
    (out_dir / filename).write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    return report


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    raise TypeError(f"cannot serialise {type(value).__name__}")


def run_loadtest(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except (TraceError, httpx.HTTPError, KeyError, IndexError) as exc:
        print(f"kvscale loadtest: error: {exc}", file=sys.stderr)
        return 2
    result = asyncio.run(run(cfg))
    report = write_outputs(result, cfg, args.output_dir, args.result_filename,
                           not args.no_plots, args.save_detailed)  # fmt: skip
    print(format_summary(report))
    print(f"Wrote {args.output_dir / args.result_filename}", file=sys.stderr)
    return 0 if report["completed"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (`python -m kvscale.tools.loadtest`), until the kvscale CLI wires it."""
    root = argparse.ArgumentParser(prog="kvscale")
    add_loadtest_parser(root.add_subparsers(dest="command", required=True))
    args = root.parse_args(["loadtest", *(sys.argv[1:] if argv is None else argv)])
    return run_loadtest(args)


if __name__ == "__main__":
    sys.exit(main())
