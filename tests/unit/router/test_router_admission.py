"""Router admission per traffic class: run, queue, or refuse with 429 + Retry-After."""

from __future__ import annotations

import asyncio

import pytest

from kvscale_router.admission import (
    Admission,
    ClassConfigError,
    Refused,
    TrafficClass,
    parse_traffic_classes,
)


def test_classes_parse_like_the_engine_flag() -> None:
    classes = parse_traffic_classes(
        '[{"name": "interactive", "priority": 10, "maxQueueWaitSeconds": "250ms",'
        ' "maxConcurrency": 2}, {"name": "batch", "max_queue": 4}]'
    )
    assert classes[0] == TrafficClass("interactive", 10, 2, 256, 0.25)
    assert classes[1].max_queue == 4 and classes[1].max_concurrency is None
    assert parse_traffic_classes(None) == (TrafficClass(),)


@pytest.mark.parametrize(
    "text",
    ["{", "[]", "[1]", '[{"name": "a"}, {"name": "a"}]', '[{"nme": "a"}]',
     '[{"name": "a", "maxQueue": "x"}]', '[{"name": "a b"}]', '[{"maxQueueWait": "soon"}]',
     '[{"maxConcurrency": 0}]'],
)  # fmt: skip
def test_bad_classes_are_refused_with_a_reason(text: str) -> None:
    with pytest.raises(ClassConfigError):
        parse_traffic_classes(text)


def test_unknown_or_missing_class_falls_back_to_the_first() -> None:
    admission = Admission(parse_traffic_classes('[{"name": "x"}, {"name": "y"}]'))
    assert admission.resolve(None).name == "x"
    assert admission.resolve("nope").name == "x"
    assert admission.resolve("y").name == "y"


async def test_a_full_queue_refuses_at_once() -> None:
    cls = TrafficClass("c", max_concurrency=1, max_queue=1, max_queue_wait_s=5)
    admission = Admission((cls,))
    await admission.enter(cls)
    waiter = asyncio.create_task(admission.enter(cls))
    await asyncio.sleep(0)
    assert admission.depth(cls) == 1
    with pytest.raises(Refused) as refused:
        await admission.enter(cls)
    assert (refused.value.status, refused.value.reason, refused.value.retry_after_s) == (
        429,
        "queue_full",
        5,
    )
    admission.leave(cls)
    await waiter  # the queued one got the slot
    assert admission.running["c"] == 1 and admission.depth(cls) == 0


async def test_a_queued_request_past_its_deadline_is_refused() -> None:
    cls = TrafficClass("c", max_concurrency=1, max_queue=4, max_queue_wait_s=0.05)
    admission = Admission((cls,))
    await admission.enter(cls)
    with pytest.raises(Refused) as refused:
        await admission.enter(cls)
    assert refused.value.reason == "deadline" and admission.depth(cls) == 0
    admission.leave(cls)
    assert admission.running["c"] == 0


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    cls = TrafficClass("c", max_concurrency=1, max_queue=4, max_queue_wait_s=5)
    admission = Admission((cls,))
    await admission.enter(cls)
    waiter = asyncio.create_task(admission.enter(cls))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.depth(cls) == 0
    admission.leave(cls)
    assert admission.running["c"] == 0


async def test_unlimited_classes_never_queue() -> None:
    cls = TrafficClass()
    admission = Admission((cls,))
    for _ in range(1000):
        await admission.enter(cls)
    assert admission.running["default"] == 1000
