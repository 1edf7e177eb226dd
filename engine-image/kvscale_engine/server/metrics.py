"""Every Prometheus metric the engine server exports, on a registry owned by one app.

Names, types, labels (`model_name`, `engine`) and histogram buckets follow vLLM's V1 metrics, so
dashboards, KEDA recipes, routers and the kvscale operator read a kvscale engine and a vLLM
engine alike. kvscale's own series (KV blocks, admission) carry a `kvscale_engine_` prefix. The
per-class time to first token, waiting requests and preemptions say whether the class is
deferrable, so the operator can tell deferred work waiting, preempted or started late (by design)
from an endpoint in trouble without knowing the classes.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LABELS = ("model_name", "engine")
PREFIX = "kvscale_engine_"  # kvscale's own series; vLLM's keep their `vllm:` names
FINISH_REASONS = ("stop", "length", "abort")
ADMISSION_REASONS = ("queue_full", "deadline", "timeout", "draining")

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CACHE_INFO_LABELS = (
    "block_size", "num_gpu_blocks", "gpu_memory_utilization", "enable_prefix_caching",
    "cache_dtype", "max_model_len", "max_num_seqs",
)  # fmt: skip


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value, as vLLM sizes its token-count histograms."""
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(buckets)
            buckets.append(float(mantissa * scale))
        scale *= 10


def version() -> str:
    """kvscale's installed version ("unknown" when run from a tree that is not installed)."""
    try:
        return metadata.version("kvscale")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class StatsSnapshot:
    """The engine-wide numbers the server reads after each engine step."""

    num_running: int
    num_waiting: int
    num_total_blocks: int
    num_free_blocks: int
    kv_cache_usage: float
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens: int
    generation_tokens: int
    preemptions_by_class: Mapping[str, int] = field(default_factory=dict)  # by the victim's
    waiting_by_class: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FinishedRequest:
    finish_reason: str
    e2e_s: float
    queue_s: float | None
    num_prompt_tokens: int
    num_generation_tokens: int


class EngineMetrics:
    """The server's metrics; gauges and counters follow the engine's cumulative stats."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        traffic_classes: Iterable[str],
        engine: str = "0",
        deferrable: Iterable[str] = (),
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = (model_name, engine)
        # requests waiting to run, by class: in the scheduler (from the last stats) and in the
        # admission queue (from the last refresh); the waiting gauges export their sums
        self._scheduler_waiting = 0
        self._scheduler_by_class: Mapping[str, int] = {}
        self._admission_by_class: dict[str, int] = {}
        self._waiting_classes: set[str] = set()  # every class whose gauge was set
        self._deferrable = frozenset(deferrable)
        self._last: StatsSnapshot | None = None
        tokens = build_1_2_5_buckets(max_model_len)
        gauge, counter, histogram = self._gauge, self._counter, self._histogram
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        # vLLM counts every accepted request that is not running (it has no admission queue);
        # here that is the scheduler's waiting requests plus the admission queue's
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.request_success = counter(
            "vllm:request_success", "Count of successfully processed requests.", "finished_reason"
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )  # fmt: skip
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )  # fmt: skip
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )  # fmt: skip
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS,
        )  # fmt: skip
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.cache_config_info = Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            [*CACHE_INFO_LABELS, "engine"], registry=self.registry,
        )  # fmt: skip
        # kvscale's own
        self.kv_blocks_total = gauge(PREFIX + "kv_blocks", "KV-cache blocks the engine allocated.")
        self.kv_blocks_free = gauge(
            PREFIX + "kv_blocks_free", "KV-cache blocks free (including evictable cached blocks)."
        )
        self.admission_rejections = counter(
            PREFIX + "admission_rejections",
            "Requests refused by admission control, by reason and traffic class.",
            "reason", "traffic_class",
        )  # fmt: skip
        self.queue_wait = histogram(
            PREFIX + "admission_queue_wait_seconds",
            "Time admitted requests waited in the admission queue, by traffic class.",
            TTFT_BUCKETS, "traffic_class",
        )  # fmt: skip
        self.admission_queued = gauge(
            PREFIX + "admission_queue_depth", "Requests waiting for admission, by traffic class.",
            "traffic_class",
        )  # fmt: skip
        self.admission_in_flight = gauge(
            PREFIX + "admission_in_flight", "Admitted requests in the engine, by traffic class.",
            "traffic_class",
        )  # fmt: skip
        self.ready = gauge(
            PREFIX + "ready", "1 when the server is loaded, warmed up and not draining."
        )
        self.class_preemptions = counter(
            PREFIX + "preemptions",
            "Preemptions by the victim's traffic class (deferred work preempted by interactive "
            "arrivals, or any class when KV blocks run out); vllm:num_preemptions is their sum.",
            "traffic_class", "deferrable",
        )  # fmt: skip
        self.class_ttft = histogram(
            PREFIX + "time_to_first_token_seconds",
            "Time to first token by traffic class (a deferred request's counts from its release "
            "by the router); vllm:time_to_first_token_seconds is their sum.",
            TTFT_BUCKETS, "traffic_class", "deferrable",
        )  # fmt: skip
        self.class_waiting = gauge(
            PREFIX + "requests_waiting",
            "Requests waiting to run by traffic class, in the admission queue or the scheduler "
            "(deferred work preempted or yielding to interactive requests included); "
            "vllm:num_requests_waiting is their sum.",
            "traffic_class", "deferrable",
        )  # fmt: skip
        self.build_info = Gauge(
            PREFIX + "build_info", "1, labelled with the engine's version.",
            ["version", "python_version"], registry=self.registry,
        )  # fmt: skip
        self.build_info.labels(version(), platform.python_version()).set(1)
        self._touch(traffic_classes)

    # every series carries the model and engine labels, on this app's registry

    def _gauge(self, name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(name, doc, [*LABELS, *labels], registry=self.registry)

    def _counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(name, doc, [*LABELS, *labels], registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: Iterable[float], *labels: str) -> Histogram:
        return Histogram(
            name, doc, [*LABELS, *labels], buckets=tuple(buckets), registry=self.registry
        )

    def _touch(self, traffic_classes: Iterable[str]) -> None:
        """Create every labelled child up front, so each series exists from the first scrape."""
        for metric in (self.running, self.waiting, self.kv_usage, self.kv_blocks_total,
                       self.kv_blocks_free, self.ready, self.preemptions, self.prompt_tokens,
                       self.generation_tokens, self.prefix_queries, self.prefix_hits, self.ttft,
                       self.itl, self.e2e, self.queue_time, self.request_prompt_tokens,
                       self.request_generation_tokens):  # fmt: skip
            metric.labels(*self._labels)
        for reason in FINISH_REASONS:
            self.request_success.labels(*self._labels, reason)
        for name in traffic_classes:
            self.queue_wait.labels(*self._labels, name)
            self.admission_queued.labels(*self._labels, name)
            self.admission_in_flight.labels(*self._labels, name)
            self.class_preemptions.labels(*self._class(name))
            self.class_waiting.labels(*self._class(name))
            self.class_ttft.labels(*self._class(name))
            for reason in ADMISSION_REASONS:
                self.admission_rejections.labels(*self._labels, reason, name)

    def set_cache_info(self, info: Mapping[str, object]) -> None:
        """The engine's cache settings as labels of a gauge set to 1, as vLLM exports them."""
        self.cache_config_info.clear()
        values = {k: str(info.get(k, "")) for k in CACHE_INFO_LABELS}
        self.cache_config_info.labels(**values, engine=self._labels[1]).set(1)

    def set_baseline(self, stats: StatsSnapshot) -> None:
        """Counters start from here: what the engine counted before (warm-up) is not exported."""
        self._last = stats

    def observe_stats(self, stats: StatsSnapshot) -> None:
        """Set gauges and advance counters by what changed since the last snapshot."""
        lab = self._labels
        self.running.labels(*lab).set(stats.num_running)
        self.kv_usage.labels(*lab).set(stats.kv_cache_usage)
        self.kv_blocks_total.labels(*lab).set(stats.num_total_blocks)
        self.kv_blocks_free.labels(*lab).set(stats.num_free_blocks)
        last = self._last
        for counter, now, before in (
            (self.preemptions, stats.num_preemptions, last and last.num_preemptions),
            (self.prompt_tokens, stats.prompt_tokens, last and last.prompt_tokens),
            (self.generation_tokens, stats.generation_tokens, last and last.generation_tokens),
            (self.prefix_queries, stats.prefix_cache_queries, last and last.prefix_cache_queries),
            (self.prefix_hits, stats.prefix_cache_hits, last and last.prefix_cache_hits),
        ):
            delta = now - (before or 0)
            if delta > 0:
                counter.labels(*lab).inc(delta)
        for name, count in stats.preemptions_by_class.items():
            delta = count - (last.preemptions_by_class.get(name, 0) if last else 0)
            if delta > 0:
                self.class_preemptions.labels(*self._class(name)).inc(delta)
        self._last = stats
        self._scheduler_waiting = stats.num_waiting
        self._scheduler_by_class = stats.waiting_by_class
        self._set_waiting()

    def _set_waiting(self) -> None:
        """The waiting gauges: the scheduler's count plus the admission queue's, in total and
        by class (a class no longer waiting anywhere is set back to 0)."""
        admission = self._admission_by_class
        self.waiting.labels(*self._labels).set(self._scheduler_waiting + sum(admission.values()))
        by_class: dict[str, int] = {}
        for counts in (self._scheduler_by_class, admission):
            for name, count in counts.items():
                by_class[name or "default"] = by_class.get(name or "default", 0) + count
        self._waiting_classes |= by_class.keys()
        for name in self._waiting_classes:
            self.class_waiting.labels(*self._class(name)).set(by_class.get(name, 0))

    def _class(self, name: str) -> tuple[str, ...]:
        """The labels of a per-class series: model, engine, class, whether it is deferrable."""
        deferrable = "true" if name in self._deferrable else "false"
        return (*self._labels, name or "default", deferrable)

    def observe_first_token(self, ttft_s: float, traffic_class: str = "default") -> None:
        self.ttft.labels(*self._labels).observe(ttft_s)
        self.class_ttft.labels(*self._class(traffic_class)).observe(ttft_s)

    def observe_inter_token(self, itl_s: float) -> None:
        self.itl.labels(*self._labels).observe(itl_s)

    def observe_finished(self, done: FinishedRequest) -> None:
        lab = self._labels
        self.request_success.labels(*lab, done.finish_reason).inc()
        self.e2e.labels(*lab).observe(done.e2e_s)
        if done.queue_s is not None:
            self.queue_time.labels(*lab).observe(done.queue_s)
        self.request_prompt_tokens.labels(*lab).observe(done.num_prompt_tokens)
        self.request_generation_tokens.labels(*lab).observe(done.num_generation_tokens)

    def observe_rejection(self, reason: str, traffic_class: str) -> None:
        self.admission_rejections.labels(*self._labels, reason, traffic_class).inc()

    def observe_queue_wait(self, traffic_class: str, wait_s: float) -> None:
        self.queue_wait.labels(*self._labels, traffic_class).observe(wait_s)

    def set_admission_load(self, traffic_class: str, queued: int, in_flight: int) -> None:
        self.admission_queued.labels(*self._labels, traffic_class).set(queued)
        self.admission_in_flight.labels(*self._labels, traffic_class).set(in_flight)
        self._admission_by_class[traffic_class] = queued
        self._set_waiting()

    def set_ready(self, ready: bool) -> None:
        self.ready.labels(*self._labels).set(1.0 if ready else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
