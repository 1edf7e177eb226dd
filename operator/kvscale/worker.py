"""One asyncio task per endpoint: the only writer of its status and of its replica count.

Kopf tells a worker that something changed (the endpoint or one of its children: `kick`); the
worker reconciles at once and again every `RECONCILE_INTERVAL`. It owns the endpoint's two loops
side by side: the capacity loop reads the signals every routing interval (so windows are full
when the law needs them) and runs the capacity law every `capacityIntervalSeconds`; the routing
loop weighs the replicas it read. Periodic work lives here instead of a Kopf timer because Kopf
puts a finalizer on every object a timer runs for, and a finalizer on a user's object makes
uninstalling the operator before its endpoints wedge their deletion.

The worker serialises everything it does for its endpoint: a pass ticks the loops, then
reconciles once (when due, when the capacity loop settled on another count, or when the loops'
conditions changed) at the count the capacity loop owns; status is computed from one read and
written once per pass (a merge patch of the changed fields), and Events aggregate by count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from kvscale.api import v1alpha1 as api
from kvscale.capacity_loop import CapacityLoop
from kvscale.context import Context
from kvscale.kube import KubeError
from kvscale.reconcile import Event, Outcome, reconcile
from kvscale.routing_loop import RoutingLoop

JSON = dict[str, Any]
RECONCILE_INTERVAL = 30.0
RETRY_DELAY = 5.0
log = logging.getLogger("kvscale.worker")


class EndpointWorker:
    def __init__(self, ctx: Context, body: JSON) -> None:
        self.ctx = ctx
        self.namespace = body["metadata"]["namespace"]
        self.name = body["metadata"]["name"]
        self.body = body
        self.written: JSON = {}
        self.kicked = asyncio.Event()
        self.capacity = CapacityLoop(ctx, self.namespace, self.name)
        self.routing = RoutingLoop(ctx, self.namespace, self.name)
        self._next_reconcile = 0.0
        self._task: asyncio.Task[None] | None = None

    # -- what the handlers call
    def kick(self, body: JSON | None = None) -> None:
        if body is not None:
            self.body = body
        self._next_reconcile = 0.0
        self.kicked.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kvscale:{self.namespace}/{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.capacity.close()
        self.ctx.metrics.forget((self.namespace, self.name))

    # -- the loop
    async def _run(self) -> None:
        while True:
            self.kicked.clear()  # before the pass: a kick during it wakes the next one at once
            try:
                with self.ctx.metrics.reconciling("pass"):
                    delay = await self._pass()
            except asyncio.CancelledError:
                raise
            except (KubeError, OSError) as err:
                self.ctx.metrics.error("pass", err)
                log.warning(f"Pass over {self.namespace}/{self.name} failed: {err}")
                delay = RETRY_DELAY
            except Exception as err:
                self.ctx.metrics.error("pass", err)
                log.exception(f"Pass over {self.namespace}/{self.name} failed unexpectedly")
                delay = RETRY_DELAY
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kicked.wait(), timeout=max(delay, 0.05))

    async def _pass(self) -> float:
        """One pass; returns the seconds until the next is due."""
        now = self.ctx.clock()
        body = self._body()
        before = self.capacity.conditions()
        tick = await self.capacity.tick(body, now)
        status = dict(tick.status)
        if tick.read is not None:
            read = tick.read
            capacity = self.capacity.replica_tokens_per_s(read.spec)
            status |= await self.routing.tick(
                read.spec, read.snap, read.pods, read.draining, now, capacity
            )
        events = list(tick.events)
        outcome: Outcome | None = None
        due = now >= self._next_reconcile
        if due or tick.rescale or self.capacity.conditions() != before:
            if due:
                self._next_reconcile = now + RECONCILE_INTERVAL  # a kick meanwhile resets it
            try:
                outcome = await self._reconcile(body, self.capacity.desired(body), tick.why)
            except Exception:
                if due:
                    self._next_reconcile = 0.0  # retried after RETRY_DELAY
                raise
            events += outcome.events
            if outcome.invalid is not None:
                await self._write(body, outcome.changes, events)
                return RECONCILE_INTERVAL
        old = body.get("status") or {}
        merged = {**(outcome.status if outcome else {}), **status}
        changes = {k: v for k, v in merged.items() if old.get(k) != v}
        await self._write(body, changes, events)
        return min(tick.next_in, max(self._next_reconcile - self.ctx.clock(), 0.0))

    async def _reconcile(self, body: JSON, desired: int | None, why: str) -> Outcome:
        conditions = self.capacity.conditions()
        log.debug(f"Reconciling {self.namespace}/{self.name} at {desired} replicas ({why})")
        with self.ctx.metrics.reconciling("reconcile"):
            return await asyncio.to_thread(
                reconcile, self.ctx.kube, body, desired, why, conditions, self.ctx.images
            )

    def _body(self) -> JSON:
        """The newest body seen, with what this worker wrote since overlaid on its status."""
        status = {**(self.body.get("status") or {}), **self.written}
        return {**self.body, "status": status}

    async def _write(self, body: JSON, changes: JSON, events: list[Event]) -> None:
        kube = self.ctx.kube
        if changes:
            await asyncio.to_thread(kube.patch_endpoint_status, self.namespace, self.name, changes)
            self.written.update(changes)
        involved = {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, **body}
        for event in events:
            await asyncio.to_thread(
                kube.post_event, involved, event.type, event.reason, event.message
            )
        if changes:
            log.info(f"Updated the status of {self.namespace}/{self.name}: {sorted(changes)}")


class Workers:
    """The running workers, by endpoint uid; held in Kopf's memo, never in a module global."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._by_uid: dict[str, EndpointWorker] = {}

    def seen(self, body: JSON) -> None:
        """An endpoint was listed, created or changed: start its worker or wake it."""
        uid = body["metadata"]["uid"]
        worker = self._by_uid.get(uid)
        if worker is None:
            worker = self._by_uid[uid] = EndpointWorker(self.ctx, body)
            worker.start()
        worker.kick(body)

    def child_changed(self, owner_uid: str) -> None:
        worker = self._by_uid.get(owner_uid)
        if worker is not None:
            worker.kick()

    def pod_changed(self, namespace: str, endpoint: str) -> None:
        for worker in self._by_uid.values():
            if (worker.namespace, worker.name) == (namespace, endpoint):
                worker.kick()

    async def gone(self, uid: str) -> None:
        worker = self._by_uid.pop(uid, None)
        if worker is not None:
            await worker.stop()

    async def stop_all(self) -> None:
        for uid in list(self._by_uid):
            await self.gone(uid)
