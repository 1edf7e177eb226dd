"""manifests/ renders with kustomize, passes a server-side dry run, and its RBAC suffices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from endpoint_helpers import ROOT, endpoint, wait_available
from kopf.testing import KopfRunner
from kubernetes.config import kube_config

from kvscale.kube import Kube
from kvscale_cluster.fixtures import kubectl
from kvscale_cluster.install import SERVICEMONITOR_CRD

NAMESPACE = "kvscale-system"


def rendered(cluster: Any) -> list[dict[str, Any]]:
    out = kubectl(cluster, "kustomize", str(ROOT / "manifests")).stdout
    return list(yaml.safe_load_all(out))


def test_manifests_render_every_part(cluster: Any) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rendered(cluster)}
    assert ("CustomResourceDefinition", "llmendpoints.kvscale.io") in kinds
    assert ("Deployment", "kvscale-operator") in kinds
    assert ("ClusterRole", "kvscale-operator") in kinds
    assert ("ServiceMonitor", "kvscale-engines") in kinds
    operator = next(d for d in rendered(cluster) if d["kind"] == "Deployment")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "kvscale/operator:0.1.0"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert operator["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_manifests_pass_a_server_side_dry_run(cluster: Any, crd: None) -> None:
    kubectl(cluster, "apply", "--server-side", "-f", str(SERVICEMONITOR_CRD))
    kubectl(
        cluster,
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/servicemonitors.monitoring.coreos.com",
    )
    docs = rendered(cluster)
    namespace = [d for d in docs if d["kind"] == "Namespace"]
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(namespace))
    out = kubectl(
        cluster,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=kvscale-test",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
    ).stdout
    for kind in ("customresourcedefinition", "clusterrole", "deployment", "servicemonitor"):
        assert kind in out.lower(), out


def test_samples_pass_a_server_side_dry_run(cluster: Any, crd: None, namespace: str) -> None:
    for sample in sorted((ROOT / "manifests" / "samples").glob("*.yaml")):
        kubectl(
            cluster,
            "apply",
            "--server-side",
            "--dry-run=server",
            "-n",
            namespace,
            "-f",
            str(sample),
        )


def _operator_kubeconfig(cluster: Any, api: Kube, directory: Path) -> Path:
    """A kubeconfig holding a token of the operator's ServiceAccount, as its pod would have."""
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/kvscale-operator/token"
    issued = api.request("POST", path, {"spec": {"expirationSeconds": 3600}})
    assert issued is not None
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": cluster.api_url,
                    "certificate-authority": str(cluster.ca_path),
                },
            }
        ],
        "users": [{"name": "operator", "user": {"token": issued["status"]["token"]}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "operator"}}],
        "current-context": "c",
    }
    target = directory / "operator.kubeconfig"
    target.write_text(yaml.safe_dump(config))
    return target


def test_operator_runs_with_only_its_rbac(
    cluster: Any, crd: None, api: Kube, namespace: str, tmp_path: Path, monkeypatch: Any
) -> None:
    docs = [
        d
        for d in rendered(cluster)
        if d["kind"] in ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
    operator_kubeconfig = str(_operator_kubeconfig(cluster, api, tmp_path))
    monkeypatch.setenv("KUBECONFIG", operator_kubeconfig)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", operator_kubeconfig)
    args = ["run", "--standalone", "--all-namespaces", "-m", "kvscale.handlers"]
    api.create(endpoint(namespace))
    with KopfRunner(args, timeout=60) as runner:
        wait_available(api, namespace, ready=1)
    denied = 'User "system:serviceaccount:kvscale-system:kvscale-operator" cannot'
    assert denied not in runner.output, runner.output
