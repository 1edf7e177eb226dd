"""Repeated Events aggregate: one Event object whose `count` rises, as client-go's correlator
does, instead of a new object for each repeat."""

from __future__ import annotations

from typing import Any

from endpoint_helpers import deployment, endpoint, events, wait_available
from kopf.testing import KopfRunner

from kvscale.kube import Kube
from kvscale_cluster.fixtures import WaitTimeout, wait_for


def intrude(api: Kube, namespace: str, replicas: int) -> None:
    """Another writer (an HPA, a person) sets the engine's replicas."""
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/chat-engine"
    body = {"spec": {"replicas": replicas}}
    api.request("PATCH", path, body, [("fieldManager", "intruder")], "application/merge-patch+json")


def restored(api: Kube, namespace: str) -> bool:
    dep = deployment(api, namespace)
    return dep is not None and dep["spec"]["replicas"] == 1


def counted(api: Kube, namespace: str) -> int:
    return sum(int(e.get("count") or 1) for e in events(api, namespace, "ReplicasRestored"))


def test_repeated_warning_is_one_event_with_a_count(
    api: Kube, namespace: str, operator: KopfRunner
) -> None:
    api.create(endpoint(namespace))
    wait_available(api, namespace, ready=1)
    # The same foreign change, again and again: each restore posts the same Warning. A change
    # that lands while a reconcile is between its read and its apply is undone by that apply
    # without an Event (the reconcile never saw it), so the test intrudes until three were seen.
    first: list[dict[str, Any]] = []
    for _ in range(8):
        before = counted(api, namespace)
        intrude(api, namespace, 3)
        wait_for(lambda: restored(api, namespace), timeout=30, what="replicas restored to 1")
        try:
            wait_for(lambda b=before: counted(api, namespace) > b, timeout=10, what="the Warning")
        except WaitTimeout:
            continue  # undone by a reconcile already in flight: no Event to count
        first = first or events(api, namespace, "ReplicasRestored")
        if counted(api, namespace) >= 3:
            break
    assert first, "no ReplicasRestored Event at all"
    assert len(first) == 1 and first[0]["count"] == 1 and first[0]["type"] == "Warning"
    found = events(api, namespace, "ReplicasRestored")
    assert len(found) == 1, [e["metadata"]["name"] for e in found]
    event = found[0]
    assert event["metadata"]["name"] == first[0]["metadata"]["name"]
    assert event["count"] == 3
    assert event["firstTimestamp"] == first[0]["firstTimestamp"]
    assert event["lastTimestamp"] >= first[0]["lastTimestamp"]
    assert event["involvedObject"]["kind"] == "LLMEndpoint"
    assert event["message"] == first[0]["message"]
