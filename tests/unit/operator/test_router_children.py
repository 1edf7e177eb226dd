"""Rendering of the router's children: deterministic, owned, least-privilege and wired up."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from kvscale import __version__
from kvscale.api.router import NODE_SELECTOR_KEY_MESSAGE, RouterSpec
from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.children import engine, router
from kvscale_cluster import images
from kvscale_cluster.specs import HOST_PATH_MODEL, llm_spec

OWNER = engine.Owner("chat", "team-a", "uid-1")


def spec(**extra: Any) -> LLMEndpointSpec:
    return llm_spec(model=HOST_PATH_MODEL, **extra)


def by_kind(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objs}


def test_render_is_deterministic_owned_and_labelled() -> None:
    objs = router.render_router(OWNER, spec())
    assert objs == router.render_router(OWNER, spec())
    assert [o["kind"] for o in objs] == [
        "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Deployment",
    ]  # fmt: skip
    for obj in objs:
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [OWNER.reference()]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "kvscale"
        assert meta["labels"]["kvscale.io/endpoint"] == "chat"
        assert meta["labels"]["kvscale.io/role"] == "router"


def test_names_follow_the_contract() -> None:
    objs = by_kind(router.render_router(OWNER, spec()))
    assert objs["Service"]["metadata"]["name"] == "chat"
    assert objs["ConfigMap"]["metadata"]["name"] == "chat-routing"
    assert "data" not in objs["ConfigMap"]  # the routing loop owns weights.json
    for kind in ("ServiceAccount", "Role", "RoleBinding", "Deployment"):
        assert objs[kind]["metadata"]["name"] == "chat-router"
    # never clashes with the engine's children
    engines = {o["metadata"]["name"] for o in engine.render(OWNER, spec(), 1)}
    assert engines.isdisjoint({"chat", "chat-routing", "chat-router"})


def test_client_url_is_the_router_service_on_its_port() -> None:
    service = by_kind(router.render_router(OWNER, spec()))["Service"]
    port = service["spec"]["ports"][0]["port"]
    assert router.client_url(OWNER) == f"http://chat.team-a.svc:{port}/v1"


def test_rbac_reads_only_what_the_router_watches() -> None:
    objs = by_kind(router.render_router(OWNER, spec()))
    rules = objs["Role"]["rules"]
    assert all(r["verbs"] == ["get", "list", "watch"] for r in rules)
    assert {(r["apiGroups"][0], r["resources"][0]) for r in rules} == {
        ("", "pods"), ("discovery.k8s.io", "endpointslices"), ("", "configmaps"),
    }  # fmt: skip
    configmaps = next(r for r in rules if r["resources"] == ["configmaps"])
    assert configmaps["resourceNames"] == ["chat-routing"]
    binding = objs["RoleBinding"]
    assert binding["roleRef"]["name"] == "chat-router"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "chat-router", "namespace": "team-a"}
    ]


def test_service_sends_the_endpoint_port_to_the_routers() -> None:
    objs = by_kind(router.render_router(OWNER, spec()))
    service, dep = objs["Service"], objs["Deployment"]
    assert service["spec"]["ports"][0]["port"] == 8000
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    pod = dep["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert service["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    engine_selector = engine.selector_labels("chat")
    assert service["spec"]["selector"] != engine_selector  # clients reach routers, not engines


def test_router_runs_the_router_image_whatever_the_engine_runs() -> None:
    dep = router.router_deployment(OWNER, spec(engine={"image": "kvscale/engine:0.2"}))
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    # this version's router image (`make image` builds it), not the pinned engine image
    assert c["image"] == f"kvscale/router:{__version__}" and c["command"] == ["kvscale-router"]
    assert images.container_argv(c)[0].endswith("kvscale-router")  # runs on the local cluster
    without_command = {k: v for k, v in c.items() if k != "command"}  # the image's entry point
    assert images.container_argv(without_command)[0].endswith("kvscale-router")
    args = c["args"]
    assert args[args.index("--endpoint") + 1] == "chat"
    assert args[args.index("--namespace") + 1] == "team-a"
    assert args[args.index("--block-size") + 1] == "16"
    assert pod["serviceAccountName"] == "chat-router"
    assert pod["automountServiceAccountToken"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    # the kubelet's SIGKILL comes after the shutdown grace and the drain, not during them
    stopping = float(args[args.index("--shutdown-grace-seconds") + 1])
    stopping += float(args[args.index("--drain-seconds") + 1])
    assert pod["terminationGracePeriodSeconds"] > stopping
    vllm = router.router_deployment(
        OWNER, spec(engine={"image": "vllm/vllm-openai:v0.6", "kind": "vllm"})
    )
    routed = vllm["spec"]["template"]["spec"]["containers"][0]
    # a vLLM endpoint gets the same router
    assert (routed["image"], routed["command"]) == (c["image"], c["command"])


def test_two_routers_once_the_endpoint_may_have_two_replicas() -> None:
    one = spec(scaling={"minReplicas": 1, "maxReplicas": 1})
    many = spec(scaling={"minReplicas": 1, "maxReplicas": 4})
    assert router.router_deployment(OWNER, one)["spec"]["replicas"] == 1
    assert router.router_deployment(OWNER, many)["spec"]["replicas"] == 2


def test_traffic_classes_reach_the_router() -> None:
    classes = [{"name": "interactive", "priority": 10, "maxQueueWaitSeconds": 2}]
    args = router.router_args(OWNER, spec(trafficClasses=classes))
    assert '"name":"interactive"' in args[args.index("--traffic-classes") + 1]
    assert "--traffic-classes" not in router.router_args(OWNER, spec())


def test_a_deferrable_class_reaches_the_router_with_its_deadline() -> None:
    classes = [{"name": "chat"}, {"name": "batch", "deadlineSeconds": 3600}]
    args = router.router_args(OWNER, spec(trafficClasses=classes))
    assert json.loads(args[args.index("--traffic-classes") + 1]) == [
        {"name": "chat", "priority": 0, "maxQueueWaitSeconds": 30.0},
        {"name": "batch", "priority": 0, "maxQueueWaitSeconds": 3600, "deadlineSeconds": 3600},
    ]


CPU_POOL = {"cloud.example.com/pool": "cpu"}
CPU_TAINT = {"key": "dedicated", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}


def router_pod(s: LLMEndpointSpec) -> dict[str, Any]:
    return router.router_deployment(OWNER, s)["spec"]["template"]["spec"]


def test_spec_router_places_the_router_pods_and_not_the_engines() -> None:
    placed = spec(router={"nodeSelector": CPU_POOL, "tolerations": [CPU_TAINT]})
    pod = router_pod(placed)
    assert pod["nodeSelector"] == CPU_POOL
    assert pod["tolerations"] == [CPU_TAINT]
    assert pod["affinity"] == router_pod(spec())["affinity"]  # the routers still spread
    engine_pod = engine.engine_deployment(OWNER, placed, 1)["spec"]["template"]["spec"]
    assert engine_pod == engine.engine_deployment(OWNER, spec(), 1)["spec"]["template"]["spec"]
    assert CPU_TAINT not in engine_pod.get("tolerations", [])
    assert "cloud.example.com/pool" not in engine_pod.get("nodeSelector", {})


def test_a_gpu_node_label_may_place_the_routers() -> None:
    # only podTemplate.nodeSelector must leave nvidia.com/gpu.product to resources.gpuType
    pod = router_pod(spec(router={"nodeSelector": {"nvidia.com/gpu.product": "none"}}))
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "none"}


def test_podtemplate_placement_does_not_reach_the_routers() -> None:
    template = {"nodeSelector": {"pool": "gpu"}, "tolerations": [CPU_TAINT]}
    pod = router_pod(spec(podTemplate=template, router={"nodeSelector": CPU_POOL}))
    assert pod["nodeSelector"] == CPU_POOL and "tolerations" not in pod


def test_without_spec_router_the_router_pods_are_unplaced() -> None:
    pod = router_pod(spec())
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert router_pod(spec(router={})) == pod
    assert router_pod(spec(router={"nodeSelector": {}, "tolerations": []})) == pod


@pytest.mark.parametrize(
    ("router_spec", "message"),
    [
        ({"nodeSelector": {"bad key!": "cpu"}}, NODE_SELECTOR_KEY_MESSAGE),
        ({"nodeSelector": {"-pool": "cpu"}}, NODE_SELECTOR_KEY_MESSAGE),
        ({"nodeSelector": {"pool": "a b"}}, "String should match pattern"),
        ({"nodeSelector": {f"k{i}": "v" for i in range(17)}}, "at most 16 items"),
        ({"tolerations": [CPU_TAINT] * 17}, "at most 16 items"),
        ({"tolerations": [{"operator": "Maybe"}]}, "'Exists' or 'Equal'"),
        ({"replicas": 3}, "Extra inputs are not permitted"),
        ({"affinity": {}}, "Extra inputs are not permitted"),
    ],
)
def test_a_bad_router_spec_is_refused(router_spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        RouterSpec.model_validate(router_spec)
    with pytest.raises(ValidationError, match=re.escape(message)):
        spec(router=router_spec)


def test_the_router_key_message_names_the_field_and_the_form() -> None:
    assert NODE_SELECTOR_KEY_MESSAGE.startswith("router.nodeSelector keys must be qualified names")
    assert "example.com/team" in NODE_SELECTOR_KEY_MESSAGE
