"""The LLMEndpoint API as Kubernetes tools read it from the real API server: `kubectl explain`,
the scale subresource, the client address, list-maps and server-side apply, name limits."""

from __future__ import annotations

from typing import Any

import pytest
from endpoint_helpers import endpoint, wait_available
from kopf.testing import KopfRunner

from kvscale.api.rules import MAX_ENDPOINT_NAME
from kvscale.children.engine_args import ENGINE_PORT
from kvscale.kube import Kube, KubeError
from kvscale_cluster.fixtures import kubectl, wait_for
from kvscale_cluster.specs import endpoint_body


def explain(cluster: Any, field: str) -> str:
    """`kubectl explain` once discovery serves the CRD's OpenAPI v3 document."""
    done: list[str] = []

    def answered() -> bool:
        out = kubectl(cluster, "explain", field, check=False)
        done[:] = [out.stdout]
        return out.returncode == 0

    wait_for(answered, timeout=30, what=f"kubectl explain {field}")
    return done[0]


def test_kubectl_explain_describes_fields_with_units_and_defaults(cluster: Any, crd: None) -> None:
    out = explain(cluster, "llme.spec.scaling")
    assert "Seconds between the capacity controller's decisions" in out, out
    assert "Default: 60." in out, out
    field = explain(cluster, "llme.spec.model.source.hostPath")
    assert "checkpoint directory on the node" in field, field


def test_status_url_is_the_client_address_and_a_column(
    api: Kube, cluster: Any, namespace: str, operator: KopfRunner
) -> None:
    api.create(endpoint(namespace))
    obj = wait_available(api, namespace, ready=1)
    url = f"http://chat.{namespace}.svc:{ENGINE_PORT}/v1"
    assert obj["status"]["url"] == url
    service = api.get("v1", "Service", namespace, "chat")  # what clients reach: the routers
    assert service is not None and service["spec"]["ports"][0]["port"] == ENGINE_PORT
    table = kubectl(cluster, "-n", namespace, "get", "llme", "chat").stdout
    assert "URL" in table.splitlines()[0] and url in table, table


def classes_apply(namespace: str, *names: str) -> dict[str, Any]:
    body = endpoint_body("probe", namespace)
    body["spec"] = {"trafficClasses": [{"name": n, "priority": 1} for n in names]}
    return body


def test_traffic_classes_merge_by_name_under_server_side_apply(
    api: Kube, namespace: str, crd: None
) -> None:
    """Two appliers each own their own classes; a duplicate name is refused."""
    api.create(endpoint_body("probe", namespace))
    api.apply(classes_apply(namespace, "interactive"), manager="team-a")
    merged = api.apply(classes_apply(namespace, "batch"), manager="team-b")
    assert [c["name"] for c in merged["spec"]["trafficClasses"]] == ["interactive", "batch"]
    # team-a re-applies its class with another priority: team-b's class stays
    body = classes_apply(namespace, "interactive")
    body["spec"]["trafficClasses"][0]["priority"] = 9
    merged = api.apply(body, manager="team-a")
    by_name = {c["name"]: c["priority"] for c in merged["spec"]["trafficClasses"]}
    assert by_name == {"interactive": 9, "batch": 1}
    # a duplicate is refused (server-side apply answers 500 "duplicate entries for key", a
    # create 422 with the CEL rule's sentence)
    with pytest.raises(KubeError) as refused:
        api.apply(classes_apply(namespace, "batch", "batch"), manager="team-c")
    assert 'duplicate entries for key [name="batch"]' in refused.value.message
    twice = endpoint_body("twice", namespace, trafficClasses=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(KubeError) as refused:
        api.create(twice, strict=True)
    assert refused.value.status == 422, refused.value.message
    assert "Duplicate value" in refused.value.message, refused.value.message


def test_the_longest_name_gets_its_children(
    api: Kube, namespace: str, operator: KopfRunner
) -> None:
    """At the limit the operator's children apply: `<name>-engine` is a 63-character Service."""
    name = "n" * MAX_ENDPOINT_NAME
    api.create(endpoint(namespace, name=name))
    wait_for(
        lambda: api.get("v1", "Service", namespace, f"{name}-engine") is not None,
        timeout=30,
        what="the 63-character engine Service",
    )
    assert len(f"{name}-engine") == 63
    obj = wait_available(api, namespace, ready=1, name=name)
    assert obj["status"]["url"].startswith(f"http://{name}.")
