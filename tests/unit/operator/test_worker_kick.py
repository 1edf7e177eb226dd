"""A change seen while a reconcile is running is reconciled right after it, not a reconcile
interval later: the worker's wake-up is not lost (the reconcile itself is replaced by a stand-in
that records its calls and holds the first one until the test has kicked the worker)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from kvscale import worker
from kvscale.context import Context
from kvscale.kube import KubeError
from kvscale.operator_metrics import OperatorMetrics
from kvscale.reconcile import Outcome

BODY: dict[str, Any] = {
    "apiVersion": "kvscale.io/v1alpha1",
    "kind": "LLMEndpoint",
    "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1", "generation": 1},
    "spec": {},
}


async def until(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_kick_during_a_reconcile_triggers_another(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    release = threading.Event()

    def reconcile(kube: Any, body: dict[str, Any], *_: Any) -> Outcome:
        calls.append(body)
        if len(calls) == 1:
            release.wait(10)
        return Outcome(status={}, changes={}, invalid="held")  # no writes, no capacity tick

    monkeypatch.setattr(worker, "reconcile", reconcile)
    ctx = Context(kube=None, source=lambda _: None, metrics=OperatorMetrics())  # type: ignore[arg-type]
    endpoint = worker.EndpointWorker(ctx, BODY)
    endpoint.start()
    try:
        await until(lambda: len(calls) == 1, timeout=10)
        changed = {**BODY, "metadata": {**BODY["metadata"], "generation": 2}}
        endpoint.kick(changed)  # the endpoint changed while the first reconcile runs
        release.set()
        # far below RECONCILE_INTERVAL (30 s), when a lost wake-up would bring the next one
        await until(lambda: len(calls) >= 2, timeout=worker.RECONCILE_INTERVAL / 3)
        assert calls[1]["metadata"]["generation"] == 2
    finally:
        release.set()
        await endpoint.stop()


async def test_failed_reconcile_is_retried_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []

    def reconcile(*_: Any) -> Outcome:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise KubeError(0, "the API server did not answer")
        return Outcome(status={}, changes={}, invalid="held")

    monkeypatch.setattr(worker, "reconcile", reconcile)
    ctx = Context(kube=None, source=lambda _: None, metrics=OperatorMetrics())  # type: ignore[arg-type]
    endpoint = worker.EndpointWorker(ctx, BODY)
    endpoint.start()
    try:
        # after RETRY_DELAY (5 s), far below RECONCILE_INTERVAL (30 s)
        await until(lambda: len(calls) >= 2, timeout=worker.RECONCILE_INTERVAL / 2)
    finally:
        await endpoint.stop()
