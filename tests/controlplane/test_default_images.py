"""The operator's default images: a restarted operator with new defaults rolls the endpoints that
pin no image through their Deployments' rolling updates, and leaves the pinned ones' engines
alone; every endpoint's routers follow the default router image, pinned or not."""

from __future__ import annotations

from typing import Any

import pytest
from endpoint_helpers import TEST_IMAGE, deployment, endpoint, get_endpoint, wait_available

from kvscale.api.images import ENGINE_ENV, ROUTER_ENV
from kvscale.kube import Kube
from kvscale_cluster.fixtures import Cluster, run_operator, wait_for

OLD = "kvscale/testserver:v1"  # the test server stands in for the engine, whatever the tag
NEW = "registry.example.com/kvscale/testserver:v2"
OLD_ROUTER = "kvscale/router:v1"  # any tag runs the router
NEW_ROUTER = "registry.example.com/kvscale/router:v2"
ENGINE = {"maxNumSeqs": 8, "maxNumBatchedTokens": 256}


def images(dep: dict[str, Any] | None) -> str:
    assert dep is not None
    return str(dep["spec"]["template"]["spec"]["containers"][0]["image"])


def router(api: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    return api.get("apps/v1", "Deployment", namespace, f"{name}-router")


def test_a_new_default_rolls_unpinned_endpoints_and_not_pinned_ones(
    api: Kube, cluster: Cluster, namespace: str, crd: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENGINE_ENV, OLD)
    monkeypatch.setenv(ROUTER_ENV, OLD_ROUTER)
    with run_operator(cluster) as runner:
        api.create(endpoint(namespace, "follow", engine=ENGINE))
        api.create(endpoint(namespace, "pinned", engine={**ENGINE, "image": TEST_IMAGE}))
        follow = wait_available(api, namespace, ready=1, name="follow")
        pinned = wait_available(api, namespace, ready=1, name="pinned")
    assert runner.exception is None, runner.output
    assert follow["status"]["images"] == {"engine": OLD, "router": OLD_ROUTER, "pinned": False}
    assert pinned["status"]["images"] == {
        "engine": TEST_IMAGE,
        "router": OLD_ROUTER,
        "pinned": True,
    }
    pinned_generation = deployment(api, namespace, "pinned")["metadata"]["generation"]  # type: ignore[index]
    old_pods = {
        p["metadata"]["name"]
        for p in api.list_pods(namespace, "kvscale.io/endpoint=follow,kvscale.io/role=engine")
    }

    monkeypatch.setenv(ENGINE_ENV, NEW)
    monkeypatch.setenv(ROUTER_ENV, NEW_ROUTER)
    with run_operator(cluster) as runner:
        wait_for(
            lambda: (
                images(deployment(api, namespace, "follow")) == NEW
                and images(router(api, namespace, "follow")) == NEW_ROUTER
                and images(router(api, namespace, "pinned")) == NEW_ROUTER
            ),
            timeout=60,
            what="follow's engine and both endpoints' routers on the new default images",
        )
        # the rolling update replaced the replica, readiness-gated (maxUnavailable 0)
        wait_for(
            lambda: get_endpoint(api, namespace, "follow")["status"]["images"]["engine"] == NEW,
            timeout=60,
            what="follow's status.images on the new default",
        )
        rolled = wait_available(api, namespace, ready=1, name="follow")
        wait_for(
            lambda: (
                not old_pods
                & {
                    p["metadata"]["name"]
                    for p in api.list_pods(
                        namespace, "kvscale.io/endpoint=follow,kvscale.io/role=engine"
                    )
                }
            ),
            timeout=90,
            what="follow's old replica replaced",
        )
    assert runner.exception is None, runner.output
    assert rolled["status"]["images"] == {"engine": NEW, "router": NEW_ROUTER, "pinned": False}
    still = deployment(api, namespace, "pinned")  # the pinned engine was not rolled
    assert images(still) == TEST_IMAGE
    assert still is not None and still["metadata"]["generation"] == pinned_generation
    strategy = deployment(api, namespace, "follow")["spec"]["strategy"]  # type: ignore[index]
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
