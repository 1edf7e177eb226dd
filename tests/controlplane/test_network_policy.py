"""The engine pods' NetworkPolicy as the operator applies it: the API server accepts it, it
selects exactly the engine pods, and it comes back when deleted. (The control-plane tier runs no
network plugin, so nothing here enforces it: what it lets through is a unit test.)"""

from __future__ import annotations

from typing import Any

from endpoint_helpers import endpoint, wait_available
from kopf.testing import KopfRunner

from kvscale.children import engine, network
from kvscale.kube import Kube
from kvscale_cluster.fixtures import wait_for

POLICY = ("networking.k8s.io/v1", "NetworkPolicy")


def test_engine_pods_are_fenced_by_a_network_policy(
    api: Kube, cluster: Any, namespace: str, operator: KopfRunner
) -> None:
    created = api.create(endpoint(namespace))
    wait_available(api, namespace, ready=1)
    policy = api.get(*POLICY, namespace, "chat-engine")
    assert policy is not None
    owner = engine.Owner("chat", namespace, created["metadata"]["uid"])
    rendered = network.engine_network_policy(owner, network.DEFAULT_NAMESPACE)
    assert policy["spec"] == rendered["spec"]
    assert policy["metadata"]["ownerReferences"] == [owner.reference()]

    selector = ",".join(f"{k}={v}" for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    fenced = {p["metadata"]["name"] for p in api.list_pods(namespace, selector)}
    engines = {
        p["metadata"]["name"] for p in api.list_pods(namespace, engine.selector_string("chat"))
    }
    assert fenced == engines and len(engines) == 1  # the engines, not the routers

    api.request(
        "DELETE", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/chat-engine"
    )
    wait_for(
        lambda: api.get(*POLICY, namespace, "chat-engine") is not None,
        timeout=30,
        what="the deleted NetworkPolicy restored",
    )
