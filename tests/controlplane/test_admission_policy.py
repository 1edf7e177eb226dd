"""manifests/base/admission.yaml, enforced by the real API server: an endpoint may mount a node
directory only under the prefixes the cluster allows, and use only allowed images when a list is
set; the refusal says what to do."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from endpoint_helpers import ROOT

from kvscale.kube import Kube, KubeError
from kvscale_cluster.fixtures import kubectl, wait_for
from kvscale_cluster.specs import endpoint_body

POLICY = "kvscale-llmendpoint-sources"
CONFIG = ("kvscale-system", "kvscale-admission")
KINDS = ("Namespace", "ConfigMap", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

Configure = Callable[..., None]


def with_source(namespace: str, path: str, image: str | None = None) -> dict[str, Any]:
    engine = {"image": image} if image else {}
    model = {"name": "m", "source": {"hostPath": {"path": path}}}
    return endpoint_body("probe", namespace, model=model, engine=engine)


def refusal(api: Kube, body: dict[str, Any]) -> str | None:
    """The API server's refusal of a create (a dry run: nothing is stored), or None."""
    path = f"/apis/kvscale.io/v1alpha1/namespaces/{body['metadata']['namespace']}/llmendpoints"
    try:
        api.request("POST", path, body, [("dryRun", "All")])
    except KubeError as err:
        assert err.status == 403, err.message
        return err.message
    return None


@pytest.fixture(scope="module")
def installed(cluster: Any, api: Kube, crd: None) -> Iterator[dict[str, Any]]:
    """The policy, its binding and its ConfigMap from manifests/, installed once for the module
    and removed after it (other tests mount any host path); yields the ConfigMap as rendered.

    Once per module, not per test: after the policy and its binding were deleted and created
    again, the API server once never saw the next change to the ConfigMap (120 s without
    `/models` allowed), so the tests change only the ConfigMap's data between them."""
    rendered = kubectl(cluster, "kustomize", str(ROOT / "manifests")).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d["kind"] in KINDS]
    assert {d["kind"] for d in docs} == set(KINDS)
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
    try:
        probe = with_source("default", "/")
        wait_for(lambda: refusal(api, probe) is not None, timeout=120, what="the policy in force")
        yield next(d for d in docs if d["kind"] == "ConfigMap")
    finally:
        kubectl(cluster, "delete", "validatingadmissionpolicybinding", POLICY, "--ignore-not-found")
        kubectl(cluster, "delete", "validatingadmissionpolicy", POLICY, "--ignore-not-found")
        kubectl(cluster, "-n", CONFIG[0], "delete", "configmap", CONFIG[1], "--ignore-not-found")
        # the API server's policy cache lags the deletes: until it lets a host path through, the
        # binding still holds, and without its ConfigMap it denies every endpoint (the next
        # test's create failed so once, "no params found for policy binding with `Deny`")
        probe = with_source("default", "/")
        wait_for(lambda: refusal(api, probe) is None, timeout=120, what="the policy out of force")


@pytest.fixture
def configure(cluster: Any, api: Kube, installed: dict[str, Any]) -> Configure:
    """The ConfigMap's data as manifests/ ship it, in force; `configure(**data)` then sets it."""
    kubectl(cluster, "replace", "-f", "-", stdin=yaml.safe_dump(installed))
    probe = with_source("default", "/")
    wait_for(
        lambda: "allows (none)" in (refusal(api, probe) or ""),
        timeout=120,
        what="the shipped ConfigMap in force (no host path allowed)",
    )

    def apply_data(**data: str) -> None:
        patch = json.dumps({"data": data})
        kubectl(cluster, "-n", CONFIG[0], "patch", "configmap", CONFIG[1], "-p", patch)

    return apply_data


def test_by_default_no_host_path_is_accepted(
    api: Kube, namespace: str, configure: Configure
) -> None:
    message = refusal(api, with_source(namespace, "/etc/kubernetes"))
    assert message is not None
    assert (
        "spec.model.source.hostPath.path /etc/kubernetes is not under a host path this cluster "
        "allows (none): use a pvc source, or ask a cluster admin to add its directory to "
        "allowedHostPathPrefixes in ConfigMap kvscale-system/kvscale-admission"
    ) in message, message
    assert refusal(api, endpoint_body("dummy", namespace)) is None  # no host path: any endpoint


def test_host_paths_under_an_allowed_prefix_and_allowed_images_are_accepted(
    api: Kube, namespace: str, configure: Configure
) -> None:
    configure(allowedHostPathPrefixes="/models, /mnt/llm/", allowedImagePrefixes="reg.example/llm/")
    inside = with_source(namespace, "/models/llama")
    wait_for(lambda: refusal(api, inside) is None, timeout=120, what="/models allowed")
    assert refusal(api, with_source(namespace, "/models")) is None
    assert refusal(api, with_source(namespace, "/mnt/llm/a/b")) is None
    for outside in ("/etc/kubernetes", "/modelsX/llama", "/", "/mnt/llmx"):
        message = refusal(api, with_source(namespace, outside))
        assert message is not None and "(/models/, /mnt/llm/)" in message, (outside, message)
    assert refusal(api, with_source(namespace, "/models/a", "reg.example/llm/engine:1")) is None
    message = refusal(api, with_source(namespace, "/models/a", "evil.example/x:1"))
    assert message is not None
    assert (
        "spec.engine.image evil.example/x:1 is not from a registry this cluster allows" in message
    )

    # an endpoint admitted before its prefix was removed is still managed (metadata writes
    # pass), but its spec cannot change until it moves to an allowed source
    created = api.create(inside)
    configure(allowedHostPathPrefixes="/mnt/llm")
    path = f"/apis/kvscale.io/v1alpha1/namespaces/{namespace}/llmendpoints/probe"

    def spec_refused() -> bool:
        try:
            api.request("PATCH", path, {"spec": {"scaling": {"maxReplicas": 3}}}, None,
                        "application/merge-patch+json")  # fmt: skip
        except KubeError as err:
            return "/models/llama is not under a host path" in err.message
        return False

    wait_for(spec_refused, timeout=120, what="a spec change refused once /models is removed")
    annotated = api.request(
        "PATCH", path, {"metadata": {"annotations": {"a": "b"}}}, None,
        "application/merge-patch+json",
    )  # fmt: skip
    assert annotated is not None
    assert annotated["metadata"]["generation"] == created["metadata"]["generation"]


def test_the_binding_reads_the_config_map_of_the_install_namespace(
    cluster: Any, tmp_path: Path
) -> None:
    """A user's kustomization over the namespaced overlay moves the ConfigMap, and the binding's
    paramRef follows it."""
    overlay = os.path.relpath(ROOT / "manifests" / "overlays" / "namespaced", tmp_path)
    kustomization = {"namespace": "team-a", "resources": [overlay]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    docs = list(yaml.safe_load_all(kubectl(cluster, "kustomize", str(tmp_path)).stdout))
    config = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIG[1]]
    assert config[0]["metadata"]["namespace"] == "team-a"
    binding = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding[0]["spec"]["paramRef"] == {
        "name": CONFIG[1],
        "namespace": "team-a",
        "parameterNotFoundAction": "Deny",
    }
