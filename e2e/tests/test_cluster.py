"""The local cluster behaves like a cluster: API, scheduling, pods on their own IPs, graceful
termination, GPU scarcity, Prometheus discovery and namespace deletion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from kubernetes import client
from manifests import PORT, pod, server_deployment, service

from kvscale_cluster.fixtures import Cluster, kubectl, wait_for


def _ready_pods(core: client.CoreV1Api, namespace: str, app: str) -> list[Any]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    return [
        p
        for p in pods
        if p.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]


def test_api_serves_and_nodes_are_ready(cluster: Cluster, kube: client.ApiClient) -> None:
    version = client.VersionApi(kube).get_code()
    assert version.git_version == "v1.37.2"
    nodes = client.CoreV1Api(kube).list_node().items
    assert len(nodes) >= 1
    for node in nodes:
        assert not node.spec.taints
        assert int(node.status.capacity["nvidia.com/gpu"]) >= 0
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready == "True"
    out = kubectl(cluster, "get", "nodes", "-o", "name").stdout
    assert all(f"node/{n.metadata.name}" in out for n in nodes)


def test_deployment_pods_serve_on_their_own_ips(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    apps.create_namespaced_deployment(namespace, server_deployment("web", 3))
    core.create_namespaced_service(namespace, service("web"))
    pods = wait_for(
        lambda: (ready := _ready_pods(core, namespace, "web")) and len(ready) == 3 and ready,
        90,
        "3 Ready pods of web",
    )
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 3
    for p in pods:
        answer = httpx.get(f"http://{p.status.pod_ip}:{PORT}/", timeout=5).text
        assert answer == f"hello from {p.metadata.name} at {p.status.pod_ip}\n"
        status = p.status.container_statuses[0]
        assert status.ready and status.state.running is not None
    if cluster.state.network == "netns":
        slices = client.DiscoveryV1Api(kube)

        def slice_ips() -> set[str]:
            items = slices.list_namespaced_endpoint_slice(
                namespace, label_selector="kubernetes.io/service-name=web"
            ).items
            return {
                a
                for s in items
                for e in s.endpoints or []
                for a in e.addresses
                if e.conditions.ready
            }

        wait_for(lambda: slice_ips() == ips, 30, "EndpointSlice of web listing the 3 pod IPs")


def test_scaling_down_terminates_pods_gracefully(
    cluster: Cluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    apps.create_namespaced_deployment(
        namespace, server_deployment("web", 3, marker_dir=str(tmp_path), term_delay=1.0)
    )
    wait_for(lambda: len(_ready_pods(core, namespace, "web")) == 3, 90, "3 Ready pods")
    before = {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
    apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 1}})
    remaining = wait_for(
        lambda: (left := core.list_namespaced_pod(namespace).items) and len(left) == 1 and left,
        60,
        "2 of 3 pods deleted",
    )
    stopped = before - {remaining[0].metadata.name}
    assert len(stopped) == 2
    assert {m.name for m in tmp_path.iterdir()} == stopped  # their SIGTERM handlers ran
    for name in stopped:
        assert (tmp_path / name).read_text() == "15\n"
        log = (cluster.pod_logs_dir / f"{namespace}_{name}_server.log").read_text()
        assert "Got signal 15; shutting down" in log and log.rstrip().endswith("Stopped")


def test_gpu_requests_beyond_capacity_stay_pending(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    per_node = max(n.gpus for n in cluster_nodes(kube))
    apps.create_namespaced_deployment(namespace, server_deployment("fits", 1, gpus=per_node))
    apps.create_namespaced_deployment(namespace, server_deployment("toobig", 1, gpus=per_node + 1))
    wait_for(lambda: _ready_pods(core, namespace, "fits"), 90, "the pod that fits Ready")

    def unschedulable() -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector="app=toobig").items
        conditions = {c.type: c for c in (pods[0].status.conditions or [])} if pods else {}
        scheduled = conditions.get("PodScheduled")
        return scheduled if scheduled and scheduled.reason == "Unschedulable" else None

    condition = wait_for(unschedulable, 60, "the oversized pod reported Unschedulable")
    assert condition.status == "False"
    assert "Insufficient nvidia.com/gpu" in condition.message
    toobig = core.list_namespaced_pod(namespace, label_selector="app=toobig").items[0]
    assert toobig.status.phase == "Pending" and not toobig.spec.node_name


class _Node:
    def __init__(self, name: str, gpus: int) -> None:
        self.name, self.gpus = name, gpus


def cluster_nodes(kube: client.ApiClient) -> list[_Node]:
    return [
        _Node(n.metadata.name, int(n.status.allocatable["nvidia.com/gpu"]))
        for n in client.CoreV1Api(kube).list_node().items
    ]


def test_prometheus_discovers_pods_and_scrapes_them(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    apps.create_namespaced_deployment(namespace, server_deployment("scraped", 2))
    pods = wait_for(
        lambda: (ready := _ready_pods(core, namespace, "scraped")) and len(ready) == 2 and ready,
        90,
        "2 Ready pods",
    )
    names = {p.metadata.name for p in pods}

    def targets_up() -> bool:
        data = httpx.get(f"{cluster.prometheus_url}/api/v1/targets", timeout=5).json()
        up = {
            t["labels"].get("pod")
            for t in data["data"]["activeTargets"]
            if t["labels"].get("namespace") == namespace and t["health"] == "up"
        }
        return up == names

    wait_for(targets_up, 60, "Prometheus targets up for both pods")

    def samples() -> dict[str, float]:
        query = f'testserver_requests_total{{namespace="{namespace}"}}'
        result = httpx.get(
            f"{cluster.prometheus_url}/api/v1/query", params={"query": query}, timeout=5
        ).json()["data"]["result"]
        return {r["metric"]["pod"]: float(r["value"][1]) for r in result}

    got = wait_for(lambda: (s := samples()) and set(s) == names and s, 30, "samples of both pods")
    assert all(value >= 1 for value in got.values())


def test_deleting_a_namespace_completes(cluster: Cluster, kube: client.ApiClient) -> None:
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    name = "doomed-ns"
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: core.read_namespaced_service_account("default", name), 30, "default SA")
    apps.create_namespaced_deployment(name, server_deployment("web", 2))
    pods = wait_for(
        lambda: (ready := _ready_pods(core, name, "web")) and len(ready) == 2 and ready,
        90,
        "2 Ready pods",
    )
    core.delete_namespace(name)

    def namespace_gone() -> bool:
        try:
            core.read_namespace(name)
        except client.ApiException as error:
            return error.status == 404
        return False

    wait_for(namespace_gone, 120, f"namespace {name} gone")
    for p in pods:
        try:
            httpx.get(f"http://{p.status.pod_ip}:{PORT}/healthz", timeout=1)
        except httpx.HTTPError:
            continue
        raise AssertionError(f"{p.metadata.name} still answers after its namespace was deleted")


def test_unknown_image_fails_the_pod_with_a_reason(kube: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, pod("nginx", "docker.io/library/nginx:1.27"))

    def waiting() -> Any:
        status = core.read_namespaced_pod("nginx", namespace).status
        statuses = status.container_statuses or []
        return statuses and statuses[0].state.waiting

    state = wait_for(waiting, 30, "a waiting reason for the unknown image")
    assert state.reason == "ErrImagePull"
    assert "docker.io/library/nginx:1.27" in state.message


def test_restart_policy_is_honoured(kube: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    crash = ["--exit-code", "3"]
    core.create_namespaced_pod(namespace, pod("crashy", "kvscale/testserver", args=crash))
    core.create_namespaced_pod(
        namespace,
        pod("once", "kvscale/testserver", args=["--exit-code", "0"], restartPolicy="Never"),
    )
    core.create_namespaced_pod(
        namespace, pod("broken", "kvscale/testserver", args=crash, restartPolicy="Never")
    )

    def restarted() -> Any:
        statuses = core.read_namespaced_pod("crashy", namespace).status.container_statuses or []
        return statuses and statuses[0].restart_count >= 2 and statuses[0]

    status = wait_for(restarted, 60, "crashy restarted twice")
    assert status.last_state.terminated.exit_code == 3
    phases = {
        name: wait_for(
            lambda name=name: (
                core.read_namespaced_pod(name, namespace).status.phase in ("Succeeded", "Failed")
                and core.read_namespaced_pod(name, namespace).status.phase
            ),
            60,
            f"{name} finished",
        )
        for name in ("once", "broken")
    }
    assert phases == {"once": "Succeeded", "broken": "Failed"}


def test_pod_reaches_the_api_as_its_service_account(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    client.RbacAuthorizationV1Api(kube).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "default-view"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "view",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        },
    )
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(
        namespace,
        pod(
            "whoami",
            "kvscale/testserver",
            command=["kubectl", "get", "pod", "$(POD_NAME)", "-o", "name"],
            env=[{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            restartPolicy="Never",
        ),
    )
    phase = wait_for(
        lambda: (
            (p := core.read_namespaced_pod("whoami", namespace).status.phase)
            in ("Succeeded", "Failed")
            and p
        ),
        60,
        "whoami finished",
    )
    log = (cluster.pod_logs_dir / f"{namespace}_whoami_main.log").read_text()
    assert phase == "Succeeded", log
    assert log.strip() == "pod/whoami"
