"""The load-test report: `vllm bench serve`'s key names, plus SLOs, refusals, cost and the
server's own view (prefix-cache hit rate, preemptions, queue depth) from /metrics.

Pure functions of the request records and metric scrapes, so they are unit-tested without a server.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvscale.tools.client import RequestRecord
from kvscale.tools.promtext import Labels, total
from kvscale.traces import TraceError

PERCENTILES = (50, 90, 95, 99)
Samples = dict[str, dict[Labels, float]]
_DURATION = re.compile(r"^([0-9]*\.?[0-9]+)(ms|s)?$")


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    itl_s: float | None = None  # checked against each request's mean inter-token time (TPOT)
    e2e_s: float | None = None

    def met_by(self, rec: RequestRecord) -> bool:
        if not rec.ok:
            return False
        checks = (
            (self.ttft_s, rec.ttft_s),
            (self.itl_s, rec.tpot_s if rec.tpot_s is not None else 0.0),
            (self.e2e_s, rec.e2e_s),
        )
        return all(limit is None or (value or 0.0) <= limit for limit, value in checks)

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.itl_s is None and self.e2e_s is None


def parse_slo(text: str | None) -> Slo:
    """'ttft=500ms,itl=50ms,e2e=10s' (a bare number means seconds)."""
    if not text:
        return Slo()
    values: dict[str, float] = {}
    for part in text.split(","):
        key, _, raw = part.partition("=")
        key = {"tpot": "itl", "e2el": "e2e"}.get(key.strip(), key.strip())
        match = _DURATION.match(raw.strip())
        if key not in ("ttft", "itl", "e2e") or not match:
            raise TraceError(f"bad SLO {part!r}: use ttft=500ms,itl=50ms,e2e=10s")
        values[f"{key}_s"] = float(match.group(1)) * (0.001 if match.group(2) == "ms" else 1.0)
    return Slo(**values)


@dataclass(frozen=True)
class Cost:
    gpu_hour_price: float = 0.0
    replicas: int = 1
    gpus_per_replica: int = 1


def latency_stats(name: str, values_s: Sequence[float]) -> dict[str, float]:
    """mean/median/std/pNN in milliseconds under vLLM's names, e.g. p99_ttft_ms."""
    ms = np.asarray(values_s, dtype=float) * 1000.0 if len(values_s) else np.zeros(1)
    stats = {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
    }
    for p in PERCENTILES:
        stats[f"p{p}_{name}_ms"] = float(np.percentile(ms, p))
    return stats


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    slo: Slo | None = None,
    cost: Cost | None = None,
    server: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    detailed: bool = False,
) -> dict[str, Any]:
    slo = slo or Slo()
    cost = cost or Cost()
    done = [r for r in records if r.ok]
    duration = max(duration_s, 1e-9)
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens or r.input_len for r in done)
    good = [r for r in done if slo.met_by(r)]
    report: dict[str, Any] = {
        **(meta or {}),
        "duration": duration_s,
        "completed": len(done),
        "failed": len(records) - len(done),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration,
        "request_goodput": len(good) / duration if not slo.empty else None,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "max_concurrent_requests": max_concurrency(records),
        **latency_stats("ttft", [r.ttft_s for r in done if r.ttft_s is not None]),
        **latency_stats("tpot", [r.tpot_s for r in done if r.tpot_s is not None]),
        **latency_stats("itl", [x for r in done for x in r.itls_s]),
        **latency_stats("e2el", [r.e2e_s for r in done]),
        "slo": {"ttft_s": slo.ttft_s, "itl_s": slo.itl_s, "e2e_s": slo.e2e_s},
        "slo_attainment": len(good) / len(done) if done and not slo.empty else None,
        "errors_by_status": errors_by_status(records),
        "refusals": refusal_stats(records),
        "cost": cost_stats(cost, duration_s, len(done), out_tokens),
        "per_class": per_class(records, slo),
        "server": server,
    }
    if detailed:
        report |= {
            "input_lens": [r.prompt_tokens or r.input_len for r in records],
            "output_lens": [r.output_tokens for r in records],
            "ttfts": [r.ttft_s for r in records],
            "itls": [r.itls_s for r in records],
            "generated_texts": [r.text for r in records],
            "errors": [r.error or "" for r in records],
        }
    return report


def errors_by_status(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Every request that did not complete, by HTTP status ('transport' when none came back)."""
    counts = Counter(
        str(r.status) if r.status not in (None, 200) else ("stream" if r.status else "transport")
        for r in records
        if not r.ok
    )
    return dict(sorted(counts.items()))


def refusal_stats(records: Sequence[RequestRecord]) -> dict[str, Any]:
    refused = [r for r in records if r.refused]
    latencies = [r.e2e_s for r in refused]
    stats: dict[str, Any] = {"count": len(refused)}
    if latencies:
        stats |= {
            "p50_refusal_ms": float(np.percentile(latencies, 50) * 1000),
            "p99_refusal_ms": float(np.percentile(latencies, 99) * 1000),
            "max_refusal_ms": max(latencies) * 1000,
        }
    return stats


def cost_stats(cost: Cost, duration_s: float, completed: int, out_tokens: int) -> dict[str, Any]:
    gpu_hours = cost.replicas * cost.gpus_per_replica * duration_s / 3600.0
    usd = gpu_hours * cost.gpu_hour_price
    return {
        "gpu_hour_price": cost.gpu_hour_price,
        "replicas": cost.replicas,
        "gpus_per_replica": cost.gpus_per_replica,
        "gpu_hours": gpu_hours,
        "cost": usd,
        "cost_per_successful_request": usd / completed if completed else None,
        "cost_per_million_output_tokens": usd / out_tokens * 1e6 if out_tokens else None,
    }


def per_class(records: Sequence[RequestRecord], slo: Slo) -> dict[str, Any]:
    names = sorted({r.traffic_class for r in records if r.traffic_class})
    out: dict[str, Any] = {}
    for name in names:
        mine = [r for r in records if r.traffic_class == name]
        done = [r for r in mine if r.ok]
        ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
        out[name] = {
            "requests": len(mine),
            "completed": len(done),
            "refused": sum(r.refused for r in mine),
            "p50_ttft_ms": float(np.percentile(ttfts, 50) * 1000) if ttfts else None,
            "p99_ttft_ms": float(np.percentile(ttfts, 99) * 1000) if ttfts else None,
            "slo_attainment": (
                sum(slo.met_by(r) for r in done) / len(done) if done and not slo.empty else None
            ),
        }
    return out


def max_concurrency(records: Sequence[RequestRecord]) -> int:
    events = sorted([(r.start_s, 1) for r in records] + [(r.end_s, -1) for r in records])
    peak = level = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def server_view(
    before: Samples, after: Samples, timeline: Sequence[tuple[float, Samples]]
) -> dict[str, Any]:
    """What the server's /metrics says happened during the run (counters as differences)."""

    def delta(name: str) -> float | None:
        a, b = total(after, name), total(before, name)
        return None if a is None or b is None else a - b

    queries, hits = delta("vllm:prefix_cache_queries_total"), delta("vllm:prefix_cache_hits_total")
    view: dict[str, Any] = {
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": hits / queries if queries and hits is not None else None,
        "num_preemptions": delta("vllm:num_preemptions_total"),
        "prompt_tokens": delta("vllm:prompt_tokens_total"),
        "generation_tokens": delta("vllm:generation_tokens_total"),
        "admission_rejections": delta("kvscale_engine_admission_rejections_total"),
    }
    for key, metric in (
        ("queue_depth", "vllm:num_requests_waiting"),
        ("running", "vllm:num_requests_running"),
        ("kv_cache_usage", "vllm:kv_cache_usage_perc"),
    ):
        series = [v for _, s in timeline if (v := total(s, metric)) is not None]
        view[f"mean_{key}"] = statistics.fmean(series) if series else None
        view[f"max_{key}"] = max(series) if series else None
    return view


def format_summary(report: dict[str, Any]) -> str:
    """A short table in the spirit of `vllm bench serve`'s."""
    lines = ["{:=^60}".format(" kvscale loadtest result ")]

    def row(label: str, value: Any, fmt: str = "{:.2f}") -> None:
        text = "n/a" if value is None else (fmt.format(value) if fmt else str(value))
        lines.append(f"{label:<44}{text:>16}")

    row("Successful requests:", report["completed"], "{}")
    row("Failed or refused requests:", report["failed"], "{}")
    row("Benchmark duration (s):", report["duration"])
    row("Request throughput (req/s):", report["request_throughput"])
    row("Request goodput (req/s):", report["request_goodput"])
    row("Output token throughput (tok/s):", report["output_throughput"])
    row("Total token throughput (tok/s):", report["total_token_throughput"])
    titles = {"ttft": "Time to First Token", "tpot": "Time per Output Token",
              "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}  # fmt: skip
    for metric, title in titles.items():
        lines.append("{:-^60}".format(f" {title} "))
        row(f"Mean {metric.upper()} (ms):", report[f"mean_{metric}_ms"])
        for p in (50, 99):
            row(f"P{p} {metric.upper()} (ms):", report[f"p{p}_{metric}_ms"])
    lines.append("{:-^60}".format(" SLO, refusals, cost, server "))
    row("SLO attainment:", report["slo_attainment"], "{:.3f}")
    row("Refused (429/503):", report["refusals"]["count"], "{}")
    row("P99 refusal latency (ms):", report["refusals"].get("p99_refusal_ms"))
    row("Cost per successful request:", report["cost"]["cost_per_successful_request"], "{:.6f}")
    server = report.get("server") or {}
    row("Prefix cache hit rate:", server.get("prefix_cache_hit_rate"), "{:.3f}")
    row("Preemptions:", server.get("num_preemptions"), "{:.0f}")
    row("Max queue depth:", server.get("max_queue_depth"), "{:.0f}")
    lines.append("=" * 60)
    return "\n".join(lines)
