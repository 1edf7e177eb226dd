"""manifests/ renders with kustomize, passes a server-side dry run, and its RBAC suffices.

Three shapes: the cluster-wide base (`kubectl apply -k manifests/`, no Prometheus Operator
needed), the base plus the optional ServiceMonitor component, and the namespaced overlay (a Role,
`--namespace`). The CRD is apart, in manifests/crds/, so deleting any of them leaves it and the
endpoints.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from endpoint_helpers import ENDPOINT, ROOT, endpoint, wait_available
from kopf.testing import KopfRunner
from kubernetes.config import kube_config

from kvscale import __version__
from kvscale.api.images import DefaultImages
from kvscale.children.engine import ENDPOINT_LABEL, ROLE_LABEL, labels
from kvscale.kube import Kube
from kvscale_cluster.fixtures import kubectl
from kvscale_cluster.install import PODMONITOR_CRD, SERVICEMONITOR_CRD, wait_established

NAMESPACE = "kvscale-system"
CRD = "llmendpoints.kvscale.io"
BASE = ROOT / "manifests"
CRDS = BASE / "crds"
KEEP = {  # what keeps GitOps tools and Helm from deleting the CRD with the install
    "argocd.argoproj.io/sync-options": "Prune=false,Delete=false",
    "kustomize.toolkit.fluxcd.io/prune": "disabled",
    "helm.sh/resource-policy": "keep",
}
WITH_SERVICEMONITOR = BASE / "overlays" / "prometheus-operator"
NAMESPACED = BASE / "overlays" / "namespaced"
SERVICEMONITOR_CRD_NAME = "crd/servicemonitors.monitoring.coreos.com"
PODMONITOR_CRD_NAME = "crd/podmonitors.monitoring.coreos.com"
MONITORS = {
    ("ServiceMonitor", "kvscale-engines"),
    ("ServiceMonitor", "kvscale-routers"),
    ("PodMonitor", "kvscale-operator"),
}
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces"}


def rendered(cluster: Any, path: Path = BASE) -> list[dict[str, Any]]:
    out = kubectl(cluster, "kustomize", str(path)).stdout
    return list(yaml.safe_load_all(out))


def namespaced_install(cluster: Any, namespace: str, directory: Path) -> list[dict[str, Any]]:
    """The namespaced overlay rendered for `namespace`, as a user's own kustomization would."""
    overlay = os.path.relpath(NAMESPACED, directory)
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": namespace,
                "resources": [overlay],
            }
        )
    )
    return rendered(cluster, directory)


def dry_run(cluster: Any, docs: list[dict[str, Any]]) -> str:
    return kubectl(
        cluster,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=kvscale-test",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
    ).stdout


def one(docs: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def test_manifests_render_every_part(cluster: Any) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rendered(cluster)}
    assert "CustomResourceDefinition" not in {kind for kind, _ in kinds}  # manifests/crds/
    assert ("Deployment", "kvscale-operator") in kinds
    assert ("ClusterRole", "kvscale-operator") in kinds
    assert not {kind for kind, _ in kinds} & {"ServiceMonitor", "PodMonitor"}  # optional
    with_monitor = {
        (d["kind"], d["metadata"]["name"]) for d in rendered(cluster, WITH_SERVICEMONITOR)
    }
    assert with_monitor == kinds | MONITORS
    operator = one(rendered(cluster), "Deployment")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"kvscale/operator:{__version__}"
    # `images:` tags the operator's defaults too: this version's engine, router and vLLM images
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert DefaultImages.from_env(env) == DefaultImages()
    assert env["KVSCALE_DEFAULT_ROUTER_IMAGE"] == f"kvscale/router:{__version__}"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert operator["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_crd_is_its_own_kustomization_that_gitops_tools_keep(cluster: Any) -> None:
    crd = one(rendered(cluster, CRDS), "CustomResourceDefinition", "llmendpoints.kvscale.io")
    assert crd["metadata"]["annotations"] == KEEP
    assert crd["metadata"]["labels"] == {"app.kubernetes.io/part-of": "kvscale"}
    committed = yaml.safe_load((ROOT / "crds" / "llmendpoints.kvscale.io.yaml").read_text())
    assert crd["spec"] == committed["spec"]


def test_namespaced_overlay_holds_a_role_and_watches_one_namespace(
    cluster: Any, tmp_path: Path
) -> None:
    docs = namespaced_install(cluster, "team-a", tmp_path)
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"Namespace", "ServiceMonitor", "PodMonitor"}
    assert {"Role", "RoleBinding", "ServiceAccount", "Deployment"} <= kinds
    cluster_scoped = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    namespaced = [d for d in docs if d["kind"] not in cluster_scoped]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"team-a"}
    for binding in ("RoleBinding", "ClusterRoleBinding"):
        assert one(docs, binding)["subjects"][0]["namespace"] == "team-a"
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--namespace=$(POD_NAMESPACE)" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_role_holds_exactly_the_cluster_roles_namespaced_rules(cluster: Any) -> None:
    """The two installs cannot drift apart: the namespaced rules in a Role, and only read-only
    discovery (what Kopf lists and watches) cluster-wide."""
    cluster_rules = one(rendered(cluster), "ClusterRole", "kvscale-operator")["rules"]
    namespaced = rendered(cluster, NAMESPACED)
    role_rules = one(namespaced, "Role")["rules"]
    assert role_rules == [r for r in cluster_rules if not set(r["resources"]) & CLUSTER_SCOPED]
    discovery = one(namespaced, "ClusterRole", "kvscale-operator")["rules"]
    assert discovery == [r for r in cluster_rules if set(r["resources"]) & CLUSTER_SCOPED]
    assert all(set(r["verbs"]) <= {"list", "watch"} for r in discovery)
    finalizers = [r for r in role_rules if r["resources"] == ["llmendpoints/finalizers"]]
    assert finalizers and finalizers[0]["verbs"] == ["update"]


def test_base_passes_a_server_side_dry_run_without_the_prometheus_operator(
    cluster: Any, crd: None
) -> None:
    for name in (SERVICEMONITOR_CRD_NAME, PODMONITOR_CRD_NAME):
        kubectl(cluster, "delete", name, "--ignore-not-found", "--wait=true")
    docs = rendered(cluster, CRDS) + rendered(cluster)
    namespace = [d for d in docs if d["kind"] == "Namespace"]
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(namespace))
    out = dry_run(cluster, docs)
    for kind in ("customresourcedefinition", "clusterrole", "deployment"):
        assert kind in out.lower(), out


def test_monitors_scrape_engines_routers_and_the_operator_with_the_labels_rules_use(
    cluster: Any,
) -> None:
    docs = rendered(cluster, WITH_SERVICEMONITOR)
    monitors = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"].endswith("Monitor")}
    children = {"kvscale-engines": "engine", "kvscale-routers": "router"}
    for name, role in children.items():  # the labels the operator puts on its children
        spec = monitors[name]
        assert spec["selector"]["matchLabels"] == {
            k: v for k, v in labels("x", role).items() if k in spec["selector"]["matchLabels"]
        }
        assert set(spec["podTargetLabels"]) == {ENDPOINT_LABEL, ROLE_LABEL}
        assert spec["endpoints"][0]["port"] == "http"
    operator = one(docs, "Deployment")["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in operator["spec"]["containers"][0]["ports"]}
    pod = monitors["kvscale-operator"]
    assert pod["selector"]["matchLabels"].items() <= operator["metadata"]["labels"].items()
    endpoint = pod["podMetricsEndpoints"][0]
    assert ports[endpoint["port"]] == int(operator["metadata"]["annotations"]["prometheus.io/port"])
    assert endpoint["honorLabels"] is True  # the series' own namespace label wins


def test_monitor_component_passes_a_server_side_dry_run(cluster: Any, crd: None) -> None:
    for path, name in ((SERVICEMONITOR_CRD, SERVICEMONITOR_CRD_NAME),
                       (PODMONITOR_CRD, PODMONITOR_CRD_NAME)):  # fmt: skip
        kubectl(cluster, "apply", "--server-side", "-f", str(path))
        wait_established(lambda *args: kubectl(cluster, *args), name)
    docs = rendered(cluster, WITH_SERVICEMONITOR)
    namespace = [d for d in docs if d["kind"] == "Namespace"]
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(namespace))
    out = dry_run(cluster, docs).lower()
    for kind, name in MONITORS:
        assert f"{kind.lower()}.monitoring.coreos.com/{name}" in out, out
    misspelt = [d for d in docs if d["kind"] == "PodMonitor"]
    misspelt[0]["spec"]["podMetricEndpoints"] = misspelt[0]["spec"].pop("podMetricsEndpoints")
    refused = kubectl(
        cluster, "apply", "--server-side", "--dry-run=server", "-f", "-",
        stdin=yaml.safe_dump_all(misspelt), check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "podMetricEndpoints" in refused.stderr, refused


def test_namespaced_overlay_passes_a_server_side_dry_run(
    cluster: Any, crd: None, namespace: str, tmp_path: Path
) -> None:
    out = dry_run(cluster, namespaced_install(cluster, namespace, tmp_path))
    for kind in (
        "role.rbac",
        "rolebinding.rbac",
        "deployment.apps",
        "serviceaccount",
        "clusterrole",
    ):
        assert kind in out.lower(), out


def test_deleting_the_install_leaves_the_crd_and_the_endpoints(
    cluster: Any, crd: None, api: Kube, namespace: str
) -> None:
    """`kubectl delete -k manifests/` (as a GitOps prune of the install would) removes the
    operator, its RBAC and namespace, and nothing of the API: endpoints stay, to be served again
    by the next install."""
    kubectl(cluster, "apply", "--server-side", "-k", str(CRDS))
    kubectl(cluster, "apply", "--server-side", "-k", str(BASE))
    api.create(endpoint(namespace))
    kubectl(cluster, "delete", "-k", str(BASE), "--wait=true", "--timeout=120s")
    assert api.get("apps/v1", "Deployment", NAMESPACE, "kvscale-operator") is None
    assert api.request("GET", f"/api/v1/namespaces/{NAMESPACE}") is None
    crd = api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}")
    assert crd is not None and crd["metadata"].get("deletionTimestamp") is None
    assert api.get(ENDPOINT, "LLMEndpoint", namespace, "chat") is not None


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


def _operator_kubeconfig(
    cluster: Any, api: Kube, directory: Path, namespace: str = NAMESPACE
) -> Path:
    """A kubeconfig holding a token of the operator's ServiceAccount, as its pod would have."""
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/kvscale-operator/token"
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


def test_namespaced_operator_runs_with_only_its_role(
    cluster: Any, crd: None, api: Kube, namespace: str, tmp_path: Path, monkeypatch: Any
) -> None:
    docs = [
        d
        for d in namespaced_install(cluster, namespace, tmp_path)
        if d["kind"]
        in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    ]
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
    operator_kubeconfig = str(_operator_kubeconfig(cluster, api, tmp_path, namespace))
    monkeypatch.setenv("KUBECONFIG", operator_kubeconfig)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", operator_kubeconfig)
    args = ["run", "--standalone", "--namespace", namespace, "-m", "kvscale.handlers"]
    api.create(endpoint(namespace))
    with KopfRunner(args, timeout=60) as runner:
        wait_available(api, namespace, ready=1)
    denied = f'User "system:serviceaccount:{namespace}:kvscale-operator" cannot'
    assert denied not in runner.output, runner.output
