"""GitOps tools read the truth: kstatus conditions against the real API server, and a re-apply
of the same manifest that never fights the operator."""

from __future__ import annotations

import json
from typing import Any

from endpoint_helpers import condition, endpoint, get_endpoint
from kopf.testing import KopfRunner

from kvscale.kube import Kube
from kvscale_cluster.fixtures import kubectl, run_operator, wait_for


def kstatus(obj: dict[str, Any]) -> tuple[str, str, str]:
    return tuple(  # type: ignore[return-value]
        condition(obj, t).get("status", "") for t in ("Ready", "Reconciling", "Stalled")
    )


def test_rollout_then_stuck_image_as_kstatus_sees_them(
    api: Kube, cluster: Any, namespace: str, operator: KopfRunner
) -> None:
    body = endpoint(namespace)
    manifest = json.dumps(body)
    kubectl(cluster, "apply", "--server-side", "-n", namespace, "-f", "-", stdin=manifest)
    seen: set[tuple[str, str, str]] = set()

    def current() -> bool:
        obj = get_endpoint(api, namespace)
        seen.add(kstatus(obj))
        generation = obj["metadata"]["generation"]
        return kstatus(obj) == ("True", "False", "False") and (
            obj["status"].get("observedGeneration") == generation
        )

    wait_for(current, timeout=90, what="Ready=True, Reconciling=False, Stalled=False")
    assert ("False", "True", "False") in seen, f"never seen converging: {seen}"
    ready = condition(get_endpoint(api, namespace), "Ready")
    assert ready["observedGeneration"] == get_endpoint(api, namespace)["metadata"]["generation"]

    # a GitOps re-apply of the very same manifest: nothing to change, nobody to fight
    generation = get_endpoint(api, namespace)["metadata"]["generation"]
    kubectl(cluster, "apply", "--server-side", "-n", namespace, "-f", "-", stdin=manifest)
    obj = get_endpoint(api, namespace)
    assert obj["metadata"]["generation"] == generation
    assert not obj["metadata"].get("finalizers")
    managers = {
        m["manager"] for m in obj["metadata"]["managedFields"] if m.get("subresource") != "status"
    }
    assert managers == {"kubectl"}, managers  # the operator writes nothing outside status

    # an image no node can pull: stuck, as kstatus calls it
    kubectl(cluster, "-n", namespace, "patch", "llme", "chat", "--type=merge",
            "-p", '{"spec": {"engine": {"image": "example.invalid/nothing:1"}}}')  # fmt: skip

    def stalled() -> bool:
        obj = get_endpoint(api, namespace)
        return kstatus(obj)[2] == "True" and kstatus(obj)[0] == "False"

    wait_for(stalled, timeout=90, what="Stalled=True, Ready=False for an image that cannot pull")
    obj = get_endpoint(api, namespace)
    assert condition(obj, "Stalled")["reason"] == "ImagePullFailed"
    assert condition(obj, "Reconciling")["status"] == "False"


def flux_kstatus(obj: dict[str, Any]) -> str:
    """kstatus' generic rule for custom resources (sigs.k8s.io/cli-utils `checkGenericProperties`,
    what Flux and `kubectl wait --for=jsonpath` GitOps checks use)."""
    observed = obj.get("status", {}).get("observedGeneration")
    if observed is not None and observed != obj["metadata"]["generation"]:
        return "InProgress"
    if condition(obj, "Reconciling").get("status") == "True":
        return "InProgress"
    if condition(obj, "Stalled").get("status") == "True":
        return "Failed"
    return "Current"


def test_a_new_endpoint_is_in_progress_until_the_operator_observes_it(
    api: Kube, cluster: Any, namespace: str, crd: None
) -> None:
    created = api.create(endpoint(namespace))
    assert flux_kstatus(created) == "InProgress", created.get("status")
    assert flux_kstatus(get_endpoint(api, namespace)) == "InProgress"
    with run_operator(cluster):
        wait_for(
            lambda: flux_kstatus(get_endpoint(api, namespace)) == "Current",
            timeout=90,
            what="kstatus Current once the operator observed and rolled out the endpoint",
        )
    obj = get_endpoint(api, namespace)
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert condition(obj, "Ready")["status"] == "True"
