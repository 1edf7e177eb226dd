"""The engine pods' NetworkPolicy enforced on the local cluster (kvscale_cluster.policy_controller):
another pod cannot drain a replica, while the router serves the endpoint, the operator (on the
node) reaches the admin port, and pods the policy names get through to exactly their ports.

Probe pods are ordinary pods the process kubelet runs in their own network namespaces; each
tries its connections to the engine pod's IP and prints what happened, one JSON line each.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from kubernetes import client
from test_autoscale import MODEL, apply, endpoint, serving

from kvscale.children import engine, network
from kvscale.children.engine_args import ADMIN_PORT, ENGINE_PORT
from kvscale.kube import Kube
from kvscale_cluster.fixtures import Cluster, wait_for

POLICY = ("networking.k8s.io/v1", "NetworkPolicy")
PROBE = textwrap.dedent(
    """
    import json, sys, httpx
    ip = sys.argv[1]
    for check in sys.argv[2:]:
        method, port, path = check.split(":", 2)
        try:
            response = httpx.request(method, f"http://{ip}:{port}{path}", timeout=3)
            print(json.dumps({"check": check, "status": response.status_code}), flush=True)
        except httpx.HTTPError as error:
            print(json.dumps({"check": check, "error": type(error).__name__}), flush=True)
    """
)
DRAIN = f"POST:{ADMIN_PORT}:/drain"
DRAIN_STATUS = f"GET:{ADMIN_PORT}:/drain"
HEALTH = f"GET:{ENGINE_PORT}:/health"


def probe_pod(name: str, ip: str, checks: list[str], labels: dict[str, str]) -> dict[str, Any]:
    container = {"name": "main", "image": "kvscale/testserver", "command": ["python", "-c", PROBE]}
    container["args"] = [ip, *checks]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }


def outcomes(cluster: Cluster, core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    """Wait for probe pod ``name`` to finish; its checks' status codes or error names."""

    def finished() -> str | None:
        phase = core.read_namespaced_pod(name, namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, 90, f"probe pod {namespace}/{name} finished")
    output = (cluster.pod_logs_dir / f"{namespace}_{name}_main.log").read_text()
    assert phase == "Succeeded", output
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return {line["check"]: line.get("status", line.get("error")) for line in lines}


def _phase(core: client.CoreV1Api, name: str) -> str | None:
    try:
        return str(core.read_namespace(name).status.phase)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def _scratch_namespace(core: client.CoreV1Api, name: str, labels: dict[str, str]) -> bool:
    """Make namespace ``name`` when it is missing (after a terminating one is gone); whether
    this made it."""
    wait_for(lambda: _phase(core, name) != "Terminating", 120, f"namespace {name} gone")
    if _phase(core, name) is not None:
        return False
    meta = client.V1ObjectMeta(name=name, labels=labels)
    core.create_namespace(client.V1Namespace(metadata=meta))
    wait_for(lambda: core.read_namespaced_service_account("default", name), 30, f"{name}/default")
    return True


@pytest.fixture
def scratch(kube: client.ApiClient) -> Iterator[list[str]]:
    """Names of namespaces the test made; they are deleted (and waited for) afterwards, so a
    later module can make them again."""
    core, made = client.CoreV1Api(kube), []
    yield made
    for name in made:
        core.delete_namespace(name)
    for name in made:
        wait_for(lambda n=name: _phase(core, n) is None, 120, f"namespace {name} deleted")


def test_another_pod_cannot_drain_a_replica(
    cluster: Cluster,
    operator: Any,
    api: Kube,
    kube: client.ApiClient,
    namespace: str,
    scratch: list[str],
) -> None:
    core = client.CoreV1Api(kube)
    apply(cluster, namespace, endpoint(namespace))
    url = serving(api, namespace, ready=1)
    assert api.get(*POLICY, namespace, "chat-engine") is not None
    (replica,) = api.list_pods(namespace, engine.selector_string("chat"))
    ip = replica["status"]["podIP"]

    # the probes: a stray pod beside the replica, a pod in a scraper namespace, and one labelled
    # as the operator in the operator's namespace (the policy's three kinds of peer)
    scrapers, operator_ns = f"{namespace}-scrapers", network.operator_namespace()
    if _scratch_namespace(core, scrapers, {network.SCRAPER_LABEL: "true"}):
        scratch.append(scrapers)
    if _scratch_namespace(core, operator_ns, {}):
        scratch.append(operator_ns)
    probes = {
        (namespace, "stray"): probe_pod("stray", ip, [DRAIN, HEALTH], {"app": "stray"}),
        (scrapers, "scraper"): probe_pod("scraper", ip, [HEALTH, DRAIN], {}),
        (operator_ns, "operator"): probe_pod(
            "operator", ip, [DRAIN_STATUS], dict(network.OPERATOR_LABELS)
        ),
    }
    for (ns, _), body in probes.items():
        core.create_namespaced_pod(ns, body)
    seen = {name: outcomes(cluster, core, ns, name) for ns, name in probes}

    # the stray pod reaches neither port: its packets are dropped, so it times out
    assert seen["stray"] == {DRAIN: "ConnectTimeout", HEALTH: "ConnectTimeout"}, seen
    # the controls: the same network carries what the policy allows, port by port
    assert seen["scraper"] == {HEALTH: 200, DRAIN: "ConnectTimeout"}, seen
    assert seen["operator"] == {DRAIN_STATUS: 200}, seen

    # the replica is not draining; the node (where the operator runs) reaches its admin port
    state = httpx.get(f"http://{ip}:{ADMIN_PORT}/drain", timeout=5).json()
    assert state["draining"] is False, state
    # and the router still serves the endpoint through its Service
    openai_client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    completion = openai_client.completions.create(model=MODEL, prompt="Hello", max_tokens=4)
    assert completion.usage is not None and completion.usage.completion_tokens == 4
