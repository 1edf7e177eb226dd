"""The capacity loop of one endpoint around the pure law: read, decide, drain, report.

Every routing interval it reads the signals (so rate windows stay full and a drain's progress is
seen within seconds); every capacity interval it hands the snapshot history to
`controllers.capacity.decide` and acts on the decision. A scale-in drains its victim first:
`POST /drain` on the victim (readiness goes false, nothing new is admitted), wait until its
in-flight requests reach 0 (or the drain deadline), mark it with the lowest pod-deletion-cost
and only then lower the Deployment's replicas, so exactly that pod goes and no request fails.
A decision to grow while a drain runs cancels the drain (`POST /undrain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import ValidationError

from kvscale import children, drain, fleet, loop_status
from kvscale.api import v1alpha1 as api
from kvscale.conditions import Cond
from kvscale.controllers.capacity import CapacityState, Decision, decide
from kvscale.engine_args import DRAIN_SECONDS, ENGINE_PORT
from kvscale.kube import KubeError
from kvscale.reconcile import Event, Outcome
from kvscale.router_children import ROUTER_PORT
from kvscale.routing_tick import RoutingLoop
from kvscale.signals.snapshot import Snapshot
from kvscale.signals.source import SignalSource, Target

if TYPE_CHECKING:
    from kvscale.worker import Context

JSON = dict[str, Any]
log = logging.getLogger("kvscale.capacity")
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MIN_FAST_WINDOW_S = 10.0


@dataclass(frozen=True)
class Tick:
    """What one tick wants: the replica count, whether to apply it now, status and Events."""

    desired: int | None = None
    why: str = ""
    rescale: bool = False
    status: JSON = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    next_in: float = 1.0


@dataclass(frozen=True)
class Draining:
    pod: str
    ip: str
    since: float
    current: int
    target: int
    why: str
    requested: bool = False  # POST /drain sent (one routing tick after its weight went to 0)


class CapacityLoop:
    def __init__(self, ctx: Context, namespace: str, name: str) -> None:
        self.ctx = ctx
        self.namespace = namespace
        self.name = name
        self.history: list[Snapshot] = []
        self.latest: Snapshot | None = None
        self.decided: int | None = None
        self.draining: Draining | None = None
        self.state: CapacityState | None = None
        self._next_capacity = 0.0
        self._next_fast = 0.0
        self._source: SignalSource | None = None
        self._ips: dict[str, str] = {}  # ready pods' addresses at the last read
        self._client = httpx.AsyncClient()
        self.routing = RoutingLoop(ctx, namespace, name)

    # -- read by the worker between ticks
    def desired(self, body: JSON) -> int | None:
        """The engine replicas to apply now (None: not decided yet, the spec's floor)."""
        if self.draining is not None:
            return self.draining.current
        if self.decided is not None:
            return self.decided
        st = body.get("status") or {}
        held = (st.get("capacity") or {}).get("desired", st.get("desiredReplicas"))
        return int(held) if held is not None else None

    def conditions(self) -> list[Cond]:
        return [loop_status.metrics_condition(self.latest)] if self.latest is not None else []

    async def close(self) -> None:
        if self._source is not None:
            self._source.forget(self.namespace, self.name)
        await self._client.aclose()

    # -- one tick
    async def tick(self, body: JSON, outcome: Outcome | None, now: float) -> Tick:
        try:
            spec = api.LLMEndpointSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            return Tick(next_in=30.0)
        scaling = spec.scaling
        fast_every = scaling.routing_interval_seconds
        capacity_due, fast_due = now >= self._next_capacity, now >= self._next_fast
        if not (capacity_due or fast_due):
            return Tick(next_in=min(self._next_capacity, self._next_fast) - now)
        self._next_fast = now + fast_every
        pods, applied = await self._observe(outcome)
        # the count the operator stands by: another writer's change is undone by the reconcile
        intended = self.desired(body)
        current = intended if intended is not None and not spec.pinned else applied
        window = scaling.capacity_interval_seconds if capacity_due else None
        snap = await self._snapshot(spec, pods, current, now, window)
        self.latest = snap
        tick = await self._drain_progress(spec, snap, now)
        if snap.fleet.current == 0 and snap.pending_requests > 0:
            capacity_due = True  # requests wait at the router for a first replica: act now
        if capacity_due:
            self._next_capacity = now + scaling.capacity_interval_seconds
            tick = await self._decide(body, spec, snap, now, tick)
        victims = {self.draining.pod} if self.draining else set()
        routing = await self.routing.tick(spec, snap, pods, victims, now)
        return replace(
            tick,
            status={**tick.status, **routing},
            next_in=min(self._next_capacity, self._next_fast) - now,
        )

    async def _observe(self, outcome: Outcome | None) -> tuple[list[JSON], int]:
        if outcome is not None and outcome.deployment is not None:
            return outcome.pods, int(outcome.deployment["spec"].get("replicas", 0))
        kube = self.ctx.kube
        name = children.engine_name(self.name)
        deployment = await asyncio.to_thread(
            kube.get, "apps/v1", "Deployment", self.namespace, name
        )
        selector = children.selector_string(self.name)
        pods = await asyncio.to_thread(kube.list_pods, self.namespace, selector)
        return pods, int((deployment or {}).get("spec", {}).get("replicas", 0))

    async def _snapshot(
        self, spec: api.LLMEndpointSpec, pods: list[JSON], current: int, now: float,
        window: float | None,
    ) -> Snapshot:  # fmt: skip
        scaling = spec.scaling
        fast_window = max(3 * scaling.routing_interval_seconds, MIN_FAST_WINDOW_S)
        routers = await asyncio.to_thread(
            self.ctx.kube.list_pods, self.namespace, children.selector_string(self.name, "router")
        )
        target = Target(
            namespace=self.namespace,
            endpoint=self.name,
            window_s=window or fast_window,
            capacity_interval_s=scaling.capacity_interval_seconds,
            pods=fleet.addresses(pods, ENGINE_PORT),
            routers=fleet.addresses(routers, ROUTER_PORT),
        )
        self._ips = {p.name: p.ip for p in target.pods}
        self._source = self.ctx.source(scaling.signals)
        snap = await self._source.snapshot(target, now)
        born = {p["metadata"]["name"]: fleet.created_at(p) for p in pods}
        replicas = tuple(replace(r, created_at=born.get(r.pod)) for r in snap.replicas)
        return replace(snap, replicas=replicas, fleet=fleet.fleet(current, pods))

    async def _decide(
        self, body: JSON, spec: api.LLMEndpointSpec, snap: Snapshot, now: float, tick: Tick
    ) -> Tick:
        scaling = spec.scaling
        span = max(scaling.scale_down_stabilization_seconds, 600)
        keep = math.ceil(span / scaling.capacity_interval_seconds) + 2
        self.history = [*self.history, snap][-keep:]
        old = body.get("status") or {}
        if self.state is None:
            self.state = loop_status.controller_state(old)
            if self.state.desired is None:
                self.state = replace(self.state, desired=snap.fleet.current)
        was = self.draining.target if self.draining else snap.fleet.current
        if spec.pinned:
            assert spec.replicas is not None
            decision = Decision(
                spec.replicas,
                "Pinned",
                f"spec.replicas pins {spec.replicas} replicas; autoscaling is suspended",
                self.state,
            )
            self.decided = spec.replicas  # unpinned, the loop resumes from the pinned count
        else:
            decision = decide(self.history, spec, self.state, now)
        self.state = decision.state
        log.info(
            f"Decided {decision.desired} replicas for {self.namespace}/{self.name} "
            f"(current {snap.fleet.current}, ready {snap.fleet.ready}, victim {decision.victim}, "
            f"waiting {snap.waiting:g}, held {snap.pending_requests:g}, running {snap.running:g}, "
            f"{snap.tokens_per_s:.0f} tokens/s, {snap.successes_per_s:.2f} requests/s): "
            f"{decision.reason}: {decision.message}"
        )
        events = list(tick.events)
        rescale, desired, why = tick.rescale, tick.desired, tick.why
        if self.draining is not None and decision.desired >= self.draining.current:
            events.append(await self._cancel_drain(decision))
        if not spec.pinned and self.draining is None:
            current = snap.fleet.current
            if decision.desired < current and spec.engine.kind == "kvscale" and decision.victim:
                started = await self._start_drain(decision, snap, now)
                if started is not None:
                    events.append(started)
            elif decision.desired != current:
                rescale, desired, why = True, decision.desired, decision.message
                self.decided = decision.desired
        status = {
            "capacity": loop_status.capacity(
                decision, snap, now, self.draining.pod if self.draining else None
            ),
            "slo": loop_status.slo(old, snap, spec),
            "cost": loop_status.cost(old, snap, spec, now),
            "decisions": loop_status.decisions(old, decision, snap, now, was),
            **tick.status,
        }
        hours = status["cost"]["gpuHours"] - float((old.get("cost") or {}).get("gpuHours") or 0)
        self.ctx.metrics.record(
            (self.namespace, self.name),
            decision,
            snap,
            scaling.max_replicas,
            decision.desired != was,
            status["slo"].get("attainment"),
            max(hours, 0.0),
            status["cost"].get("perSuccessfulRequest"),
        )
        return replace(
            tick, desired=desired, why=why, rescale=rescale, status=status, events=events
        )

    async def _start_drain(self, decision: Decision, snap: Snapshot, now: float) -> Event | None:
        """Mark the victim: its weight goes to 0 now, its /drain follows one routing tick later."""
        victim = decision.victim
        ip = self._ips.get(victim or "")
        if victim is None or ip is None:
            return None
        self.draining = Draining(
            victim, ip, now, snap.fleet.current, decision.desired, decision.message
        )
        return Event(
            "Normal",
            "DrainingReplica",
            f"Draining {victim} before scaling from {snap.fleet.current} to "
            f"{decision.desired} replicas: {decision.message}",
        )

    async def _drain_progress(self, spec: api.LLMEndpointSpec, snap: Snapshot, now: float) -> Tick:
        """Scale in once the victim has nothing in flight (or its drain deadline passed)."""
        victim = self.draining
        if victim is None:
            return Tick()
        if not victim.requested:
            if now - victim.since < spec.scaling.routing_interval_seconds:
                return Tick()  # routers first learn that its weight is 0
            try:
                await drain.start(self._client, victim.ip)
                self.draining = replace(victim, requested=True)
            except httpx.HTTPError:
                self.draining = replace(victim, ip="", requested=True)  # it cannot take work
            return Tick()
        in_flight = 0
        if victim.ip:
            try:
                in_flight = (await drain.status(self._client, victim.ip)).busy
            except httpx.HTTPError:
                in_flight = 0  # gone or dead: nothing it holds can still finish
        if in_flight > 0 and now - victim.since < DRAIN_SECONDS:
            return Tick()
        with contextlib.suppress(KubeError, OSError):  # gone already: the scale-in goes ahead
            await asyncio.to_thread(
                self.ctx.kube.annotate_pod, self.namespace, victim.pod, {DELETION_COST: "-1000"}
            )
        self.draining = None
        self.decided = victim.target
        waited = now - victim.since
        return Tick(
            desired=victim.target,
            why=f"{victim.pod} drained in {waited:.0f} s ({victim.why})",
            rescale=True,
        )

    async def _cancel_drain(self, decision: Decision) -> Event:
        victim = self.draining
        assert victim is not None
        self.draining = None
        if victim.ip:
            with contextlib.suppress(httpx.HTTPError):
                await drain.cancel(self._client, victim.ip)
        return Event(
            "Normal",
            "DrainCancelled",
            f"Kept {victim.pod}: demand needs {decision.desired} replicas again "
            f"({decision.message})",
        )
