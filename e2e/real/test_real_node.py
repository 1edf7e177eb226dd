"""One pod on the real node: what the process kubelet never enforced, a real node does."""

from __future__ import annotations

import base64
import ipaddress
import json
import urllib.request
from typing import Any

from kvscale_cluster import real_node
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for

IMAGE = "kvscale.local/busybox:1.35.0"  # e2e/real-node/build-images.sh
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SCRIPT = f"""id
touch /probe 2>&1 || true
echo "token $(cat {TOKEN})"
exec sleep 3600
"""


RESTRICTED = {
    "runAsUser": 65534,
    "runAsGroup": 65534,
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def real_pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    """A pod for the real node running ``script`` in busybox, within the restricted profile."""
    container = {
        "name": "main",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", script],
        "securityContext": RESTRICTED,
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {real_node.LABEL[0]: real_node.LABEL[1]},
            "tolerations": [real_node.TOLERATION],
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            **spec,
        },
    }


def apply(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> None:
    kubectl(cluster, "-n", namespace, "apply", "-f", "-", stdin=json.dumps(obj))


def restrict(cluster: Cluster, namespace: str) -> None:
    """Enforce the restricted Pod Security profile on ``namespace``."""
    label = "pod-security.kubernetes.io/enforce=restricted"
    kubectl(cluster, "label", "namespace", namespace, label)


def pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out = kubectl(cluster, "-n", namespace, "get", "pod", name, "-o", "json").stdout
    result: dict[str, Any] = json.loads(out)
    return result


def running(cluster: Cluster, namespace: str, name: str, restarts: int) -> bool:
    statuses = pod(cluster, namespace, name)["status"].get("containerStatuses") or []
    return any(s["restartCount"] == restarts and "running" in s["state"] for s in statuses)


def jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


def test_pod_runs_as_a_container_on_the_real_node(cluster: Cluster, namespace: str) -> None:
    restrict(cluster, namespace)
    apply(cluster, namespace, real_pod("probe", SCRIPT))
    wait_for(lambda: running(cluster, namespace, "probe", 0), 90, "probe running")
    status = pod(cluster, namespace, "probe")
    assert status["spec"]["nodeName"] == real_node.NAME
    assert status["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert ipaddress.ip_address(status["status"]["podIP"]).packed[3] >= real_node.FIRST_ADDRESS
    wait_for(
        lambda: "token " in kubectl(cluster, "-n", namespace, "logs", "probe").stdout,
        30,
        "probe's output",
    )
    logs = kubectl(cluster, "-n", namespace, "logs", "probe").stdout
    assert "uid=65534(nobody) gid=65534(nogroup)" in logs  # the image's /etc/passwd, group
    assert "Read-only file system" in logs
    token = logs.split("token ", 1)[1].split()[0]
    claims = jwt_claims(token)  # a projected, pod-bound token from the kubelet's TokenRequest
    assert claims["kubernetes.io"]["pod"]["name"] == "probe"
    assert claims["kubernetes.io"]["node"]["name"] == real_node.NAME
    assert claims["sub"] == f"system:serviceaccount:{namespace}:default"
    exec_id = kubectl(cluster, "-n", namespace, "exec", "probe", "--", "id", "-u").stdout
    assert exec_id.strip() == "65534"
    cgroups = kubectl(cluster, "-n", namespace, "exec", "probe", "--", "cat", "/proc/self/cgroup")
    pod_uid = status["metadata"]["uid"]
    under = f"{real_node.cgroup_root(cluster.state.slot)}/kubepods/besteffort/pod{pod_uid}/"
    assert f":memory:{under}" in cgroups.stdout, cgroups.stdout
    # in-cluster clients dial the kubernetes Service the kubelet names in the environment
    dial = "timeout 5 nc $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT </dev/null; echo rc=$?"
    api = kubectl(cluster, "-n", namespace, "exec", "probe", "--", "sh", "-c", dial)
    assert api.stdout.strip() == "rc=0", api.stdout + api.stderr


def test_killed_container_is_restarted(cluster: Cluster, namespace: str) -> None:
    restrict(cluster, namespace)
    apply(cluster, namespace, real_pod("victim", SCRIPT))
    wait_for(lambda: running(cluster, namespace, "victim", 0), 90, "victim running")
    container = pod(cluster, namespace, "victim")["status"]["containerStatuses"][0]
    task = container["containerID"].removeprefix("containerd://")
    node = real_node.RealNode(cluster.directory / "real-node")
    node.ctr_checked("tasks", "kill", "--signal", "SIGKILL", task)
    wait_for(lambda: running(cluster, namespace, "victim", 1), 60, "victim restarted")
    restarted = pod(cluster, namespace, "victim")["status"]["containerStatuses"][0]
    assert restarted["lastState"]["terminated"]["exitCode"] == 137
    previous = kubectl(cluster, "-n", namespace, "logs", "victim", "--previous").stdout
    assert "uid=65534" in previous


def test_service_and_dns_reach_a_real_node_pod(cluster: Cluster, namespace: str) -> None:
    restrict(cluster, namespace)
    page = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "page"}}
    apply(cluster, namespace, {**page, "data": {"index.html": "served from the real node\n"}})
    web = real_pod(
        "web",
        "exec httpd -f -p 8080 -h /www",
        volumes=[{"name": "www", "configMap": {"name": "page"}}],
        container={
            "volumeMounts": [{"name": "www", "mountPath": "/www"}],
            "ports": [{"containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
        },
    )
    apply(cluster, namespace, web)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    apply(cluster, namespace, service)
    # a second real-node pod finds the Service by name through the cluster DNS
    client = "until wget -qO- http://web; do sleep 1; done; exec sleep 3600"
    apply(cluster, namespace, real_pod("client", client))

    def ready() -> bool:
        conditions = pod(cluster, namespace, "web")["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(ready, 90, "web Ready (the kubelet's HTTP probe)")
    wait_for(
        lambda: "served from" in kubectl(cluster, "-n", namespace, "logs", "client").stdout,
        60,
        "client's fetch through the Service",
    )
    ip = kubectl(cluster, "-n", namespace, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}")

    def fetched() -> bool:  # the host reaches the pod through the ClusterIP as well
        with urllib.request.urlopen(f"http://{ip.stdout}/", timeout=5) as response:
            return bool(response.read() == b"served from the real node\n")

    wait_for(fetched, 30, "the Service's ClusterIP from the host")
