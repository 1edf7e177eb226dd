"""spec.podTemplate: merged into the engine Deployment as server-side apply merges, and refused
where it would break the operator's contract."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from kvscale.api import pod_template as pt
from kvscale.children import engine, router
from kvscale.children.overrides import keyed
from kvscale_cluster.specs import HOST_PATH_MODEL, llm_spec

JSON = dict[str, Any]
OWNER = engine.Owner("chat", "team-a", "uid-1")

TEMPLATE: JSON = {
    "labels": {"sidecar.istio.io/inject": "false", "cost-center": "ml"},
    "annotations": {"example.com/owner": "team-a"},
    "imagePullSecrets": [{"name": "registry"}],
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    ],
    "nodeSelector": {"topology.kubernetes.io/zone": "eu-1a"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
                ]
            }
        }
    },
    "priorityClassName": "llm-high",
    "runtimeClassName": "nvidia",
    "env": [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "OMP_NUM_THREADS", "value": "8"},
    ],
    "envFrom": [{"configMapRef": {"name": "engine-env"}}],
    "resources": {"limits": {"cpu": "8", "ephemeral-storage": "20Gi"}},
    "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}}],
    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
}


def deployment(template: JSON | None = TEMPLATE, **spec: Any) -> JSON:
    extra = {"podTemplate": template} if template is not None else {}
    return engine.engine_deployment(OWNER, llm_spec(model=HOST_PATH_MODEL, **extra, **spec), 1)


def test_without_a_template_nothing_changes() -> None:
    plain = llm_spec(model=HOST_PATH_MODEL)
    assert deployment(None) == engine.engine_deployment(OWNER, plain, 1)
    empty = deployment({})
    assert empty == engine.engine_deployment(OWNER, plain, 1)


def test_the_template_is_merged_into_the_engine_pods() -> None:
    plain = deployment(None)["spec"]["template"]
    merged = deployment()
    tpl = merged["spec"]["template"]
    meta, pod = tpl["metadata"], tpl["spec"]
    assert plain["metadata"]["labels"].items() < meta["labels"].items()
    assert meta["labels"]["cost-center"] == "ml"
    assert meta["annotations"]["example.com/owner"] == "team-a"
    assert meta["annotations"]["prometheus.io/scrape"] == "true"  # the operator's stay
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert pod["tolerations"] == [gpu, TEMPLATE["tolerations"][0]]
    assert pod["nodeSelector"] == {"topology.kubernetes.io/zone": "eu-1a"}
    assert pod["affinity"] == TEMPLATE["affinity"]
    assert pod["priorityClassName"] == "llm-high" and pod["runtimeClassName"] == "nvidia"
    assert [v["name"] for v in pod["volumes"]] == ["tmp", "model", "cache"]
    c = pod["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["HOME"] == {"name": "HOME", "value": "/tmp"}  # the operator's stays
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert c["envFrom"] == [{"configMapRef": {"name": "engine-env"}}]
    # a resource of the same name replaces the operator's; others are added
    assert c["resources"]["limits"] == {
        "cpu": "8",
        "memory": "8Gi",
        "nvidia.com/gpu": "1",
        "ephemeral-storage": "20Gi",
    }
    assert c["resources"]["requests"]["cpu"] == "2"
    assert c["volumeMounts"][-1] == {"name": "cache", "mountPath": "/cache"}
    # what the contract rests on is untouched
    for key in ("ports", "args", "readinessProbe", "livenessProbe", "startupProbe", "image"):
        assert c[key] == plain["spec"]["containers"][0][key]
    assert tpl["metadata"]["labels"].items() >= engine.selector_labels("chat").items()


def test_a_template_variable_replaces_the_operators_of_the_same_name() -> None:
    cpu_vllm = {"kind": "vllm"}
    c = deployment(
        {"env": [{"name": "OMP_NUM_THREADS", "value": "16"}]},
        engine=cpu_vllm,
        resources={"gpusPerReplica": 0},
    )["spec"]["template"]["spec"]["containers"][0]
    names = [e["name"] for e in c["env"]]
    assert names.count("OMP_NUM_THREADS") == 1
    assert {"name": "OMP_NUM_THREADS", "value": "16"} in c["env"]


def test_keyed_merges_like_a_list_map() -> None:
    mine = [{"name": "a", "v": 1}, {"name": "b", "v": 2}]
    theirs = [{"name": "c", "v": 3}, {"name": "a", "v": 9}]
    assert keyed(mine, theirs) == [
        {"name": "a", "v": 9},
        {"name": "b", "v": 2},
        {"name": "c", "v": 3},
    ]


def test_router_pods_get_the_pull_secrets_only() -> None:
    spec = llm_spec(model=HOST_PATH_MODEL, podTemplate=TEMPLATE)
    pod = router.router_deployment(OWNER, spec)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert "priorityClassName" not in pod and "tolerations" not in pod


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ({"labels": {"kvscale.io/endpoint": "other"}}, pt.LABELS_MESSAGE),
        ({"labels": {"app.kubernetes.io/name": "x"}}, pt.LABELS_MESSAGE),
        ({"labels": {"bad key!": "x"}}, pt.KEY_MESSAGE),
        ({"annotations": {"kvscale.io/model": "x"}}, pt.ANNOTATIONS_MESSAGE),
        (
            {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "9"}},
            pt.ANNOTATIONS_MESSAGE,
        ),
        ({"nodeSelector": {"nvidia.com/gpu.product": "H100"}}, pt.NODE_SELECTOR_MESSAGE),
        ({"resources": {"limits": {"nvidia.com/gpu": 2}}}, pt.GPU_RESOURCE_MESSAGE),
        ({"volumes": [{"name": "tmp", "emptyDir": {}}]}, pt.VOLUME_NAME_MESSAGE),
        (
            {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "y", "mountPath": "/y"}],
            },
            pt.MOUNT_VOLUME_MESSAGE,
        ),
        (
            {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/models/x"}],
            },
            pt.MOUNT_PATH_MESSAGE,
        ),
        ({"volumes": [{"name": "x"}]}, "exactly one of emptyDir"),
        (
            {"volumes": [{"name": "x", "hostPath": {"path": "/etc"}}]},
            "Extra inputs are not permitted",
        ),
        ({"env": [{"name": "A", "value": "1", "valueFrom": {}}]}, "valueFrom"),
        ({"envFrom": [{"prefix": "X"}]}, "exactly one of secretRef or configMapRef"),
        ({"ports": [{"containerPort": 9000}]}, "Extra inputs are not permitted"),
        ({"readinessProbe": {}}, "Extra inputs are not permitted"),
        ({"args": ["--port", "1"]}, "Extra inputs are not permitted"),
    ],
)
def test_what_would_break_the_contract_is_refused(template: JSON, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        pt.PodTemplate.model_validate(template)
