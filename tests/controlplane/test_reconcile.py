"""The operator's reconcile core against a real API server, controllers and process kubelet."""

from __future__ import annotations

import copy
from typing import Any

from kopf.testing import KopfRunner

from kvscale.kube import Kube
from kvscale_cluster.wait import wait_for

ENDPOINT = "kvscale.io/v1alpha1"
TEST_IMAGE = "kvscale/testserver:latest"


def endpoint(namespace: str, name: str = "chat", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": "tiny", "source": {"dummy": {}}, "maxModelLen": 256},
        # The test server stands in for the engine: it answers the probes and drains.
        "engine": {"image": TEST_IMAGE, "maxNumSeqs": 8, "maxNumBatchedTokens": 256},
        "resources": {"gpusPerReplica": 1, "cpu": "100m", "memory": "128Mi"},
        "scaling": {"minReplicas": 1, "maxReplicas": 3},
    }
    body.update(copy.deepcopy(spec))
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": ENDPOINT, "kind": "LLMEndpoint", "metadata": meta, "spec": body}


def get_endpoint(kube: Kube, namespace: str, name: str = "chat") -> dict[str, Any]:
    found = kube.get(ENDPOINT, "LLMEndpoint", namespace, name)
    assert found is not None
    return found


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == type_:
            return dict(c)
    return {}


def deployment(kube: Kube, namespace: str, name: str = "chat") -> dict[str, Any] | None:
    return kube.get("apps/v1", "Deployment", namespace, f"{name}-engine")


def events(kube: Kube, namespace: str, reason: str) -> list[dict[str, Any]]:
    found = kube.request("GET", f"/api/v1/namespaces/{namespace}/events") or {}
    return [e for e in found.get("items", []) if e.get("reason") == reason]


def wait_available(kube: Kube, namespace: str, ready: int, name: str = "chat") -> dict[str, Any]:
    def available() -> bool:
        obj = get_endpoint(kube, namespace, name)
        st = obj.get("status", {})
        return (
            condition(obj, "Available").get("status") == "True"
            and st.get("readyReplicas") == ready
            and condition(obj, "Progressing").get("reason") == "Stable"
        )

    wait_for(available, timeout=90, what=f"{name} Available with {ready} ready replicas")
    return get_endpoint(kube, namespace, name)


def test_creates_children_and_reports_status(
    kube: Kube, namespace: str, operator: KopfRunner
) -> None:
    created = kube.create(endpoint(namespace))
    obj = wait_available(kube, namespace, ready=1)
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
        child = kube.get(api_version, kind, namespace, "chat-engine")
        assert child is not None, kind
        owner = child["metadata"]["ownerReferences"][0]
        assert owner["uid"] == created["metadata"]["uid"] and owner["controller"] is True
        managers = {m["manager"] for m in child["metadata"]["managedFields"]}
        assert "kvscale" in managers
    dep = deployment(kube, namespace)
    assert dep is not None
    limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert events(kube, namespace, "Created"), "no Created event"


def test_kubectl_scale_pins_replicas(kube: Kube, namespace: str, operator: KopfRunner) -> None:
    kube.create(endpoint(namespace))
    wait_available(kube, namespace, ready=1)
    path = f"/apis/kvscale.io/v1alpha1/namespaces/{namespace}/llmendpoints/chat/scale"
    scale = kube.request("GET", path)
    assert scale is not None and scale["status"]["selector"].startswith("kvscale.io/endpoint=")
    kube.request("PATCH", path, {"spec": {"replicas": 2}}, None, "application/merge-patch+json")
    obj = wait_available(kube, namespace, ready=2)
    assert obj["spec"]["replicas"] == 2
    assert obj["status"]["desiredReplicas"] == 2
    wait_for(lambda: bool(events(kube, namespace, "Scaled")), timeout=20, what="a Scaled event")


def test_foreign_replica_change_is_restored(
    kube: Kube, namespace: str, operator: KopfRunner
) -> None:
    kube.create(endpoint(namespace))
    wait_available(kube, namespace, ready=1)
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/chat-engine"
    kube.request(
        "PATCH",
        path,
        {"spec": {"replicas": 3}},
        [("fieldManager", "intruder")],
        "application/merge-patch+json",
    )

    def restored() -> bool:
        dep = deployment(kube, namespace)
        return dep is not None and dep["spec"]["replicas"] == 1

    wait_for(restored, timeout=30, what="the operator to restore replicas to 1")
    wait_for(
        lambda: bool(events(kube, namespace, "ReplicasRestored")),
        timeout=20,
        what="a ReplicasRestored event",
    )


def test_deleted_children_come_back(kube: Kube, namespace: str, operator: KopfRunner) -> None:
    kube.create(endpoint(namespace))
    wait_available(kube, namespace, ready=1)
    for collection in (
        "api/v1/namespaces/{ns}/services",
        "apis/apps/v1/namespaces/{ns}/deployments",
    ):
        path = "/" + collection.format(ns=namespace) + "/chat-engine"
        before = kube.request("GET", path)
        assert before is not None
        kube.request("DELETE", path)

        def recreated(path: str = path, uid: str = before["metadata"]["uid"]) -> bool:
            now = kube.request("GET", path)
            return now is not None and now["metadata"]["uid"] != uid

        wait_for(recreated, timeout=30, what=f"{path} to be recreated")
    wait_available(kube, namespace, ready=1)


def test_edited_managed_fields_are_reverted(
    kube: Kube, namespace: str, operator: KopfRunner
) -> None:
    kube.create(endpoint(namespace))
    wait_available(kube, namespace, ready=1)
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/chat-engine"
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": ["x"]}]
    kube.request(
        "PATCH", path, patch, [("fieldManager", "intruder")], "application/json-patch+json"
    )

    def reverted() -> bool:
        dep = deployment(kube, namespace)
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"] if dep else []
        return args[:1] == ["serve"]

    wait_for(reverted, timeout=30, what="the operator to revert the edited args")


def test_spec_change_rolls_out_and_bumps_observed_generation(
    kube: Kube, namespace: str, operator: KopfRunner
) -> None:
    kube.create(endpoint(namespace))
    wait_available(kube, namespace, ready=1)
    path = f"/apis/kvscale.io/v1alpha1/namespaces/{namespace}/llmendpoints/chat"
    patched = kube.request(
        "PATCH", path, {"spec": {"engine": {"blockSize": 32}}}, None, "application/merge-patch+json"
    )
    assert patched is not None
    generation = patched["metadata"]["generation"]

    def rolled() -> bool:
        obj = get_endpoint(kube, namespace)
        dep = deployment(kube, namespace)
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"] if dep else []
        return obj["status"].get("observedGeneration") == generation and "32" in args

    wait_for(rolled, timeout=30, what="the new block size to reach the Deployment")
    wait_available(kube, namespace, ready=1)


def test_missing_model_volume_sets_degraded(
    kube: Kube, namespace: str, operator: KopfRunner
) -> None:
    source = {"pvc": {"claimName": "weights"}}
    model = {"name": "tiny", "source": source}
    kube.create(endpoint(namespace, model=model))

    def degraded() -> bool:
        cond = condition(get_endpoint(kube, namespace), "Degraded")
        return cond.get("status") == "True" and cond.get("reason") == "ModelSourceNotFound"

    wait_for(degraded, timeout=30, what="Degraded=True ModelSourceNotFound")
    cond = condition(get_endpoint(kube, namespace), "Degraded")
    assert "PersistentVolumeClaim weights does not exist" in cond["message"]
    assert deployment(kube, namespace) is not None


def test_too_many_gpus_reports_capacity_limited(
    kube: Kube, namespace: str, operator: KopfRunner
) -> None:
    kube.create(
        endpoint(namespace, resources={"gpusPerReplica": 16, "cpu": "100m", "memory": "128Mi"})
    )

    def limited() -> bool:
        cond = condition(get_endpoint(kube, namespace), "CapacityLimited")
        return cond.get("status") == "True"

    wait_for(limited, timeout=60, what="CapacityLimited=True for an unschedulable replica")
    cond = condition(get_endpoint(kube, namespace), "CapacityLimited")
    assert "nvidia.com/gpu" in cond["message"]


def test_restart_leaves_no_duplicates_or_orphans(
    kube: Kube, namespace: str, cluster: Any, crd: None, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    args = ["run", "--standalone", "--all-namespaces", "-m", "kvscale.handlers"]
    kube.create(endpoint(namespace))
    with KopfRunner(args, timeout=60):
        # stop as soon as the first child exists: mid-reconcile
        wait_for(
            lambda: kube.get("v1", "Service", namespace, "chat-engine") is not None,
            timeout=30,
            what="the first child",
        )
    with KopfRunner(args, timeout=60):
        wait_available(kube, namespace, ready=1)
    selector = "app.kubernetes.io/managed-by=kvscale"
    for collection in (
        "apis/apps/v1/namespaces/{ns}/deployments",
        "api/v1/namespaces/{ns}/services",
        "apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        "apis/apps/v1/namespaces/{ns}/replicasets",
    ):
        path = "/" + collection.format(ns=namespace)
        items = (kube.request("GET", path, query=[("labelSelector", selector)]) or {})["items"]
        assert len(items) == 1, f"{path}: {[i['metadata']['name'] for i in items]}"


def test_deleting_the_endpoint_collects_its_children(
    kube: Kube, namespace: str, operator: KopfRunner
) -> None:
    kube.create(endpoint(namespace))
    wait_available(kube, namespace, ready=1)
    kube.request("DELETE", f"/apis/kvscale.io/v1alpha1/namespaces/{namespace}/llmendpoints/chat")
    wait_for(
        lambda: deployment(kube, namespace) is None,
        timeout=60,
        what="the garbage collector to delete the engine Deployment",
    )
    wait_for(
        lambda: kube.get("v1", "Service", namespace, "chat-engine") is None,
        timeout=30,
        what="the engine Service to be deleted",
    )
