"""What the fault scenarios need beyond `kvscale_demo.load` and the autoscale helpers: a load that
records when each request ended, the process behind a pod's container, the router's own counters,
and an inventory of an endpoint's children to compare before and after a fault."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from kvscale.children.router import ROUTER_PORT
from kvscale.kube import Kube
from kvscale_demo.load import Load

OPERATOR_NAMESPACE = "kvscale-system"
OPERATOR_SELECTOR = "app.kubernetes.io/name=kvscale-operator"
ENGINE_PORT = 8000
# what an endpoint's children are, listed by its label: (apiVersion, collection path)
CHILD_KINDS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
}


class TimedLoad(Load):
    """`Load` that also records when each request ended (`ended[i]` goes with `results[i]`)."""

    def __init__(self, base_url: str, model: str, max_tokens: int = 48) -> None:
        super().__init__(base_url, model, max_tokens)
        self.ended: list[float] = []

    async def _one(self, client: openai.AsyncOpenAI, n: int) -> None:
        await super()._one(client, n)
        # no await between the parent's append and this one: the lists stay aligned
        with self._lock:
            self.ended.append(time.monotonic())

    def finished_between(self, start: float, end: float) -> list[tuple[float, float, str | None]]:
        """(started, ended, error) of every request that started before `end` and ended after
        `start`: the ones in flight at some point in [start, end]."""
        with self._lock:
            pairs = list(zip(self.results, self.ended, strict=False))
        return [(r.started, e, r.error) for r, e in pairs if r.started < end and e > start]


def pods(api: Kube, namespace: str, selector: str) -> list[dict[str, Any]]:
    return api.list_pods(namespace, selector)


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def restarts(pod: dict[str, Any]) -> int:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def kill_container(pod: dict[str, Any], container: str) -> int:
    """SIGKILL the process group of a running container (the process kubelet names its PID in
    `containerID`), as an out-of-memory kill or a segfault would end it; returns the PID."""
    for st in pod["status"]["containerStatuses"]:
        if st["name"] == container:
            pid = int(st["containerID"].removeprefix("kvscale-process://"))
            os.killpg(pid, signal.SIGKILL)
            return pid
    raise AssertionError(f"no container {container} in {pod['metadata']['name']}")


def router_counters(api: Kube, namespace: str, endpoint: str) -> dict[tuple[str, str], float]:
    """Every `kvscale_router_*` sample summed over the endpoint's router pods, by (name, labels
    as sorted `k=v` pairs)."""
    totals: dict[tuple[str, str], float] = {}
    selector = f"kvscale.io/endpoint={endpoint},kvscale.io/role=router"
    for pod in pods(api, namespace, selector):
        ip = pod.get("status", {}).get("podIP")
        if not ip or not is_ready(pod):
            continue
        text = httpx.get(f"http://{ip}:{ROUTER_PORT}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                key = (sample.name, labels)
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def engine_metric(pod: dict[str, Any], name: str) -> float:
    """A sample of the engine's `/metrics` (kvscale's or vLLM's), summed over its labels."""
    text = httpx.get(f"http://{pod['status']['podIP']}:{ENGINE_PORT}/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def engine_running(pod: dict[str, Any]) -> float:
    """Requests the engine is generating for right now (its `vllm:num_requests_running`)."""
    return engine_metric(pod, "vllm:num_requests_running")


def upstream_failed(counters: dict[tuple[str, str], float], replica: str) -> float:
    """Requests a replica failed after their first byte (the router relayed an error)."""
    key = ("kvscale_router_requests_total", f"code=upstream_failed,replica={replica}")
    return counters.get(key, 0.0)


def requests_by_replica(counters: dict[tuple[str, str], float]) -> dict[str, float]:
    """Requests the routers relayed to each replica (any HTTP status; the router's own answers,
    with an empty replica, left out)."""
    by_replica: dict[str, float] = {}
    for (name, labels), value in counters.items():
        found = dict(pair.split("=", 1) for pair in labels.split(",") if "=" in pair)
        if name == "kvscale_router_requests_total" and found.get("replica"):
            by_replica[found["replica"]] = by_replica.get(found["replica"], 0.0) + value
    return by_replica


def in_flight(counters: dict[tuple[str, str], float], replica: str) -> float:
    return counters.get(("kvscale_router_in_flight", f"replica={replica}"), 0.0)


def weights(api: Kube, namespace: str, endpoint: str) -> dict[str, float] | None:
    """The weights the operator published for the routers (None before the first)."""
    found = api.get("v1", "ConfigMap", namespace, f"{endpoint}-routing")
    raw = ((found or {}).get("data") or {}).get("weights.json")
    return dict(json.loads(raw)["weights"]) if raw else None


def children(api: Kube, namespace: str, endpoint: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Every object labelled as the endpoint's, by (kind, name)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for kind, path in CHILD_KINDS.items():
        listed = api.request(
            "GET",
            path.format(ns=namespace),
            query=[("labelSelector", f"kvscale.io/endpoint={endpoint}")],
        )
        for item in (listed or {}).get("items", []):
            found[kind, item["metadata"]["name"]] = item
    return found


def owners(obj: dict[str, Any]) -> set[str]:
    return {ref["uid"] for ref in obj["metadata"].get("ownerReferences") or []}


def operator_pod(api: Kube) -> dict[str, Any] | None:
    """The operator's pod when exactly one runs and is Ready."""
    live = [
        p
        for p in pods(api, OPERATOR_NAMESPACE, OPERATOR_SELECTOR)
        if not p["metadata"].get("deletionTimestamp")
    ]
    return live[0] if len(live) == 1 and is_ready(live[0]) else None
