"""What the signals module would read from the simulated replicas, with the scrape's delay.

Every `interval_s` the Ready replicas' counters, histograms and gauges are sampled (as Prometheus
or a direct scrape would). A snapshot at time t uses the newest sample taken at or before
`t - delay_s` and rates over `window_s` before it, per pod; latency quantiles come from the bucket
deltas merged across pods, interpolated inside a bucket as Prometheus' `histogram_quantile` does.
A pod without a sample at the window's start (it became Ready inside the window) has its rates
taken over the time since it became Ready, as `rate()` over its own samples would.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from kvscale.signals.snapshot import Fleet, Latency, ReplicaSignals, Snapshot
from kvscale.sim.endpoint import Endpoint
from kvscale.sim.engine import COUNTERS, DEFERRED_COUNTERS, ITL_BUCKETS, TTFT_BUCKETS, F


@dataclass(frozen=True)
class PodSample:
    counters: F  # prompt, generation, successes, refusals, preemptions, deferred, valley,
    # deferred preemptions
    ttft: F
    itl: F
    running: float
    waiting: float
    kv_usage: float
    deferred_waiting: float
    created_at: float
    ready_at: float


@dataclass(frozen=True)
class Sample:
    t: float
    pods: dict[str, PodSample]


class Scraper:
    def __init__(self, interval_s: float, delay_s: float, window_s: float) -> None:
        self.interval_s, self.delay_s, self.window_s = interval_s, delay_s, window_s
        self.samples: deque[Sample] = deque()
        self._next = -math.inf  # the first call scrapes, whenever the run starts
        self.deferred_rates = (0.0, 0.0)  # the last snapshot's deferred and valley tokens/s

    def maybe_scrape(self, t: float, ep: Endpoint) -> None:
        if t + 1e-9 < self._next:
            return
        self._next = t + self.interval_s
        e = ep.engines
        running, waiting, kv_usage, deferred_waiting = e.gauges()
        names = (*COUNTERS, *DEFERRED_COUNTERS)
        pods = {
            r.pod: PodSample(
                np.array([e.counters[n][r.slot] for n in names]),
                e.ttft_hist[r.slot].copy(),
                e.itl_hist[r.slot].copy(),
                float(running[r.slot]),
                float(waiting[r.slot]),
                float(kv_usage[r.slot]),
                float(deferred_waiting[r.slot]),
                r.created_at,
                r.ready_at,
            )
            for r in ep.ready(t)
        }
        self.samples.append(Sample(t, pods))
        horizon = t - self.window_s - self.delay_s - 2 * self.interval_s
        while len(self.samples) > 2 and self.samples[1].t < horizon:
            self.samples.popleft()

    def snapshot(self, t: float, fleet: Fleet, pending: float) -> Snapshot:
        newest = next((s for s in reversed(self.samples) if s.t <= t - self.delay_s + 1e-9), None)
        if newest is None:
            return Snapshot(
                taken_at=t, window_s=self.window_s, pending_requests=pending, fleet=fleet
            )
        base = next(
            (s for s in reversed(self.samples) if s.t <= newest.t - self.window_s + 1e-9), None
        )
        span = newest.t - base.t if base is not None else self.window_s
        replicas, ttft, itl = [], np.zeros(len(TTFT_BUCKETS) + 1), np.zeros(len(ITL_BUCKETS) + 1)
        deferred = np.zeros(2)  # deferred and valley tokens/s (a router would export them)
        for pod, now in newest.pods.items():
            before = base.pods.get(pod) if base is not None else None
            d = now.counters - (before.counters if before else 0.0)
            d_ttft = now.ttft - (before.ttft if before else 0.0)
            d_itl = now.itl - (before.itl if before else 0.0)
            ttft += d_ttft
            itl += d_itl
            # a pod without a sample at the window's start: its rate over its own samples
            own = span if before else min(span, newest.t - now.ready_at)
            rate = d / max(own, 1.0)
            deferred += rate[5:7]

            replicas.append(
                ReplicaSignals(
                    pod=pod,
                    prompt_tokens_per_s=float(rate[0]),
                    generation_tokens_per_s=float(rate[1]),
                    running=now.running,
                    waiting=now.waiting,
                    kv_usage=now.kv_usage,
                    preemptions_per_s=float(rate[4]),
                    refusals_per_s=float(rate[3]),
                    successes_per_s=float(rate[2]),
                    latency=_latency(d_ttft, d_itl),
                    sample_age_s=t - newest.t,
                    created_at=now.created_at,
                    ready_since=now.ready_at,
                    deferred_waiting=now.deferred_waiting,
                    deferred_preemptions_per_s=float(rate[7]),
                )
            )
        self.deferred_rates = (float(deferred[0]), float(deferred[1]))
        return Snapshot(
            taken_at=t,
            window_s=self.window_s,
            replicas=tuple(replicas),
            latency=_latency(ttft, itl),
            pending_requests=pending,
            fleet=fleet,
        )


def histogram_quantile(q: float, bounds: F, counts: F) -> float | None:
    """Prometheus' estimate: linear inside the bucket; the +Inf bucket answers its lower bound."""
    total = float(counts.sum())
    if total <= 0:
        return None
    cum = np.cumsum(counts)
    rank = q * total
    i = int(np.searchsorted(cum, rank, side="left"))
    if i >= len(bounds):
        return float(bounds[-1])
    lo = 0.0 if i == 0 else float(bounds[i - 1])
    below = 0.0 if i == 0 else float(cum[i - 1])
    inside = float(counts[i])
    return lo + (float(bounds[i]) - lo) * ((rank - below) / inside if inside > 0 else 1.0)


def _latency(ttft: F, itl: F) -> Latency:
    return Latency(
        ttft_p50=histogram_quantile(0.5, TTFT_BUCKETS, ttft),
        ttft_p99=histogram_quantile(0.99, TTFT_BUCKETS, ttft),
        itl_p50=histogram_quantile(0.5, ITL_BUCKETS, itl),
        itl_p99=histogram_quantile(0.99, ITL_BUCKETS, itl),
    )
