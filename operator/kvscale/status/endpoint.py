"""Computes an LLMEndpoint's status from what is observed of its children. Pure functions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvscale import fleet
from kvscale.status.conditions import Cond, merge
from kvscale.status.kstatus import kstatus

JSON = dict[str, Any]
_FAILING_WAITS = {
    "CrashLoopBackOff": "EngineCrashLooping",
    "ErrImagePull": "ImagePullFailed",
    "ImagePullBackOff": "ImagePullFailed",
    "InvalidImageName": "ImagePullFailed",
    "CreateContainerConfigError": "EngineConfigError",
    "CreateContainerError": "EngineConfigError",
}


@dataclass(frozen=True)
class Problem:
    """Something only the operator can judge, reported as `Degraded=True`."""

    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """The engine Deployment and its pods, and the router Deployment's ready count, as last read
    from the API server (`routers_ready` None: no router was observed, as in unit tests)."""

    replicas: int = 0
    ready: int = 0
    updated: int = 0
    rolled_out: bool = True
    deadline_exceeded: str | None = None
    replica_failure: str | None = None
    unschedulable: list[str] = field(default_factory=list)
    failing: list[Problem] = field(default_factory=list)
    routers_ready: int | None = None

    @classmethod
    def read(
        cls, deployment: JSON | None, pods: Iterable[JSON] = (), router: JSON | None = None
    ) -> Observed:
        routers_ready = None if router is None else router.get("status", {}).get("readyReplicas", 0)
        if deployment is None:
            return cls(rolled_out=False, routers_ready=routers_ready)
        st = deployment.get("status", {})
        conds = {c["type"]: c for c in st.get("conditions", [])}
        progressing = conds.get("Progressing", {})
        failure = conds.get("ReplicaFailure", {})
        unschedulable, failing = _pod_problems(pods)
        return cls(
            replicas=st.get("replicas", 0),
            ready=st.get("readyReplicas", 0),
            updated=st.get("updatedReplicas", 0),
            rolled_out=st.get("observedGeneration", 0)
            >= deployment["metadata"].get("generation", 0),
            deadline_exceeded=progressing.get("message")
            if progressing.get("reason") == "ProgressDeadlineExceeded"
            else None,
            replica_failure=failure.get("message") if failure.get("status") == "True" else None,
            unschedulable=unschedulable,
            failing=failing,
            routers_ready=routers_ready,
        )


def _pod_problems(pods: Iterable[JSON]) -> tuple[list[str], list[Problem]]:
    unschedulable: list[str] = []
    failing: list[Problem] = []
    for pod in pods:
        name = pod["metadata"]["name"]
        if fleet.unschedulable(pod):
            unschedulable.append(f"{name}: {fleet.scheduling_message(pod)}")
        for cs in pod.get("status", {}).get("containerStatuses", []):
            waiting = cs.get("state", {}).get("waiting", {})
            why = waiting.get("reason", "")
            if why in _FAILING_WAITS:
                detail = f"{name}: {why}: {waiting.get('message', '')}".rstrip(": ")
                failing.append(Problem(_FAILING_WAITS[why], detail))
        failing += _init_problems(name, pod.get("status", {}).get("initContainerStatuses", []))
    return unschedulable, failing


# what an init container's exit code means: `kvscale-engine fetch` (kvscale_engine.fetch) exits
# with these, a contract test checks they agree
FETCH_FAILURES = {
    3: (
        "ModelNotFound",
        "the Hub has no such repository or revision (check model.source.huggingface.repo and "
        "revision; a private repository needs tokenSecret)",
    ),
    4: (
        "ModelAccessDenied",
        "the Hub refused the token (check the Secret model.source.huggingface.tokenSecret names)",
    ),
}
FETCH_FAILED = ("ModelFetchFailed", "downloading the model failed (see the init container's log)")


def _init_problems(pod: str, statuses: Iterable[JSON]) -> list[Problem]:
    """An init container that exited with an error, now or before its back-off restart."""
    found: list[Problem] = []
    for cs in statuses:
        state, last = cs.get("state", {}), cs.get("lastState", {})
        waiting = state.get("waiting", {}).get("reason", "")
        if waiting in _FAILING_WAITS and waiting != "CrashLoopBackOff":  # e.g. no such Secret
            message = state["waiting"].get("message", "")
            detail = f"{pod}: init container {cs['name']}: {waiting}: {message}".rstrip(": ")
            found.append(Problem(_FAILING_WAITS[waiting], detail))
            continue
        ended = state.get("terminated") or last.get("terminated") or {}
        code = ended.get("exitCode", 0)
        if code == 0 or state.get("terminated", {}).get("exitCode") == 0:
            continue
        reason, meaning = FETCH_FAILURES.get(code, FETCH_FAILED)
        found.append(
            Problem(reason, f"{pod}: init container {cs['name']} exited {code}: {meaning}")
        )
    return found


def conditions(desired: int, seen: Observed, problems: list[Problem]) -> list[Cond]:
    """Available, Progressing, Degraded and CapacityLimited from what was observed."""
    return [
        _available(desired, seen),
        _progressing(desired, seen),
        _degraded(seen, problems),
        _capacity_limited(seen),
    ]


def _available(desired: int, seen: Observed) -> Cond:
    if desired == 0 and seen.ready == 0:
        return Cond("Available", "False", "ScaledToZero", "The endpoint has no replicas")
    if seen.ready > 0 and seen.routers_ready == 0:
        # clients reach the endpoint through its routers' Service: without a Ready router it
        # has no endpoint and refuses connections, however many engines are Ready
        return Cond(
            "Available",
            "False",
            "RouterNotReady",
            f"{seen.ready} of {desired} ready, but no router replica is ready yet",
        )
    if seen.ready > 0:
        return Cond("Available", "True", "ReplicasReady", f"{seen.ready} of {desired} ready")
    return Cond("Available", "False", "NoReplicasReady", f"0 of {desired} replicas are ready")


def _progressing(desired: int, seen: Observed) -> Cond:
    counts = f"{seen.ready} of {desired} ready, {seen.updated} up to date"
    if seen.deadline_exceeded:
        return Cond("Progressing", "False", "ProgressDeadlineExceeded", seen.deadline_exceeded)
    if not seen.rolled_out or seen.updated < desired:
        return Cond("Progressing", "True", "RollingOut", counts)
    if seen.ready < desired:
        return Cond("Progressing", "True", "ScalingUp", counts)
    if seen.replicas > desired:
        return Cond(
            "Progressing", "True", "ScalingDown", f"{seen.replicas} running, {desired} wanted"
        )
    if seen.routers_ready == 0:
        # the engines are settled but nothing routes to them yet: still converging, so that
        # kstatus never reads Current (Reconciling False) while Available is False for the router
        return Cond("Progressing", "True", "RouterStarting", "No router replica is ready yet")
    return Cond("Progressing", "False", "Stable", f"All {desired} replicas ready and up to date")


def _degraded(seen: Observed, problems: list[Problem]) -> Cond:
    found = list(problems) + list(seen.failing)
    if seen.deadline_exceeded:
        found.append(Problem("ProgressDeadlineExceeded", seen.deadline_exceeded))
    if seen.replica_failure:
        found.append(Problem("ReplicaFailure", seen.replica_failure))
    if not found:
        return Cond("Degraded", "False", "AsExpected", "No problems detected")
    message = "; ".join(p.message for p in found)
    return Cond("Degraded", "True", found[0].reason, message)


def _capacity_limited(seen: Observed) -> Cond:
    if seen.unschedulable:
        count = len(seen.unschedulable)
        message = f"{count} replica(s) cannot be scheduled: " + "; ".join(seen.unschedulable)
        return Cond("CapacityLimited", "True", "ReplicasUnschedulable", message)
    return Cond("CapacityLimited", "False", "AllScheduled", "Every replica found a node")


def compute(
    *,
    generation: int,
    desired: int,
    selector: str,
    url: str,
    seen: Observed,
    problems: list[Problem],
    old: JSON,
    now: str,
    extra: list[Cond] | None = None,
    images: JSON | None = None,
) -> JSON:
    """The status fields the reconcile owns; `extra` are conditions the loops concluded,
    `images` what the endpoint's Deployments run (`status.images`)."""
    conds = [*conditions(desired, seen, problems), *(extra or [])]
    images_field = {"images": images} if images else {}
    return {
        **images_field,
        "observedGeneration": generation,
        "replicas": seen.replicas,
        "readyReplicas": seen.ready,
        "desiredReplicas": desired,
        "selector": selector,
        "url": url,
        "conditions": merge(old.get("conditions", []), [*conds, *kstatus(conds)], generation, now),
    }


def invalid_spec(generation: int, message: str, old: JSON, now: str) -> JSON:
    """The status of an object whose spec the operator cannot use."""
    cond = Cond("Degraded", "True", "InvalidSpec", message)
    return {
        "observedGeneration": generation,
        "conditions": merge(old.get("conditions", []), [cond, *kstatus([cond])], generation, now),
    }


def changes(old: JSON, new: JSON) -> JSON:
    """Only the top-level status fields whose value differs: an empty dict means no write."""
    return {k: v for k, v in new.items() if old.get(k) != v}
