"""kvscale installed with Helm from charts/kvscale/ on the local cluster, as platform teams install
KEDA or KServe, without the kustomize install of the other modules (`installed`).

`helm install` into a namespace of its own (the chart runs anywhere, not only kvscale-system),
with the CRD from the chart's crds/; the tiny sample applied and Available; `helm upgrade` with a
changed value (the operator's memory limit) rolls the operator, and the new one reconciles the
endpoint; `helm uninstall` removes the operator and its RBAC and leaves the CRD and the endpoint
with its replicas.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from kvscale.kube import Kube
from kvscale_cluster.binaries import helm_binary
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.install import CRD_NAME, CRDS, ROOT

CHART = ROOT / "charts" / "kvscale"
SAMPLE = ROOT / "manifests" / "samples" / "tiny-dummy.yaml"
RELEASE = "kvscale"
RELEASE_NAMESPACE = "kvscale-helm"
OPERATOR = "app.kubernetes.io/name=kvscale-operator"
API = "kvscale.io/v1alpha1"

Helm = Callable[..., str]


@pytest.fixture(scope="module")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    """helm against the local cluster, its own config and cache; after the module the release,
    its namespace and the CRD are gone again."""
    binary = helm_binary()  # fails, never skips, when helm is neither cached nor buildable
    home = tmp_path_factory.mktemp("helm")
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        **{f"HELM_{part}_HOME": str(home / part.lower()) for part in ("CONFIG", "CACHE", "DATA")},
    }

    def run(*args: str) -> str:
        done = subprocess.run(
            [str(binary), *args], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}{done.stderr}"
        return done.stdout

    try:
        yield run
    finally:
        run("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--ignore-not-found", "--wait")
        kubectl(cluster, "delete", "-k", str(CRDS), "--ignore-not-found", "--timeout=180s")
        kubectl(cluster, "delete", "namespace", RELEASE_NAMESPACE, "--ignore-not-found",
                "--timeout=180s")  # fmt: skip


def operator_pods(api: Kube) -> list[dict[str, Any]]:
    return [
        p
        for p in api.list_pods(RELEASE_NAMESPACE, OPERATOR)
        if not p["metadata"].get("deletionTimestamp")
    ]


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def available(cluster: Cluster, namespace: str, name: str) -> None:
    kubectl(cluster, "-n", namespace, "wait", f"llme/{name}", "--for=condition=Available",
            "--timeout=300s")  # fmt: skip


def test_helm_install_upgrade_and_uninstall_keep_the_crd_and_the_endpoint(
    cluster: Cluster, helm: Helm, namespace: str
) -> None:
    api = Kube(cluster.api_client())
    kubectl(cluster, "delete", "-k", str(CRDS), "--ignore-not-found", "--timeout=180s")
    helm("install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace",
         "--wait", "--timeout=300s")  # fmt: skip
    crd = yaml.safe_load(kubectl(cluster, "get", CRD_NAME, "-o", "yaml").stdout)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # from crds/
    (first,) = operator_pods(api)
    assert ready(first)

    body = yaml.safe_load(SAMPLE.read_text())
    name = body["metadata"]["name"]
    kubectl(cluster, "apply", "--server-side", "-n", namespace, "-f", str(SAMPLE))
    available(cluster, namespace, name)

    helm("upgrade", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--wait", "--timeout=300s",
         "--set", "operator.resources.limits.memory=768Mi")  # fmt: skip
    deployment = api.get("apps/v1", "Deployment", RELEASE_NAMESPACE, "kvscale-operator") or {}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] == "768Mi"

    def rolled() -> bool:
        pods = operator_pods(api)
        return len(pods) == 1 and pods[0]["metadata"]["uid"] != first["metadata"]["uid"]

    wait_for(rolled, timeout=180, what="the upgraded operator's pod in place of the first")
    wait_for(lambda: all(ready(p) for p in operator_pods(api)), 180, "the new operator Ready")
    # the new operator reconciles: a spec change is observed
    kubectl(cluster, "-n", namespace, "patch", "llme", name, "--type=merge",
            "-p", '{"spec": {"scaling": {"maxReplicas": 2}}}')  # fmt: skip

    def observed() -> bool:
        found = api.get(API, "LLMEndpoint", namespace, name) or {}
        generation = found["metadata"]["generation"]
        return bool(found.get("status", {}).get("observedGeneration") == generation)

    wait_for(observed, timeout=120, what="the upgraded operator observing the change")
    available(cluster, namespace, name)

    helm("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", "--timeout=180s")
    assert api.get("apps/v1", "Deployment", RELEASE_NAMESPACE, "kvscale-operator") is None
    gone = kubectl(cluster, "get", "clusterrole", "kvscale-operator", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone
    kubectl(cluster, "get", CRD_NAME)  # Helm keeps crds/
    assert api.get(API, "LLMEndpoint", namespace, name) is not None
    assert api.get("apps/v1", "Deployment", namespace, f"{name}-engine") is not None
