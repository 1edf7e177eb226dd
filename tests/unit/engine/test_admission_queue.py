"""The engine server's admission wait queue on a real event loop, without an engine."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvscale_engine.server.admission import AdmissionController, KvFootprint, TrafficClass
from kvscale_engine.server.admission_queue import AdmissionQueue, Admitted, KvPool, Refused
from kvscale_engine.server.config import ServerConfig
from kvscale_engine.server.metrics import EngineMetrics

FAST = TrafficClass("fast", priority=1, max_queue=4, max_queue_wait_s=5.0)
POOL = KvPool(num_blocks=64, block_size=16, max_num_seqs=256)


def _queue(limit: int | None, *classes: TrafficClass) -> AdmissionQueue:
    classes = classes or (FAST,)
    metrics = EngineMetrics("tiny", 512, [c.name for c in classes])
    return AdmissionQueue(AdmissionController(classes, limit), metrics, POOL)


def _sample(queue: AdmissionQueue, name: str, **labels: str) -> float:
    value = queue.metrics.registry.get_sample_value(
        name, {"model_name": "tiny", "engine": "0", **labels}
    )
    return value or 0.0


async def _until_queued(queue: AdmissionQueue, n: int) -> None:
    while queue.queued < n:
        await asyncio.sleep(0)


async def test_under_the_limit_a_request_is_admitted_at_once_and_counted_until_released() -> None:
    queue = _queue(2)
    admitted = await queue.admit("fast", 16, 0.0)
    assert (admitted.ticket, admitted.traffic_class) == (0, FAST)
    assert queue.active == 1 and queue.controller.in_flight == 1
    assert not await queue.wait_idle(0.01)
    queue.release(admitted)
    queue.release(admitted)  # a second release is a no-op
    assert queue.active == 0 and queue.controller.in_flight == 0
    assert await queue.wait_idle(0.01)
    assert _sample(queue, "kvscale_engine_admission_queue_wait_seconds_count", traffic_class="fast")


async def test_a_queued_request_starts_when_a_slot_is_released() -> None:
    queue = _queue(1)
    first = await queue.admit("fast", 16, time.monotonic())
    waiting = asyncio.create_task(queue.admit("fast", 16, first.arrival))
    await _until_queued(queue, 1)
    assert queue.active == 2 and not waiting.done()
    queue.release(first)
    second = await waiting
    assert second.ticket == 1 and queue.queued == 0 and queue.controller.in_flight == 1
    queue.release(second)
    assert await queue.wait_idle(0.01)


async def test_a_request_queued_past_its_class_wait_is_refused_and_counted() -> None:
    brief = TrafficClass("brief", max_queue=4, max_queue_wait_s=0.05)
    queue = _queue(1, brief)
    first = await queue.admit(None, 16, 0.0)
    with pytest.raises(Refused) as refused:
        await queue.admit("brief", 16, time.monotonic())
    assert (refused.value.status, refused.value.reason) == (429, "timeout")
    assert queue.active == 1 and queue.queued == 0
    assert _sample(
        queue, "kvscale_engine_admission_rejections_total", reason="timeout", traffic_class="brief"
    )
    queue.release(first)
    assert await queue.wait_idle(0.01)


async def test_a_client_that_leaves_while_queued_gives_its_place_to_the_next() -> None:
    queue = _queue(2)  # a cold queue holds one wave: as many as the limit
    running = [await queue.admit("fast", 16, time.monotonic()) for _ in range(2)]
    leaving = asyncio.create_task(queue.admit("fast", 16, time.monotonic()))
    staying = asyncio.create_task(queue.admit("fast", 16, time.monotonic()))
    await _until_queued(queue, 2)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert queue.active == 3 and queue.queued == 1
    queue.release(running[0])
    queue.release(await staying)
    queue.release(running[1])
    assert queue.active == 0 and await queue.wait_idle(0.01)


async def test_a_draining_queue_refuses_with_503() -> None:
    queue = _queue(2)
    queue.controller.start_draining()
    with pytest.raises(Refused) as refused:
        await queue.admit("fast", 16, 0.0)
    assert (refused.value.status, refused.value.reason) == (503, "draining")
    assert queue.active == 0


async def test_a_full_queue_refuses_at_once_with_429() -> None:
    one_deep = TrafficClass("one", max_queue=1, max_queue_wait_s=5.0)
    queue = _queue(1, one_deep)
    first = await queue.admit(None, 16, 0.0)
    waiting = asyncio.create_task(queue.admit(None, 16, time.monotonic()))
    await _until_queued(queue, 1)
    with pytest.raises(Refused) as refused:
        await queue.admit(None, 16, time.monotonic())
    assert (refused.value.status, refused.value.reason) == (429, "queue_full")
    assert refused.value.retry_after_s >= 1.0
    queue.release(first)
    queue.release(await waiting)
    assert queue.active == 0


async def test_the_limit_follows_what_requests_used_and_a_higher_limit_starts_queued_ones() -> None:
    pool = KvPool(num_blocks=8, block_size=16, max_num_seqs=256)
    footprint = KvFootprint(max_model_len=128, alpha=1.0)
    controller = AdmissionController((FAST,), pool.limit(footprint.expected_tokens))
    queue = AdmissionQueue(controller, EngineMetrics("tiny", 128, ["fast"]), pool, footprint)
    assert controller.limit == 1  # 8 blocks / (128 tokens / 16) blocks a request
    first = await queue.admit("fast", 128, 0.0)
    waiting = asyncio.create_task(queue.admit("fast", 128, time.monotonic()))
    await _until_queued(queue, 1)
    first.used_tokens = 16  # the request stayed short: one block
    queue.release(first)
    second = await waiting
    assert controller.limit == 8 and queue.controller.in_flight == 1
    queue.release(second)


@pytest.mark.parametrize(
    ("admission", "max_concurrency", "limit"),
    [(False, None, None), (True, 3, 3), (True, None, 4)],
    ids=["off", "pinned", "following-lengths"],
)
def test_for_server_sizes_admission_as_the_settings_ask(
    admission: bool, max_concurrency: int | None, limit: int | None
) -> None:
    config = ServerConfig(
        served_model_name="tiny",
        max_model_len=256,  # 16 blocks of 16 tokens: 64 blocks hold 4 such requests
        traffic_classes=(FAST,),
        admission=admission,
        max_concurrency=max_concurrency,
    )
    queue = AdmissionQueue.for_server(config, POOL, EngineMetrics("tiny", 256, ["fast"]))
    assert queue.controller.limit == limit
    cls = queue.controller.resolve("fast")
    if admission:
        assert cls == FAST
    else:
        assert (cls.max_concurrency, cls.max_queue, cls.max_queue_wait_s) == (
            None,
            1 << 30,
            float("inf"),
        )


async def test_admitted_requests_carry_their_class_and_arrival() -> None:
    queue = _queue(None, FAST, TrafficClass("slow"))
    admitted = await queue.admit("slow", 16, 12.5)
    assert admitted == Admitted(0, TrafficClass("slow"), 12.5)
    assert (await queue.admit("nonexistent", 16, 13.0)).traffic_class == FAST  # the default
