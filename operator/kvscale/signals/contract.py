"""The metric contract the signals read: vLLM's names in every spelling it has used, and SGLang's.

kvscale's engine exports vLLM's names, so one table serves `engine.kind: kvscale` and `vllm`.
vLLM renamed several metrics across versions and, for a while, exported the old and the new name
side by side (v0.10 has both `vllm:kv_cache_usage_perc` and the deprecated
`vllm:gpu_cache_usage_perc`): each signal lists its spellings newest first, and a reader takes the
first one present, never the sum of two; 0.32 exports only the new ones. SGLang's spellings
follow vLLM's: a replica exports one engine's names, so they never meet. SGLang has no preemption
or refusal counter (its retractions are a gauge reset at each log line), so those two signals
read nothing from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class CounterKey(StrEnum):
    PROMPT_TOKENS = "prompt_tokens"
    GENERATION_TOKENS = "generation_tokens"
    PREEMPTIONS = "preemptions"
    SUCCESSES = "successes"
    PREFIX_QUERIES = "prefix_queries"
    PREFIX_HITS = "prefix_hits"
    REFUSALS = "refusals"
    DEFERRED_PREEMPTIONS = "deferred_preemptions"  # of PREEMPTIONS, those of deferred work


class GaugeKey(StrEnum):
    RUNNING = "running"
    WAITING = "waiting"
    KV_USAGE = "kv_usage"
    PREFIX_HIT_RATE = "prefix_hit_rate"  # vLLM V0 only: its own hit rate, no counters
    PENDING = "pending"  # the router's held requests while no replica is ready
    DEFERRED_WAITING = "deferred_waiting"  # of WAITING, the deferrable classes' requests


class HistogramKey(StrEnum):
    TTFT = "ttft"
    ITL = "itl"


@dataclass(frozen=True)
class Spelling:
    """The family names of one signal (newest first) and the series it leaves out."""

    names: tuple[str, ...]
    exclude: tuple[tuple[str, str], ...] = ()  # (label, value) pairs that do not count
    combine: str = "sum"  # how the series of one replica add up: sum | max | mean


ENGINES = ("vllm", "sglang")  # the metric prefixes of the engines whose names the contract reads

COUNTERS: dict[CounterKey, Spelling] = {
    CounterKey.PROMPT_TOKENS: Spelling(("vllm:prompt_tokens", "sglang:prompt_tokens")),
    CounterKey.GENERATION_TOKENS: Spelling(("vllm:generation_tokens", "sglang:generation_tokens")),
    CounterKey.PREEMPTIONS: Spelling(("vllm:num_preemptions",)),
    # vLLM V1 counts aborted requests under request_success{finished_reason="abort"}, and 0.32
    # failed ones under "error"; SGLang's finished requests include its aborted ones (they serve a
    # tokens-per-request estimate, not a verdict)
    CounterKey.SUCCESSES: Spelling(
        ("vllm:request_success", "sglang:num_requests"),
        (("finished_reason", "abort"), ("finished_reason", "error")),
    ),
    # SGLang counts cached prompt tokens against its prompt tokens (cached ones included)
    CounterKey.PREFIX_QUERIES: Spelling(
        ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries", "sglang:prompt_tokens")
    ),
    CounterKey.PREFIX_HITS: Spelling(
        ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits", "sglang:cached_tokens")
    ),
    # a draining replica refuses by design: that is not demand the fleet failed to carry.
    # vLLM (0.32) counts refusals only when a queue limit is set (--max-num-queued-reqs/-tokens)
    CounterKey.REFUSALS: Spelling(
        ("kvscale_engine_admission_rejections", "vllm:admission_rejections"),
        (("reason", "draining"),),
    ),
    # kvscale's engine only: deferred work preempted by interactive arrivals is by design, not
    # an endpoint in trouble; an engine without the series reads none
    CounterKey.DEFERRED_PREEMPTIONS: Spelling(
        ("kvscale_engine_preemptions",), (("deferrable", "false"),)
    ),
}

GAUGES: dict[GaugeKey, Spelling] = {
    GaugeKey.RUNNING: Spelling(("vllm:num_requests_running", "sglang:num_running_reqs")),
    # vLLM 0.32 splits its waiting requests by reason too (capacity, deferred): they add up to it
    GaugeKey.WAITING: Spelling(
        (
            "vllm:num_requests_waiting",
            "vllm:num_requests_waiting_by_reason",
            "sglang:num_queue_reqs",
        )
    ),
    # data-parallel ranks each report their own pool: the fullest one preempts first
    GaugeKey.KV_USAGE: Spelling(
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
        combine="max",
    ),
    # not SGLang's cache_hit_rate: that is the last prefill batch's, and decode steps zero it
    GaugeKey.PREFIX_HIT_RATE: Spelling(("vllm:gpu_prefix_cache_hit_rate",), combine="mean"),
    GaugeKey.PENDING: Spelling(("kvscale_router_pending_requests",)),
    # kvscale's engine only: released deferred work that yields to interactive requests waits
    # in the engine by design
    GaugeKey.DEFERRED_WAITING: Spelling(
        ("kvscale_engine_requests_waiting",), (("deferrable", "false"),)
    ),
}

HISTOGRAMS: dict[HistogramKey, Spelling] = {
    # kvscale's engine splits it by class: deferred work starts late by design (it yields to
    # interactive requests), so the laws read the interactive classes' time to first token
    HistogramKey.TTFT: Spelling(
        (
            "kvscale_engine_time_to_first_token_seconds",
            "vllm:time_to_first_token_seconds",
            "sglang:time_to_first_token_seconds",
        ),
        (("deferrable", "true"),),
    ),
    # not vLLM 0.32's request_time_per_output_token_seconds: one mean per request, not per token
    HistogramKey.ITL: Spelling(
        (
            "vllm:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds",
            "sglang:inter_token_latency_seconds",
            "sglang:time_per_output_token_seconds",
        )
    ),
}

# vLLM's bucket bounds for the two latency histograms (kvscale's engine uses the same): an SLO
# target is counted up to the bucket bound that holds it
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

# Without these a replica's snapshot cannot be trusted: the laws read every one of them.
REQUIRED_COUNTERS = (CounterKey.PROMPT_TOKENS, CounterKey.GENERATION_TOKENS)
REQUIRED_GAUGES = (GaugeKey.RUNNING, GaugeKey.WAITING, GaugeKey.KV_USAGE)
REQUIRED_HISTOGRAMS = (HistogramKey.TTFT, HistogramKey.ITL)


def counter_sample_names(family: str) -> tuple[str, ...]:
    """A counter's sample names: `_total` as exposed today, bare as some exporters write it."""
    return (f"{family}_total", family)


def sample_names() -> frozenset[str]:
    """Every sample name the contract reads: a line with any other name need not be parsed."""
    names: set[str] = set()
    for spelling in COUNTERS.values():
        for family in spelling.names:
            names.update(counter_sample_names(family))
    for spelling in GAUGES.values():
        names.update(spelling.names)
    for spelling in HISTOGRAMS.values():
        names.update(f"{family}_bucket" for family in spelling.names)
    names.update(created_sample_names())
    return frozenset(names)


def created_sample_names() -> tuple[str, ...]:
    """Where the counters' zero point is read: an engine creates all its series at start."""
    return tuple(f"{family}_created" for family in COUNTERS[CounterKey.PROMPT_TOKENS].names)


def engine_of(family: str) -> str | None:
    """The engine whose names `family` is spelt in (`vllm`, `sglang`), if one the contract reads."""
    prefix = family.split(":", 1)[0]
    return prefix if prefix in ENGINES and ":" in family else None


def spelt_for(spelling: Spelling, engine: str | None) -> str:
    """The family to name when `spelling` is absent from an engine's /metrics: its own newest,
    else vLLM's (the contract's reference names), else the first."""
    named = [n for n in spelling.names if engine_of(n) is not None]
    return next((n for n in named if engine_of(n) == engine), (named or spelling.names)[0])


def bucket_at_or_above(target_s: float, buckets: tuple[float, ...]) -> str:
    """The `le` of the first bucket that holds `target_s`, spelt without a trailing ".0" as the
    recording rules spell the engines' bounds ("+Inf" above the last)."""
    bound = next((b for b in buckets if b >= target_s), None)
    return "+Inf" if bound is None else f"{bound:g}"
