"""kvscale's engine image as containers under the real kubelet.

kvscale installed from manifests/ (e2e/install) with its operator on a process node; an endpoint
whose engine pods (`spec.podTemplate`) and router pods (`spec.router`) are pinned to the real node
(its label and a toleration of its taint), in a namespace enforcing the restricted Pod Security
profile: the whole data path runs as containers. In order: the engine
container runs as the image's user with a read-only root and becomes Ready by the real kubelet's
probes; it serves through the endpoint's Service (the router on a process node) and the operator
reads its metrics; killed with SIGKILL it is restarted and serves again; two replicas drain back
to one with requests flowing and none failed.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from kvscale.kube import Kube
from kvscale_cluster import real_node
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.install import install_kvscale, uninstall_kvscale
from kvscale_cluster.reads import (
    API,
    accepts_connections,
    condition,
    container_status,
    ready,
    service_url,
    status,
)
from kvscale_demo.load import Load

NAME, MODEL = "chat", "tiny"
ENGINES = f"kvscale.io/endpoint={NAME},kvscale.io/role=engine"
INTERVAL, STABILIZATION = 10, 20


def endpoint(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LLMEndpoint",
        "metadata": {"name": NAME},
        "spec": {
            "model": {
                "name": MODEL,
                "source": {"dummy": {"preset": "llama-tiny"}},
                "maxModelLen": 512,
            },
            # the CPU decode kernel required: the engine refuses to start unless the image's
            # compiler builds it under the real kubelet (read-only root, /tmp an emptyDir)
            "engine": {
                "maxNumSeqs": 4,
                "maxNumBatchedTokens": 512,
                "extraArgs": ["--decode-attention=cpu"],
            },
            "resources": {"gpusPerReplica": 0, "cpu": "500m", "memory": "2Gi"},
            "slo": {"ttftP99Seconds": 2, "itlP99Seconds": 0.5},
            "replicas": replicas,
            "scaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "capacityIntervalSeconds": INTERVAL,
                "routingIntervalSeconds": 1,
                "scaleDownStabilizationSeconds": STABILIZATION,
                "replicaCapacityTokensPerSecond": 150,
            },
            "podTemplate": {
                "nodeSelector": {real_node.LABEL[0]: real_node.LABEL[1]},
                "tolerations": [real_node.TOLERATION],
            },
            "router": {
                "nodeSelector": {real_node.LABEL[0]: real_node.LABEL[1]},
                "tolerations": [real_node.TOLERATION],
            },
        },
    }


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Kube:
    return Kube(cluster.api_client())


@pytest.fixture(scope="module")
def namespace(cluster: Cluster, api: Kube) -> Iterator[str]:
    def run(*args: str) -> object:
        return kubectl(cluster, *args)

    install_kvscale(run)
    name = f"engine-{secrets.token_hex(3)}"
    kubectl(cluster, "create", "namespace", name)
    kubectl(cluster, "label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    try:
        apply(cluster, name, endpoint(replicas=1))
        yield name
    finally:
        with contextlib.suppress(AssertionError):
            kubectl(cluster, "delete", "namespace", name, "--wait=false")
        wait_for(lambda: not api.list_pods(name, ""), 180, f"pods of {name} gone")
        uninstall_kvscale(run)


def apply(cluster: Cluster, namespace: str, body: dict[str, Any]) -> None:
    kubectl(cluster, "apply", "--server-side", "-n", namespace, "-f", "-", stdin=json.dumps(body))


def engines(api: Kube, namespace: str) -> list[dict[str, Any]]:
    """The engine pods that run or will: not deleted, not ended (an evicted pod stays, Failed)."""
    pods = api.list_pods(namespace, ENGINES)
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and p.get("status", {}).get("phase") not in ("Failed", "Succeeded")
    ]


def complete(api: Kube, namespace: str, prompt: str) -> None:
    url = service_url(api, namespace, NAME)
    wait_for(lambda: accepts_connections(url), 30, "the Service's endpoints at the proxy")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0)
    out = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.completion_tokens == 8


def test_engine_runs_as_a_container_and_serves(cluster: Cluster, api: Kube, namespace: str) -> None:
    wait_for(
        lambda: condition(status(api, namespace, NAME), "Available").get("status") == "True",
        300,
        "the endpoint Available with its engine on the real node",
    )
    (pod,) = engines(api, namespace)
    assert pod["spec"]["nodeName"] == real_node.NAME
    assert container_status(pod)["containerID"].startswith("containerd://")
    for router in api.list_pods(namespace, f"kvscale.io/endpoint={NAME},kvscale.io/role=router"):
        assert router["spec"]["nodeName"] == real_node.NAME
        assert "kvscale/router:" in container_status(router)["image"]
    name = pod["metadata"]["name"]
    uid = kubectl(cluster, "-n", namespace, "exec", name, "--", "id", "-u").stdout.strip()
    assert uid == "10001"
    denied = kubectl(cluster, "-n", namespace, "exec", name, "--", "touch", "/opt/probe",
                     check=False)  # fmt: skip
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied
    complete(api, namespace, "Hello from a real node's engine")
    wait_for(
        lambda: condition(status(api, namespace, NAME), "MetricsAvailable").get("status") == "True",
        6 * INTERVAL,
        "MetricsAvailable=True (the operator scraping the container)",
    )


def test_killed_engine_container_restarts_and_serves_again(
    cluster: Cluster, api: Kube, namespace: str
) -> None:
    (pod,) = engines(api, namespace)
    task = container_status(pod)["containerID"].removeprefix("containerd://")
    node = real_node.RealNode(cluster.directory / "real-node")
    node.ctr_checked("tasks", "kill", "--signal", "SIGKILL", task)

    def back() -> dict[str, Any] | None:
        (now,) = engines(api, namespace)
        state = container_status(now)
        return now if state.get("restartCount") == 1 and ready(now) else None

    restarted = wait_for(back, 180, "the engine container restarted and Ready")
    assert container_status(restarted)["lastState"]["terminated"]["exitCode"] == 137
    wait_for(lambda: complete(api, namespace, "Again") is None, 60, "a completion after it")


def test_two_replicas_drain_to_one_without_failures(
    cluster: Cluster, api: Kube, namespace: str
) -> None:
    apply(cluster, namespace, endpoint(replicas=2))
    wait_for(lambda: len([p for p in engines(api, namespace) if ready(p)]) == 2, 300,
             "2 engine containers Ready")  # fmt: skip
    with Load(service_url(api, namespace, NAME), MODEL) as load:
        # traffic before, during and after the scale-in: once unpinned, the law may drain the
        # second replica at its first decision (a run here did, with 2 requests sent by then)
        load.set_rate(0.5)
        wait_for(lambda: len(load.results) >= 5, 60, "5 requests served by 2 replicas")
        kubectl(cluster, "-n", namespace, "patch", "llme", NAME, "--type=json",
                "-p", '[{"op": "remove", "path": "/spec/replicas"}]')  # fmt: skip
        wait_for(
            lambda: (
                status(api, namespace, NAME).get("replicas") == 1
                and len(engines(api, namespace)) == 1
            ),
            10 * (STABILIZATION + INTERVAL),
            "back to 1 engine container once unpinned",
        )
        after = len(load.results)
        wait_for(lambda: len(load.results) >= after + 5, 60, "5 more requests on 1 replica")
    assert not load.failures(), load.failures()[:5]
