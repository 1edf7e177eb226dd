"""DirectScrape against real HTTP servers on loopback serving the engine's own /metrics."""

from __future__ import annotations

import time

import pytest
from metrics_farm import Replica, closed_port, farm, stats
from prometheus_client import generate_latest

from kvscale.signals.direct import DirectScrape
from kvscale.signals.snapshot import Problem
from kvscale.signals.source import PodAddress, Target


class Clock:
    def __init__(self) -> None:
        self.t = time.time() + 1  # after the farm's counters were created

    def __call__(self) -> float:
        return self.t


def target(*pods: PodAddress, routers: tuple[PodAddress, ...] = (), window: float = 60,
           interval: float = 60) -> Target:  # fmt: skip
    return Target("ns", "llama", window, interval, pods, routers)


async def test_rates_gauges_and_endpoint_quantiles_over_the_window() -> None:
    async with farm("a", "b") as replicas, DirectScrape(clock=(clock := Clock())) as source:
        a, b = replicas["a"], replicas["b"]
        tgt = target(a.address, b.address)
        first = await source.snapshot(tgt, clock.t)
        assert first.ok, first.message  # counters began inside the window (`_created`)
        t0 = clock.t
        a.metrics.observe_stats(
            stats(600, 300, running=4, waiting=2, kv=0.5, queries=600, hits=150)
        )
        b.metrics.observe_stats(stats(1200, 60, running=1, kv=0.25))
        a.finish(98, ttft_s=0.05)
        b.finish(2, ttft_s=2.0)
        clock.t = t0 + 60
        snap = await source.snapshot(tgt, clock.t + 1)
    assert snap.ok, snap.message
    ra, rb = snap.replicas
    assert (ra.pod, rb.pod) == ("a", "b")
    assert ra.prompt_tokens_per_s == pytest.approx(10) and ra.generation_tokens_per_s == 5
    assert rb.prompt_tokens_per_s == pytest.approx(20)
    assert (ra.running, ra.waiting, ra.kv_usage) == (4, 2, 0.5)
    assert ra.successes_per_s == pytest.approx(98 / 60)
    assert ra.prefix_hit_rate == 0.25 and snap.prefix_hit_rate == 0.25
    assert ra.sample_age_s == pytest.approx(1)
    assert snap.tokens_per_s == pytest.approx(10 + 5 + 20 + 1)
    # 100 TTFTs in the window: 98 in (0.04, 0.06], 2 in (1.0, 2.5]
    assert snap.latency.ttft_p50 == pytest.approx(0.04 + 0.02 * 50 / 98)
    assert snap.latency.ttft_p99 == pytest.approx(1.0 + 1.5 * 1 / 2)
    assert rb.latency.ttft_p50 == pytest.approx(1.0 + 1.5 * 0.5)
    assert snap.window_s == 60


async def test_a_restarted_replica_counts_from_its_new_zero() -> None:
    clock = Clock()
    async with farm("a") as replicas, DirectScrape(clock=clock) as source:
        a = replicas["a"]
        tgt = target(a.address)
        a.metrics.observe_stats(stats(5000, 0))
        await source.snapshot(tgt, clock.t)
        a.restart()
        a.metrics.observe_stats(stats(300, 0))
        clock.t += 30
        snap = await source.snapshot(tgt, clock.t)
    assert snap.ok, snap.message
    assert snap.replicas[0].prompt_tokens_per_s == pytest.approx(300 / 30)


async def test_unreachable_timeouts_and_errors() -> None:
    async with farm("slow", "broken") as replicas, DirectScrape(timeout_s=0.3) as source:
        replicas["slow"].delay_s = 5
        replicas["broken"].status = 500
        gone = closed_port()
        for pod, why in ((gone, "Cannot connect"), (replicas["slow"].address, "within 0.3 s"),
                         (replicas["broken"].address, "HTTP 500")):  # fmt: skip
            snap = await source.snapshot(target(pod), time.time())
            assert snap.problem is Problem.UNREACHABLE
            assert why in snap.message and pod.name in snap.message
            assert snap.replicas == ()


async def test_a_failing_replica_is_carried_until_stale() -> None:
    clock = Clock()
    async with farm("a", "b") as replicas, DirectScrape(timeout_s=0.3, clock=clock) as source:
        a, b = replicas["a"], replicas["b"]
        tgt = target(a.address, b.address, window=10, interval=10)
        assert (await source.snapshot(tgt, clock.t)).ok
        clock.t += 10
        a.metrics.observe_stats(stats(100, 0, waiting=9))
        assert (await source.snapshot(tgt, clock.t)).ok
        a.status = 503  # overloaded: its last numbers still count, with their age
        clock.t += 10
        carried = await source.snapshot(tgt, clock.t)
        assert carried.ok, carried.message
        assert carried.replicas[0].waiting == 9 and carried.replicas[0].sample_age_s == 10
        clock.t += 25  # 35 s old: older than 3 intervals
        stale = await source.snapshot(tgt, clock.t)
        assert stale.problem is Problem.STALE and "replica a is 35 s old" in stale.message
        b.status = 503  # nobody answers: unreachable, whatever was carried
        clock.t += 1
        assert (await source.snapshot(tgt, clock.t)).problem is Problem.UNREACHABLE


async def test_a_new_replica_that_fails_is_unreachable_and_one_without_metrics_missing() -> None:
    async with farm("a", "b") as replicas, DirectScrape() as source:
        a, b = replicas["a"], replicas["b"]
        snap = await source.snapshot(target(a.address, closed_port()), time.time())
        assert snap.problem is Problem.UNREACHABLE and "gone-0" in snap.message
        assert [r.pod for r in snap.replicas] == ["a"]
        b.text = "python_gc_objects_collected_total 1\n"
        snap = await source.snapshot(target(a.address, b.address), time.time())
        assert snap.problem is Problem.MISSING
        assert "replica b carry none of the series kvscale reads" in snap.message
        b.text = "vllm:num_requests_running 1\n"
        snap = await source.snapshot(target(a.address, b.address), time.time())
        assert snap.problem is Problem.MISSING
        assert "replica b lack vllm:prompt_tokens" in snap.message
        b.text = "sglang:num_running_reqs 1\n"
        snap = await source.snapshot(target(a.address, b.address), time.time())
        assert "replica b lack sglang:prompt_tokens" in snap.message


async def test_a_first_reading_without_created_waits_for_a_second() -> None:
    clock = Clock()
    async with farm("a") as replicas, DirectScrape(clock=clock) as source:
        a = replicas["a"]
        a.text = without_created(a)
        first = await source.snapshot(target(a.address), clock.t)
        assert first.problem is Problem.MISSING and "rates need a second reading" in first.message
        clock.t += 5
        assert (await source.snapshot(target(a.address), clock.t)).ok


async def test_pending_requests_from_the_routers_when_no_replica_is_ready() -> None:
    async with farm("router-0") as replicas, DirectScrape() as source:
        router = replicas["router-0"]
        router.text = (
            "# TYPE kvscale_router_pending_requests gauge\nkvscale_router_pending_requests 3\n"
        )
        snap = await source.snapshot(target(routers=(router.address,)), time.time())
        assert snap.ok and snap.pending_requests == 3 and snap.replicas == ()
        router.status = 502
        snap = await source.snapshot(target(routers=(router.address,)), time.time())
        assert snap.problem is Problem.UNREACHABLE and "Router router-0" in snap.message
        empty = await source.snapshot(target(), time.time())
        assert empty.ok and empty.pending_requests == 0


async def test_pods_that_left_are_forgotten() -> None:
    clock = Clock()
    async with farm("a") as replicas, DirectScrape(clock=clock) as source:
        a = replicas["a"]
        a.text = without_created(a)
        await source.snapshot(target(a.address), clock.t)
        clock.t += 5
        assert (await source.snapshot(target(a.address), clock.t)).ok
        await source.snapshot(target(), clock.t)  # a left the ready set: its samples go
        clock.t += 5
        back = await source.snapshot(target(a.address), clock.t)
        assert back.problem is Problem.MISSING  # a first reading again
        source.forget("ns", "llama")
        clock.t += 5
        assert (await source.snapshot(target(a.address), clock.t)).problem is Problem.MISSING


def without_created(replica: Replica) -> str:
    text = generate_latest(replica.metrics.registry).decode()
    return "\n".join(line for line in text.splitlines() if "_created" not in line) + "\n"


async def test_a_short_window_does_not_cut_a_long_ones_history() -> None:
    async with farm("a") as replicas, DirectScrape(clock=(clock := Clock())) as source:
        a = replicas["a"]
        t0 = clock.t
        for step in range(7):  # a fast loop: every 10 s over 10 s
            clock.t = t0 + 10 * step
            a.metrics.observe_stats(stats(100 * step, 0))
            assert (await source.snapshot(target(a.address, window=10), clock.t)).ok
        slow = await source.snapshot(target(a.address, window=60), clock.t)
        fast = await source.snapshot(target(a.address, window=10), clock.t)
    assert slow.replicas[0].prompt_tokens_per_s == pytest.approx(600 / 60)
    assert fast.replicas[0].prompt_tokens_per_s == pytest.approx(100 / 10)
