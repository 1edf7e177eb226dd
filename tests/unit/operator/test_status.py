"""Status and conditions computed from observed children; events for replica changes."""

from typing import Any

from hypothesis import given
from hypothesis import strategies as st_

from kvscale.reconcile import replica_event
from kvscale.status import endpoint
from kvscale.status.conditions import Cond, find, merge


def deployment(replicas: int, ready: int, updated: int, generation: int = 1, **conds: Any) -> Any:
    return {
        "metadata": {"generation": generation},
        "status": {
            "observedGeneration": 1,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "conditions": [{"type": t, **c} for t, c in conds.items()],
        },
    }


def compute(desired: int, seen: endpoint.Observed, old: Any = None, **kw: Any) -> Any:
    return endpoint.compute(
        generation=4,
        desired=desired,
        selector="a=b",
        url="http://chat.ns.svc:8000/v1",
        seen=seen,
        problems=kw.get("problems", []),
        old=old or {},
        now=kw.get("now", "2026-01-01T00:00:00Z"),
    )


def cond(st: Any, type_: str) -> Any:
    found = find(st["conditions"], type_)
    assert found is not None
    return found


def test_ready_endpoint_is_available_and_stable() -> None:
    st = compute(2, endpoint.Observed.read(deployment(2, 2, 2)))
    assert cond(st, "Available")["status"] == "True"
    assert cond(st, "Progressing")["reason"] == "Stable"
    assert cond(st, "Degraded")["status"] == "False"
    assert st["readyReplicas"] == 2 and st["desiredReplicas"] == 2 and st["observedGeneration"] == 4


def test_scaling_up_is_progressing() -> None:
    st = compute(3, endpoint.Observed.read(deployment(3, 1, 3)))
    assert cond(st, "Progressing")["reason"] == "ScalingUp"
    assert cond(st, "Available")["status"] == "True"


def test_engines_ready_without_a_ready_router_are_not_available() -> None:
    # clients reach the endpoint through the routers' Service: none Ready, nothing answers
    st = compute(2, endpoint.Observed.read(deployment(2, 2, 2), router=deployment(2, 0, 2)))
    available = cond(st, "Available")
    assert (available["status"], available["reason"]) == ("False", "RouterNotReady")
    assert "2 of 2 ready" in available["message"]
    assert cond(st, "Ready")["status"] == "False"
    # and still converging, so a GitOps tool does not read Current (Reconciling False) too early
    assert (cond(st, "Progressing")["status"], cond(st, "Progressing")["reason"]) == (
        "True",
        "RouterStarting",
    )
    assert cond(st, "Reconciling")["status"] == "True"
    st = compute(2, endpoint.Observed.read(deployment(2, 2, 2), router=deployment(2, 1, 2)))
    assert cond(st, "Progressing")["reason"] == "Stable"
    assert cond(st, "Available")["status"] == "True"
    st = compute(2, endpoint.Observed.read(deployment(2, 0, 2), router=deployment(2, 1, 2)))
    assert cond(st, "Available")["reason"] == "NoReplicasReady"


@given(
    desired=st_.integers(0, 3),
    replicas=st_.integers(0, 4),
    ready=st_.integers(0, 4),
    updated=st_.integers(0, 4),
    routers=st_.one_of(st_.none(), st_.integers(0, 2)),
)
def test_kstatus_reads_current_only_when_the_endpoint_answers(
    desired: int, replicas: int, ready: int, updated: int, routers: int | None
) -> None:
    """What Flux and `kubectl wait` check: Reconciling and Stalled False means Ready True."""
    router = None if routers is None else deployment(2, routers, 2)
    engines = deployment(replicas, min(ready, replicas), updated)
    seen = endpoint.Observed.read(engines, router=router)
    st = compute(desired, seen)
    if cond(st, "Reconciling")["status"] == "False" and cond(st, "Stalled")["status"] == "False":
        assert cond(st, "Ready")["status"] == "True", st["conditions"]


def test_missing_deployment_is_not_available() -> None:
    st = compute(1, endpoint.Observed.read(None))
    assert cond(st, "Available")["reason"] == "NoReplicasReady"
    assert cond(st, "Progressing")["reason"] == "RollingOut"


def test_scaled_to_zero() -> None:
    st = compute(0, endpoint.Observed.read(deployment(0, 0, 0)))
    assert cond(st, "Available")["reason"] == "ScaledToZero"


def test_deadline_exceeded_degrades() -> None:
    dep = deployment(
        1,
        0,
        1,
        Progressing={"status": "False", "reason": "ProgressDeadlineExceeded", "message": "x"},
    )
    st = compute(1, endpoint.Observed.read(dep))
    assert cond(st, "Degraded")["reason"] == "ProgressDeadlineExceeded"
    assert cond(st, "Progressing")["status"] == "False"


def test_operator_problems_and_pod_failures_degrade() -> None:
    pod = {
        "metadata": {"name": "p1"},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                }
            ],
            "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
        },
    }
    problem = endpoint.Problem("ModelSourceNotFound", "PersistentVolumeClaim w does not exist")
    st = compute(1, endpoint.Observed.read(deployment(1, 0, 1), [pod]), problems=[problem])
    degraded = cond(st, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ModelSourceNotFound"
    assert "CrashLoopBackOff" in degraded["message"]
    limited = cond(st, "CapacityLimited")
    assert limited["status"] == "True" and "nvidia.com/gpu" in limited["message"]


def test_transition_time_moves_only_on_flip() -> None:
    first = merge([], [Cond("Available", "False", "A", "m")], 1, "t1")
    same = merge(first, [Cond("Available", "False", "B", "n")], 2, "t2")
    flipped = merge(same, [Cond("Available", "True", "C", "o")], 3, "t3")
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["reason"] == "B"
    assert flipped[0]["lastTransitionTime"] == "t3"


def test_conditions_from_other_controllers_are_kept() -> None:
    other = {
        "type": "MetricsAvailable",
        "status": "True",
        "reason": "R",
        "message": "",
        "lastTransitionTime": "t0",
    }
    merged = merge([other], [Cond("Available", "True", "R", "m")], 1, "t1")
    assert [c["type"] for c in merged] == ["Available", "MetricsAvailable"]


def test_unchanged_status_writes_nothing() -> None:
    seen = endpoint.Observed.read(deployment(1, 1, 1))
    first = compute(1, seen, now="t1")
    again = compute(1, seen, old=first, now="t2")
    assert endpoint.changes(first, again) == {}


def test_replica_events() -> None:
    assert replica_event(None, None, 1) is None
    assert replica_event(1, 1, 1) is None
    scaled = replica_event(1, 1, 2)
    assert scaled is not None and scaled.reason == "ScaledUp"
    down = replica_event(3, 3, 2, "demand fell")
    assert down is not None and down.reason == "ScaledDown" and down.message.endswith("demand fell")
    restored = replica_event(5, 1, 1)
    assert restored is not None and restored.reason == "ReplicasRestored"
    assert restored.type == "Warning"


def test_a_spec_the_operator_cannot_use_degrades_without_api_calls() -> None:
    from kvscale.kube import Kube
    from kvscale.reconcile import reconcile

    body = {
        "metadata": {"name": "x", "namespace": "n", "uid": "u", "generation": 3},
        "spec": {"model": {"name": "m", "source": {}}, "scaling": {"minReplicas": 5}},
    }
    outcome = reconcile(Kube(api_client=None), body)  # type: ignore[arg-type]
    assert outcome.invalid is not None
    assert "exactly one of hostPath, pvc, dummy or huggingface" in outcome.invalid
    assert "minReplicas must not exceed" in outcome.invalid
    degraded = find(outcome.status["conditions"], "Degraded")
    assert degraded is not None and degraded["reason"] == "InvalidSpec"
    assert outcome.status["observedGeneration"] == 3
    assert [e.reason for e in outcome.events] == ["InvalidSpec"]


def test_kstatus_conditions_follow_the_others() -> None:
    from kvscale.status.conditions import Cond
    from kvscale.status.kstatus import kstatus

    def by_type(conds: list[Cond]) -> dict[str, tuple[str, str]]:
        return {c.type: (c.status, c.reason) for c in conds}

    ok = [
        Cond("Available", "True", "ReplicasReady", "1 of 1 ready"),
        Cond("Progressing", "False", "Stable", "done"),
        Cond("Degraded", "False", "AsExpected", "fine"),
    ]
    assert by_type(kstatus(ok)) == {
        "Ready": ("True", "ReplicasReady"),
        "Reconciling": ("False", "Settled"),
        "Stalled": ("False", "AsExpected"),
    }
    rolling = [ok[0], Cond("Progressing", "True", "RollingOut", "0 of 1 up to date"), ok[2]]
    assert by_type(kstatus(rolling))["Reconciling"] == ("True", "RollingOut")
    assert by_type(kstatus(rolling))["Ready"] == ("False", "RollingOut")
    stuck = [ok[0], rolling[1], Cond("Degraded", "True", "ImagePullFailed", "no image")]
    assert by_type(kstatus(stuck)) == {
        "Stalled": ("True", "ImagePullFailed"),
        "Reconciling": ("False", "Stalled"),
        "Ready": ("False", "ImagePullFailed"),
    }
    zero = [Cond("Available", "False", "ScaledToZero", "none"), ok[1], ok[2]]
    assert by_type(kstatus(zero))["Ready"] == ("True", "ScaledToZero")
    waiting = [Cond("Available", "False", "NoReplicasReady", "0 of 1"), ok[1], ok[2]]
    assert by_type(kstatus(waiting))["Ready"] == ("False", "NoReplicasReady")


def test_an_invalid_spec_is_stalled() -> None:
    st = endpoint.invalid_spec(4, "spec.model: bad", {}, "t1")
    stalled = find(st["conditions"], "Stalled")
    assert stalled is not None and stalled["status"] == "True"
    assert stalled["reason"] == "InvalidSpec" and stalled["observedGeneration"] == 4
