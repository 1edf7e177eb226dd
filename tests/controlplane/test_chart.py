"""The Helm chart renders what kustomize renders, value for value.

charts/kvscale/ is generated from manifests/ (charts/generate.py; the unit tier checks that the
committed chart is its output). Here helm itself (built by e2e/helm/build.sh) lints it and renders
it: with default values the same objects as `kubectl kustomize manifests/` (less the Namespace,
which the release's namespace is), with rbac.scope=namespaced the namespaced overlay's, each
component's value the objects of that component, crds/ the CRD of manifests/crds/; the objects
are compared parsed, not as text. The rendering passes a server-side dry run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from endpoint_helpers import ROOT
from test_manifests import CRDS, NAMESPACE, dry_run, namespaced_install, rendered

from kvscale_cluster.binaries import helm_binary
from kvscale_cluster.fixtures import kubectl

CHART = ROOT / "charts" / "kvscale"
ALL_ON = ("monitors.enabled=true", "prometheusRule.enabled=true", "grafanaDashboard.enabled=true")
COMPONENTS = {
    "monitors.enabled": "servicemonitor",
    "prometheusRule.enabled": "prometheusrule",
    "grafanaDashboard.enabled": "grafana",
}

Objects = dict[tuple[str, str, str, str], dict[str, Any]]


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()  # fails, never skips, when helm is neither cached nor buildable


def run(helm: Path, *args: str) -> str:
    done = subprocess.run([str(helm), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def template(helm: Path, namespace: str = NAMESPACE, *sets: str, crds: bool = False) -> Objects:
    args = ["template", "kvscale", str(CHART), "--namespace", namespace]
    args += [a for s in sets for a in ("--set", s)] + (["--include-crds"] if crds else [])
    return by_key(yaml.safe_load_all(run(helm, *args)))


def by_key(docs: Any) -> Objects:
    found: Objects = {}
    for d in docs:
        if not d:
            continue
        meta = d["metadata"]
        found[(d["apiVersion"], d["kind"], meta.get("namespace", ""), meta["name"])] = d
    return found


def with_components(cluster: Any, tmp_path: Path, namespace: str, *components: str) -> Objects:
    """manifests/ plus components, from a user's kustomization that sets the namespace."""
    tmp_path.joinpath("kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": namespace,
                "resources": [os.path.relpath(ROOT / "manifests", tmp_path)],
                "components": [
                    os.path.relpath(ROOT / "manifests" / "components" / c, tmp_path)
                    for c in components
                ],
            }
        )
    )
    return by_key(rendered(cluster, tmp_path))


def test_chart_passes_helm_lint_with_every_value_on_and_off(helm: Path) -> None:
    assert "0 chart(s) failed" in run(helm, "lint", str(CHART))
    every = (*ALL_ON, "rbac.scope=namespaced", "createNamespace=true")
    sets = [a for s in every for a in ("--set", s)]
    assert "0 chart(s) failed" in run(helm, "lint", str(CHART), *sets)


def test_default_values_render_the_kustomize_install(cluster: Any, helm: Path) -> None:
    kustomized = by_key(rendered(cluster))
    namespace = [k for k in kustomized if k[1] == "Namespace"]
    assert len(namespace) == 1
    assert template(helm, NAMESPACE, "createNamespace=true") == kustomized
    del kustomized[namespace[0]]  # `helm install --create-namespace` makes it
    assert template(helm) == kustomized


def test_namespaced_scope_renders_the_namespaced_overlay(
    cluster: Any, helm: Path, tmp_path: Path
) -> None:
    overlay = by_key(namespaced_install(cluster, "team-a", tmp_path))
    assert template(helm, "team-a", "rbac.scope=namespaced") == overlay


def test_each_component_value_renders_its_component(
    cluster: Any, helm: Path, tmp_path: Path
) -> None:
    base = by_key(rendered(cluster))
    del base[next(k for k in base if k[1] == "Namespace")]
    for n, (value, component) in enumerate(COMPONENTS.items()):
        folder = tmp_path / str(n)
        folder.mkdir()
        expected = with_components(cluster, folder, NAMESPACE, component)
        del expected[next(k for k in expected if k[1] == "Namespace")]
        assert set(expected) > set(base), component
        assert template(helm, NAMESPACE, f"{value}=true") == expected, component


def test_crds_are_the_crd_kustomization(cluster: Any, helm: Path) -> None:
    crds = by_key(rendered(cluster, CRDS))
    with_crds = template(helm, crds=True)
    assert {k: v for k, v in with_crds.items() if k[1] == "CustomResourceDefinition"} == crds
    assert not [k for k in template(helm) if k[1] == "CustomResourceDefinition"]
    assert (CHART / "crds" / "llmendpoints.kvscale.io.yaml").exists()  # Helm keeps crds/


def test_values_set_images_resources_and_admission(helm: Path) -> None:
    objects = template(
        helm, "ops", "images.registry=registry.example.com/team", "images.operator.tag=9.9.9",
        "images.router.tag=1.2.3", "operator.resources.limits.memory=1Gi",
        "admission.allowedHostPathPrefixes=/models",
    )  # fmt: skip
    deployment = objects[("apps/v1", "Deployment", "ops", "kvscale-operator")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/team/kvscale/operator:9.9.9"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KVSCALE_DEFAULT_ROUTER_IMAGE"] == "registry.example.com/team/kvscale/router:1.2.3"
    assert env["KVSCALE_DEFAULT_ENGINE_IMAGE"].startswith(
        "registry.example.com/team/kvscale/engine:"
    )
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    config = objects[("v1", "ConfigMap", "ops", "kvscale-admission")]
    assert config["data"]["allowedHostPathPrefixes"] == "/models"
    own = template(
        helm, "ops", "images.registry=a.example", "images.operator.registry=b.example",
        "operator.imagePullSecrets[0].name=pull", "operator.priorityClassName=high",
    )  # fmt: skip
    pod = own[("apps/v1", "Deployment", "ops", "kvscale-operator")]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"].startswith("b.example/kvscale/operator:")
    assert pod["imagePullSecrets"] == [{"name": "pull"}] and pod["priorityClassName"] == "high"
    assert "imagePullSecrets" not in container and "nodeSelector" not in pod


def test_an_unknown_value_or_scope_is_refused(helm: Path) -> None:
    for wrong in ("monitor.enabled=true", "rbac.scope=everywhere"):
        args = [str(helm), "template", "kvscale", str(CHART), "--set", wrong]
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        assert done.returncode != 0, wrong
        assert "values don't meet the specifications of the schema" in done.stderr, done.stderr


def test_chart_rendering_passes_a_server_side_dry_run(cluster: Any, crd: None, helm: Path) -> None:
    docs = list(template(helm, NAMESPACE, "createNamespace=true", crds=True).values())
    namespace = [d for d in docs if d["kind"] == "Namespace"]
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(namespace))
    out = dry_run(cluster, docs).lower()
    for kind in ("customresourcedefinition", "clusterrole", "deployment", "validatingadmission"):
        assert kind in out, out
