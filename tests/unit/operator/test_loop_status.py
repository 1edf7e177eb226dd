"""What the loops write into status and metrics, and how they read pods: pure functions."""

from __future__ import annotations

import json
from dataclasses import replace

from prometheus_client import generate_latest

from kvscale import fleet, timestamps
from kvscale.api.status import LLMEndpointStatus
from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.controllers.capacity import CapacityState, Decision
from kvscale.operator_metrics import OperatorMetrics
from kvscale.routing_loop import warming
from kvscale.signals.snapshot import (
    DeferredBacklog,
    Fleet,
    Latency,
    Problem,
    ReplicaSignals,
    Snapshot,
)
from kvscale.status import endpoint, loops
from kvscale_cluster.specs import llm_spec


def spec(**over: object) -> LLMEndpointSpec:
    sections: dict[str, object] = {
        "slo": {"ttftP99Seconds": 1, "itlP99Seconds": 0.1},
        "scaling": {"capacityIntervalSeconds": 60},
        "resources": {"gpusPerReplica": 2},
        "cost": {"gpuHourPrice": 3.0},
    }
    return llm_spec(**{**sections, **over})


def snap(ttft: float | None, tokens: float = 100.0, ready: int = 2, current: int = 3) -> Snapshot:
    reps = tuple(
        ReplicaSignals(
            pod=f"p{i}",
            prompt_tokens_per_s=tokens / ready,
            successes_per_s=1.0 / ready,
            running=1,
        )
        for i in range(ready)
    )
    return Snapshot(
        taken_at=0.0,
        window_s=60,
        replicas=reps,
        latency=Latency(ttft_p99=ttft, itl_p99=0.05),
        fleet=Fleet(current=current, ready=ready),
    )


def test_slo_attainment_counts_busy_intervals_within_both_targets() -> None:
    old: dict[str, object] = {}
    for ttft in (0.5, 0.9, 1.5, 0.2):
        old = {"slo": loops.slo(old, snap(ttft), spec())}
    slo = old["slo"]
    assert isinstance(slo, dict)
    assert slo["minutes"] == [1, 1, 0, 1] and slo["attainment"] == 0.75
    assert slo["ttftP99Seconds"] == 0.2 and slo["windowSeconds"] == 600
    idle = Snapshot(taken_at=0.0, window_s=60, fleet=Fleet(current=1, ready=1))
    assert loops.slo(old, idle, spec())["minutes"] == [1, 1, 0, 1]  # idle: no evidence
    bad = Snapshot(**{**snap(5.0).__dict__, "problem": Problem.STALE})
    assert loops.slo(old, bad, spec())["minutes"] == [1, 1, 0, 1]  # untrusted: none
    many: dict[str, object] = {}
    for _ in range(15):
        many = {"slo": loops.slo(many, snap(0.1), spec())}
    assert len(many["slo"]["minutes"]) == 10  # type: ignore[index]


def test_cost_accumulates_gpu_hours_waste_and_unit_costs() -> None:
    s = spec()
    first = loops.cost({}, snap(0.5), s, now=1000.0)
    assert first["gpuHours"] == 0 and first["currency"] == "USD"
    old = {"cost": first, "capacity": {"updatedAt": timestamps.stamp(1000.0)}}
    second = loops.cost(old, snap(0.5, ready=2, current=3), s, now=1060.0)
    # 3 replicas x 2 GPUs for a minute; one replica was not ready: wasted
    assert second["gpuHours"] == round(3 * 2 / 60, 6)
    assert second["wastedGpuHours"] == round(1 * 2 / 60, 6)
    assert second["successfulRequests"] == 60.0 and second["tokens"] == 6000.0
    assert second["perSuccessfulRequest"] == round(0.1 * 3.0 / 60, 6)
    assert second["perMillionTokens"] == round(0.1 * 3.0 / 6000 * 1e6, 4)
    # a long gap (operator down) counts at most two intervals
    later = loops.cost(old, snap(0.5), s, now=1000.0 + 3600)
    assert later["gpuHours"] == round(3 * 2 * 120 / 3600, 6)


def test_decisions_keep_the_last_ten_changes_with_their_signals() -> None:
    old: dict[str, object] = {}
    state = CapacityState()
    for i in range(12):
        d = Decision(i + 2, "DemandForecast", f"step {i}", state, 10.0 * i, 11.0, 5.0)
        old = {"decisions": loops.decisions(old, d, snap(0.4), float(i), was=i + 1)}
    kept = old["decisions"]
    assert isinstance(kept, list) and len(kept) == 10
    assert kept[-1]["toReplicas"] == 13 and kept[-1]["demandTokensPerSecond"] == 110.0
    assert kept[-1]["ttftP99Seconds"] == 0.4 and kept[0]["message"] == "step 2"
    same = Decision(13, "Stable", "no change", state)
    assert loops.decisions(old, same, snap(0.4), 99.0, was=13) == kept


def test_controller_state_survives_status_and_garbage_starts_afresh() -> None:
    state = CapacityState(desired=4, startup_s=33.0)
    d = Decision(4, "Stable", "m", state)
    capacity = loops.capacity(d, snap(0.3), 0.0, None)
    assert json.loads(capacity["controllerState"])["desired"] == 4
    assert loops.controller_state({"capacity": capacity}) == state
    assert loops.controller_state({"capacity": {"controllerState": "{oops"}}) == (CapacityState())


def test_metrics_condition_names_the_problem() -> None:
    assert loops.metrics_condition(snap(0.3)).status == "True"
    bad = Snapshot(taken_at=0, window_s=60, problem=Problem.UNREACHABLE, message="refused")
    cond = loops.metrics_condition(bad)
    assert (cond.status, cond.reason, cond.message) == ("False", "Unreachable", "refused")


def pod(name: str, ready: bool, since: str, created: str = "2026-01-01T00:00:00Z") -> dict:  # type: ignore[type-arg]
    cond = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": since}
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "status": {"podIP": "10.0.0.1", "conditions": [cond]},
    }


def test_fleet_counts_and_startup_time() -> None:
    pods = [
        pod("a", True, "2026-01-01T00:00:30Z"),
        pod("b", True, "2026-01-01T00:01:30Z", "2026-01-01T00:01:00Z"),
        pod("c", False, "2026-01-01T00:00:00Z"),
    ]
    pods[2]["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no gpu"}
    )
    seen = fleet.fleet(3, pods)
    assert (seen.ready, seen.starting, seen.unschedulable) == (2, 0, 1)
    assert seen.unschedulable_reason == "no gpu" and seen.startup_seconds == 30.0
    assert [a.name for a in fleet.addresses(pods, 8000)] == ["a", "b"]


def test_young_replicas_ramp_up_only_while_an_older_one_serves() -> None:
    start = timestamps.parse("2026-01-01T00:01:00Z")
    assert start is not None
    old, young = pod("a", True, "2026-01-01T00:00:00Z"), pod("b", True, "2026-01-01T00:01:00Z")
    assert warming([old, young], start + 5) == {"b": 0.5}  # halfway through its warm-up
    assert warming([young], start + 5) == {}
    assert warming([old, young], start + 60) == {}


def test_operator_metrics_render_and_forget() -> None:
    metrics = OperatorMetrics()
    d = Decision(3, "DemandForecast", "m", CapacityState(), 500.0, 600.0, 250.0)
    metrics.record(("ns", "ep"), d, snap(0.3), 8, True, 0.9, 0.5, 0.01)
    metrics.weights(("ns", "ep"), {"p0": 1.0, "p1": 0.0})
    text = generate_latest(metrics.registry).decode()
    assert 'kvscale_operator_desired_replicas{endpoint="ep",namespace="ns"} 3.0' in text
    assert 'kvscale_operator_scaling_decisions_total{endpoint="ep",namespace="ns",reason=' in text
    assert 'kvscale_operator_routing_weight{endpoint="ep",namespace="ns",pod="p1"} 0.0' in text
    assert 'kvscale_operator_gpu_seconds_total{endpoint="ep",namespace="ns"} 1800.0' in text
    metrics.forget(("ns", "ep"))
    assert "kvscale_operator_desired_replicas{" not in generate_latest(metrics.registry).decode()


def test_timestamps_are_rfc3339_in_whole_seconds_and_parse_back() -> None:
    assert timestamps.stamp(1e9) == "2001-09-09T01:46:40Z"
    assert timestamps.parse("2001-09-09T01:46:40Z") == 1e9
    assert timestamps.parse("2001-09-09T01:46:40.500000Z") == 1e9 + 0.5  # the API's MicroTime
    assert timestamps.parse("") is None and timestamps.parse("yesterday") is None


def test_a_pod_is_unschedulable_only_while_its_scheduled_condition_is_false() -> None:
    """The status decides, not the reason alone: a scheduled pod may keep the old reason."""

    def scheduled(status: str, reason: str) -> dict[str, object]:
        cond = {"type": "PodScheduled", "status": status, "reason": reason, "message": "no gpu"}
        return {"metadata": {"name": "p"}, "status": {"conditions": [cond]}}

    assert fleet.unschedulable(scheduled("False", "Unschedulable"))
    assert not fleet.unschedulable(scheduled("True", "Unschedulable"))
    assert not fleet.unschedulable(scheduled("False", "SchedulingGated"))
    assert fleet.scheduling_message(scheduled("False", "Unschedulable")) == "no gpu"
    placed = scheduled("True", "Unschedulable")
    assert endpoint.Observed.read({"metadata": {}, "status": {}}, [placed]).unschedulable == []


def test_traffic_classes_report_slo_deadlines_backlog_and_valley_tokens() -> None:
    classes = [{"name": "chat"}, {"name": "batch", "deadlineSeconds": 3600}]
    mixed = spec(trafficClasses=classes)
    queue = DeferredBacklog(
        "batch",
        requests=4,
        oldest_age_s=90.0,
        due=((300.0, 100.0), (float("inf"), 800.0)),
        valley_tokens_per_s=10.0,
        met_per_s=0.5,
        missed_per_s=0.0,
    )
    decision = Decision(2, "Stable", "", CapacityState(), deferred_tokens_per_s=12.5)
    old: dict[str, object] = {}
    for t in (1000.0, 1060.0, 1120.0):
        now = replace(snap(0.5), deferred=(queue,))
        old = loops.report(old, decision, now, mixed, t, None, 2)
    assert old["capacity"]["deferredTokensPerSecond"] == 12.5  # type: ignore[index]
    chat, batch = old["trafficClasses"]  # type: ignore[misc]
    assert chat == {"name": "chat", "deferrable": False, "sloAttainment": 1.0}
    # two intervals of 60 s after the first tick: 60 met, 1200 tokens served in valleys
    assert batch["deadlineMet"] == 60 and batch["deadlineMissed"] == 0
    assert batch["deadlineAttainment"] == 1.0 and batch["valleyTokens"] == 1200
    assert (batch["backlogRequests"], batch["backlogTokens"], batch["oldestAgeSeconds"]) == (
        4,
        800,
        90.0,
    )
    assert "trafficClasses" not in loops.report({}, decision, snap(0.5), spec(), 0.0, None, 2)


def test_the_traffic_class_status_fits_the_api() -> None:
    mixed = spec(trafficClasses=[{"name": "batch", "deadlineSeconds": 600}])
    queue = DeferredBacklog("batch", requests=1, due=((float("inf"), 5.0),))
    decision = Decision(1, "Stable", "", CapacityState())
    written = loops.report({}, decision, replace(snap(0.5), deferred=(queue,)), mixed, 0.0, None, 1)
    status = LLMEndpointStatus.model_validate(written)
    assert status.traffic_classes[0].backlog_tokens == 5.0
