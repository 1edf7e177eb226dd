"""What the local cluster's userspace kube-proxy costs: the same requests to a pod by its IP and
through its Service's ClusterIP, side by side in one run, on a real local cluster.

Two pods run Python's `http.server` on a 32 MiB file (and a 1-byte one) behind one Service. From
the host: (1) small GETs, a fresh connection each (the proxy's worst case: it accepts, then opens
a second connection), sequential, direct and proxied interleaved in blocks so that machine noise
hits both (raw sockets, HTTP/1.0, so that client set-up costs nothing); (2) the 32 MiB body,
MiB/s, over one kept client. Reported: p50/p99 latency and their proxied/direct ratios,
and the throughput ratio. What runs: a netns pod network on this host (veth + bridge), no GPU.
"""

from __future__ import annotations

import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from kvscale_cluster.cluster import Cluster
from kvscale_cluster.config import ClusterConfig, NodeConfig
from kvscale_cluster.kube_api import KubeApi
from kvscale_cluster.wait import wait_for

PORT = 8080
BIG_MIB = 32


def _manifests(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    container = {
        "name": "files",
        "image": "kvscale/testserver",
        "command": ["python", "-m", "http.server", str(PORT), "--directory", str(folder)],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "files"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "files"}},
            "template": {
                "metadata": {"labels": {"app": "files"}},
                "spec": {"containers": [container]},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "files"},
        "spec": {"selector": {"app": "files"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    return deployment, service


def _ready_ips(api: KubeApi) -> list[str]:
    slices = api.get(
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
        {"labelSelector": "kubernetes.io/service-name=files"},
    )["items"]
    return [
        e["addresses"][0]
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
    ]


def _small_gets(host: str, port: int, count: int) -> list[float]:
    """``count`` HTTP/1.0 GETs of the 1-byte file on raw sockets, a fresh connection each."""
    took = []
    for _ in range(count):
        began = time.perf_counter()
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(b"GET /small HTTP/1.0\r\n\r\n")
            answer = b""
            while data := sock.recv(65536):
                answer += data
        took.append(time.perf_counter() - began)
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"\r\n\r\nx"), answer
    return took


def _big_get(http: httpx.Client, url: str) -> float:
    began = time.perf_counter()
    size = 0
    with http.stream("GET", url, timeout=60) as response:
        for chunk in response.iter_bytes():
            size += len(chunk)
    assert size == BIG_MIB * 2**20
    return size / 2**20 / (time.perf_counter() - began)


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def run(quick: bool = False) -> dict[str, Any]:
    blocks, per_block, big_repeats = (4, 25, 2) if quick else (10, 100, 5)
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work, "files")
        folder.mkdir()
        (folder / "small").write_bytes(b"x")
        (folder / "big").write_bytes(b"\0" * (BIG_MIB * 2**20))
        config = ClusterConfig(
            nodes=(NodeConfig("bench", gpus=0),), network="netns", prometheus=False
        )
        cluster = Cluster.start(Path(work, "cluster"), config)
        try:
            api = KubeApi(cluster.api_url, cluster.token, str(cluster.ca_path))
            deployment, service = _manifests(folder)
            api.post("/apis/apps/v1/namespaces/default/deployments", deployment)
            cluster_ip = api.post("/api/v1/namespaces/default/services", service)["spec"][
                "clusterIP"
            ]
            ips = wait_for(lambda: len(_ready_ips(api)) == 2 and _ready_ips(api), 120, "2 pods")
            proxied, direct = f"http://{cluster_ip}:80", f"http://{ips[0]}:{PORT}"
            wait_for(lambda: httpx.get(f"{proxied}/small", timeout=2).status_code == 200, 30, "svc")
            latency: dict[str, list[float]] = {"direct": [], "proxied": []}
            for _ in range(blocks):
                latency["direct"] += _small_gets(ips[0], PORT, per_block)
                latency["proxied"] += _small_gets(cluster_ip, 80, per_block)
            mbps: dict[str, list[float]] = {"direct": [], "proxied": []}
            with httpx.Client() as http:
                for _ in range(big_repeats):
                    mbps["direct"].append(_big_get(http, f"{direct}/big"))
                    mbps["proxied"].append(_big_get(http, f"{proxied}/big"))
            api.close()
        finally:
            cluster.stop()
    result: dict[str, Any] = {"what_ran": __doc__.split("\n\n")[0].replace("\n", " ")}
    for key in ("direct", "proxied"):
        result[f"{key}_p50_ms"] = round(1000 * _quantile(latency[key], 0.5), 2)
        result[f"{key}_p99_ms"] = round(1000 * _quantile(latency[key], 0.99), 2)
        result[f"{key}_mib_per_s_median"] = round(statistics.median(mbps[key]), 1)
    result["requests_each"] = blocks * per_block
    result["transfers_each"] = big_repeats
    result["p50_ratio_proxied_over_direct"] = round(
        result["proxied_p50_ms"] / result["direct_p50_ms"], 2
    )
    result["p99_ratio_proxied_over_direct"] = round(
        result["proxied_p99_ms"] / result["direct_p99_ms"], 2
    )
    result["throughput_ratio_proxied_over_direct"] = round(
        result["proxied_mib_per_s_median"] / result["direct_mib_per_s_median"], 2
    )
    return result
