"""The deferred queue's wire contract: what a real router exports is what the operator reads.

The router (kvscale_router/release.py) and the operator (kvscale/signals/deferred.py) may not
import each other; this test runs the router's Releaser, renders its registry as /metrics does,
and parses that text with the operator's reader.
"""

from __future__ import annotations

import asyncio
import math
import time

from prometheus_client import generate_latest

from kvscale.controllers.deferred import required_tokens_per_s
from kvscale.signals.deferred import DUE_WITHIN, backlogs, parse_router
from kvscale_router.admission import Admission, TrafficClass
from kvscale_router.config import RouterConfig
from kvscale_router.deferred import DUE_BUCKETS_S, DeferralPolicy, Release
from kvscale_router.hold import Hold
from kvscale_router.metrics import RouterMetrics
from kvscale_router.picker import Picker
from kvscale_router.release import Releaser, deferred_of
from kvscale_router.replicas import ReplicaTable

BATCH = TrafficClass("batch", max_queue=8, deadline_s=3600.0)


def test_both_sides_name_the_same_due_time_buckets() -> None:
    assert tuple(DUE_BUCKETS_S) == (*map(float, DUE_WITHIN), math.inf)


async def test_the_operator_reads_the_backlog_a_router_exports() -> None:
    config = RouterConfig(traffic_classes=(BATCH,), deferral=DeferralPolicy())
    metrics = RouterMetrics()
    table = ReplicaTable(warmup_s=0)  # no routable replica: everything stays queued
    r = Releaser(config, table, Picker(), Admission(config.traffic_classes),
                 Hold(table, metrics, 10, 10.0), metrics)  # fmt: skip
    now = time.monotonic()
    waiters = [asyncio.create_task(r.wait(deferred_of(BATCH, now, 500, 100))) for _ in range(3)]
    await asyncio.sleep(0.01)
    r.finished(Release(deferred_of(BATCH, now, 400, 300), "a", "spare", True), "a", 250, 5.0, True)
    r.show(time.monotonic())
    text = generate_latest(metrics.registry).decode()
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)

    before = parse_router(text.replace("_total{", "_total_unused{"), 0.0)  # counters at zero
    (batch,) = backlogs([parse_router(text, 10.0)], [before])
    assert batch.traffic_class == "batch" and batch.requests == 3
    assert dict(batch.due)[math.inf] == 1500 and dict(batch.due)[3600.0] == 1500
    assert dict(batch.due)[60.0] == 0
    assert batch.served_tokens_per_s == (100 + 250) / 10 == batch.valley_tokens_per_s
    assert batch.met_per_s == 1 / 10 and batch.missed_per_s == 0
    assert required_tokens_per_s([batch]) > 0
