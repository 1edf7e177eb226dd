"""The real API server refuses malformed LLMEndpoints at admission, with a readable reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvscale.api.router import NODE_SELECTOR_KEY_MESSAGE
from kvscale.kube import Kube, KubeError
from kvscale_cluster.specs import endpoint_body

VALID: dict[str, Any] = endpoint_body("probe")


def with_spec(**changes: Any) -> dict[str, Any]:
    obj = copy.deepcopy(VALID)
    for path, value in changes.items():
        node = obj
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return obj


DELETE = object()

# (case id, the object, a phrase the refusal must contain)
MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("negative-min-replicas", with_spec(spec__scaling={"minReplicas": -1}), "minReplicas"),
    ("zero-max-replicas", with_spec(spec__scaling={"maxReplicas": 0}), "maxReplicas"),
    (
        "swapped-replica-bounds",
        with_spec(spec__scaling={"minReplicas": 5, "maxReplicas": 2}),
        "minReplicas must not exceed scaling.maxReplicas",
    ),
    ("negative-pinned-replicas", with_spec(spec__replicas=-2), "spec.replicas"),
    (
        "pinned-above-max",
        with_spec(spec__replicas=9, spec__scaling={"maxReplicas": 4}),
        "spec.replicas must not exceed scaling.maxReplicas",
    ),
    (
        "scale-to-zero-without-min-zero",
        with_spec(spec__scaling={"minReplicas": 1, "scaleToZeroAfterSeconds": 300}),
        "scaleToZeroAfterSeconds needs scaling.minReplicas: 0",
    ),
    (
        "unknown-engine-kind",
        with_spec(spec__engine={"kind": "tgi"}),
        'supported values: "kvscale", "vllm"',
    ),
    ("bad-block-size", with_spec(spec__engine={"blockSize": 12}), "blockSize"),
    ("zero-memory-fraction", with_spec(spec__engine={"memoryFraction": 0}), "memoryFraction"),
    (
        "memory-fraction-above-one",
        with_spec(spec__engine={"memoryFraction": 1.5}),
        "memoryFraction",
    ),
    ("zero-max-num-seqs", with_spec(spec__engine={"maxNumSeqs": 0}), "maxNumSeqs"),
    (
        "token-budget-below-seqs",
        with_spec(spec__engine={"maxNumSeqs": 512, "maxNumBatchedTokens": 256}),
        "maxNumBatchedTokens must be at least engine.maxNumSeqs",
    ),
    ("empty-image", with_spec(spec__engine={"image": ""}), "image"),
    (
        "bad-cpu-quantity",
        with_spec(spec__resources={"cpu": "two"}),
        "must be a Kubernetes quantity",
    ),
    (
        "bad-memory-quantity",
        with_spec(spec__resources={"memory": "8 GB"}),
        "must be a Kubernetes quantity",
    ),
    ("negative-gpus", with_spec(spec__resources={"gpusPerReplica": -1}), "gpusPerReplica"),
    ("too-many-gpus", with_spec(spec__resources={"gpusPerReplica": 64}), "gpusPerReplica"),
    ("empty-model-name", with_spec(spec__model__name=""), "spec.model.name"),
    ("missing-model", with_spec(spec__model=DELETE), "spec.model: Required value"),
    (
        "missing-model-source",
        with_spec(spec__model__source=DELETE),
        "spec.model.source: Required value",
    ),
    (
        "two-model-sources",
        with_spec(spec__model__source={"dummy": {}, "hostPath": {"path": "/m"}}),
        "exactly one of hostPath, pvc, dummy or huggingface",
    ),
    (
        "no-model-source",
        with_spec(spec__model__source={}),
        "exactly one of hostPath, pvc, dummy or huggingface",
    ),
    (
        "relative-host-path",
        with_spec(spec__model__source={"hostPath": {"path": "models/llama"}}),
        "spec.model.source.hostPath.path",
    ),
    (
        "unknown-dummy-preset",
        with_spec(spec__model__source={"dummy": {"preset": "gpt2"}}),
        "spec.model.source.dummy.preset",
    ),
    ("tiny-context", with_spec(spec__model__maxModelLen=8), "maxModelLen"),
    ("zero-ttft-slo", with_spec(spec__slo={"ttftP99Seconds": 0}), "ttftP99Seconds"),
    ("negative-itl-slo", with_spec(spec__slo={"itlP99Seconds": -0.1}), "itlP99Seconds"),
    ("attainment-above-one", with_spec(spec__slo={"attainmentTarget": 1.2}), "attainmentTarget"),
    (
        "duplicate-traffic-classes",
        with_spec(spec__trafficClasses=[{"name": "chat"}, {"name": "chat"}]),
        "trafficClasses names must be unique",
    ),
    (
        "bad-class-name",
        with_spec(spec__trafficClasses=[{"name": "Chat_Class"}]),
        "spec.trafficClasses[0].name",
    ),
    (
        "zero-class-wait",
        with_spec(spec__trafficClasses=[{"name": "chat", "maxQueueWaitSeconds": 0}]),
        "maxQueueWaitSeconds",
    ),
    (
        "deferrable-wait-under-deadline",
        with_spec(
            spec__trafficClasses=[
                {"name": "batch", "deadlineSeconds": 3600, "maxQueueWaitSeconds": 60}
            ]
        ),
        "maxQueueWaitSeconds must be at least its deadlineSeconds",
    ),
    (
        "interactive-wait-of-an-hour-and-more",
        with_spec(spec__trafficClasses=[{"name": "chat", "maxQueueWaitSeconds": 7200}]),
        "needs a deferrable class",
    ),
    (
        "deadline-over-a-day",
        with_spec(spec__trafficClasses=[{"name": "batch", "deadlineSeconds": 90000}]),
        "deadlineSeconds",
    ),
    (
        "five-deferrable-classes",
        with_spec(
            spec__trafficClasses=[{"name": f"b{i}", "deadlineSeconds": 600} for i in range(5)]
        ),
        "at most 4 trafficClasses may set deadlineSeconds",
    ),
    (
        "prometheus-without-url",
        with_spec(spec__scaling={"signals": {"source": "prometheus"}}),
        "prometheusUrl is required when source is prometheus",
    ),
    (
        "bad-prometheus-url",
        with_spec(
            spec__scaling={"signals": {"source": "prometheus", "prometheusUrl": "prom:9090"}}
        ),
        "prometheusUrl",
    ),
    (
        "unknown-signal-source",
        with_spec(spec__scaling={"signals": {"source": "datadog"}}),
        "source",
    ),
    ("negative-headroom", with_spec(spec__scaling={"headroom": -0.1}), "headroom"),
    ("negative-price", with_spec(spec__cost={"gpuHourPrice": -1}), "gpuHourPrice"),
    ("bad-currency", with_spec(spec__cost={"currency": "dollars"}), "currency"),
    ("unknown-top-level-field", with_spec(spec__autoscale=True), 'unknown field "spec.autoscale"'),
    (
        "unknown-nested-field",
        with_spec(spec__engine={"gpus": 2}),
        'unknown field "spec.engine.gpus"',
    ),
    ("string-for-integer", with_spec(spec__scaling={"maxReplicas": "four"}), "maxReplicas"),
    ("missing-spec", with_spec(spec=DELETE), "spec: Required value"),
    (
        "host-path-traversal",
        with_spec(spec__model__source={"hostPath": {"path": "/models/../etc"}}),
        "spec.model.source.hostPath.path: Invalid value: \"/models/../etc\": must not contain '..'",
    ),
    (
        "sub-path-traversal",
        with_spec(spec__model__source={"pvc": {"claimName": "models", "subPath": "a/../../x"}}),
        "spec.model.source.pvc.subPath: Invalid value: \"a/../../x\": must not contain '..'",
    ),
    (
        "image-with-scheme",
        with_spec(spec__engine={"image": "https://ghcr.io/kvscale/engine:0.1.0"}),
        "no scheme, a lowercase repository",
    ),
    (
        "image-uppercase-repository",
        with_spec(spec__engine={"image": "ghcr.io/KVScale/engine"}),
        "no scheme, a lowercase repository",
    ),
    (
        "image-empty-tag",
        with_spec(spec__engine={"image": "kvscale/engine:"}),
        "must be an image reference",
    ),
    (
        "extra-args-override-port",
        with_spec(spec__engine={"extraArgs": ["--enforce-eager", "--port", "9000"]}),
        'spec.engine.extraArgs[1]: Invalid value: "--port": must not set a flag the operator',
    ),
    (
        "extra-args-override-model-inline",
        with_spec(spec__engine={"extraArgs": ["--model=/elsewhere"]}),
        "must not set a flag the operator manages",
    ),
    (
        "extra-args-served-name-underscore",
        with_spec(spec__engine={"extraArgs": ["--served_model_name", "x"]}),
        "must not set a flag the operator manages",
    ),
    (
        "extra-args-not-a-flag",
        with_spec(spec__engine={"extraArgs": ["---weird"]}),
        'spec.engine.extraArgs[0]: Invalid value: "---weird": must be a flag',
    ),
    (
        "negative-cpu-number",
        with_spec(spec__resources={"cpu": -2}),
        "spec.resources.cpu: Invalid value: -2: must be greater than zero",
    ),
    (
        "negative-memory",
        with_spec(spec__resources={"memory": "-1Gi"}),
        'spec.resources.memory: Invalid value: "-1Gi": must be greater than zero',
    ),
    (
        "gpu-type-without-gpus",
        with_spec(spec__resources={"gpusPerReplica": 0, "gpuType": "NVIDIA-A100"}),
        "gpuType needs resources.gpusPerReplica of at least 1",
    ),
    (
        "router-node-selector-bad-key",
        with_spec(spec__router={"nodeSelector": {"bad key!": "cpu"}}),
        NODE_SELECTOR_KEY_MESSAGE,
    ),
    (
        "prometheus-url-ftp",
        with_spec(
            spec__scaling={"signals": {"source": "prometheus", "prometheusUrl": "ftp://p:9090"}}
        ),
        'prometheusUrl: Invalid value: "ftp://p:9090": must be an http:// or https:// URL',
    ),
    *(
        (
            f"prometheus-url-link-local-{i}",
            with_spec(spec__scaling={"signals": {"source": "prometheus", "prometheusUrl": url}}),
            "must not point at a link-local address",
        )
        for i, url in enumerate(
            [
                "http://169.254.169.254/latest/meta-data",
                "http://[fe80::1]:9090",
                "http://[::ffff:169.254.169.254]/",
                "http://2852039166/",
            ]
        )
    ),
]


def test_the_table_is_large_enough() -> None:
    assert len(MALFORMED) >= 25
    assert len({case for case, _, _ in MALFORMED}) == len(MALFORMED)


@pytest.mark.parametrize(("case", "obj", "phrase"), MALFORMED, ids=[c for c, _, _ in MALFORMED])
def test_malformed_endpoint_is_refused(
    api: Kube, crd: None, namespace: str, case: str, obj: dict[str, Any], phrase: str
) -> None:
    obj = copy.deepcopy(obj)
    obj["metadata"] = {"name": case, "namespace": namespace}
    with pytest.raises(KubeError) as refused:
        api.create(obj, strict=True)
    assert refused.value.status in (400, 422), refused.value.message
    assert phrase in refused.value.message, refused.value.message
    assert api.get("kvscale.io/v1alpha1", "LLMEndpoint", namespace, case) is None


NAMES: list[tuple[str, str]] = [
    ("llama.v2", "must be a DNS label (lowercase letters, digits and '-', no dots)"),
    ("a" * 57, "must be at most 56 characters: the operator names the endpoint's Services"),
]


@pytest.mark.parametrize(("name", "phrase"), NAMES, ids=["dots", "too-long"])
def test_endpoint_names_that_cannot_name_children_are_refused(
    api: Kube, crd: None, namespace: str, name: str, phrase: str
) -> None:
    obj = copy.deepcopy(VALID)
    obj["metadata"] = {"name": name, "namespace": namespace}
    with pytest.raises(KubeError) as refused:
        api.create(obj, strict=True)
    assert refused.value.status == 422, refused.value.message
    assert phrase in refused.value.message, refused.value.message


# (case id, the object, where to look in the stored object, the value expected there)
ACCEPTED: list[tuple[str, dict[str, Any], tuple[str, ...], Any]] = [
    ("cpu-as-a-number", with_spec(spec__resources={"cpu": 4}), ("resources", "cpu"), 4),
    (
        "quantities-as-strings",
        with_spec(spec__resources={"cpu": "500m", "memory": "1.5Gi"}),
        ("resources", "memory"),
        "1.5Gi",
    ),
    (
        "pvc-name-with-dots",
        with_spec(spec__model__source={"pvc": {"claimName": "llama.v2.weights"}}),
        ("model", "source", "pvc", "claimName"),
        "llama.v2.weights",
    ),
    (
        "dots-within-path-names",
        with_spec(spec__model__source={"hostPath": {"path": "/models/..cache/v1..2"}}),
        ("model", "source", "hostPath", "path"),
        "/models/..cache/v1..2",
    ),
    (
        "image-registry-port-tag-digest",
        with_spec(
            spec__engine={"image": "registry.example.com:5000/team/engine:0.1.0@sha256:" + "c" * 64}
        ),
        ("engine", "image"),
        "registry.example.com:5000/team/engine:0.1.0@sha256:" + "c" * 64,
    ),
    (
        "unmanaged-extra-args",
        with_spec(spec__engine={"extraArgs": ["--enforce-eager", "--seed=7", "--swap", "-1"]}),
        ("engine", "extraArgs"),
        ["--enforce-eager", "--seed=7", "--swap", "-1"],
    ),
    (
        "router-on-a-cpu-pool",
        with_spec(
            spec__router={
                "nodeSelector": {"cloud.example.com/pool": "cpu", "nvidia.com/gpu.product": "x"},
                "tolerations": [{"key": "dedicated", "value": "cpu", "effect": "NoSchedule"}],
            }
        ),
        ("router",),
        {
            "nodeSelector": {"cloud.example.com/pool": "cpu", "nvidia.com/gpu.product": "x"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}
            ],
        },
    ),
    (
        "gpu-type-with-gpus",
        with_spec(spec__resources={"gpusPerReplica": 1, "gpuType": "NVIDIA-H100"}),
        ("resources", "gpuType"),
        "NVIDIA-H100",
    ),
    (
        "prometheus-in-cluster",
        with_spec(
            spec__scaling={
                "signals": {"source": "prometheus", "prometheusUrl": "http://prom.mon.svc:9090"}
            }
        ),
        ("scaling", "signals", "prometheusUrl"),
        "http://prom.mon.svc:9090",
    ),
    (
        "deferrable-class-without-a-queue-wait",
        with_spec(
            spec__trafficClasses=[{"name": "chat"}, {"name": "batch", "deadlineSeconds": 14400}]
        ),
        ("trafficClasses",),
        [
            {"name": "chat", "priority": 0},
            {"name": "batch", "priority": 0, "deadlineSeconds": 14400},
        ],
    ),
    # its longest Service name, <name>-engine, is exactly 63 characters
    ("longest-name", with_spec(metadata__name="n" * 56), ("model", "name"), "tiny"),
]


@pytest.mark.parametrize(
    ("case", "obj", "path", "expected"), ACCEPTED, ids=[c for c, *_ in ACCEPTED]
)
def test_well_formed_endpoint_is_accepted(
    api: Kube, crd: None, namespace: str, case: str, obj: dict[str, Any], path: Any, expected: Any
) -> None:
    obj = copy.deepcopy(obj)
    name = case if obj["metadata"]["name"] == "probe" else obj["metadata"]["name"]
    obj["metadata"] = {"name": name, "namespace": namespace}
    node = api.create(obj, strict=True)["spec"]
    for key in path:
        node = node[key]
    assert node == expected


def test_valid_endpoint_is_accepted_with_defaults(api: Kube, crd: None, namespace: str) -> None:
    obj = copy.deepcopy(VALID)
    obj["metadata"]["namespace"] = namespace
    created = api.create(obj, strict=True)
    spec = created["spec"]
    assert spec["engine"]["kind"] == "kvscale" and spec["engine"]["blockSize"] == 16
    assert spec["scaling"] == {
        "minReplicas": 1,
        "maxReplicas": 4,
        "capacityIntervalSeconds": 60,
        "routingIntervalSeconds": 3.0,
        "forecastHorizonSeconds": 300,
        "headroom": 0.2,
        "scaleDownStabilizationSeconds": 300,
        "signals": {"source": "direct"},
    }
    assert spec["model"]["maxModelLen"] == 4096
