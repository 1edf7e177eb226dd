"""Rendering of the router's children: deterministic, owned, least-privilege and wired up."""

from __future__ import annotations

import json
from typing import Any

from kvscale import __version__
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
