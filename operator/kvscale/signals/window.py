"""Window math over raw samples: counter increases, rates, and histogram quantiles.

Pure functions. A counter that drops has restarted (the replica's process began again): the new
value is what it counted since, as in Prometheus's `increase()` — without its extrapolation to
the window's edges, since a direct scrape knows exactly when each sample was taken. Quantiles
follow Prometheus's `histogram_quantile` over bucket increases (linear inside a bucket, the
highest finite bound when the rank falls into +Inf); endpoint-wide quantiles merge the
replicas' bucket increases first (`sum by (le)`), never average per-replica quantiles.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvscale.signals.contract import CounterKey, GaugeKey, HistogramKey
from kvscale.signals.raw import Buckets, RawSample
from kvscale.signals.snapshot import Latency, ReplicaSignals


def increase(values: Sequence[float]) -> float:
    """What a counter counted across consecutive readings, resets included; never negative."""
    total = 0.0
    for before, after in itertools.pairwise(values):
        total += after - before if after >= before else after
    return total


def bucket_increase(histograms: Sequence[Buckets]) -> Buckets:
    """Per-bound increase across consecutive readings of one replica's histogram."""
    if not histograms:
        return Buckets()
    readings = [dict(zip(h.bounds, h.counts, strict=True)) for h in histograms]
    bounds = sorted({b for h in histograms for b in h.bounds})
    counts = [increase([r[bound] for r in readings if bound in r]) for bound in bounds]
    return Buckets(tuple(bounds), tuple(counts))


def merge(histograms: Iterable[Buckets]) -> Buckets:
    """Sum by bound across replicas (`sum by (le)`); a bound one replica lacks adds nothing."""
    summed: dict[float, float] = {}
    for h in histograms:
        for bound, count in zip(h.bounds, h.counts, strict=True):
            summed[bound] = summed.get(bound, 0.0) + count
    bounds = tuple(sorted(summed))
    return Buckets(bounds, tuple(summed[b] for b in bounds))


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus's `histogram_quantile(q, ...)` over classic buckets; None where it gives NaN."""
    if math.isnan(q):
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    coalesced = merge([buckets])  # sorted, one count per bound
    if not coalesced.bounds or not math.isinf(coalesced.bounds[-1]):
        return None
    bounds, counts = list(coalesced.bounds), _monotonic(_precise(list(coalesced.counts)))
    if len(bounds) < 2 or counts[-1] == 0:
        return None
    rank = q * counts[-1]
    b = bisect.bisect_left(counts, rank, hi=len(counts) - 1)  # first bucket with count >= rank
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start, count, rank = bounds[b - 1], count - counts[b - 1], rank - counts[b - 1]
    if count == 0:
        return None  # q == 0 on an empty lowest bucket: 0/0 in Prometheus
    return start + (end - start) * (rank / count)


def _precise(counts: list[float], tolerance: float = 1e-12) -> list[float]:
    """Prometheus's correction of float noise that would break monotonicity."""
    previous = counts[0] if counts else 0.0
    for i in range(1, len(counts)):
        delta = abs(counts[i] - previous)
        if delta == 0:
            continue
        if delta / counts[i] <= tolerance:
            counts[i] = previous
        else:
            previous = counts[i]
    return counts


def _monotonic(counts: list[float]) -> list[float]:
    """The envelope of cumulative counts: a decrease between bounds is lifted to the max so far."""
    highest = -math.inf
    for i, c in enumerate(counts):
        highest = max(highest, c)
        counts[i] = highest
    return counts


@dataclass(frozen=True)
class ReplicaWindow:
    """One replica over one window: increases, newest gauges, bucket increases, age."""

    pod: str
    elapsed_s: float
    increases: dict[CounterKey, float] = field(default_factory=dict)
    gauges: dict[GaugeKey, float] = field(default_factory=dict)
    histograms: dict[HistogramKey, Buckets] = field(default_factory=dict)
    age_s: float = 0.0

    def rate(self, key: CounterKey) -> float:
        if self.elapsed_s <= 0:
            return 0.0
        return self.increases.get(key, 0.0) / self.elapsed_s

    @property
    def prefix_hit_rate(self) -> float | None:
        queries = self.increases.get(CounterKey.PREFIX_QUERIES)
        if queries:
            return self.increases.get(CounterKey.PREFIX_HITS, 0.0) / queries
        if queries is None:
            return self.gauges.get(GaugeKey.PREFIX_HIT_RATE)
        return None

    def signals(self) -> ReplicaSignals:
        return ReplicaSignals(
            pod=self.pod,
            prompt_tokens_per_s=self.rate(CounterKey.PROMPT_TOKENS),
            generation_tokens_per_s=self.rate(CounterKey.GENERATION_TOKENS),
            running=self.gauges.get(GaugeKey.RUNNING, 0.0),
            waiting=self.gauges.get(GaugeKey.WAITING, 0.0),
            kv_usage=self.gauges.get(GaugeKey.KV_USAGE, 0.0),
            preemptions_per_s=self.rate(CounterKey.PREEMPTIONS),
            refusals_per_s=self.rate(CounterKey.REFUSALS),
            successes_per_s=self.rate(CounterKey.SUCCESSES),
            latency=latency(self.histograms),
            prefix_hit_rate=self.prefix_hit_rate,
            sample_age_s=self.age_s,
            deferred_waiting=self.gauges.get(GaugeKey.DEFERRED_WAITING, 0.0),
            deferred_preemptions_per_s=self.rate(CounterKey.DEFERRED_PREEMPTIONS),
        )


def base_index(samples: Sequence[RawSample], window_s: float) -> int:
    """The newest sample at least `window_s` older than the newest one, else the oldest."""
    cutoff = samples[-1].taken_at - window_s
    older = [i for i, s in enumerate(samples) if s.taken_at <= cutoff]
    return older[-1] if older else 0


def replica_window(
    pod: str, samples: Sequence[RawSample], window_s: float, now: float
) -> ReplicaWindow | None:
    """The window ending at the newest sample (oldest first); None without two readings.

    A single reading whose counters began inside the window (`_created`) counts from zero.
    """
    if not samples:
        return None
    newest = samples[-1]
    started = newest.started_at
    if len(samples) == 1 and started is not None and now - window_s <= started < newest.taken_at:
        samples = [newest.zero(started), newest]
    span = samples[base_index(samples, window_s) :]
    elapsed = span[-1].taken_at - span[0].taken_at
    if len(span) < 2 or elapsed <= 0:
        return None
    increases = {
        key: increase([s.counters[key] for s in span if key in s.counters])
        for key in newest.counters
    }
    histograms = {
        key: bucket_increase([s.histograms[key] for s in span if key in s.histograms])
        for key in newest.histograms
    }
    return ReplicaWindow(
        pod=pod,
        elapsed_s=elapsed,
        increases=increases,
        gauges=dict(newest.gauges),
        histograms=histograms,
        age_s=max(0.0, now - newest.taken_at),
    )


def latency(histograms: dict[HistogramKey, Buckets]) -> Latency:
    ttft, itl = histograms.get(HistogramKey.TTFT), histograms.get(HistogramKey.ITL)
    return Latency(
        ttft_p50=None if ttft is None else histogram_quantile(0.5, ttft),
        ttft_p99=None if ttft is None else histogram_quantile(0.99, ttft),
        itl_p50=None if itl is None else histogram_quantile(0.5, itl),
        itl_p99=None if itl is None else histogram_quantile(0.99, itl),
    )


def endpoint_latency(windows: Sequence[ReplicaWindow]) -> Latency:
    """Quantiles over every replica's observations in the window (bucket increases merged)."""
    merged = {
        key: merge(w.histograms[key] for w in windows if key in w.histograms)
        for key in HistogramKey
    }
    return latency(merged)


def endpoint_prefix_hit_rate(windows: Sequence[ReplicaWindow]) -> float | None:
    """Hits over queries (tokens) summed across replicas; V0's gauges averaged otherwise."""
    queries = sum(w.increases.get(CounterKey.PREFIX_QUERIES, 0.0) for w in windows)
    if queries > 0:
        return sum(w.increases.get(CounterKey.PREFIX_HITS, 0.0) for w in windows) / queries
    gauges = [
        w.gauges[GaugeKey.PREFIX_HIT_RATE]
        for w in windows
        if CounterKey.PREFIX_QUERIES not in w.increases and GaugeKey.PREFIX_HIT_RATE in w.gauges
    ]
    return sum(gauges) / len(gauges) if gauges else None
