"""The operator's reconcile core against a real API server, controllers and process kubelet."""

from __future__ import annotations

from typing import Any

import pytest
from endpoint_helpers import condition, deployment, endpoint, events, get_endpoint, wait_available
from kopf.testing import KopfRunner

from kvscale.kube import Kube
from kvscale_cluster.fixtures import kubectl, run_operator, wait_for


@pytest.fixture
def chat(api: Kube, namespace: str, operator: KopfRunner) -> None:
    """The endpoint `chat` of `endpoint()`, created and available with its one replica."""
    api.create(endpoint(namespace))
    wait_available(api, namespace, ready=1)


def test_creates_children_and_reports_status(
    api: Kube, namespace: str, operator: KopfRunner
) -> None:
    created = api.create(endpoint(namespace))
    obj = wait_available(api, namespace, ready=1)
    st = obj["status"]
    assert st["observedGeneration"] == created["metadata"]["generation"]
    assert st["selector"] == "kvscale.io/endpoint=chat,kvscale.io/role=engine"
    assert st["desiredReplicas"] == 1 and st["replicas"] == 1
    assert condition(obj, "Degraded")["status"] == "False"
    for api_version, kind in (
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("policy/v1", "PodDisruptionBudget"),
    ):
        child = api.get(api_version, kind, namespace, "chat-engine")
        assert child is not None, kind
        owner = child["metadata"]["ownerReferences"][0]
        assert owner["uid"] == created["metadata"]["uid"] and owner["controller"] is True
        managers = {m["manager"] for m in child["metadata"]["managedFields"]}
        assert "kvscale" in managers
    dep = deployment(api, namespace)
    assert dep is not None
    limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert events(api, namespace, "Created"), "no Created event"


def test_scale_subresource_answers_on_an_autoscaling_endpoint(
    api: Kube, cluster: Any, namespace: str, chat: None
) -> None:
    """What HPA, KEDA and Lens read: GET /scale on an endpoint without spec.replicas answers
    with the current count; `kubectl scale` (a PUT) raises the autoscaler's floor, no pin."""
    path = f"/apis/kvscale.io/v1alpha1/namespaces/{namespace}/llmendpoints/chat/scale"
    scale = api.request("GET", path)
    assert scale is not None and scale["status"]["replicas"] == 1
    assert scale["spec"]["replicas"] == 1  # scaling.minReplicas
    assert scale["status"]["selector"] == "kvscale.io/endpoint=chat,kvscale.io/role=engine"
    kubectl(cluster, "-n", namespace, "scale", "llme/chat", "--replicas=2")
    obj = wait_available(api, namespace, ready=2)
    assert obj["spec"]["scaling"]["minReplicas"] == 2 and "replicas" not in obj["spec"]
    assert obj["status"]["desiredReplicas"] == 2
    scale = api.request("GET", path)
    assert scale is not None and scale["status"]["replicas"] == 2
    wait_for(lambda: bool(events(api, namespace, "ScaledUp")), timeout=20, what="a ScaledUp event")
    refused = kubectl(cluster, "-n", namespace, "scale", "llme/chat", "--replicas=9", check=False)
    assert "minReplicas must not exceed scaling.maxReplicas" in refused.stderr, refused


def test_foreign_replica_change_is_restored(api: Kube, namespace: str, chat: None) -> None:
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/chat-engine"

    def intrude_until_announced() -> bool:
        # A change that lands while a reconcile already applies is undone without an Event (the
        # reconcile read the Deployment before it): intrude again until one is announced.
        if not events(api, namespace, "ReplicasRestored"):
            api.request(
                "PATCH",
                path,
                {"spec": {"replicas": 3}},
                [("fieldManager", "intruder")],
                "application/merge-patch+json",
            )
            return False
        return True

    def restored() -> bool:
        dep = deployment(api, namespace)
        return dep is not None and dep["spec"]["replicas"] == 1

    wait_for(intrude_until_announced, timeout=60, what="a ReplicasRestored event", interval=3)
    wait_for(restored, timeout=30, what="the operator to restore replicas to 1")


def test_deleted_children_come_back(api: Kube, namespace: str, chat: None) -> None:
    for collection in (
        "api/v1/namespaces/{ns}/services",
        "apis/apps/v1/namespaces/{ns}/deployments",
    ):
        path = "/" + collection.format(ns=namespace) + "/chat-engine"
        before = api.request("GET", path)
        assert before is not None
        api.request("DELETE", path)

        def recreated(path: str = path, uid: str = before["metadata"]["uid"]) -> bool:
            now = api.request("GET", path)
            return now is not None and now["metadata"]["uid"] != uid

        wait_for(recreated, timeout=30, what=f"{path} to be recreated")
    wait_available(api, namespace, ready=1)


def test_edited_managed_fields_are_reverted(api: Kube, namespace: str, chat: None) -> None:
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/chat-engine"
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": ["x"]}]
    api.request("PATCH", path, patch, [("fieldManager", "intruder")], "application/json-patch+json")

    def reverted() -> bool:
        dep = deployment(api, namespace)
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"] if dep else []
        return args[:1] == ["serve"]

    wait_for(reverted, timeout=30, what="the operator to revert the edited args")


def test_spec_change_rolls_out_and_bumps_observed_generation(
    api: Kube, namespace: str, chat: None
) -> None:
    path = f"/apis/kvscale.io/v1alpha1/namespaces/{namespace}/llmendpoints/chat"
    patched = api.request(
        "PATCH", path, {"spec": {"engine": {"blockSize": 32}}}, None, "application/merge-patch+json"
    )
    assert patched is not None
    generation = patched["metadata"]["generation"]

    def rolled() -> bool:
        obj = get_endpoint(api, namespace)
        dep = deployment(api, namespace)
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"] if dep else []
        return obj["status"].get("observedGeneration") == generation and "32" in args

    wait_for(rolled, timeout=30, what="the new block size to reach the Deployment")
    wait_available(api, namespace, ready=1)


def test_missing_model_volume_sets_degraded(
    api: Kube, namespace: str, operator: KopfRunner
) -> None:
    source = {"pvc": {"claimName": "weights"}}
    model = {"name": "tiny", "source": source}
    api.create(endpoint(namespace, model=model))

    def degraded() -> bool:
        cond = condition(get_endpoint(api, namespace), "Degraded")
        return cond.get("status") == "True" and cond.get("reason") == "ModelSourceNotFound"

    wait_for(degraded, timeout=30, what="Degraded=True ModelSourceNotFound")
    cond = condition(get_endpoint(api, namespace), "Degraded")
    assert "PersistentVolumeClaim weights does not exist" in cond["message"]
    assert deployment(api, namespace) is not None


def test_too_many_gpus_reports_capacity_limited(
    api: Kube, namespace: str, operator: KopfRunner
) -> None:
    api.create(
        endpoint(namespace, resources={"gpusPerReplica": 16, "cpu": "100m", "memory": "128Mi"})
    )

    def limited() -> bool:
        cond = condition(get_endpoint(api, namespace), "CapacityLimited")
        return cond.get("status") == "True"

    wait_for(limited, timeout=60, what="CapacityLimited=True for an unschedulable replica")
    cond = condition(get_endpoint(api, namespace), "CapacityLimited")
    assert "nvidia.com/gpu" in cond["message"]


def test_restart_leaves_no_duplicates_or_orphans(
    api: Kube, namespace: str, cluster: Any, crd: None
) -> None:
    api.create(endpoint(namespace))
    with run_operator(cluster):
        # stop as soon as the first child exists: mid-reconcile
        wait_for(
            lambda: api.get("v1", "Service", namespace, "chat-engine") is not None,
            timeout=30,
            what="the first child",
        )
    with run_operator(cluster):
        wait_available(api, namespace, ready=1)
    selector = "app.kubernetes.io/managed-by=kvscale"
    expected = {
        "apis/apps/v1/namespaces/{ns}/deployments": ["chat-engine", "chat-router"],
        "api/v1/namespaces/{ns}/services": ["chat", "chat-engine"],
        "apis/policy/v1/namespaces/{ns}/poddisruptionbudgets": ["chat-engine"],
        "api/v1/namespaces/{ns}/configmaps": ["chat-routing"],
        "api/v1/namespaces/{ns}/serviceaccounts": ["chat-router"],
    }
    for collection, names in expected.items():
        path = "/" + collection.format(ns=namespace)
        items = (api.request("GET", path, query=[("labelSelector", selector)]) or {})["items"]
        assert sorted(i["metadata"]["name"] for i in items) == names, path
    replicasets = "/" + f"apis/apps/v1/namespaces/{namespace}/replicasets"
    items = (api.request("GET", replicasets, query=[("labelSelector", selector)]) or {})["items"]
    owners = sorted(i["metadata"]["ownerReferences"][0]["name"] for i in items)
    assert owners == ["chat-engine", "chat-router"], owners


def test_deleting_the_endpoint_collects_its_children(api: Kube, namespace: str, chat: None) -> None:
    api.request("DELETE", f"/apis/kvscale.io/v1alpha1/namespaces/{namespace}/llmendpoints/chat")
    wait_for(
        lambda: deployment(api, namespace) is None,
        timeout=60,
        what="the garbage collector to delete the engine Deployment",
    )
    wait_for(
        lambda: api.get("v1", "Service", namespace, "chat-engine") is None,
        timeout=30,
        what="the engine Service to be deleted",
    )
