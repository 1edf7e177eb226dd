"""The router's Kubernetes source against a real API server, with the RBAC the operator renders.

The router runs as its own process under the router ServiceAccount's token (so the rendered Role
is what lets it list and watch), and follows engine pods and the routing ConfigMap as a test
creates, readies, reweights and deletes them. The pods carry a scheduling gate: no kubelet runs
them, and the test writes their status as a kubelet would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client, utils

from kvscale import timestamps
from kvscale.children import engine
from kvscale.children import router as router_children
from kvscale_cluster.fixtures import Cluster, wait_for
from kvscale_cluster.kubeconfig import write_kubeconfig
from kvscale_cluster.ports import free_port
from kvscale_cluster.specs import llm_spec

ENDPOINT = "chat"


def router_rbac(namespace: str) -> list[dict[str, Any]]:
    """The rendered ServiceAccount, Role, RoleBinding and ConfigMap, without an owner (none
    exists here, and the garbage collector would delete orphans)."""
    owner = engine.Owner(ENDPOINT, namespace, "no-owner")
    model = {"name": "m", "source": {"dummy": {"preset": "llama-tiny"}}}
    objs = router_children.render_router(owner, llm_spec(model=model))
    wanted = [
        o for o in objs if o["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ConfigMap")
    ]
    for obj in wanted:
        del obj["metadata"]["ownerReferences"]
    return wanted


def engine_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": engine.selector_labels(ENDPOINT)},
        "spec": {
            "schedulingGates": [{"name": "kvscale.io/test"}],
            "containers": [{"name": "engine", "image": "kvscale/engine:test"}],
        },
    }


def set_ready(core: Any, namespace: str, name: str, ip: str) -> None:
    now = timestamps.now()
    status = {
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
    }
    core.patch_namespaced_pod_status(name, namespace, {"status": status})


def publish(core: Any, namespace: str, text: str) -> None:
    name = router_children.routing_configmap_name(ENDPOINT)
    core.patch_namespaced_config_map(name, namespace, {"data": {"weights.json": text}})


@pytest.fixture
def router(cluster: Cluster, kube: Any, namespace: str, tmp_path: Path) -> Iterator[str]:
    """The router's URL; its log is tmp_path/router.log."""
    utils.create_from_yaml(kube, yaml_objects=router_rbac(namespace), namespace=namespace)  # type: ignore[no-untyped-call]
    core: Any = client.CoreV1Api(kube)
    account = router_children.router_name(ENDPOINT)
    token = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    user = f"system:serviceaccount:{namespace}:{account}"
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", cluster.api_url, cluster.ca_path, token, user, namespace
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "kvscale_router.cli", "--endpoint", ENDPOINT,
        "--namespace", namespace, "--host", "127.0.0.1", "--port", str(port),
        "--warmup-seconds", "1",
    ]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: _get(f"{url}/ready").status_code == 200, 60, "the router to list pods")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        sys.stderr.write(f"router log:\n{log.read_text(errors='replace')[-4000:]}\n")


def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=5)


def weights(url: str) -> dict[str, float]:
    """The router's per-replica weights, from its /metrics."""
    found: dict[str, float] = {}
    for line in _get(f"{url}/metrics").text.splitlines():
        if line.startswith("kvscale_router_replica_weight{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('replica="')[1].split('"')[0]] = float(value)
    return found


def routable(url: str) -> float:
    """The router's count of replicas with a weight above 0, from its /metrics."""
    for line in _get(f"{url}/metrics").text.splitlines():
        if line.startswith("kvscale_router_routable_replicas "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("the router exports no kvscale_router_routable_replicas")


def follows(url: str, expected: dict[str, float], what: str) -> None:
    wait_for(lambda: weights(url) == expected, 60, f"the router to see {what}: {expected}")


def test_router_follows_pods_and_published_weights(
    kube: Any, namespace: str, router: str, tmp_path: Path
) -> None:
    core: Any = client.CoreV1Api(kube)
    assert weights(router) == {}  # no pods: requests would be held
    for name in ("engine-a", "engine-b"):
        core.create_namespaced_pod(namespace, engine_pod(name))
    follows(router, {}, "no Ready pod")
    set_ready(core, namespace, "engine-a", "10.250.0.1")
    follows(router, {"engine-a": 1.0}, "a Ready pod joining after its warm-up")

    publish(core, namespace, json.dumps({"weights": {"engine-a": 0.25, "engine-b": 0.0}}))
    follows(router, {"engine-a": 0.25}, "the published weight")
    set_ready(core, namespace, "engine-b", "10.250.0.2")
    follows(router, {"engine-a": 0.25, "engine-b": 0.0}, "a Ready pod the operator holds at 0")

    publish(core, namespace, "{not json")  # a bad publication keeps the last good weights
    log = tmp_path / "router.log"
    wait_for(lambda: "Kept the last routing weights" in log.read_text(), 60, "the refusal")
    assert weights(router) == {"engine-a": 0.25, "engine-b": 0.0}
    publish(core, namespace, json.dumps({"weights": {"engine-a": 0.0, "engine-b": 1.0}}))
    follows(router, {"engine-a": 0.0, "engine-b": 1.0}, "the drain of engine-a")

    publish(core, namespace, json.dumps({"weights": {"engine-a": 0.5, "engine-b": 0.5}}))
    follows(router, {"engine-a": 0.5, "engine-b": 0.5}, "both replicas routable")
    core.delete_namespaced_pod("engine-a", namespace, grace_period_seconds=0)
    # A gone replica is shown at weight 0 at once although the operator still publishes it; its
    # series stay until it has been missing for a while, so its last errors are still scraped.
    follows(router, {"engine-a": 0.0, "engine-b": 0.5}, "engine-a gone")
    assert routable(router) == 1


def test_the_rendered_role_is_least_privilege(
    cluster: Cluster, kube: Any, namespace: str, router: str
) -> None:
    """The router's account may read its own ConfigMap but no other."""
    core: Any = client.CoreV1Api(kube)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "secret-ish"}, "data": {}})
    authz: Any = client.AuthorizationV1Api(kube)
    review = authz.create_subject_access_review(
        {
            "spec": {
                "user": f"system:serviceaccount:{namespace}:chat-router",
                "resourceAttributes": {"namespace": namespace, "verb": "get",
                                       "resource": "configmaps", "name": "secret-ish"},
            }
        }
    )  # fmt: skip
    assert review.status.allowed is False
