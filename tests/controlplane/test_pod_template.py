"""spec.podTemplate on the real API server: `kubectl explain` shows what may be set, what would
break the operator's contract is refused at admission with a readable message, and the operator
merges the rest into the engine and router Deployments, whose pods then serve."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from endpoint_helpers import deployment, endpoint, wait_available
from kopf.testing import KopfRunner
from test_api_conventions import explain

from kvscale.api import pod_template as pt
from kvscale.kube import Kube, KubeError
from kvscale_cluster.specs import endpoint_body

VALID: dict[str, Any] = endpoint_body("probe")
MOUNTED = {"volumes": [{"name": "cache", "emptyDir": {}}]}

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("selector-label", {"labels": {"kvscale.io/endpoint": "other"}}, pt.LABELS_MESSAGE),
    ("name-label", {"labels": {"app.kubernetes.io/instance": "x"}}, pt.LABELS_MESSAGE),
    ("bad-label-key", {"labels": {"a b": "x"}}, pt.KEY_MESSAGE),
    ("bad-label-value", {"labels": {"team": "a b"}}, "spec.podTemplate.labels.team"),
    (
        "deletion-cost",
        {"annotations": {pt.OPERATOR_ANNOTATION_PREFIXES[1]: "1"}},
        "pod-deletion-cost",
    ),
    (
        "gpu-node-label",
        {"nodeSelector": {"nvidia.com/gpu.product": "H100"}},
        "use resources.gpuType",
    ),
    ("gpu-resource", {"resources": {"requests": {"nvidia.com/gpu": 1}}}, pt.GPU_RESOURCE_MESSAGE),
    (
        "bad-quantity",
        {"resources": {"limits": {"cpu": "lots"}}},
        "spec.podTemplate.resources.limits.cpu",
    ),
    ("operator-volume", {"volumes": [{"name": "model", "emptyDir": {}}]}, pt.VOLUME_NAME_MESSAGE),
    (
        "two-sources",
        {"volumes": [{"name": "x", "emptyDir": {}, "secret": {"secretName": "s"}}]},
        "exactly one of emptyDir",
    ),
    (
        "host-path-volume",
        {"volumes": [{"name": "x", "hostPath": {"path": "/etc"}}]},
        'unknown field "spec.podTemplate.volumes[0].hostPath"',
    ),
    (
        "mount-unknown-volume",
        {**MOUNTED, "volumeMounts": [{"name": "nope", "mountPath": "/c"}]},
        pt.MOUNT_VOLUME_MESSAGE,
    ),
    (
        "mount-over-tmp",
        {**MOUNTED, "volumeMounts": [{"name": "cache", "mountPath": "/tmp"}]},
        pt.MOUNT_PATH_MESSAGE,
    ),
    (
        "mount-dot-dot",
        {**MOUNTED, "volumeMounts": [{"name": "cache", "mountPath": "/a/../models"}]},
        "'..' path segments",
    ),
    (
        "env-value-and-from",
        {
            "env": [
                {
                    "name": "A",
                    "value": "1",
                    "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
                }
            ]
        },
        "env sets value or valueFrom, not both",
    ),
    (
        "env-from-nothing",
        {"envFrom": [{"prefix": "X_"}]},
        "exactly one of secretRef or configMapRef",
    ),
    ("ports", {"ports": [{"containerPort": 9000}]}, 'unknown field "spec.podTemplate.ports"'),
    (
        "probe",
        {"readinessProbe": {"exec": {"command": ["true"]}}},
        'unknown field "spec.podTemplate.readinessProbe"',
    ),
    ("args", {"args": ["--port", "9000"]}, 'unknown field "spec.podTemplate.args"'),
    ("command", {"command": ["sh"]}, 'unknown field "spec.podTemplate.command"'),
]


@pytest.mark.parametrize(("case", "template", "phrase"), REFUSED, ids=[c for c, _, _ in REFUSED])
def test_a_template_that_would_break_the_contract_is_refused(
    api: Kube, crd: None, namespace: str, case: str, template: dict[str, Any], phrase: str
) -> None:
    obj = copy.deepcopy(VALID)
    obj["metadata"] = {"name": case, "namespace": namespace}
    obj["spec"]["podTemplate"] = template
    with pytest.raises(KubeError) as refused:
        api.create(obj, strict=True)
    assert refused.value.status in (400, 422), refused.value.message
    assert phrase in refused.value.message, refused.value.message


def test_kubectl_explain_shows_what_may_be_set(cluster: Any, crd: None) -> None:
    out = explain(cluster, "llme.spec.podTemplate")
    fields = {line.split()[0] for line in out.splitlines() if "\t<" in line}
    assert fields == {
        "imagePullSecrets",
        "tolerations",
        "nodeSelector",
        "affinity",
        "env",
        "envFrom",
        "labels",
        "annotations",
        "priorityClassName",
        "runtimeClassName",
        "resources",
        "volumes",
        "volumeMounts",
    }, out
    assert "Ports, probes, the command and the managed flags cannot be set" in " ".join(out.split())
    env = explain(cluster, "llme.spec.podTemplate.env.valueFrom")
    assert "A key of a Secret (e.g. an HF_TOKEN)" in " ".join(env.split()), env


TEMPLATE: dict[str, Any] = {
    "labels": {"cost-center": "ml"},
    "annotations": {"example.com/owner": "team-a"},
    "imagePullSecrets": [{"name": "registry"}],
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {
                        "matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]
                    },
                }
            ]
        }
    },
    "env": [
        {"name": "TEAM", "value": "a"},
        {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token", "optional": True}},
        },
    ],
    "resources": {"limits": {"cpu": "1"}},
    "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}],
    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
}


def test_the_operator_merges_the_template_and_the_pods_serve(
    api: Kube, namespace: str, operator: KopfRunner
) -> None:
    api.create(endpoint(namespace, podTemplate=TEMPLATE))
    wait_available(api, namespace, ready=1)
    dep = deployment(api, namespace)
    assert dep is not None
    tpl = dep["spec"]["template"]
    pod, c = tpl["spec"], tpl["spec"]["containers"][0]
    assert tpl["metadata"]["labels"]["cost-center"] == "ml"
    assert tpl["metadata"]["labels"]["kvscale.io/endpoint"] == "chat"
    assert tpl["metadata"]["annotations"]["example.com/owner"] == "team-a"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["affinity"] == TEMPLATE["affinity"]
    env = {e["name"]: e for e in c["env"]}
    assert env["TEAM"]["value"] == "a" and env["HOME"]["value"] == "/tmp"
    assert c["resources"]["limits"]["cpu"] == "1" and c["resources"]["requests"]["cpu"] == "100m"
    assert {"name": "cache", "mountPath": "/cache"} in c["volumeMounts"]
    router = api.get("apps/v1", "Deployment", namespace, "chat-router")
    assert router is not None
    assert router["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    pods = api.list_pods(namespace, "kvscale.io/endpoint=chat,kvscale.io/role=engine")
    assert all(p["metadata"]["labels"]["cost-center"] == "ml" for p in pods)
