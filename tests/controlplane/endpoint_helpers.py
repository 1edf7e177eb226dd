"""Helpers shared by the control-plane tests: endpoint bodies, lookups, waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvscale.kube import Kube
from kvscale_cluster.fixtures import wait_for
from kvscale_cluster.specs import MODEL, endpoint_body

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = "kvscale.io/v1alpha1"
TEST_IMAGE = "kvscale/testserver:latest"


def endpoint(namespace: str, name: str = "chat", **spec: Any) -> dict[str, Any]:
    sections: dict[str, Any] = {
        "model": {**MODEL, "maxModelLen": 256},
        # The test server stands in for the engine: it answers the probes and drains.
        "engine": {"image": TEST_IMAGE, "maxNumSeqs": 8, "maxNumBatchedTokens": 256},
        "resources": {"gpusPerReplica": 1, "cpu": "100m", "memory": "128Mi"},
        "scaling": {"minReplicas": 1, "maxReplicas": 3},
    }
    return endpoint_body(name, namespace, **{**sections, **spec})


def get_endpoint(api: Kube, namespace: str, name: str = "chat") -> dict[str, Any]:
    found = api.get(ENDPOINT, "LLMEndpoint", namespace, name)
    assert found is not None
    return found


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == type_:
            return dict(c)
    return {}


def deployment(api: Kube, namespace: str, name: str = "chat") -> dict[str, Any] | None:
    return api.get("apps/v1", "Deployment", namespace, f"{name}-engine")


def events(api: Kube, namespace: str, reason: str) -> list[dict[str, Any]]:
    found = api.request("GET", f"/api/v1/namespaces/{namespace}/events") or {}
    return [e for e in found.get("items", []) if e.get("reason") == reason]


def wait_available(api: Kube, namespace: str, ready: int, name: str = "chat") -> dict[str, Any]:
    def available() -> bool:
        obj = get_endpoint(api, namespace, name)
        st = obj.get("status", {})
        return (
            condition(obj, "Available").get("status") == "True"
            and st.get("readyReplicas") == ready
            and condition(obj, "Progressing").get("reason") == "Stable"
        )

    wait_for(available, timeout=90, what=f"{name} Available with {ready} ready replicas")
    return get_endpoint(api, namespace, name)
