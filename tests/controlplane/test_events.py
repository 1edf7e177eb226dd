"""Repeated Events aggregate: one Event object whose `count` rises, as client-go's correlator
does, instead of a new object for each repeat."""

from __future__ import annotations

from typing import Any

from endpoint_helpers import deployment, endpoint, events, wait_available
from kopf.testing import KopfRunner

from kvscale.kube import Kube
from kvscale_cluster.fixtures import wait_for


def intrude(api: Kube, namespace: str, replicas: int) -> None:
    """Another writer (an HPA, a person) sets the engine's replicas."""
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/chat-engine"
    body = {"spec": {"replicas": replicas}}
    api.request("PATCH", path, body, [("fieldManager", "intruder")], "application/merge-patch+json")


def restored(api: Kube, namespace: str, count: int) -> list[dict[str, Any]] | None:
    dep = deployment(api, namespace)
    found = events(api, namespace, "ReplicasRestored")
    done = dep is not None and dep["spec"]["replicas"] == 1
    return found if done and sum(int(e.get("count") or 1) for e in found) >= count else None


def test_repeated_warning_is_one_event_with_a_count(
    api: Kube, namespace: str, operator: KopfRunner
) -> None:
    api.create(endpoint(namespace))
    wait_available(api, namespace, ready=1)
    intrude(api, namespace, 3)
    first = wait_for(
        lambda: restored(api, namespace, 1), timeout=30, what="a first ReplicasRestored"
    )
    assert len(first) == 1 and first[0]["count"] == 1 and first[0]["type"] == "Warning"
    for repeat in (2, 3):
        intrude(api, namespace, 3)  # the same change again: the same Warning
        wait_for(
            lambda repeat=repeat: restored(api, namespace, repeat),
            timeout=30,
            what=f"ReplicasRestored number {repeat}",
        )
    found = events(api, namespace, "ReplicasRestored")
    assert len(found) == 1, [e["metadata"]["name"] for e in found]
    event = found[0]
    assert event["metadata"]["name"] == first[0]["metadata"]["name"]
    assert event["count"] == 3
    assert event["firstTimestamp"] == first[0]["firstTimestamp"]
    assert event["lastTimestamp"] >= first[0]["lastTimestamp"]
    assert event["involvedObject"]["kind"] == "LLMEndpoint"
    assert event["message"] == first[0]["message"]
