"""The capacity loop of one endpoint around the pure law: read, decide, act, report.

Every routing interval it reads the signals (so rate windows stay full and a drain's progress is
seen within seconds) and moves a running scale-in on; every capacity interval it hands the
snapshot history to `controllers.capacity.decide`. Deciding is the law's, the steps of a
scale-in are `drain.transition`'s (both pure); this loop only carries out what they ask: the
admin API calls, the pod-deletion-cost mark, and the replica count it hands to the worker's
reconcile. It owns that count (`replicas`): the one number the endpoint should have now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from pydantic import ValidationError

from kvscale import drain, engine_admin, fleet
from kvscale.api import v1alpha1 as api
from kvscale.children import engine
from kvscale.children.engine_args import DRAIN_SECONDS, ENGINE_PORT
from kvscale.children.router import ROUTER_PORT
from kvscale.context import Context
from kvscale.controllers import feasibility
from kvscale.controllers.capacity import CapacityLaw, CapacityState, Decision
from kvscale.kube import KubeError
from kvscale.reconcile import Event
from kvscale.signals.snapshot import Snapshot
from kvscale.signals.source import SignalSource, Target
from kvscale.status import loops
from kvscale.status.conditions import Cond

JSON = dict[str, Any]
log = logging.getLogger("kvscale.capacity")
MIN_FAST_WINDOW_S = 10.0


@dataclass(frozen=True)
class Reading:
    """What a tick read, for the routing loop to weigh the same replicas."""

    spec: api.LLMEndpointSpec
    snap: Snapshot
    pods: list[JSON]
    draining: frozenset[str]


@dataclass(frozen=True)
class Tick:
    """What one tick wants: a reconcile now (at `CapacityLoop.replicas`), status and Events."""

    rescale: bool = False
    why: str = ""
    status: JSON = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    next_in: float = 1.0
    read: Reading | None = None


class CapacityLoop:
    def __init__(
        self, ctx: Context, namespace: str, name: str, admin: httpx.AsyncClient | None = None
    ) -> None:
        self.ctx = ctx
        self.namespace = namespace
        self.name = name
        self.latest: Snapshot | None = None
        self.replicas: int | None = None  # decided by this loop (None: not yet)
        self.drain: drain.Drain | None = None
        self.law: CapacityLaw | None = None  # None: its state not yet read from status
        self.feasibility: feasibility.Feasibility | None = None  # from the last quiet window
        self._next_capacity = 0.0
        self._next_fast = 0.0
        self._source: SignalSource | None = None
        self._ips: dict[str, str] = {}  # ready pods' addresses at the last read
        self._client = admin or httpx.AsyncClient()  # the engines' admin API

    # -- read by the worker between ticks
    def desired(self, body: JSON) -> int | None:
        """The engine replicas to apply now (None: not decided yet, the spec's floor).

        Until this loop decides, the count a previous operator left in status stands.
        """
        if self.replicas is not None:
            return self.replicas
        st = body.get("status") or {}
        held = (st.get("capacity") or {}).get("desired", st.get("desiredReplicas"))
        return int(held) if held is not None else None

    def replica_tokens_per_s(self, spec: api.LLMEndpointSpec) -> float:
        """A replica's capacity at the SLO: what the law has learned, else the spec's prior."""
        state = self.law.state if self.law is not None else CapacityState()
        return state.replica_capacity(spec)[0]

    def conditions(self) -> list[Cond]:
        out = [loops.metrics_condition(self.latest)] if self.latest is not None else []
        if self.feasibility is not None:
            out.append(loops.feasibility_condition(self.feasibility))
        return out

    async def close(self) -> None:
        if self._source is not None:
            self._source.forget(self.namespace, self.name)
        await self._client.aclose()

    # -- one tick
    async def tick(self, body: JSON, now: float) -> Tick:
        try:
            spec = api.LLMEndpointSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            return Tick(next_in=30.0)
        self.ctx.metrics.slo((self.namespace, self.name), spec.slo)
        scaling = spec.scaling
        capacity_due, fast_due = now >= self._next_capacity, now >= self._next_fast
        if not (capacity_due or fast_due):
            return Tick(next_in=min(self._next_capacity, self._next_fast) - now)
        self._next_fast = now + scaling.routing_interval_seconds
        pods = await asyncio.to_thread(
            self.ctx.kube.list_pods, self.namespace, engine.selector_string(self.name)
        )
        # the count the operator stands by: another writer's change is undone by the reconcile
        intended = self.desired(body)
        current = intended if intended is not None and not spec.pinned else None
        if current is None:
            current = engine.desired_replicas(spec)
        window = scaling.capacity_interval_seconds if capacity_due else None
        snap = await self._snapshot(spec, pods, current, now, window)
        self.latest = snap
        tick = await self._act(drain.Ticked(now, scaling.routing_interval_seconds), Tick())
        if snap.fleet.current == 0 and snap.pending_requests > 0:
            capacity_due = True  # requests wait at the router for a first replica: act now
        if capacity_due:
            self._next_capacity = now + scaling.capacity_interval_seconds
            tick = await self._decide(body, spec, snap, now, tick)
        draining = frozenset({self.drain.pod} if self.drain else ())
        return replace(
            tick,
            read=Reading(spec, snap, pods, draining),
            next_in=min(self._next_capacity, self._next_fast) - now,
        )

    async def _snapshot(
        self, spec: api.LLMEndpointSpec, pods: list[JSON], current: int, now: float,
        window: float | None,
    ) -> Snapshot:  # fmt: skip
        scaling = spec.scaling
        fast_window = max(3 * scaling.routing_interval_seconds, MIN_FAST_WINDOW_S)
        routers = await asyncio.to_thread(
            self.ctx.kube.list_pods, self.namespace, engine.selector_string(self.name, "router")
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
        ready = {p["metadata"]["name"]: fleet.ready_since(p) for p in pods}
        replicas = tuple(
            replace(r, created_at=born.get(r.pod), ready_since=ready.get(r.pod))
            for r in snap.replicas
        )
        return replace(snap, replicas=replicas, fleet=fleet.fleet(current, pods))

    async def _decide(
        self, body: JSON, spec: api.LLMEndpointSpec, snap: Snapshot, now: float, tick: Tick
    ) -> Tick:
        scaling = spec.scaling
        old = body.get("status") or {}
        slo_s = spec.slo.ttft_p99_seconds
        verdict = feasibility.observed(snap, slo_s) or self.feasibility
        self.feasibility = replace(verdict, slo_s=slo_s) if verdict else None  # spec may change
        if self.law is None:
            state = loops.controller_state(old)
            if state.desired is None:
                state = replace(state, desired=snap.fleet.current)
            self.law = CapacityLaw(state)
        was = self.drain.target if self.drain else snap.fleet.current
        if spec.pinned:
            assert spec.replicas is not None
            decision = Decision(
                spec.replicas,
                "Pinned",
                f"spec.replicas pins {spec.replicas} replicas; autoscaling is suspended",
                self.law.state,
            )
            self.law.record(snap, spec)
            self.replicas = spec.replicas  # unpinned, the loop resumes from the pinned count
        else:
            decision = self.law.decide(snap, spec, now)
        log.info(
            f"Decided {decision.desired} replicas for {self.namespace}/{self.name} "
            f"(current {snap.fleet.current}, ready {snap.fleet.ready}, victim {decision.victim}, "
            f"waiting {snap.waiting:g}, held {snap.pending_requests:g}, running {snap.running:g}, "
            f"{snap.tokens_per_s:.0f} tokens/s, {snap.successes_per_s:.2f} requests/s): "
            f"{decision.reason}: {decision.message}"
        )
        decided = drain.Decided(
            now,
            decision.desired,
            snap.fleet.current,
            decision.message,
            decision.victim,
            self._ips.get(decision.victim or ""),
            admin=spec.engine.kind == "kvscale",
            pinned=spec.pinned,
        )
        tick = await self._act(decided, tick)
        victim = self.drain.pod if self.drain else None
        status = {**loops.report(old, decision, snap, spec, now, victim, was), **tick.status}
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
        return replace(tick, status=status)

    # -- carrying out the scale-in machine's actions
    async def _act(self, event: drain.Event, tick: Tick) -> Tick:
        step = drain.transition(self.drain, event, DRAIN_SECONDS)
        self.drain = step.drain
        for action in step.actions:
            match action:
                case drain.AdminCall(method=method, ip=ip):
                    call = engine_admin.start if method == "POST" else engine_admin.status
                    try:
                        in_flight: int | None = (await call(self._client, ip)).busy
                    except httpx.HTTPError:
                        in_flight = None
                    assert isinstance(event, drain.Ticked)
                    return await self._act(drain.Answered(event.now, in_flight), tick)
                case drain.ReadLoad(pod=pod):
                    assert isinstance(event, drain.Ticked)
                    return await self._act(self._load(pod, event.now), tick)
                case drain.Announce():
                    assert self.drain is not None
                    self.replicas = self.drain.current
                    tick = _with_event(tick, "DrainingReplica", _draining(self.drain))
                case drain.Undrain(drain=cancelled):
                    if cancelled.ip and cancelled.admin:
                        with contextlib.suppress(httpx.HTTPError):
                            await engine_admin.cancel(self._client, cancelled.ip)
                    tick = _with_event(tick, "DrainCancelled", _cancelled(action))
                case drain.MarkDeletionCost(pod=pod):
                    with contextlib.suppress(KubeError, OSError):  # gone: the scale-in goes on
                        await asyncio.to_thread(
                            self.ctx.kube.annotate_pod,
                            self.namespace,
                            pod,
                            {drain.DELETION_COST: drain.LOWEST_DELETION_COST},
                        )
                case drain.ScaleTo(replicas=replicas, why=why):
                    self.replicas = replicas
                    tick = replace(tick, rescale=True, why=why)
        return tick

    def _load(self, pod: str, now: float) -> drain.Answered:
        """The victim's running and waiting requests from this tick's snapshot of its metrics."""
        snap = self.latest
        found = [r for r in snap.replicas if r.pod == pod] if snap is not None else []
        if snap is None or snap.problem is not None or not found:
            return drain.Answered(now, None)
        replica = found[0]
        busy = math.ceil(replica.running + replica.waiting)
        return drain.Answered(now, busy, sampled_at=snap.taken_at - replica.sample_age_s)


def _with_event(tick: Tick, reason: str, message: str) -> Tick:
    return replace(tick, events=[*tick.events, Event("Normal", reason, message)])


def _draining(victim: drain.Drain) -> str:
    return (
        f"Draining {victim.pod} before scaling from {victim.current} to "
        f"{victim.target} replicas: {victim.why}"
    )


def _cancelled(undrain: drain.Undrain) -> str:
    kept = undrain.drain.pod
    return f"Kept {kept}: demand needs {undrain.desired} replicas again ({undrain.message})"
