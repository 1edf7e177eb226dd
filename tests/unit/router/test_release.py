"""The deferred queue on the event loop: released into spare room, refused with a reason, given
up by a client that leaves, held while a replica is hot; and the backlog metrics."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvscale_router.admission import Admission, Refused, TrafficClass
from kvscale_router.config import RouterConfig
from kvscale_router.deferred import DeferralPolicy, Release
from kvscale_router.hold import Hold
from kvscale_router.metrics import RouterMetrics
from kvscale_router.picker import Picker
from kvscale_router.protocol import OutputTally
from kvscale_router.release import Releaser, deferred_of
from kvscale_router.replicas import Pod, ReplicaTable
from kvscale_router.weights import Published

CHAT = TrafficClass("chat", priority=10)
BATCH = TrafficClass("batch", max_queue=2, deadline_s=3600.0)
TIGHT = TrafficClass("tight", deadline_s=10.0)


def releaser(spare_tokens: float = 1000.0) -> Releaser:
    config = RouterConfig(
        traffic_classes=(CHAT, BATCH, TIGHT), spare_tokens=spare_tokens,
        deferral=DeferralPolicy(prior_tokens_per_s=10.0),
    )  # fmt: skip
    metrics = RouterMetrics()
    table = ReplicaTable(warmup_s=0)
    table.set_pods({"a": Pod("a", "http://a", 0.0)})
    admission = Admission(config.traffic_classes)
    hold = Hold(table, metrics, 10, 10.0)
    return Releaser(config, table, Picker(), admission, hold, metrics)


def sample(r: Releaser, name: str, **labels: str) -> float:
    value = r.metrics.registry.get_sample_value(f"kvscale_router_{name}", labels)
    return value or 0.0


async def test_a_request_is_released_into_spare_room_and_counted() -> None:
    r = releaser()
    runner = asyncio.create_task(r.run())
    try:
        release = await asyncio.wait_for(r.wait(deferred_of(BATCH, time.monotonic(), 300, 200)), 5)
    finally:
        runner.cancel()
    assert (release.replica, release.reason, release.valley) == ("a", "spare", True)
    assert sample(r, "deferred_released_total", traffic_class="batch", reason="spare") == 1
    assert sample(r, "deferred_valley_tokens_total", traffic_class="batch") == 300
    # promised to replica a until it starts there
    assert r.rooms()["a"].outstanding == 300
    r.settle(release)
    assert r.rooms()["a"].outstanding == 0


async def test_a_client_that_leaves_while_queued_takes_its_request_out() -> None:
    r = releaser(spare_tokens=0.0)  # no spare room: it stays queued
    waiter = asyncio.create_task(r.wait(deferred_of(BATCH, time.monotonic(), 300, 200)))
    await asyncio.sleep(0.01)
    r.step(time.monotonic())
    assert len(r.queue) == 1 and not waiter.done()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(r.queue) == 0 and not r._waiting


async def test_a_full_queue_refuses_with_429_and_retry_after() -> None:
    r = releaser(spare_tokens=0.0)
    waiters = [
        asyncio.create_task(r.wait(deferred_of(BATCH, time.monotonic(), 300, 200)))
        for _ in range(2)
    ]
    await asyncio.sleep(0.01)
    with pytest.raises(Refused) as refused:
        await r.wait(deferred_of(BATCH, time.monotonic(), 300, 200))
    assert (refused.value.status, refused.value.reason) == (429, "queue_full")
    assert 1 <= refused.value.retry_after_s <= 60
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert len(r.queue) == 0


async def test_an_unmeetable_deadline_is_refused_with_a_reason() -> None:
    r = releaser()
    with pytest.raises(Refused) as refused:  # 1000 tokens at 10/s: 100 s, the deadline is 10 s
        await r.wait(deferred_of(TIGHT, time.monotonic(), 1100, 1000))
    assert (refused.value.status, refused.value.reason) == (503, "deadline_unmeetable")
    assert "cannot be met" in str(refused.value)
    assert sample(r, "deferred_deadline_missed_total", traffic_class="tight",
                  reason="refused") == 1  # fmt: skip


async def test_a_hot_replica_stops_taking_deferred_work_at_once() -> None:
    r = releaser()
    r.table.set_published(Published({"a": 0.3}))  # the routing law calls it hot
    waiter = asyncio.create_task(r.wait(deferred_of(BATCH, time.monotonic(), 300, 200)))
    await asyncio.sleep(0.01)
    r.step(time.monotonic())
    assert not waiter.done() and r.rooms()["a"].hot
    r.table.set_published(Published({"a": 1.0}, token_budgets={"a": 200.0}))
    r.step(time.monotonic())  # cool again, but its published budget is smaller than the request
    assert not waiter.done()
    r.table.set_published(Published({"a": 1.0}, token_budgets={"a": 400.0}))
    r.step(time.monotonic())
    assert (await asyncio.wait_for(waiter, 5)).replica == "a"


async def test_interactive_requests_waiting_hold_deferred_work_back() -> None:
    r = releaser()
    r.hold.pending = 1  # an interactive request waits for a replica
    waiter = asyncio.create_task(r.wait(deferred_of(BATCH, time.monotonic(), 300, 200)))
    await asyncio.sleep(0.01)
    r.step(time.monotonic())
    assert not waiter.done()
    r.hold.pending = 0
    r.step(time.monotonic())
    await asyncio.wait_for(waiter, 5)


async def test_backlog_gauges_and_the_learned_rate() -> None:
    r = releaser(spare_tokens=0.0)
    waiter = asyncio.create_task(r.wait(deferred_of(BATCH, time.monotonic() - 5, 300, 200)))
    await asyncio.sleep(0.01)
    r.show(time.monotonic())
    assert sample(r, "deferred_queue_requests", traffic_class="batch") == 1
    assert sample(r, "deferred_oldest_age_seconds", traffic_class="batch") >= 5
    for due, tokens in [("60", 0), ("900", 0), ("3600", 300), ("14400", 300), ("+Inf", 300)]:
        assert sample(r, "deferred_queue_tokens", traffic_class="batch", due_within=due) == tokens
    assert sample(r, "deferred_decode_rate_tokens_per_second", replica="a") == 10.0
    request = deferred_of(BATCH, time.monotonic(), 300, 200)
    r.finished(Release(request, "a", "spare", True), "a", 200, 2.0, complete=True)  # 100 tok/s
    r.show(time.monotonic())
    assert sample(r, "deferred_decode_rate_tokens_per_second", replica="a") > 10.0
    assert sample(r, "deferred_completed_total", traffic_class="batch", outcome="met") == 1
    assert sample(r, "deferred_served_tokens_total", traffic_class="batch", release="spare") == 300
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


def test_output_tokens_come_from_usage_or_stream_events() -> None:
    whole = OutputTally()
    whole.feed(b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_')
    whole.feed(b'tokens": 42, "total_tokens": 47}}')
    assert whole.tokens == 42
    stream = OutputTally()
    for _ in range(7):
        stream.feed(b'data: {"choices": [{"text": "x"}]}\n\n')
    stream.feed(b"data: [DONE]\n\n")
    assert stream.tokens == 7
    assert OutputTally().tokens is None
