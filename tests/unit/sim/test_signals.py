"""Snapshots from scraped samples: rates over the window, delay, merged histogram quantiles."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import batch, limits, profile

from kvscale.sim.endpoint import Endpoint
from kvscale.sim.signals import Scraper, histogram_quantile


def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    bounds = np.array([0.1, 0.5, 1.0])
    counts = np.array([50.0, 40.0, 10.0, 0.0])  # last: +Inf
    # rank 90 of 100 is the top of the second bucket; rank 95 is half-way into the third
    assert histogram_quantile(0.9, bounds, counts) == pytest.approx(0.5)
    assert histogram_quantile(0.95, bounds, counts) == pytest.approx(0.75)
    assert histogram_quantile(0.99, bounds, np.array([0, 0, 0, 5.0])) == 1.0  # +Inf: lower bound
    assert histogram_quantile(0.5, bounds, np.zeros(4)) is None


def run_endpoint(scraper: Scraper, seconds: int, per_s: int) -> Endpoint:
    ep = Endpoint("e", profile(), limits(), 4, np.random.default_rng(0))
    ep.scale_to(2, 0.0, instant=True)
    for k in range(seconds):
        ep.route(batch(per_s, float(k), inp=400, out=20), float(k))
        ep.engines.step(float(k), 1.0)
        scraper.maybe_scrape(k + 1.0, ep)
    return ep


def test_rates_are_per_second_over_the_window_and_sum_over_pods() -> None:
    scraper = Scraper(interval_s=5.0, delay_s=0.0, window_s=30.0)
    ep = run_endpoint(scraper, 120, 4)
    snap = scraper.snapshot(120.0, ep.fleet(120.0), 0.0)
    assert len(snap.replicas) == 2
    # 4 requests/s of 400 prompt tokens, all served
    assert snap.prompt_tokens_per_s == pytest.approx(1600, rel=0.1)
    assert snap.successes_per_s == pytest.approx(4, rel=0.15)
    assert snap.latency.ttft_p99 is not None and snap.latency.ttft_p99 < 1.0


def test_a_delayed_source_shows_an_older_sample() -> None:
    fresh = Scraper(interval_s=5.0, delay_s=0.0, window_s=30.0)
    late = Scraper(interval_s=5.0, delay_s=20.0, window_s=30.0)
    ep = run_endpoint(fresh, 60, 2)
    ep_late = run_endpoint(late, 60, 2)
    a = fresh.snapshot(60.0, ep.fleet(60.0), 0.0)
    b = late.snapshot(60.0, ep_late.fleet(60.0), 0.0)
    assert 0.0 <= a.replicas[0].sample_age_s < 5.0  # at most one scrape interval
    assert 20.0 <= b.replicas[0].sample_age_s < 25.0


def test_no_sample_yet_gives_a_snapshot_without_replicas() -> None:
    scraper = Scraper(interval_s=5.0, delay_s=0.0, window_s=30.0)
    ep = Endpoint("e", profile(), limits(), 4, np.random.default_rng(0))
    snap = scraper.snapshot(0.0, ep.fleet(0.0), 3.0)
    assert snap.replicas == () and snap.pending_requests == 3.0
