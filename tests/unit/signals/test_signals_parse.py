"""Parsing one replica's /metrics into a typed raw sample: our engine's, vLLM's and SGLang's."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscale.signals.contract import CounterKey, GaugeKey, HistogramKey
from kvscale.signals.exposition import parse_exposition
from kvscale.signals.raw import parse_replica
from kvscale.signals.window import histogram_quantile
from kvscale_engine.server.metrics import EngineMetrics, StatsSnapshot

FIXTURES = Path(__file__).parents[2] / "data" / "metrics"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize("name", ["vllm_v0_6.txt", "vllm_v0_10.txt"])
def test_vllm_versions_read_alike(name: str) -> None:
    raw = parse_replica(fixture(name), scraped_at=100.0)
    assert raw.missing() == ()
    assert raw.taken_at == 100.0
    assert raw.counters[CounterKey.PROMPT_TOKENS] == 48_200
    assert raw.counters[CounterKey.GENERATION_TOKENS] == 21_000
    assert raw.counters[CounterKey.PREEMPTIONS] == 2
    assert raw.counters[CounterKey.SUCCESSES] == 100  # v0.10's 4 aborted requests left out
    # v0.10 exports old and new names side by side: one is read, never both
    assert raw.gauges[GaugeKey.KV_USAGE] == 0.8125
    assert (raw.gauges[GaugeKey.RUNNING], raw.gauges[GaugeKey.WAITING]) == (7, 3)
    ttft, itl = raw.histograms[HistogramKey.TTFT], raw.histograms[HistogramKey.ITL]
    assert ttft.total == 100 and itl.total == 2_000
    assert histogram_quantile(0.5, ttft) == pytest.approx(0.08 + 0.02 * 10 / 30)
    assert histogram_quantile(0.99, ttft) == pytest.approx(1.75)
    assert histogram_quantile(0.5, itl) == pytest.approx(0.02)
    assert histogram_quantile(0.99, itl) == pytest.approx(0.1)


def test_vllm_v0_6_has_a_hit_rate_gauge_and_no_created() -> None:
    raw = parse_replica(fixture("vllm_v0_6.txt"), 0.0)
    assert CounterKey.PREFIX_QUERIES not in raw.counters
    assert raw.gauges[GaugeKey.PREFIX_HIT_RATE] == 0.4375
    assert raw.started_at is None
    assert len(raw.histograms[HistogramKey.TTFT].bounds) == 17  # V0's 16 bounds and +Inf


def test_vllm_v0_10_prefers_new_spellings() -> None:
    text = fixture("vllm_v0_10.txt")
    raw = parse_replica(text, 0.0)
    assert raw.counters[CounterKey.PREFIX_QUERIES] == 48_200
    assert raw.counters[CounterKey.PREFIX_HITS] == 21_088
    assert raw.started_at == 1.7285e9
    assert len(raw.histograms[HistogramKey.TTFT].bounds) == 23  # V1's 22 bounds and +Inf
    # only the deprecated spellings left: still read
    old_only = "\n".join(
        line
        for line in text.splitlines()
        if "kv_cache_usage_perc" not in line
        and "vllm:prefix_cache" not in line
        and "inter_token_latency" not in line
    )
    old = parse_replica(old_only, 0.0)
    assert old.missing() == ()
    assert old.gauges[GaugeKey.KV_USAGE] == 0.8125
    assert old.counters[CounterKey.PREFIX_HITS] == 21_088
    assert old.histograms[HistogramKey.ITL] == raw.histograms[HistogramKey.ITL]


def test_a_real_vllm_0_32() -> None:
    text = fixture("vllm_v0_32.txt")
    raw = parse_replica(text, 0.0)
    assert raw.missing() == () and raw.engine == "vllm"
    assert raw.counters[CounterKey.PROMPT_TOKENS] == 45
    assert raw.counters[CounterKey.GENERATION_TOKENS] == 72
    assert raw.counters[CounterKey.SUCCESSES] == 6
    assert raw.counters[CounterKey.REFUSALS] == 0  # vllm:admission_rejections, read
    assert raw.counters[CounterKey.PREFIX_QUERIES] == 45
    assert (raw.gauges[GaugeKey.RUNNING], raw.gauges[GaugeKey.WAITING]) == (0, 0)
    assert raw.gauges[GaugeKey.KV_USAGE] == 0
    assert raw.started_at is not None
    assert raw.histograms[HistogramKey.TTFT].total == 6
    assert raw.histograms[HistogramKey.ITL].total == 66  # 72 tokens less the 6 first ones
    errors = text.replace(
        'finished_reason="error",model_name="tiny-llama"} 0.0',
        'finished_reason="error",model_name="tiny-llama"} 17.0',
    )
    assert errors.count("} 17.0") == 1
    assert parse_replica(errors, 0.0).counters[CounterKey.SUCCESSES] == 6  # failures left out


def test_a_real_vllm_0_32_past_its_queue_limit() -> None:
    text = fixture("vllm_v0_32_busy.txt")
    raw = parse_replica(text, 0.0)
    assert raw.missing() == ()
    assert (raw.gauges[GaugeKey.RUNNING], raw.gauges[GaugeKey.WAITING]) == (2, 2)
    assert raw.gauges[GaugeKey.KV_USAGE] == pytest.approx(0.000977, rel=1e-3)  # a fraction
    assert raw.counters[CounterKey.REFUSALS] == 6  # over --max-num-queued-reqs 4
    assert raw.counters[CounterKey.SUCCESSES] == 0  # nothing finished yet
    assert raw.counters[CounterKey.GENERATION_TOKENS] == 835
    assert raw.histograms[HistogramKey.ITL].total == 833
    # without the total, the waiting requests by reason (capacity, deferred) add up to it
    by_reason = "\n".join(
        line for line in text.splitlines() if not line.startswith("vllm:num_requests_waiting{")
    )
    assert parse_replica(by_reason, 0.0).gauges[GaugeKey.WAITING] == 2
    assert "vllm:num_requests_waiting_by_reason" in by_reason


def test_sglang_reads_as_the_same_signals() -> None:
    raw = parse_replica(fixture("sglang_v0_5.txt"), scraped_at=100.0)
    assert raw.missing() == () and raw.engine == "sglang"
    assert raw.counters[CounterKey.PROMPT_TOKENS] == 48_200
    assert raw.counters[CounterKey.GENERATION_TOKENS] == 21_000
    assert raw.counters[CounterKey.SUCCESSES] == 100
    assert raw.counters[CounterKey.PREFIX_QUERIES] == 48_200  # its prompt tokens
    assert raw.counters[CounterKey.PREFIX_HITS] == 21_088  # its cached tokens
    assert CounterKey.PREEMPTIONS not in raw.counters and CounterKey.REFUSALS not in raw.counters
    assert (raw.gauges[GaugeKey.RUNNING], raw.gauges[GaugeKey.WAITING]) == (7, 3)
    assert raw.gauges[GaugeKey.KV_USAGE] == 0.8125
    assert GaugeKey.PREFIX_HIT_RATE not in raw.gauges  # its cache_hit_rate is per batch
    assert raw.started_at is None  # multiprocess mode exports no _created
    ttft, itl = raw.histograms[HistogramKey.TTFT], raw.histograms[HistogramKey.ITL]
    assert ttft.total == 100 and itl.total == 2_000
    assert len(ttft.bounds) == 19 and len(itl.bounds) == 24  # SGLang's bounds and +Inf
    # SGLang's lowest TTFT bound is 100 ms: 70 of the 100 TTFTs fall in it
    assert histogram_quantile(0.5, ttft) == pytest.approx(0.1 * 50 / 70)
    assert histogram_quantile(0.99, ttft) == pytest.approx(1.0 + 1.0 * 1 / 2)
    assert histogram_quantile(0.5, itl) == pytest.approx(0.015 + 0.005 * 1_000 / 1_500)
    assert histogram_quantile(0.99, itl) == pytest.approx(0.1)


def test_sglang_older_spelling_and_what_it_lacks_named_in_its_names() -> None:
    text = fixture("sglang_v0_5.txt").replace(
        "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"
    )
    raw = parse_replica(text, 0.0)
    assert raw.histograms[HistogramKey.ITL].total == 2_000
    lacking = "\n".join(line for line in text.splitlines() if "time_per_output" not in line)
    assert parse_replica(lacking, 0.0).missing() == ("sglang:inter_token_latency_seconds",)


def test_nothing_of_the_contract_reads_as_nothing() -> None:
    raw = parse_replica("tgi_queue_size 3\npython_gc_objects_collected_total 3\n", 0.0)
    assert raw.read_nothing and raw.engine is None
    assert not parse_replica(fixture("sglang_v0_5.txt"), 0.0).read_nothing


def test_our_engine() -> None:
    raw = parse_replica(fixture("kvscale_engine.txt"), 0.0)
    assert raw.missing() == ()
    assert raw.counters[CounterKey.PROMPT_TOKENS] == 120
    assert raw.counters[CounterKey.GENERATION_TOKENS] == 38
    assert raw.counters[CounterKey.SUCCESSES] == 4
    assert raw.counters[CounterKey.REFUSALS] == 0
    assert raw.counters[CounterKey.PREFIX_HITS] == 48
    assert raw.histograms[HistogramKey.TTFT].total == 4
    assert raw.histograms[HistogramKey.ITL].total == 34
    assert raw.started_at is not None


def test_data_parallel_ranks_add_up_and_kv_takes_the_fullest() -> None:
    text = """
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="1",model_name="m"} 4
vllm:num_requests_waiting{engine="0",model_name="m"} 0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:prompt_tokens_total{engine="0",model_name="m"} 10
vllm:prompt_tokens_total{engine="1",model_name="m"} 20
vllm:generation_tokens{engine="0",model_name="m"} 5
kvscale_engine_admission_rejections_total{reason="queue_full"} 2
kvscale_engine_admission_rejections_total{reason="draining"} 7
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 1
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 2
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1"} 3
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 3
"""
    raw = parse_replica(text, 5.0)
    assert raw.gauges[GaugeKey.RUNNING] == 7
    assert raw.gauges[GaugeKey.KV_USAGE] == 0.75
    assert raw.counters[CounterKey.PROMPT_TOKENS] == 30
    assert raw.counters[CounterKey.GENERATION_TOKENS] == 5  # a counter without _total
    assert raw.counters[CounterKey.REFUSALS] == 2  # refusals of a draining replica left out
    ttft = raw.histograms[HistogramKey.TTFT]
    assert (ttft.bounds, ttft.counts) == ((0.1, float("inf")), (4.0, 5.0))
    assert raw.missing() == ("vllm:inter_token_latency_seconds",)


def test_missing_names_what_is_absent() -> None:
    raw = parse_replica("python_gc_objects_collected_total 3\n", 1.0)
    assert set(raw.missing()) == {
        "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_requests_running",
        "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    }  # fmt: skip
    assert raw.missing(router=True) == ("kvscale_router_pending_requests",)
    router = parse_replica("kvscale_router_pending_requests 4\n", 1.0)
    assert router.missing(router=True) == ()
    assert router.gauges[GaugeKey.PENDING] == 4


def test_a_malformed_line_costs_only_itself() -> None:
    text = fixture("kvscale_engine.txt").replace(
        "vllm:num_requests_waiting{", 'vllm:num_requests_waiting{broken="x} nonsense\nignored{'
    )
    raw = parse_replica(text, 0.0)
    assert raw.counters[CounterKey.PROMPT_TOKENS] == 120
    assert GaugeKey.WAITING not in raw.gauges
    assert raw.missing() == ("vllm:num_requests_waiting",)


def test_exporter_timestamps_date_the_sample() -> None:
    raw = parse_replica("vllm:num_requests_running 1 1700000000000\n", scraped_at=1.8e9)
    assert raw.taken_at == 1.7e9


def test_exposition_keeps_labels_sorted_and_unescaped() -> None:
    samples = parse_exposition('x_total{b="2",a="q\\"uote"} 1\n')
    (point,) = samples["x_total"]
    assert point.labels == (("a", 'q"uote'), ("b", "2"))
    assert point.label("b") == "2" and point.label("c") is None


def test_deferred_work_is_read_apart_from_the_interactive_classes() -> None:
    """The engine's per-class series say which class is deferrable: the laws read the
    interactive classes' time to first token, and deferred work's waiting and preemptions apart
    from the totals (the vLLM-compatible totals keep every class)."""
    metrics = EngineMetrics("tiny-llama", 512, ["chat", "batch"], deferrable=["batch"])
    metrics.set_baseline(StatsSnapshot(0, 0, 256, 256, 0.0, 0, 0, 0, 0, 0))
    metrics.observe_stats(
        StatsSnapshot(
            num_running=2, num_waiting=5, num_total_blocks=256, num_free_blocks=128,
            kv_cache_usage=0.5, num_preemptions=4, prefix_cache_queries=0, prefix_cache_hits=0,
            prompt_tokens=100, generation_tokens=50, preemptions_by_class={"batch": 3, "chat": 1},
            waiting_by_class={"batch": 4, "chat": 1},
        )
    )  # fmt: skip
    for _ in range(9):
        metrics.observe_first_token(0.05, "chat")
    metrics.observe_first_token(30.0, "batch")
    raw = parse_replica(metrics.render().decode(), 0.0)
    assert raw.missing() == ()
    assert (raw.gauges[GaugeKey.WAITING], raw.gauges[GaugeKey.DEFERRED_WAITING]) == (5, 4)
    assert (
        raw.counters[CounterKey.PREEMPTIONS],
        raw.counters[CounterKey.DEFERRED_PREEMPTIONS],
    ) == (
        4,
        3,
    )
    ttft = raw.histograms[HistogramKey.TTFT]
    assert ttft.total == 9 and histogram_quantile(0.99, ttft) <= 0.06
    # the engine's own total still counts every class
    total = 'vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-llama"} 10.0'
    assert total in metrics.render().decode().splitlines()


def test_an_engine_without_the_split_reads_no_deferred_work() -> None:
    raw = parse_replica(fixture("vllm_v0_10.txt"), 0.0)
    assert GaugeKey.DEFERRED_WAITING not in raw.gauges
    assert CounterKey.DEFERRED_PREEMPTIONS not in raw.counters
    assert raw.histograms[HistogramKey.TTFT].total == 100
