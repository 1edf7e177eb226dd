"""An operator upgrade on the local cluster, as a platform team would roll one: kvscale installed
from `manifests/`, the operator's default engine and router images changed on its Deployment
(what a new operator version or `images:` in the kustomization does). The endpoint that pins no
image rolls onto the new defaults through its Deployments' rolling updates (one surge pod, none
unavailable, readiness-gated) with no failed request under load; the pinned endpoint's engine is
left alone, while its routers, which follow the default router image whatever the engine runs,
roll too.

The process kubelet maps an image to a local command by its repository, whatever its registry
and tag, so the new default runs the same local engine and the roll is real: new pods, old ones
drained and removed.
"""

from __future__ import annotations

from typing import Any

from scenario_helpers import OPERATOR_NAMESPACE, TimedLoad, is_ready, pods
from test_autoscale import API, MODEL, apply, endpoint, serving, status

from kvscale import __version__
from kvscale.api.images import ENGINE_ENV, ROUTER_ENV
from kvscale.kube import Kube
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for

OLD = f"kvscale/engine:{__version__}"  # the manifests' defaults
OLD_ROUTER = f"kvscale/router:{__version__}"
NEW = "registry.example.com/kvscale/engine:0.1.1"
NEW_ROUTER = "registry.example.com/kvscale/router:0.1.1"
ENGINES = "kvscale.io/endpoint=chat,kvscale.io/role=engine"


def image(dep: dict[str, Any] | None) -> str:
    assert dep is not None
    return str(dep["spec"]["template"]["spec"]["containers"][0]["image"])


def deployment(api: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    return api.get("apps/v1", "Deployment", namespace, name)


def rolled(api: Kube, namespace: str, name: str, replicas: int, new: str = NEW) -> bool:
    """The Deployment's new template (image `new`) is all that runs: every replica updated and
    ready."""
    dep = deployment(api, namespace, name) or {}
    st = dep.get("status", {})
    return (
        image(dep) == new
        and st.get("observedGeneration") == dep["metadata"]["generation"]
        and st.get("updatedReplicas") == replicas == st.get("readyReplicas")
        and st.get("replicas") == replicas
    )


def test_a_new_default_image_rolls_unpinned_endpoints_without_failures(
    cluster: Cluster, installed: None, api: Kube, namespace: str
) -> None:
    two = {"minReplicas": 2, "maxReplicas": 2}
    apply(cluster, namespace, endpoint(namespace, scaling=two))
    one = {"minReplicas": 1, "maxReplicas": 1}
    apply(cluster, namespace, endpoint(namespace, "pinned", engine={"image": OLD}, scaling=one))
    url = serving(api, namespace, ready=2)
    serving(api, namespace, ready=1, name="pinned")
    assert status(api, namespace)["images"] == {
        "engine": OLD,
        "router": OLD_ROUTER,
        "pinned": False,
    }
    assert status(api, namespace, "pinned")["images"]["pinned"] is True
    pinned_engine = deployment(api, namespace, "pinned-engine")
    assert pinned_engine is not None
    pinned_generation = pinned_engine["metadata"]["generation"]
    old_pods = {p["metadata"]["name"] for p in pods(api, namespace, ENGINES)}

    with TimedLoad(url, MODEL) as load:
        load.set_rate(1)
        wait_for(lambda: len(load.results) >= 3, timeout=60, what="load flowing")
        kubectl(cluster, "-n", OPERATOR_NAMESPACE, "set", "env", "deployment/kvscale-operator",
                f"{ENGINE_ENV}={NEW}", f"{ROUTER_ENV}={NEW_ROUTER}")  # fmt: skip
        kubectl(cluster, "-n", OPERATOR_NAMESPACE, "rollout", "status",
                "deployment/kvscale-operator", "--timeout=180s")  # fmt: skip
        wait_for(
            lambda: (
                rolled(api, namespace, "chat-engine", 2)
                and rolled(api, namespace, "chat-router", 2, NEW_ROUTER)
                and rolled(api, namespace, "pinned-router", 1, NEW_ROUTER)
            ),
            timeout=600,
            what="chat's engines and both endpoints' routers rolled onto the new default images",
        )

        def old_gone() -> bool:
            now = pods(api, namespace, ENGINES)
            names = {p["metadata"]["name"] for p in now}
            return not names & old_pods and len(now) == 2 and all(is_ready(p) for p in now)

        wait_for(old_gone, timeout=180, what="chat's old replicas drained and removed")
        before = len(load.results)
        wait_for(lambda: len(load.results) >= before + 3, timeout=60, what="load on new pods")
    assert len(load.results) >= 10, len(load.results)
    assert not load.failures(), load.failures()[:5]

    def reported() -> dict[str, Any] | None:
        images = status(api, namespace).get("images")
        return images if images and images["engine"] == NEW else None

    images = wait_for(reported, timeout=60, what="status.images on the new default")
    assert images == {"engine": NEW, "router": NEW_ROUTER, "pinned": False}
    # the pinned endpoint kept its engine image, and its engine Deployment was not rolled
    dep = deployment(api, namespace, "pinned-engine")
    assert image(dep) == OLD and dep is not None
    assert dep["metadata"]["generation"] == pinned_generation
    assert status(api, namespace, "pinned")["images"]["engine"] == OLD
    assert api.get(API, "LLMEndpoint", namespace, "pinned") is not None
