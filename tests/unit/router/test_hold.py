"""Hold-from-zero: requests wait for a routable replica, within a count and a time bound."""

from __future__ import annotations

import asyncio

import pytest

from kvscale_router.admission import Refused
from kvscale_router.hold import Hold
from kvscale_router.metrics import RouterMetrics
from kvscale_router.replicas import Pod, ReplicaTable
from kvscale_router.weights import Published


def pending(metrics: RouterMetrics) -> float:
    value = metrics.registry.get_sample_value("kvscale_router_pending_requests")
    assert value is not None
    return value


async def test_a_held_request_goes_once_a_replica_is_routable() -> None:
    table, metrics = ReplicaTable(warmup_s=0), RouterMetrics()
    hold = Hold(table, metrics, max_pending=2, timeout_s=30)
    waiter = asyncio.create_task(hold.until_routable("c"))
    await asyncio.sleep(0.01)
    assert not waiter.done() and pending(metrics) == 1
    table.set_pods({"a": Pod("a", "http://a", 0.0)})
    assert await asyncio.wait_for(waiter, 5) >= 0.0
    assert pending(metrics) == 0


async def test_weight_zero_holds_and_a_published_weight_releases() -> None:
    table, metrics = ReplicaTable(warmup_s=0), RouterMetrics()
    table.set_pods({"a": Pod("a", "http://a", 0.0)})
    table.set_published(Published({"a": 0.0}))  # draining, or warming
    hold = Hold(table, metrics, max_pending=2, timeout_s=30)
    waiter = asyncio.create_task(hold.until_routable("c"))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    table.set_published(Published({"a": 0.5}))
    await asyncio.wait_for(waiter, 5)


async def test_a_warm_up_ending_releases_without_any_event() -> None:
    table = ReplicaTable(warmup_s=0.2)
    table.set_pods({"a": Pod("a", "http://a", table.clock())})  # Ready just now
    hold = Hold(table, RouterMetrics(), max_pending=2, timeout_s=30)
    await asyncio.wait_for(hold.until_routable("c"), 5)


async def test_bounds_refuse_with_503() -> None:
    table, metrics = ReplicaTable(warmup_s=0), RouterMetrics()
    hold = Hold(table, metrics, max_pending=1, timeout_s=0.05)
    first = asyncio.create_task(hold.until_routable("c"))
    await asyncio.sleep(0)
    with pytest.raises(Refused) as full:
        await hold.until_routable("c")
    assert (full.value.status, full.value.reason, full.value.retry_after_s) == (
        503,
        "pending_full",
        1,
    )
    with pytest.raises(Refused) as late:
        await first
    assert late.value.reason == "pending_timeout" and pending(metrics) == 0
