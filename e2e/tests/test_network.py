"""Pod networking: the loopback fallback serves pods, and a crashed cluster's namespaces,
processes, bridge and iptables chains are removed afterwards. Each test runs its own small
cluster."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client
from manifests import PORT, pod

from kvscale_cluster import firewall, netns
from kvscale_cluster.config import NodeConfig
from kvscale_cluster.fixtures import Cluster, ClusterConfig, wait_for
from kvscale_cluster.process import alive

SMALL = (NodeConfig("solo", gpus=0),)


@pytest.fixture
def small_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    started = Cluster.start(tmp_path / "cluster", ClusterConfig(nodes=SMALL, **request.param))
    try:
        yield started
    finally:
        started.stop()


def _serve(cluster: Cluster, name: str) -> str:
    """Run one test server pod bound to its own IP; return that IP once it answers."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    manifest = pod(
        name,
        "kvscale/testserver",
        args=["--host", "$(POD_IP)", "--port", str(PORT)],
        env=[{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    )
    core.create_namespaced_pod("default", manifest)
    ip: str = wait_for(
        lambda: core.read_namespaced_pod(name, "default").status.pod_ip, 60, f"{name} has an IP"
    )
    wait_for(
        lambda: httpx.get(f"http://{ip}:{PORT}/healthz", timeout=1).text == "ok\n",
        60,
        f"{name} answering on {ip}",
    )
    api.close()
    return ip


@pytest.mark.parametrize(
    "small_cluster", [{"network": "loopback", "prometheus": False}], indirect=True
)
def test_loopback_fallback_gives_pods_distinct_addresses(small_cluster: Cluster) -> None:
    first, second = _serve(small_cluster, "first"), _serve(small_cluster, "second")
    assert first != second
    assert first.startswith("127.244.") and second.startswith("127.244.")


@pytest.mark.parametrize(
    "small_cluster", [{"network": "netns", "prometheus": False}], indirect=True
)
def test_crashed_cluster_leaves_nothing_after_down(small_cluster: Cluster) -> None:
    ip = _serve(small_cluster, "survivor")
    slot = small_cluster.state.slot
    namespaces = [n for n in netns.ip("netns", "list").split() if n.startswith(f"kvs{slot}-")]
    assert len(namespaces) == 1
    assert firewall.chains(slot) == [f"KVS-NP-{slot}"]  # no policy: nothing isolated
    server_pids = [int(p) for p in netns.ip("netns", "pids", namespaces[0]).split()]
    assert server_pids
    for pid in small_cluster.state.pids.values():  # the crash: everything SIGKILLed
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(p) for p in small_cluster.state.pids.values()), 10, "a crash")
    assert all(alive(p) for p in server_pids)  # the pod's process outlived its kubelet
    assert httpx.get(f"http://{ip}:{PORT}/healthz", timeout=2).text == "ok\n"

    Cluster.attach(small_cluster.directory).stop()  # what `make cluster-down` does

    assert not any(alive(p) for p in server_pids)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert netns.bridge_name(slot) + ":" not in links
    assert f"kvs{slot}v" not in links
    assert namespaces[0] not in netns.ip("netns", "list")
    assert not firewall.chains(slot)  # the NetworkPolicy enforcer's chains and jump went too
    assert (
        f'kvscale cluster slot {slot}"'
        not in subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    )
