"""The capacity loop around a scripted law: it carries out a scale-in step by step (weight 0,
drain, wait, mark, scale down), undrains when demand returns, and owns the replica count; and
the routing loop publishes exactly what `controllers.routing.publication` writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import httpx
import pytest

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.capacity_loop import CapacityLoop
from kvscale.context import Context
from kvscale.controllers import capacity, routing
from kvscale.controllers.capacity import CapacityState, Decision
from kvscale.drain import DELETION_COST
from kvscale.operator_metrics import OperatorMetrics
from kvscale.routing_loop import RoutingLoop
from kvscale.signals.snapshot import Latency, ReplicaSignals, Snapshot
from kvscale.signals.source import Target
from kvscale_cluster.specs import spec_body

JSON = dict[str, Any]
PODS = {"p-0": "10.0.0.1", "p-1": "10.0.0.2", "p-2": "10.0.0.3"}
SPEC = spec_body(scaling={"capacityIntervalSeconds": 60, "routingIntervalSeconds": 5})


def pod(name: str, ip: str) -> JSON:
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"podIP": ip, "conditions": [ready]},
    }


class FakeKube:
    def __init__(self) -> None:
        self.annotated: list[tuple[str, dict[str, str]]] = []
        self.applied: list[tuple[JSON, str]] = []

    def list_pods(self, namespace: str, selector: str) -> list[JSON]:
        return [] if "router" in selector else [pod(n, ip) for n, ip in PODS.items()]

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.annotated.append((name, annotations))

    def apply(self, obj: JSON, manager: str) -> JSON:
        self.applied.append((obj, manager))
        return obj


class FakeSource:
    async def snapshot(self, target: Target, now: float) -> Snapshot:
        reps = tuple(ReplicaSignals(pod=p.name, running=1) for p in target.pods)
        return Snapshot(taken_at=now, window_s=target.window_s, replicas=reps)

    def forget(self, namespace: str, endpoint: str) -> None:
        pass


class Admin:
    """The engines' admin API: records the calls, answers with `in_flight`."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.in_flight = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.method} {request.url.host}{request.url.path}")
        return httpx.Response(200, json={"in_flight": self.in_flight, "queued": 0})


def script(desired: list[int]) -> Any:
    """A law that answers `desired` in turn, naming p-2 when it wants fewer replicas."""
    answers = iter(desired)

    def decide(
        history: Sequence[Snapshot], spec: LLMEndpointSpec, state: CapacityState, now: float
    ) -> Decision:
        want = next(answers)
        current = history[-1].fleet.current
        victim = "p-2" if want < current else None
        message = "demand fell" if want < current else "demand rose"
        return Decision(want, "Scripted", message, state, victim=victim)

    return decide


@pytest.fixture
def admin() -> Admin:
    return Admin()


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


def context(kube: object) -> Context:
    source: Any = FakeSource()
    return Context(kube=cast(Any, kube), source=lambda _: source, metrics=OperatorMetrics())


def loop(kube: object, admin: Admin) -> CapacityLoop:
    ctx = context(kube)
    client = httpx.AsyncClient(transport=httpx.MockTransport(admin))
    return CapacityLoop(ctx, "ns", "chat", admin=client)


BODY: JSON = {"spec": SPEC, "status": {"capacity": {"desired": 3}}}


async def test_a_scale_in_walks_weight_zero_drain_wait_mark_scale_down(
    monkeypatch: pytest.MonkeyPatch, kube: FakeKube, admin: Admin
) -> None:
    monkeypatch.setattr(capacity, "decide", script([2]))
    cap = loop(kube, admin)
    assert cap.desired(BODY) == 3  # before it decides, the count in status stands
    first = await cap.tick(BODY, 1000.0)
    assert [e.reason for e in first.events] == ["DrainingReplica"] and not first.rescale
    assert first.read is not None and first.read.draining == {"p-2"}
    assert first.status["capacity"]["victim"] == "p-2" and first.status["capacity"]["desired"] == 2
    assert set(first.status) == {"capacity", "slo", "cost", "decisions"}
    assert cap.desired(BODY) == 3 and admin.calls == []  # weight 0 first: routers learn it
    await cap.tick(BODY, 1005.0)
    assert admin.calls == ["POST 10.0.0.3/drain"]
    admin.in_flight = 1
    waiting = await cap.tick(BODY, 1010.0)
    assert admin.calls[-1] == "GET 10.0.0.3/drain" and not waiting.rescale
    admin.in_flight = 0
    done = await cap.tick(BODY, 1015.0)
    assert kube.annotated == [("p-2", {DELETION_COST: "-1000"})]
    assert done.rescale and done.why == "p-2 drained in 15 s (demand fell)"
    assert cap.desired(BODY) == 2 and cap.drain is None
    assert done.read is not None and done.read.draining == frozenset()


class VictimLoad:
    """A direct scrape where p-2 runs `running` and queues `waiting` requests (vLLM's gauges)."""

    def __init__(self) -> None:
        self.running, self.waiting = 1.0, 1.0

    async def snapshot(self, target: Target, now: float) -> Snapshot:
        reps = tuple(
            ReplicaSignals(p.name, running=self.running, waiting=self.waiting)
            if p.name == "p-2"
            else ReplicaSignals(p.name, running=1)
            for p in target.pods
        )
        return Snapshot(taken_at=now, window_s=target.window_s, replicas=reps)

    def forget(self, namespace: str, endpoint: str) -> None:
        pass


async def test_a_vllm_scale_in_waits_for_the_victims_own_gauges_without_admin_calls(
    monkeypatch: pytest.MonkeyPatch, kube: FakeKube, admin: Admin
) -> None:
    monkeypatch.setattr(capacity, "decide", script([2]))
    load = VictimLoad()
    source: Any = load
    ctx = Context(kube=cast(Any, kube), source=lambda _: source, metrics=OperatorMetrics())
    client = httpx.AsyncClient(transport=httpx.MockTransport(admin))
    cap = CapacityLoop(ctx, "ns", "chat", admin=client)
    body = {**BODY, "spec": {**SPEC, "engine": {"kind": "vllm"}}}
    first = await cap.tick(body, 1000.0)
    assert [e.reason for e in first.events] == ["DrainingReplica"]
    assert first.read is not None and first.read.draining == {"p-2"}
    for now in (1005.0, 1010.0):  # weight 0, then its gauges: 1 running, 1 waiting
        assert not (await cap.tick(body, now)).rescale and cap.desired(body) == 3
    load.waiting = 0.0
    assert not (await cap.tick(body, 1015.0)).rescale  # still one running
    load.running = 0.0
    done = await cap.tick(body, 1020.0)
    assert done.rescale and done.why == "p-2 drained in 20 s (demand fell)"
    assert kube.annotated == [("p-2", {DELETION_COST: "-1000"})] and cap.desired(body) == 2
    assert admin.calls == []  # vLLM has no /drain


async def test_demand_coming_back_keeps_a_vllm_victim_with_no_call_to_make(
    monkeypatch: pytest.MonkeyPatch, kube: FakeKube, admin: Admin
) -> None:
    monkeypatch.setattr(capacity, "decide", script([2, 3]))
    load = VictimLoad()
    source: Any = load
    ctx = Context(kube=cast(Any, kube), source=lambda _: source, metrics=OperatorMetrics())
    cap = CapacityLoop(
        ctx, "ns", "chat", admin=httpx.AsyncClient(transport=httpx.MockTransport(admin))
    )
    body = {
        **BODY,
        "spec": {**SPEC, "engine": {"kind": "vllm"}, "scaling": {"capacityIntervalSeconds": 20}},
    }
    await cap.tick(body, 1000.0)
    await cap.tick(body, 1005.0)  # weight 0 seen by the routers: its gauges are read
    back = await cap.tick(body, 1020.0)
    assert [e.reason for e in back.events] == ["DrainCancelled"] and cap.drain is None
    assert admin.calls == [] and cap.desired(body) == 3 and kube.annotated == []
    assert back.read is not None and back.read.draining == frozenset()  # its weight comes back


async def test_demand_coming_back_undrains_the_victim(
    monkeypatch: pytest.MonkeyPatch, kube: FakeKube, admin: Admin
) -> None:
    monkeypatch.setattr(capacity, "decide", script([2, 3]))
    cap = loop(kube, admin)
    body = {**BODY, "spec": {**SPEC, "scaling": {"capacityIntervalSeconds": 20}}}
    await cap.tick(body, 1000.0)
    await cap.tick(body, 1005.0)  # POST /drain
    admin.in_flight = 4
    back = await cap.tick(body, 1020.0)  # a capacity interval later the law wants 3 again
    assert [e.reason for e in back.events] == ["DrainCancelled"]
    assert admin.calls[-1] == "POST 10.0.0.3/undrain" and cap.drain is None
    assert cap.desired(body) == 3 and not back.rescale and kube.annotated == []


async def test_the_drain_deadline_scales_in_with_requests_in_flight(
    monkeypatch: pytest.MonkeyPatch, kube: FakeKube, admin: Admin
) -> None:
    monkeypatch.setattr(capacity, "decide", script([2]))
    cap = loop(kube, admin)
    admin.in_flight = 3
    await cap.tick(BODY, 1000.0)
    late = None
    for now in range(1005, 1031, 5):
        late = await cap.tick(BODY, float(now))
    assert late is not None and late.rescale and cap.desired(BODY) == 2


async def test_a_scale_out_is_applied_at_once(
    monkeypatch: pytest.MonkeyPatch, kube: FakeKube, admin: Admin
) -> None:
    monkeypatch.setattr(capacity, "decide", script([5]))
    cap = loop(kube, admin)
    tick = await cap.tick(BODY, 1000.0)
    assert tick.rescale and tick.why == "demand rose" and cap.desired(BODY) == 5
    assert tick.status["decisions"][-1]["toReplicas"] == 5 and admin.calls == []


async def test_a_quiet_window_slower_than_the_slo_sets_slo_feasible_false(
    monkeypatch: pytest.MonkeyPatch, kube: FakeKube, admin: Admin
) -> None:
    monkeypatch.setattr(capacity, "decide", script([3, 3, 3]))
    ttft = [9.0]

    class Slow(FakeSource):
        async def snapshot(self, target: Target, now: float) -> Snapshot:
            reps = tuple(
                ReplicaSignals(pod=p.name, running=1, successes_per_s=1.0) for p in target.pods
            )
            latency = Latency(ttft_p99=ttft[0])
            return Snapshot(taken_at=now, window_s=target.window_s, replicas=reps, latency=latency)

    source: Any = Slow()
    ctx = Context(kube=cast(Any, kube), source=lambda _: source, metrics=OperatorMetrics())
    client = httpx.AsyncClient(transport=httpx.MockTransport(admin))
    cap = CapacityLoop(ctx, "ns", "chat", admin=client)
    await cap.tick(BODY, 1000.0)
    (cond,) = [c for c in cap.conditions() if c.type == "SLOFeasible"]
    assert (cond.status, cond.reason) == ("False", "PrefillExceedsSLO")
    assert "p99 TTFT was 9.00 s while no request waited" in cond.message
    ttft[0] = 0.2
    await cap.tick(BODY, 1060.0)
    (cond,) = [c for c in cap.conditions() if c.type == "SLOFeasible"]
    assert cond.status == "True"


async def test_an_unusable_spec_waits_without_reading_anything(admin: Admin) -> None:
    class NoKube:
        pass

    cap = loop(NoKube(), admin)
    tick = await cap.tick({"spec": {}}, 1000.0)
    assert tick.next_in == 30.0 and tick.read is None and tick.status == {}


async def test_the_routing_loop_publishes_what_publication_writes(kube: FakeKube) -> None:
    ctx = context(kube)
    spec = LLMEndpointSpec.model_validate(SPEC)
    pods = [pod(n, ip) for n, ip in PODS.items()]
    snap = Snapshot(taken_at=1e9, window_s=15.0)
    status = await RoutingLoop(ctx, "ns", "chat").tick(spec, snap, pods, {"p-2"}, 1e9)
    expected = routing.decide(sorted(PODS), (), (), {"p-2"}, routing.RoutingState())
    (configmap, manager), *_ = kube.applied
    assert manager == "kvscale-routing"
    assert configmap["metadata"] == {"name": "chat-routing", "namespace": "ns"}
    assert configmap["data"] == {routing.WEIGHTS_KEY: routing.publication(expected, 1e9)}
    assert json.loads(configmap["data"][routing.WEIGHTS_KEY])["weights"]["p-2"] == 0.0
    assert status["routing"]["weights"] == expected.weights


async def test_the_routing_loop_publishes_token_budgets_for_deferrable_classes(
    kube: FakeKube,
) -> None:
    classes = [{"name": "chat"}, {"name": "batch", "deadlineSeconds": 3600}]
    body = spec_body(scaling={"routingIntervalSeconds": 5}, trafficClasses=classes)
    spec = LLMEndpointSpec.model_validate(body)
    pods = [pod(n, ip) for n, ip in PODS.items()]
    snap = Snapshot(taken_at=1e9, window_s=15.0)
    routing_loop = RoutingLoop(context(kube), "ns", "chat")
    await routing_loop.tick(spec, snap, pods, {"p-2"}, 1e9, 400.0)
    first = json.loads(kube.applied[-1][0]["data"][routing.WEIGHTS_KEY])
    per = 400.0 * spec.slo.ttft_p99_seconds
    assert first["tokenBudgets"] == {p: 0.0 if p == "p-2" else per for p in PODS}
    # the same weights with a newly learned capacity: published again
    assert await routing_loop.tick(spec, snap, pods, {"p-2"}, 1e9 + 5, 400.0) == {}
    await routing_loop.tick(spec, snap, pods, {"p-2"}, 1e9 + 10, 800.0)
    again = json.loads(kube.applied[-1][0]["data"][routing.WEIGHTS_KEY])
    assert again["weights"] == first["weights"] and again["tokenBudgets"]["p-0"] == 2 * per
