"""Load-test report math: vLLM key names, percentiles, goodput, refusals, cost, server deltas."""

from __future__ import annotations

import pytest

from kvscale.tools.client import RequestRecord, Target, request_body
from kvscale.tools.promtext import parse_prometheus_text, total
from kvscale.tools.report import (
    Cost,
    Slo,
    format_summary,
    max_concurrency,
    parse_slo,
    server_view,
    summarize,
)
from kvscale.tools.workload import PlannedRequest
from kvscale.traces import TraceError


def record(index: int, ttft: float, tokens: int, gap: float, start: float = 0.0,
           status: int = 200, cls: str | None = None) -> RequestRecord:  # fmt: skip
    rec = RequestRecord(index, cls, 100, tokens, start, start_s=start, status=status)
    if status == 200:
        rec.ttft_s = ttft
        rec.itls_s = [gap] * (tokens - 1)
        rec.output_tokens = tokens
        rec.prompt_tokens = 100
        rec.end_s = start + ttft + gap * (tokens - 1)
    else:
        rec.error = "refused"
        rec.end_s = start + ttft
    return rec


VLLM_KEYS = {
    "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput", "max_concurrent_requests",
    *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
      for stat in ("mean", "median", "std", "p50", "p90", "p95", "p99")),
}  # fmt: skip


def test_summary_has_vllm_keys_and_right_numbers() -> None:
    recs = [record(i, 0.1 * (i + 1), 11, 0.01) for i in range(10)]
    rep = summarize(recs, 2.0, slo=parse_slo("ttft=500ms,itl=20ms"))
    assert rep.keys() >= VLLM_KEYS
    assert rep["completed"] == 10 and rep["failed"] == 0
    assert rep["total_output_tokens"] == 110 and rep["output_throughput"] == 55.0
    assert rep["total_input_tokens"] == 1000
    assert rep["mean_ttft_ms"] == pytest.approx(550.0)
    assert rep["median_ttft_ms"] == pytest.approx(550.0)
    assert rep["p99_ttft_ms"] == pytest.approx(991.0)
    assert rep["mean_itl_ms"] == pytest.approx(10.0) and rep["mean_tpot_ms"] == pytest.approx(10.0)
    assert rep["slo_attainment"] == 0.5 and rep["request_goodput"] == 2.5
    assert "ttfts" not in rep
    detailed = summarize(recs, 2.0, detailed=True)
    assert len(detailed["ttfts"]) == len(detailed["itls"]) == len(detailed["input_lens"]) == 10
    assert detailed["request_goodput"] is None and detailed["slo_attainment"] is None


def test_refusals_errors_and_classes() -> None:
    recs = [
        record(0, 0.2, 5, 0.01, cls="interactive"),
        record(1, 0.004, 0, 0.0, status=429, cls="batch"),
        record(2, 0.010, 0, 0.0, status=429, cls="batch"),
        record(3, 0.002, 0, 0.0, status=503, cls="interactive"),
    ]
    broken = RequestRecord(4, None, 10, 5, 0.0, status=None, error="ConnectError")
    rep = summarize([*recs, broken], 1.0)
    assert rep["errors_by_status"] == {"429": 2, "503": 1, "transport": 1}
    assert rep["refusals"]["count"] == 3
    assert rep["refusals"]["max_refusal_ms"] == pytest.approx(10.0)
    assert rep["per_class"]["batch"] == {
        "requests": 2, "completed": 0, "refused": 2, "p50_ttft_ms": None, "p99_ttft_ms": None,
        "slo_attainment": None,
    }  # fmt: skip
    assert rep["per_class"]["interactive"]["completed"] == 1


def test_cost_per_successful_request() -> None:
    recs = [record(i, 0.1, 5, 0.01) for i in range(4)]
    rep = summarize(recs, 3600.0, cost=Cost(gpu_hour_price=2.0, replicas=3, gpus_per_replica=2))
    assert rep["cost"]["gpu_hours"] == pytest.approx(6.0)
    assert rep["cost"]["cost"] == pytest.approx(12.0)
    assert rep["cost"]["cost_per_successful_request"] == pytest.approx(3.0)
    assert rep["cost"]["cost_per_million_output_tokens"] == pytest.approx(12.0 / 20 * 1e6)


def test_slo_parsing() -> None:
    assert parse_slo("ttft=500ms,itl=0.05,e2e=10s") == Slo(0.5, 0.05, 10.0)
    assert parse_slo("tpot=20ms") == Slo(itl_s=0.02)
    assert parse_slo(None).empty
    for bad in ("ttft", "latency=1s", "ttft=fast"):
        with pytest.raises(TraceError):
            parse_slo(bad)


def test_max_concurrency_counts_overlaps() -> None:
    recs = [record(0, 1.0, 1, 0.0, start=0.0), record(1, 1.0, 1, 0.0, start=0.5),
            record(2, 1.0, 1, 0.0, start=2.0)]  # fmt: skip
    assert max_concurrency(recs) == 2


METRICS_BEFORE = """# HELP vllm:prefix_cache_queries_total x
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
"""
METRICS_AFTER = """vllm:prefix_cache_queries_total{engine="0",model_name="m"} 300.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 110.0
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
weird line without a value
vllm:request_success_total{finished_reason="stop",engine="0",model_name="a \\"b\\""} 2
"""


def test_prometheus_text_and_server_view() -> None:
    before, after = parse_prometheus_text(METRICS_BEFORE), parse_prometheus_text(METRICS_AFTER)
    assert total(after, "vllm:request_success_total", model_name='a "b"') == 2.0
    assert total(after, "vllm:nothing") is None
    timeline = [(0.0, parse_prometheus_text("vllm:num_requests_waiting 4\n")),
                (1.0, parse_prometheus_text("vllm:num_requests_waiting 8\n"))]  # fmt: skip
    view = server_view(before, after, timeline)
    assert view["prefix_cache_hit_rate"] == 0.5
    assert view["num_preemptions"] == 3.0
    assert (view["mean_queue_depth"], view["max_queue_depth"]) == (6.0, 8.0)
    assert view["mean_running"] is None


def test_request_body_for_completions_and_chat() -> None:
    req = PlannedRequest(0, 0.0, [11, 12], 2, 7, "interactive")
    body = request_body(Target("http://h:1", "m"), req)
    assert body["prompt"] == [11, 12] and body["max_tokens"] == 7 and body["ignore_eos"]
    assert body["stream_options"] == {"include_usage": True}
    chat = request_body(Target("http://h:1", "m", "/v1/chat/completions", ignore_eos=False), req)
    assert chat["messages"] == [{"role": "user", "content": "11 12"}] and "ignore_eos" not in chat


def test_summary_table_renders() -> None:
    rep = summarize([record(0, 0.1, 3, 0.01)], 1.0)
    text = format_summary(rep)
    assert "Successful requests:" in text and "P99 TTFT (ms):" in text
