"""Window math: counter increases across resets, Prometheus's histogram_quantile, windows."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscale.signals.contract import CounterKey, GaugeKey, HistogramKey
from kvscale.signals.raw import Buckets, RawSample
from kvscale.signals.window import (
    bucket_increase,
    endpoint_latency,
    endpoint_prefix_hit_rate,
    histogram_quantile,
    increase,
    merge,
    replica_window,
)

INF = math.inf


def buckets(*pairs: tuple[float, float]) -> Buckets:
    return Buckets(tuple(b for b, _ in pairs), tuple(c for _, c in pairs))


def test_increase_handles_resets() -> None:
    assert increase([10, 15, 30]) == 20
    assert increase([100, 130, 5, 25]) == 30 + 5 + 20  # restarted after 130
    assert increase([7]) == 0 and increase([]) == 0
    assert increase([50, 50]) == 0


def test_quantile_matches_prometheus_rules() -> None:
    h = buckets((0.1, 10), (0.5, 30), (1.0, 40), (INF, 40))
    assert histogram_quantile(0.25, h) == pytest.approx(0.1)  # rank 10, end of the first bucket
    assert histogram_quantile(0.5, h) == pytest.approx(0.1 + 0.4 * 10 / 20)
    assert histogram_quantile(1.0, h) == pytest.approx(1.0)
    # ranks in +Inf give the highest finite bound
    assert histogram_quantile(0.99, buckets((0.1, 1), (INF, 100))) == 0.1
    # no +Inf bucket, no observations, or a single bucket: NaN in Prometheus
    assert histogram_quantile(0.5, buckets((0.1, 1), (1.0, 2))) is None
    assert histogram_quantile(0.5, buckets((0.1, 0), (INF, 0))) is None
    assert histogram_quantile(0.5, buckets((INF, 5))) is None
    assert histogram_quantile(0.5, Buckets()) is None
    # out-of-range q, as Prometheus answers it
    assert histogram_quantile(-0.1, h) == -INF and histogram_quantile(1.5, h) == INF
    assert histogram_quantile(math.nan, h) is None
    # lowest bucket at or below zero: its bound is the answer
    assert histogram_quantile(0.1, buckets((-1.0, 5), (INF, 10))) == -1.0
    # non-monotonic counts are lifted to their envelope before the search
    assert histogram_quantile(0.5, buckets((0.1, 6), (0.2, 4), (INF, 10))) == pytest.approx(
        0.1 * 5 / 6
    )


def test_merge_sums_by_bound_over_unlike_layouts() -> None:
    merged = merge([buckets((0.1, 1), (INF, 2)), buckets((0.1, 3), (0.5, 4), (INF, 5))])
    assert merged == buckets((0.1, 4), (0.5, 4), (INF, 7))


def test_bucket_increase_across_a_restart() -> None:
    a, b, c = buckets((0.1, 5), (INF, 9)), buckets((0.1, 8), (INF, 20)), buckets((0.1, 1), (INF, 2))
    assert bucket_increase([a, b, c]) == buckets((0.1, 3 + 1), (INF, 11 + 2))


def raw(t: float, prompt: float, ttft: Buckets | None = None, **extra: float) -> RawSample:
    counters = {CounterKey.PROMPT_TOKENS: prompt, CounterKey.GENERATION_TOKENS: prompt / 2}
    counters.update({CounterKey(k): v for k, v in extra.items()})
    histograms = {HistogramKey.TTFT: ttft} if ttft else {}
    return RawSample(t, counters, {GaugeKey.RUNNING: t}, histograms)


def test_replica_window_uses_the_window_and_the_newest_gauges() -> None:
    samples = [raw(0, 0), raw(30, 300), raw(60, 900), raw(90, 1200)]
    w = replica_window("p", samples, window_s=60, now=95)
    assert w is not None
    assert w.elapsed_s == 60 and w.increases[CounterKey.PROMPT_TOKENS] == 900  # 30 -> 90
    s = w.signals()
    assert s.prompt_tokens_per_s == 15 and s.generation_tokens_per_s == 7.5
    assert s.running == 90 and s.sample_age_s == 5
    short = replica_window("p", samples[:2], window_s=60, now=30)
    assert short is not None and short.elapsed_s == 30  # not enough history: what there is


def test_replica_window_needs_two_readings_unless_counters_began_inside() -> None:
    one = raw(100, 50)
    assert replica_window("p", [one], 60, now=100) is None
    fresh = RawSample(100, one.counters, one.gauges, started_at=80)
    w = replica_window("p", [fresh], 60, now=100)
    assert w is not None and w.elapsed_s == 20 and w.rate(CounterKey.PROMPT_TOKENS) == 2.5
    old = RawSample(100, one.counters, one.gauges, started_at=10)
    assert replica_window("p", [old], 60, now=100) is None  # began long before: no window


def test_endpoint_latency_merges_buckets_not_quantiles() -> None:
    fast = [raw(0, 0, buckets((0.1, 0), (1.0, 0), (INF, 0))),
            raw(60, 60, buckets((0.1, 98), (1.0, 98), (INF, 98)))]  # fmt: skip
    slow = [raw(0, 0, buckets((0.1, 0), (1.0, 0), (INF, 0))),
            raw(60, 60, buckets((0.1, 0), (1.0, 2), (INF, 2)))]  # fmt: skip
    windows = [replica_window("a", fast, 60, 60), replica_window("b", slow, 60, 60)]
    assert all(w is not None for w in windows)
    latency = endpoint_latency([w for w in windows if w is not None])
    # 100 observations: 98 under 0.1 s, 2 in (0.1, 1]: p99 is rank 99 in the second bucket
    assert latency.ttft_p99 == pytest.approx(0.1 + 0.9 * 1 / 2)
    assert latency.itl_p99 is None


def test_prefix_hit_rate_from_token_counters() -> None:
    a = [
        raw(0, 0, prefix_queries=0, prefix_hits=0),
        raw(10, 10, prefix_queries=100, prefix_hits=50),
    ]
    b = [
        raw(0, 0, prefix_queries=0, prefix_hits=0),
        raw(10, 10, prefix_queries=300, prefix_hits=50),
    ]
    wa, wb = replica_window("a", a, 60, 10), replica_window("b", b, 60, 10)
    assert wa is not None and wb is not None
    assert wa.signals().prefix_hit_rate == 0.5
    assert endpoint_prefix_hit_rate([wa, wb]) == 100 / 400


# --- properties ---------------------------------------------------------------------------

bounds_strategy = st.lists(
    st.floats(0.001, 1000, allow_nan=False), min_size=1, max_size=12, unique=True
).map(sorted)


@st.composite
def histograms(draw: st.DrawFn) -> Buckets:
    bounds = draw(bounds_strategy)
    per_bucket = draw(st.lists(st.integers(0, 50), min_size=len(bounds) + 1,
                               max_size=len(bounds) + 1))  # fmt: skip
    cumulative, running = [], 0
    for n in per_bucket:
        running += n
        cumulative.append(float(running))
    return Buckets((*bounds, INF), tuple(cumulative))


@given(histograms(), st.floats(0.001, 1), st.floats(0.001, 1))
def test_quantile_is_monotone_in_q_and_within_bucket_bounds(
    h: Buckets, q1: float, q2: float
) -> None:
    lo, hi = sorted((q1, q2))
    a, b = histogram_quantile(lo, h), histogram_quantile(hi, h)
    if h.total == 0:
        assert a is None and b is None
        return
    assert a is not None and b is not None
    assert a <= b + 1e-9
    finite = h.bounds[:-1]
    assert 0 <= a <= finite[-1] and 0 <= b <= finite[-1]


@given(st.lists(st.floats(0, 1e9, allow_nan=False), max_size=20))
def test_increase_is_never_negative_across_resets(values: list[float]) -> None:
    assert increase(values) >= 0
    if values == sorted(values) and values:
        assert increase(values) == pytest.approx(values[-1] - values[0])


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=2, max_size=10),
       st.floats(1, 100))  # fmt: skip
def test_rates_are_never_negative(prompts: list[float], step: float) -> None:
    samples = [raw(i * step, p) for i, p in enumerate(prompts)]
    w = replica_window("p", samples, window_s=step * len(prompts), now=step * len(prompts))
    assert w is not None
    assert w.signals().prompt_tokens_per_s >= 0


@given(st.lists(histograms(), min_size=1, max_size=4), st.floats(0.01, 1))
def test_merged_quantile_lies_between_the_replicas(hs: list[Buckets], q: float) -> None:
    layout = hs[0].bounds
    same = [Buckets(layout, h.counts[: len(layout)]) for h in hs if len(h.counts) >= len(layout)]
    same = [h for h in same if h.total > 0 and list(h.counts) == sorted(h.counts)]
    if not same:
        return
    each = [histogram_quantile(q, h) for h in same]
    merged = histogram_quantile(q, merge(same))
    assert merged is not None and all(v is not None for v in each)
    assert min(v for v in each if v is not None) - 1e-9 <= merged
    assert merged <= max(v for v in each if v is not None) + 1e-9
