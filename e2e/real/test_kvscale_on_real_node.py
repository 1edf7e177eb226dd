"""kvscale itself under the real kubelet: installed from manifests/ as a user installs it.

`kubectl apply --server-side -k` of the CRDs, then of e2e/real/operator/ (e2e/install, i.e.
manifests/ unchanged, plus a nodeSelector and a toleration that pin the operator to the real
node): the operator runs there as a container of kvscale/operator under its ServiceAccount, in
kvscale-system, which enforces the restricted Pod Security profile. It reconciles the sample
manifests/samples/tiny-autoscaling.yaml in a namespace that enforces the restricted profile too,
with its routers placed on the real node (`spec.router`: the node's label and a toleration of its
taint), where they run as containers of kvscale/router; the engines run on the process nodes
(the engine image, 5.9 GB with PyPI's torch, is not imported here: e2e/real-engine/ and
docs/real-node.md). The module walks one cycle in order: the operator's container as the real
node runs it; the sample Available and serving through its Service (the router containers) with
the official `openai` client; a burst that scales up and a quiet spell that drains a replica
away with 0 failed requests; a router container and the operator's container killed, restarted
by the kubelet, and the endpoint reconciled again by the restarted operator.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import yaml
from test_real_node import jwt_claims

from kvscale.kube import Kube
from kvscale_cluster import real_node
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.install import CRD_NAME, CRDS, ROOT, wait_established
from kvscale_cluster.reads import (
    accepts_connections,
    condition,
    container_status,
    ready,
    service_url,
    status,
)
from kvscale_demo.load import Load

OVERLAY = ROOT / "e2e" / "real" / "operator"
SAMPLE = ROOT / "manifests" / "samples" / "tiny-autoscaling.yaml"
BODY: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
NAME, MODEL = BODY["metadata"]["name"], BODY["spec"]["model"]["name"]
PLACED = {  # the sample, its routers on the real node
    **BODY,
    "spec": {
        **BODY["spec"],
        "router": {
            "nodeSelector": {real_node.LABEL[0]: real_node.LABEL[1]},
            "tolerations": [real_node.TOLERATION],
        },
    },
}
INTERVAL = int(BODY["spec"]["scaling"]["capacityIntervalSeconds"])
STABILIZATION = int(BODY["spec"]["scaling"]["scaleDownStabilizationSeconds"])
SYSTEM = "kvscale-system"
OPERATOR = "app.kubernetes.io/name=kvscale-operator"
ENGINES = f"kvscale.io/endpoint={NAME},kvscale.io/role=engine"
ROUTERS = f"kvscale.io/endpoint={NAME},kvscale.io/role=router"
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
# a request is ~15 prompt + 48 generated tokens; the sample declares 150 tokens/s a replica, so
# 0.5 request/s needs one replica and 6 requests/s all three
LOW, BURST = 0.5, 6.0


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Kube:
    return Kube(cluster.api_client())


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[None]:
    def run(*args: str) -> object:
        return kubectl(cluster, *args)

    kubectl(cluster, "apply", "--server-side", "-k", str(CRDS))
    wait_established(run, CRD_NAME)
    kubectl(cluster, "apply", "--server-side", "-k", str(OVERLAY))
    kubectl(cluster, "-n", SYSTEM, "rollout", "status", "deployment/kvscale-operator",
            "--timeout=240s")  # fmt: skip
    yield
    kubectl(cluster, "delete", "-k", str(OVERLAY), "--ignore-not-found", "--timeout=120s",
            check=False)  # fmt: skip


@pytest.fixture(scope="module")
def namespace(cluster: Cluster, api: Kube, installed: None) -> Iterator[str]:
    """The sample's namespace, enforcing the restricted Pod Security profile."""
    name = f"real-{secrets.token_hex(3)}"
    kubectl(cluster, "create", "namespace", name)
    kubectl(cluster, "label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    try:
        kubectl(cluster, "apply", "--server-side", "-n", name, "-f", "-", stdin=json.dumps(PLACED))
        yield name
    finally:
        with contextlib.suppress(AssertionError):
            kubectl(cluster, "delete", "namespace", name, "--wait=false")
        wait_for(lambda: not api.list_pods(name, ""), 180, f"pods of {name} gone")


def operator_pod(api: Kube) -> dict[str, Any]:
    pods = api.list_pods(SYSTEM, OPERATOR)
    (pod,) = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return pod


def reasons(api: Kube, namespace: str) -> list[str]:
    found = api.request("GET", f"/api/v1/namespaces/{namespace}/events") or {}
    return [e["reason"] for e in found.get("items", [])]


def exec_operator(cluster: Cluster, api: Kube, *command: str) -> Any:
    name = operator_pod(api)["metadata"]["name"]
    return kubectl(cluster, "-n", SYSTEM, "exec", name, "--", *command, check=False)


def test_operator_runs_as_a_container_under_its_service_account(
    cluster: Cluster, api: Kube, installed: None
) -> None:
    pod = operator_pod(api)
    assert pod["spec"]["nodeName"] == real_node.NAME
    state = container_status(pod)
    assert state["containerID"].startswith("containerd://") and "running" in state["state"]
    assert "kvscale/operator:" in state["image"], state["image"]
    system = api.request("GET", f"/api/v1/namespaces/{SYSTEM}") or {}
    assert system["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # the image's user (the manifests' runAsUser), a read-only root, /tmp the emptyDir
    assert exec_operator(cluster, api, "id", "-u").stdout.strip() == "10001"
    denied = exec_operator(cluster, api, "touch", "/opt/kvscale/probe")
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied
    assert exec_operator(cluster, api, "touch", "/tmp/probe").returncode == 0
    # the kubelet's projected, pod-bound token for the operator's ServiceAccount
    claims = jwt_claims(exec_operator(cluster, api, "cat", TOKEN).stdout)
    assert claims["sub"] == f"system:serviceaccount:{SYSTEM}:kvscale-operator"
    assert claims["kubernetes.io"]["pod"]["name"] == pod["metadata"]["name"]
    assert claims["kubernetes.io"]["node"]["name"] == real_node.NAME


def test_sample_becomes_available_and_serves_through_its_service(
    cluster: Cluster, api: Kube, namespace: str
) -> None:
    wait_for(
        lambda: condition(status(api, namespace, NAME), "Available").get("status") == "True",
        240,
        "the sample Available (the operator container reconciling it)",
    )
    for pod in api.list_pods(namespace, ENGINES):
        assert pod["spec"]["nodeName"] != real_node.NAME, pod["metadata"]["name"]
    routers = api.list_pods(namespace, ROUTERS)
    assert len(routers) == 2  # the sample may scale to 3 replicas: two routers
    for pod in routers:
        assert pod["spec"]["nodeName"] == real_node.NAME, pod["metadata"]["name"]
        state = container_status(pod)
        assert state["containerID"].startswith("containerd://"), state
        assert "kvscale/router:" in state["image"], state["image"]
    url = service_url(api, namespace, NAME)
    wait_for(lambda: accepts_connections(url), 30, "the Service's endpoints at the proxy")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0)
    answer = client.completions.create(  # the sample's dummy model has no chat template
        model=MODEL, prompt="Hello from a real node", max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    assert answer.choices[0].finish_reason == "length"
    wait_for(
        lambda: condition(status(api, namespace, NAME), "MetricsAvailable").get("status") == "True",
        6 * INTERVAL,
        "MetricsAvailable=True (the container scraping the engines)",
    )


def test_burst_scales_up_and_quiet_drains_without_failures(
    cluster: Cluster, api: Kube, namespace: str
) -> None:
    with Load(service_url(api, namespace, NAME), MODEL) as load:
        load.set_rate(LOW)
        wait_for(
            lambda: status(api, namespace, NAME).get("capacity", {}).get("demandTokensPerSecond"),
            6 * INTERVAL,
            "a first demand measurement",
        )
        load.set_rate(BURST)
        wait_for(
            lambda: int(status(api, namespace, NAME).get("desiredReplicas", 1)) >= 2,
            3 * INTERVAL + 15,
            "replicas to rise for the burst",
        )
        wait_for(
            lambda: int(status(api, namespace, NAME).get("readyReplicas", 0)) >= 2,
            180,
            "a second replica Ready",
        )
        load.set_rate(LOW)
        quiet = time.monotonic()
        wait_for(
            lambda: status(api, namespace, NAME).get("replicas") == 1,
            10 * (STABILIZATION + INTERVAL),
            "replicas back to 1 in the quiet spell",
        )
        print(f"Drained to 1 replica {time.monotonic() - quiet:.0f} s into the quiet spell")
    assert len(load.results) >= 100 and not load.failures(), load.failures()[:5]
    seen = reasons(api, namespace)
    assert "ScaledUp" in seen and "DrainingReplica" in seen and "ScaledDown" in seen, seen


def test_killed_router_container_restarts_and_serves_again(
    cluster: Cluster, api: Kube, namespace: str
) -> None:
    pod = api.list_pods(namespace, ROUTERS)[0]
    name = pod["metadata"]["name"]
    task = container_status(pod)["containerID"].removeprefix("containerd://")
    real_node.RealNode(cluster.directory / "real-node").ctr_checked(
        "tasks", "kill", "--signal", "SIGKILL", task
    )

    def back() -> bool:
        found = api.get("v1", "Pod", namespace, name) or {}
        state = container_status(found) if found.get("status") else {}
        return state.get("restartCount") == 1 and ready(found)

    wait_for(back, 90, f"router {name} restarted by the kubelet and Ready")
    client = openai.OpenAI(
        base_url=f"{service_url(api, namespace, NAME)}/v1", api_key="-", max_retries=0
    )
    for i in range(4):  # whichever router the Service picks
        out = client.completions.create(model=MODEL, prompt=f"again {i}", max_tokens=4,
                                        extra_body={"ignore_eos": True})  # fmt: skip
        assert out.usage is not None and out.usage.completion_tokens == 4


def test_killed_operator_container_restarts_and_reconciles_again(
    cluster: Cluster, api: Kube, namespace: str
) -> None:
    before = container_status(operator_pod(api))
    assert before["restartCount"] == 0  # its liveness probe held through the module so far
    task = before["containerID"].removeprefix("containerd://")
    node = real_node.RealNode(cluster.directory / "real-node")
    node.ctr_checked("tasks", "kill", "--signal", "SIGKILL", task)

    def restarted() -> dict[str, Any] | None:
        state = container_status(operator_pod(api))
        return state if state.get("restartCount") == 1 and "running" in state["state"] else None

    state = wait_for(restarted, 90, "the operator container restarted by the kubelet")
    assert state["lastState"]["terminated"]["exitCode"] == 137
    # the restarted operator acts on a change made after the kill
    patch = json.dumps({"spec": {"replicas": 2}})
    kubectl(cluster, "-n", namespace, "patch", "llme", NAME, "--type=merge", "-p", patch)
    wait_for(
        lambda: len([p for p in api.list_pods(namespace, ENGINES) if ready(p)]) == 2,
        180,
        "2 engine replicas from the restarted operator",
    )
