"""Services on the local cluster: the kube-proxy routes a ClusterIP to the Ready endpoints of its
EndpointSlices, from the host and from pods, and pods resolve Service names through the cluster
DNS and find the Service variables in their environment."""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rcode
import httpx
import pytest
from kubernetes import client
from manifests import PORT, service

from kvscale_cluster.fixtures import Cluster, wait_for
from kvscale_cluster.install import ROOT
from kvscale_cluster.kube_proxy import Proxy
from kvscale_cluster.ports import free_port
from kvscale_cluster.service_table import Backend, Route, dns_records, routes, service_env

HELLO = re.compile(r"hello from (\S+) at")


def _server_pod(name: str, app: str, ready_file: Path | None = None) -> dict[str, Any]:
    """A test server pod labelled ``app``; with ``ready_file``, Ready while that file exists."""
    probe: dict[str, Any] = {"httpGet": {"path": "/healthz", "port": PORT}, "periodSeconds": 1}
    if ready_file is not None:
        probe = {"exec": {"command": ["test", "-e", str(ready_file)]}, "periodSeconds": 1}
    container = {
        "name": "server",
        "image": "kvscale/testserver",
        "args": ["--port", str(PORT)],
        "ports": [{"name": "http", "containerPort": PORT}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": probe,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"terminationGracePeriodSeconds": 5, "containers": [container]},
    }


def _ready_endpoints(kube: client.ApiClient, namespace: str, name: str) -> set[str]:
    slices = client.DiscoveryV1Api(kube).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={name}"
    )
    return {
        e.target_ref.name
        for s in slices.items
        for e in s.endpoints or []
        if e.conditions.ready and e.target_ref is not None
    }


def _serve(kube: client.ApiClient, namespace: str, pods: list[dict[str, Any]]) -> str:
    """Create ``pods`` and the Service ``web`` over them; return its ClusterIP once both Ready
    endpoints are listed."""
    core = client.CoreV1Api(kube)
    for manifest in pods:
        core.create_namespaced_pod(namespace, manifest)
    core.create_namespaced_service(namespace, service("web"))
    names = {p["metadata"]["name"] for p in pods}
    wait_for(lambda: _ready_endpoints(kube, namespace, "web") == names, 90, f"{names} Ready")
    ip: str = core.read_namespaced_service("web", namespace).spec.cluster_ip
    return ip


def _hello(url: str) -> str:
    """One request on a fresh connection; the name of the pod that answered."""
    found = HELLO.match(httpx.get(url, timeout=5).text)
    assert found, url
    return found.group(1)


def _only(url: str, names: set[str], count: int = 6) -> bool:
    """Whether ``count`` requests in a row are all answered by ``names``."""
    return {_hello(url) for _ in range(count)} <= names


# -- the tables, from API objects (pure)
def _svc(name: str, ip: str, ports: list[dict[str, Any]]) -> dict[str, Any]:
    meta = {"namespace": "ns", "name": name}
    return {"metadata": meta, "spec": {"clusterIP": ip, "ports": ports}}


def _slice(service_name: str, endpoints: list[tuple[str, bool | None]]) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": f"{service_name}-x",
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [ip], "conditions": {} if ready is None else {"ready": ready}}
            for ip, ready in endpoints
        ],
    }


def test_tables_list_ready_endpoints_only() -> None:
    services = {
        ("ns", "web"): _svc("web", "10.96.1.10", [{"name": "http", "port": 80}]),
        ("ns", "db"): _svc("db", "None", [{"name": "http", "port": 80}]),
    }
    slices = {
        ("ns", "web-x"): _slice("web", [("10.244.1.3", True), ("10.244.1.2", None), ("x", False)]),
        ("ns", "db-x"): _slice("db", [("10.244.1.9", True), ("10.244.1.8", False)]),
    }
    table = routes(services, slices)
    assert list(table) == [("10.96.1.10", 80)]  # the headless Service has no proxy
    assert table[("10.96.1.10", 80)].backends == (
        Backend("10.244.1.2", 8080),
        Backend("10.244.1.3", 8080),
    )
    assert dns_records(services, slices) == {
        "web.ns.svc.cluster.local": ["10.96.1.10"],
        "db.ns.svc.cluster.local": ["10.244.1.9"],
    }
    env = service_env(list(services.values()))
    assert env["WEB_SERVICE_HOST"] == "10.96.1.10"
    assert env["WEB_SERVICE_PORT"] == env["WEB_SERVICE_PORT_HTTP"] == "80"
    assert env["WEB_PORT_80_TCP"] == "tcp://10.96.1.10:80"
    assert not any(k.startswith("DB_") for k in env)


# -- on the cluster
def test_service_balances_host_and_pod_clients_across_ready_pods(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    assert cluster.state.network == "netns", "Services need the netns pod network"
    ip = _serve(kube, namespace, [_server_pod("web-a", "web"), _server_pod("web-b", "web")])
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(cluster.state.service_cidr)
    url = f"http://{ip}:{PORT}/"
    counts = collections.Counter(_hello(url) for _ in range(10))
    assert set(counts) == {"web-a", "web-b"} and max(counts.values()) <= 6, counts

    # a pod reaches the Service by its names and by its variables
    script = textwrap.dedent(
        f"""
        import os, httpx
        urls = [
            "http://web:{PORT}/",
            "http://web.{namespace}.svc.cluster.local:{PORT}/",
            "http://" + os.environ["WEB_SERVICE_HOST"] + ":" + os.environ["WEB_SERVICE_PORT"] + "/",
        ]
        for url in urls:
            for _ in range(4):
                print(url, httpx.get(url, timeout=5).text.strip(), flush=True)
        """
    )
    client_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "kvscale/testserver", "command": ["python", "-c", script]}
            ],
        },
    }
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, client_pod)
    phase = wait_for(
        lambda: (
            core.read_namespaced_pod("client", namespace).status.phase in ("Succeeded", "Failed")
            and core.read_namespaced_pod("client", namespace).status.phase
        ),
        90,
        "the client pod finished",
    )
    output = (cluster.pod_logs_dir / f"{namespace}_client_main.log").read_text()
    assert phase == "Succeeded", output
    answers = collections.defaultdict(set)
    for line in output.splitlines():
        url, _, text = line.partition(" ")
        if found := HELLO.match(text):
            answers[url].add(found.group(1))
    assert len(answers) == 3, output
    assert all(names == {"web-a", "web-b"} for names in answers.values()), answers


def test_service_follows_readiness_and_deletion(
    cluster: Cluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    ready_a, ready_b = tmp_path / "ready-a", tmp_path / "ready-b"
    ready_a.touch()
    ready_b.touch()
    pods = [_server_pod("web-a", "web", ready_a), _server_pod("web-b", "web", ready_b)]
    url = f"http://{_serve(kube, namespace, pods)}:{PORT}/"
    assert {_hello(url) for _ in range(4)} == {"web-a", "web-b"}

    ready_b.unlink()  # web-b fails its readiness probe: no new connections go to it
    wait_for(lambda: _only(url, {"web-a"}), 60, "only web-a answering while web-b is unready")
    assert _ready_endpoints(kube, namespace, "web") == {"web-a"}

    ready_b.touch()  # back in rotation
    wait_for(lambda: {_hello(url) for _ in range(4)} == {"web-a", "web-b"}, 60, "both again")

    core = client.CoreV1Api(kube)
    core.delete_namespaced_pod("web-a", namespace)
    wait_for(lambda: _only(url, {"web-b"}), 60, "only web-b answering after web-a's deletion")

    ready_b.unlink()  # no Ready endpoint left: connections are refused, not hung

    def refused() -> bool:
        try:
            httpx.get(url, timeout=5)
        except httpx.ConnectError:
            return True
        return False

    wait_for(refused, 60, "connections refused with no Ready endpoint")


def _ask(cluster: Cluster, name: str, tcp: bool = False) -> dns.message.Message:
    query = dns.message.make_query(name, "A")
    if tcp:
        return dns.query.tcp(query, cluster.host_ip, timeout=5)
    return dns.query.udp(query, cluster.host_ip, timeout=5)


def _addresses(answer: dns.message.Message) -> list[str]:
    return [item.address for rrset in answer.answer for item in rrset]


def test_cluster_dns_answers_services_refuses_unknown_names_and_forwards_others(
    cluster: Cluster,
) -> None:
    kubernetes_ip = str(next(ipaddress.ip_network(cluster.state.service_cidr).hosts()))
    for tcp in (False, True):
        answer = _ask(cluster, "kubernetes.default.svc.cluster.local", tcp)
        assert _addresses(answer) == [kubernetes_ip]
    assert _ask(cluster, "no-such.default.svc.cluster.local").rcode() == dns.rcode.NXDOMAIN
    assert _addresses(_ask(cluster, "localhost")) == ["127.0.0.1"]  # the host's resolver


# -- the proxy's data path, in process on loopback addresses
async def _backend(name: str) -> tuple[asyncio.Server, int]:
    """A TCP server that reads to end of stream, then answers its name and what it read."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        writer.write(f"{name}:".encode() + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _call(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    writer.write_eof()  # the backend answers only after end of stream: half-close must pass
    answer = await reader.read()
    writer.close()
    return answer


def _route(*ports: int) -> Route:
    return Route("ns", "web", "http", tuple(Backend("127.0.0.1", p) for p in ports))


async def test_proxy_splices_round_robin_skips_dead_backends_and_refuses_without_any() -> None:
    (one, one_port), (two, two_port) = await _backend("one"), await _backend("two")
    dead, dead_port = await _backend("dead")
    dead.close()
    await dead.wait_closed()
    listen = free_port("127.0.0.1")
    proxy = Proxy()
    try:
        await proxy.apply({("127.0.0.1", listen): _route(one_port, two_port)})
        answers = [await _call(listen, b"x" * 100_000) for _ in range(4)]
        assert [a[:4] for a in answers] == [b"one:", b"two:", b"one:", b"two:"]
        assert all(a.endswith(b"x" * 100_000) for a in answers)

        await proxy.apply({("127.0.0.1", listen): _route(dead_port, two_port)})
        assert {(await _call(listen, b"hi"))[:4] for _ in range(4)} == {b"two:"}

        await proxy.apply({("127.0.0.1", listen): _route()})
        with pytest.raises(ConnectionRefusedError):
            await _call(listen, b"hi")
    finally:
        await proxy.apply({})
        for server in (one, two):
            server.close()


def test_service_proxy_benchmark_runs_in_quick_mode(tmp_path: Path) -> None:
    """`python -m bench service_proxy` (its own small cluster) keeps working."""
    command = [sys.executable, "-m", "bench", "service_proxy", "--quick", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "service_proxy.json").read_text())
    assert result["requests_each"] == 100
    for key in ("p50", "p99", "throughput"):
        assert result[f"{key}_ratio_proxied_over_direct"] > 0
