"""The capacity loop closed on the local cluster: real engine pods, the router, real signals.

The operator runs in this process (Kopf's runner) against the cluster; clients reach the endpoint
the way users do, through its Service (`<name>`, the router) with the official `openai` client.
Intervals come from the spec (10 s capacity, 1 s routing, 20 s stabilization), and every wait is
on a condition.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai
from scenario_helpers import is_ready, requests_by_replica, router_counters, weights

from kvscale.kube import Kube
from kvscale.routing_loop import warming
from kvscale_cluster import process
from kvscale_cluster.config import NodeConfig
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.ports import free_port
from kvscale_cluster.prometheus import prometheus_binary
from kvscale_demo.load import Load, p99

API = "kvscale.io/v1alpha1"
INTERVAL = 10
STABILIZATION = 20
MODEL = "tiny"


def endpoint(namespace: str, name: str = "chat", **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": MODEL, "source": {"dummy": {"preset": "llama-tiny"}}, "maxModelLen": 512},
        "engine": {"maxNumSeqs": 4, "maxNumBatchedTokens": 512},
        "resources": {"gpusPerReplica": 0, "cpu": "500m", "memory": "1Gi"},
        "slo": {"ttftP99Seconds": 2, "itlP99Seconds": 0.5},
        "scaling": {
            "minReplicas": 1,
            "maxReplicas": 3,
            "capacityIntervalSeconds": INTERVAL,
            "routingIntervalSeconds": 1,
            "scaleDownStabilizationSeconds": STABILIZATION,
            "replicaCapacityTokensPerSecond": 1_000_000,
        },
    }
    for key, value in over.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return {"apiVersion": API, "kind": "LLMEndpoint", "metadata": {"name": name}, "spec": spec}


def apply(cluster: Cluster, namespace: str, body: dict[str, Any]) -> None:
    kubectl(cluster, "apply", "--server-side", "-n", namespace, "-f", "-", stdin=json.dumps(body))


def status(api: Kube, namespace: str, name: str = "chat") -> dict[str, Any]:
    found = api.get(API, "LLMEndpoint", namespace, name)
    assert found is not None
    return dict(found.get("status") or {})


def condition(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c["type"] == type_), {})


def serving(api: Kube, namespace: str, ready: int, name: str = "chat") -> str:
    """Wait until `ready` engines and a router serve; return the endpoint's Service URL."""

    def up() -> str | None:
        st = status(api, namespace, name)
        router = api.get("apps/v1", "Deployment", namespace, f"{name}-router") or {}
        service = api.get("v1", "Service", namespace, name) or {}
        if st.get("readyReplicas") != ready or not router.get("status", {}).get("readyReplicas"):
            return None
        return f"http://{service['spec']['clusterIP']}:8000" if service else None

    return wait_for(up, timeout=240, what=f"{ready} engine replica(s) and a router serving")


def events(api: Kube, namespace: str) -> dict[str, list[str]]:
    found = api.request("GET", f"/api/v1/namespaces/{namespace}/events") or {}
    by_reason: dict[str, list[str]] = {}
    for e in found.get("items", []):
        by_reason.setdefault(e["reason"], []).append(e["message"])
    return by_reason


HINT = {"replicaCapacityTokensPerSecond": 150}


def all_weighted(api: Kube, namespace: str, replicas: int) -> bool:
    """The operator published a weight above 0 for each of `replicas` replicas."""
    published = weights(api, namespace, "chat") or {}
    return len(published) == replicas and min(published.values()) > 0


def warmed_up(api: Kube, namespace: str, replicas: int) -> bool:
    """`replicas` engine pods are Ready, none is still in its routing warm-up (the operator's own
    rule, `routing_loop.warming`), and the operator published a weight above 0 for each."""
    engines = api.list_pods(namespace, "kvscale.io/endpoint=chat,kvscale.io/role=engine")
    ready = [p for p in engines if is_ready(p) and not p["metadata"].get("deletionTimestamp")]
    return (
        len(ready) == replicas
        and not warming(ready, time.time())
        and all_weighted(api, namespace, replicas)
    )


def test_burst_scales_up_within_two_intervals_and_ttft_recovers(
    cluster: Cluster, operator: Any, api: Kube, namespace: str
) -> None:
    # a request is ~40 prompt + 48 generated tokens (the engine's count): ~87; one replica is
    # declared to carry 150 tokens/s, so 0.5 request/s needs one replica and 6/s all three
    apply(cluster, namespace, endpoint(namespace, scaling=HINT))
    url = serving(api, namespace, ready=1)
    with Load(url, MODEL) as load:
        load.set_rate(0.5)
        wait_for(
            lambda: status(api, namespace).get("capacity", {}).get("demandTokensPerSecond"),
            timeout=120,
            what="a first demand measurement",
        )
        assert status(api, namespace)["desiredReplicas"] == 1
        load.set_rate(6)  # the burst: 12x
        burst = time.monotonic()

        def scaled_up() -> int | None:
            desired = int(status(api, namespace).get("desiredReplicas", 1))
            return desired if desired >= 2 else None

        wait_for(scaled_up, timeout=2 * INTERVAL + 15, what="replicas to rise within 2 intervals")
        reaction = time.monotonic() - burst
        st = status(api, namespace)
        assert st["decisions"][-1]["reason"] in (
            "DemandForecast", "QueueGrowing", "TTFTAboveSLO", "AtMaxReplicas"
        )  # fmt: skip
        wait_for(
            lambda: status(api, namespace).get("desiredReplicas") == 3,
            timeout=4 * INTERVAL,
            what="3 replicas for the burst",
        )
        serving(api, namespace, ready=3)
        # a Ready replica's weight ramps up over its warm-up (the routing loop's slow start):
        # until it is over, the first replica still carries most of the burst, so the recovery
        # is judged from the moment no replica is warming up any more
        wait_for(lambda: warmed_up(api, namespace, 3), timeout=60, what="3 replicas warmed up")
        recovered = time.monotonic()
        before = requests_by_replica(router_counters(api, namespace, "chat"))
        window = wait_for(  # 120 requests at 6/s, every one of them ended
            lambda: load.between(recovered, recovered + 20),
            timeout=20 + 150,
            what="the requests of 20 s after scale-up",
        )
        shares = {
            replica: n - before.get(replica, 0.0)
            for replica, n in requests_by_replica(router_counters(api, namespace, "chat")).items()
            if n > before.get(replica, 0.0)
        }
        # the scale-up is what carries the burst now: each replica answers a part of it
        assert len(shares) == 3 and min(shares.values()) >= len(window) / 10, (
            f"requests after scale-up answered by replica: {shares}"
        )
        alone = wait_for(lambda: load.between(burst, recovered), timeout=150, what="the burst")
    # TTFT recovers: within the SLO (a p99: over ~120 requests its nearest rank is the 119th, so
    # one stall of this shared machine's two cores is the 1% it allows), or, where the machine
    # is too busy for that, shorter than while the first replica carried the burst alone
    ttfts = [r.ttft_s for r in window if r.ttft_s is not None]
    peak = p99([r.ttft_s for r in alone if r.ttft_s is not None])
    assert len(window) >= 100 and len(ttfts) >= 0.99 * len(window), window[:5]
    assert p99(ttfts) <= 2.0 or p99(ttfts) < peak, (
        f"p99 TTFT {p99(ttfts):.2f} s after scaling up ({reaction:.0f} s), {peak:.2f} s before; "
        f"the worst {[round(t, 2) for t in sorted(ttfts)[-5:]]}; answered by replica {shares}"
    )
    # a busy machine may make the engine refuse a request at admission (429, before it is
    # accepted); nothing it accepted fails
    lost = [r for r in load.failures() if not (r.error or "").startswith("RateLimitError")]
    assert not lost, lost[:5]
    assert events(api, namespace).get("ScaledUp")


def test_quiet_drains_replicas_one_per_window_without_failures(
    cluster: Cluster, operator: Any, api: Kube, namespace: str
) -> None:
    apply(cluster, namespace, endpoint(namespace, scaling=HINT, replicas=3))
    url = serving(api, namespace, ready=3)
    with Load(url, MODEL) as load:
        load.set_rate(0.5)  # a trickle keeps flowing while the replicas drain away
        kubectl(cluster, "-n", namespace, "patch", "llme", "chat", "--type=json",
                "-p", '[{"op": "remove", "path": "/spec/replicas"}]')  # fmt: skip
        wait_for(
            lambda: (
                status(api, namespace).get("desiredReplicas") == 1
                and status(api, namespace).get("replicas") == 1
            ),
            timeout=8 * (STABILIZATION + INTERVAL),
            what="replicas to come back to 1 once unpinned",
        )
    assert not load.failures(), load.failures()[:5]
    assert len(load.results) >= 10
    history = status(api, namespace)["decisions"]
    downs = [d for d in history if d["toReplicas"] < d["fromReplicas"]]
    assert [(d["fromReplicas"], d["toReplicas"]) for d in downs] == [(3, 2), (2, 1)]
    assert all(d["reason"] == "Consolidating" for d in downs)
    seen = events(api, namespace)
    assert len(seen.get("DrainingReplica", [])) == 2 and len(seen.get("ScaledDown", [])) == 2


def test_from_zero_holds_the_request_until_a_replica_serves_it(
    cluster: Cluster, operator: Any, api: Kube, namespace: str
) -> None:
    zero = {**HINT, "minReplicas": 0, "scaleToZeroAfterSeconds": 30}
    apply(cluster, namespace, endpoint(namespace, scaling=zero))
    url = serving(api, namespace, ready=0)
    assert condition(status(api, namespace), "Available")["reason"] == "ScaledToZero"
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    started = time.monotonic()
    completion = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8)
    waited = time.monotonic() - started
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    st = status(api, namespace)
    assert st["decisions"][0]["reason"] == "ScaleFromZero", st["decisions"]
    assert st["decisions"][0]["fromReplicas"] == 0, f"answered after {waited:.0f} s"
    # idle again: back to zero after scaleToZeroAfterSeconds
    wait_for(
        lambda: status(api, namespace).get("desiredReplicas") == 0,
        timeout=30 + 6 * INTERVAL,
        what="the idle endpoint to scale back to zero",
    )
    assert status(api, namespace)["decisions"][-1]["reason"] == "ScaleToZero"


def _prometheus(config: Path, data: Path, address: str, logs: Path) -> process.Component:
    argv = [
        prometheus_binary(),
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address={address}",
        "--log.level=warn",
    ]
    prom = process.start("prometheus-test", argv, logs)
    wait_for(lambda: process.alive(prom.pid) and _up(f"http://{address}"), 30, "test Prometheus")
    return prom


def _up(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_metrics_outage_holds_replicas_and_recovers(
    cluster: Cluster, operator: Any, api: Kube, namespace: str, tmp_path: Path
) -> None:
    # a Prometheus of this test's own, with the cluster's discovery and scrape configuration
    config = cluster.directory / "prometheus" / "prometheus.yml"
    address = f"{cluster.host_ip}:{free_port(cluster.host_ip)}"
    prom = _prometheus(config, tmp_path / "data", address, tmp_path)
    signals = {"signals": {"source": "prometheus", "prometheusUrl": f"http://{address}"}}
    pinned = endpoint(namespace, scaling=signals, replicas=2)
    apply(cluster, namespace, pinned)
    serving(api, namespace, ready=2)
    wait_for(
        lambda: condition(status(api, namespace), "MetricsAvailable").get("status") == "True",
        timeout=120,
        what="MetricsAvailable=True from Prometheus",
    )
    process.stop(prom.pid)
    unpinned = endpoint(namespace, scaling=signals)
    kubectl(cluster, "-n", namespace, "patch", "llme", "chat", "--type=json",
            "-p", '[{"op": "remove", "path": "/spec/replicas"}]')  # fmt: skip
    assert "replicas" not in unpinned["spec"]

    def unreachable() -> bool:
        cond = condition(status(api, namespace), "MetricsAvailable")
        return cond.get("status") == "False" and cond.get("reason") == "Unreachable"

    wait_for(unreachable, timeout=60, what="MetricsAvailable=False, Unreachable")
    first = status(api, namespace)["capacity"]["updatedAt"]
    ticks: set[str] = set()

    def held_for_three_intervals() -> bool:
        st = status(api, namespace)
        assert st["desiredReplicas"] == 2, "scaled down blind"
        assert st["capacity"]["reason"] == "MetricsUnavailable"
        ticks.add(st["capacity"]["updatedAt"])
        return len(ticks - {first}) >= 3  # longer than the stabilization window

    wait_for(held_for_three_intervals, timeout=10 * INTERVAL, what="3 held capacity decisions")
    prom = _prometheus(config, tmp_path / "data", address, tmp_path)
    try:
        wait_for(
            lambda: condition(status(api, namespace), "MetricsAvailable").get("status") == "True",
            timeout=120,
            what="MetricsAvailable=True again",
        )
        wait_for(
            lambda: status(api, namespace).get("desiredReplicas") == 1,
            timeout=6 * (STABILIZATION + INTERVAL),
            what="the idle endpoint to consolidate once signals are back",
        )
    finally:
        process.stop(prom.pid)


def test_gpu_scarcity_limits_capacity_without_runaway_until_a_node_joins(
    cluster: Cluster, operator: Any, api: Kube, namespace: str
) -> None:
    # two nodes of 2 nvidia.com/gpu each: two replicas of 2 GPUs fit. A headroom of 250% asks
    # for at least 3.5x what one replica carries (its learned capacity can never exceed the
    # whole demand it served alone), so demand wants all 4 replicas the spec allows
    body = endpoint(
        namespace,
        resources={"gpusPerReplica": 2},
        scaling={"maxReplicas": 4, "headroom": 2.5, "replicaCapacityTokensPerSecond": 1},
    )
    apply(cluster, namespace, body)
    url = serving(api, namespace, ready=1)
    try:
        with Load(url, MODEL) as load:
            load.set_rate(0.5)

            def limited() -> dict[str, Any] | None:
                st = status(api, namespace)
                cond = condition(st, "CapacityLimited")
                decided = st.get("capacity", {}).get("reason") == "CapacityLimited"
                return st if cond.get("status") == "True" and decided else None

            st = wait_for(limited, timeout=180, what="CapacityLimited=True")
            assert "nvidia.com/gpu" in condition(st, "CapacityLimited")["message"]
            seen: set[str] = set()

            def no_runaway() -> bool:
                now = status(api, namespace)
                deployment = api.get("apps/v1", "Deployment", namespace, "chat-engine") or {}
                assert deployment["spec"]["replicas"] <= 3, "more than one beyond what runs"
                seen.add(now["capacity"]["updatedAt"])
                return len(seen) >= 4

            wait_for(no_runaway, timeout=10 * INTERVAL, what="4 capacity decisions under scarcity")
            # a node with 4 GPUs joins: the pending replica is placed and the endpoint grows to
            # what demand wants, all of it scheduled
            cluster.add_node(NodeConfig(name="gpu-joined", gpus=4))

            def recovered() -> bool:
                now = status(api, namespace)
                cond = condition(now, "CapacityLimited")
                ready, desired = now.get("readyReplicas", 0), now.get("desiredReplicas", 0)
                return cond.get("status") == "False" and ready == desired >= 3

            wait_for(
                recovered,
                timeout=240,
                what="more replicas than the old nodes held, all Ready: CapacityLimited=False",
            )
        assert not load.failures(), load.failures()[:5]
    finally:
        cluster.remove_node("gpu-joined")
