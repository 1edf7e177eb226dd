"""The metric contract the signals read: vLLM's names, with every spelling vLLM has used.

kvscale's engine exports vLLM's names, so one table serves `engine.kind: kvscale` and `vllm`.
vLLM renamed several metrics across versions and, for a while, exported the old and the new name
side by side (v0.10 has both `vllm:kv_cache_usage_perc` and the deprecated
`vllm:gpu_cache_usage_perc`): each signal lists its spellings newest first, and a reader takes the
first one present, never the sum of two.
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


class GaugeKey(StrEnum):
    RUNNING = "running"
    WAITING = "waiting"
    KV_USAGE = "kv_usage"
    PREFIX_HIT_RATE = "prefix_hit_rate"  # vLLM V0 only: its own hit rate, no counters
    PENDING = "pending"  # the router's held requests while no replica is ready


class HistogramKey(StrEnum):
    TTFT = "ttft"
    ITL = "itl"


@dataclass(frozen=True)
class Spelling:
    """The family names of one signal (newest first) and the series it leaves out."""

    names: tuple[str, ...]
    exclude: tuple[tuple[str, str], ...] = ()  # (label, value) pairs that do not count
    combine: str = "sum"  # how the series of one replica add up: sum | max | mean


COUNTERS: dict[CounterKey, Spelling] = {
    CounterKey.PROMPT_TOKENS: Spelling(("vllm:prompt_tokens",)),
    CounterKey.GENERATION_TOKENS: Spelling(("vllm:generation_tokens",)),
    CounterKey.PREEMPTIONS: Spelling(("vllm:num_preemptions",)),
    # vLLM V1 counts aborted requests under request_success{finished_reason="abort"}
    CounterKey.SUCCESSES: Spelling(("vllm:request_success",), (("finished_reason", "abort"),)),
    CounterKey.PREFIX_QUERIES: Spelling(
        ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
    ),
    CounterKey.PREFIX_HITS: Spelling(("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")),
    # a draining replica refuses by design: that is not demand the fleet failed to carry
    CounterKey.REFUSALS: Spelling(("kvscale:admission_rejections",), (("reason", "draining"),)),
}

GAUGES: dict[GaugeKey, Spelling] = {
    GaugeKey.RUNNING: Spelling(("vllm:num_requests_running",)),
    GaugeKey.WAITING: Spelling(("vllm:num_requests_waiting",)),
    # data-parallel ranks each report their own pool: the fullest one preempts first
    GaugeKey.KV_USAGE: Spelling(
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), combine="max"
    ),
    GaugeKey.PREFIX_HIT_RATE: Spelling(("vllm:gpu_prefix_cache_hit_rate",), combine="mean"),
    GaugeKey.PENDING: Spelling(("kvscale_router:pending_requests",)),
}

HISTOGRAMS: dict[HistogramKey, Spelling] = {
    HistogramKey.TTFT: Spelling(("vllm:time_to_first_token_seconds",)),
    HistogramKey.ITL: Spelling(
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
    ),
}

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
