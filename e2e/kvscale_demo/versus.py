"""One scenario, two autoscalers: kvscale's LLMEndpoint, then KEDA + the HPA, on the same cluster.

Both runs serve the same engine Deployment (`chat-engine`, rendered by kvscale's own
`engine_deployment` from the same spec) behind a ClusterIP Service; kvscale's run reaches it
through its router (Service `chat`), KEDA's through the engines' own Service (`chat-engine`),
as its guides deploy vLLM. KEDA's ScaledObject scales the Deployment on the queue
(`sum(vllm:num_requests_waiting{namespace=...})` from the cluster's Prometheus, an AverageValue
target per replica), as the llm-d and KEDA guides publish it (kvscale's engine counts the requests
in its admission queue there too, as vLLM counts every accepted request that is not running). The
same open-loop phases replay
against each, every request is recorded (start, first token, end, error), and the Deployment is
sampled every second; figures.py turns one run into the figures of the comparison.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvscale import api as kvapi
from kvscale.children.engine import Owner, engine_deployment, engine_service
from kvscale.tools.promtext import parse_prometheus_text, total
from kvscale_cluster.cluster import Cluster
from kvscale_cluster.kube_api import KubeApi, Obj
from kvscale_cluster.wait import wait_for

MODEL = "tiny"
VLLM_CHECKPOINT = "/tmp/kvscale/models/llama-hd64"  # vLLM's CPU attention needs head_dim >= 64
NAME = "chat"
DEPLOYMENT = f"{NAME}-engine"
SLO_TTFT_S = 2.0
SLO_INTERVAL_S = 10.0
SAMPLE_EVERY_S = 1.0
MIN_REPLICAS, MAX_REPLICAS = 1, 3
REFUSED = "HTTP 429"  # a request refused at admission: how Request.error begins (`status_error`)


@dataclass(frozen=True)
class Phase:
    name: str
    rate: float  # requests per second
    seconds: float


# the guides' query
WAITING = 'sum(vllm:num_requests_waiting{{namespace="{ns}"}})'


@dataclass(frozen=True)
class KedaTuning:
    """The user's knobs: the query, the queue per replica the HPA aims at, how often KEDA polls,
    and the HPA's scale-down stabilization (the HPA's default is 300 s)."""

    threshold: float = 5.0
    polling_s: int = 5
    scale_down_stabilization_s: int = 20
    query: str = WAITING


@dataclass(frozen=True)
class Request:
    started: float
    ended: float
    ttft_s: float | None
    error: str | None


@dataclass(frozen=True)
class Sample:
    t: float
    desired: int  # the Deployment's spec.replicas
    replicas: int  # pods of the Deployment (status.replicas, terminating ones not counted)
    ready: int


@dataclass
class Run:
    autoscaler: str
    phases: list[tuple[str, float, float]] = field(default_factory=list)  # name, start, end
    requests: list[Request] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)


def endpoint_spec(capacity_hint: float = 150, engine: str = "kvscale") -> dict[str, Any]:
    """The endpoint both runs serve: kvscale's e2e shape (a tiny dummy model on CPU), or with
    `engine="vllm"` the same shape on vLLM (its seeded checkpoint at `VLLM_CHECKPOINT`, written by
    `kvscale-engine tiny-checkpoint --vllm`, as manifests/samples/vllm-cpu.yaml serves it)."""
    spec: dict[str, Any] = {
        "model": {"name": MODEL, "source": {"dummy": {"preset": "llama-tiny"}}, "maxModelLen": 512},
        "engine": {"maxNumSeqs": 4, "maxNumBatchedTokens": 512},
        "resources": {"gpusPerReplica": 0, "cpu": "500m", "memory": "1Gi"},
        "slo": {"ttftP99Seconds": SLO_TTFT_S, "itlP99Seconds": 0.5},
        "scaling": {
            "minReplicas": MIN_REPLICAS,
            "maxReplicas": MAX_REPLICAS,
            "capacityIntervalSeconds": 10,
            "routingIntervalSeconds": 1,
            "scaleDownStabilizationSeconds": 20,
            "replicaCapacityTokensPerSecond": capacity_hint,
        },
    }
    if engine == "vllm":
        # vLLM's CPU KV cache is whole GiB (memoryFraction x memory = 1 GiB), its CPU blocks 128
        # tokens; --enforce-eager skips a 13-41 s compile at each start
        spec["model"]["source"] = {"hostPath": {"path": VLLM_CHECKPOINT}}
        spec["engine"] |= {"kind": "vllm", "blockSize": 128, "memoryFraction": 0.25,
                           "extraArgs": ["--enforce-eager"]}  # fmt: skip
        spec["resources"]["memory"] = "4Gi"
    return spec


def start_timeout_s(spec: dict[str, Any]) -> float:
    """How long a first replica may take to serve: vLLM loads for 1-3 minutes here, more while
    other replicas load the CPU (e2e/tests/test_vllm.py); kvscale's engine for seconds."""
    return 600.0 if spec["engine"].get("kind") == "vllm" else 240.0


# -- the two deployments ------------------------------------------------------------------------


def _ready_url(api: KubeApi, namespace: str, service: str, need_router: bool) -> str | None:
    engines = api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{DEPLOYMENT}")
    if not engines.get("status", {}).get("readyReplicas"):
        return None
    if need_router:
        router = api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{NAME}-router")
        if not router.get("status", {}).get("readyReplicas"):
            return None
    found = api.get(f"/api/v1/namespaces/{namespace}/services/{service}")
    return f"http://{found['spec']['clusterIP']}:8000"


def deploy_kvscale(api: KubeApi, namespace: str, spec: dict[str, Any]) -> str:
    """The LLMEndpoint (the operator must run); its router Service's URL once it serves."""
    body: Obj = {"apiVersion": "kvscale.io/v1alpha1", "kind": "LLMEndpoint"}
    body |= {"metadata": {"name": NAME}, "spec": spec}
    api.post(f"/apis/kvscale.io/v1alpha1/namespaces/{namespace}/llmendpoints", body)
    return wait_for(
        lambda: _ready_url(api, namespace, NAME, need_router=True),
        start_timeout_s(spec),
        "kvscale's endpoint",
    )


def plain_children(namespace: str, spec: dict[str, Any]) -> tuple[Obj, Obj]:
    """The engine Deployment and Service kvscale renders for `spec`, without the endpoint that
    would own them: what a user deploys by hand."""
    owner = Owner(name=NAME, namespace=namespace, uid="")
    parsed = kvapi.LLMEndpointSpec.model_validate(spec)
    children = engine_deployment(owner, parsed, MIN_REPLICAS), engine_service(owner)
    for child in children:
        del child["metadata"]["ownerReferences"]
    return children


def scaled_object(namespace: str, prometheus_url: str, tuning: KedaTuning) -> Obj:
    query = tuning.query.format(ns=namespace)
    behavior = {"scaleDown": {"stabilizationWindowSeconds": tuning.scale_down_stabilization_s}}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": NAME},
        "spec": {
            "scaleTargetRef": {"name": DEPLOYMENT},
            "minReplicaCount": MIN_REPLICAS,
            "maxReplicaCount": MAX_REPLICAS,
            "pollingInterval": tuning.polling_s,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": query,
                        "threshold": f"{tuning.threshold:g}",
                    },
                }
            ],
        },
    }


def deploy_plain(api: KubeApi, namespace: str, spec: dict[str, Any]) -> str:
    """The engine Deployment and its Service; the Service's URL once an engine is Ready."""
    deployment, service = plain_children(namespace, spec)
    api.post(f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)
    api.post(f"/api/v1/namespaces/{namespace}/services", service)
    return wait_for(
        lambda: _ready_url(api, namespace, DEPLOYMENT, need_router=False),
        start_timeout_s(spec),
        "engine",
    )


def add_scaled_object(api: KubeApi, cluster: Cluster, namespace: str, tuning: KedaTuning) -> None:
    """KEDA takes the Deployment over; returns once its HPA reads the metric."""
    so = scaled_object(namespace, cluster.prometheus_url, tuning)
    api.post(f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects", so)
    hpa = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/keda-hpa-{NAME}"

    def reads_metric() -> bool:
        conditions = api.get(hpa).get("status", {}).get("conditions") or []
        return any(c["type"] == "ScalingActive" and c["status"] == "True" for c in conditions)

    wait_for(reads_metric, 120, "KEDA's HPA reading the queue metric", 1.0)


# -- load and samples ---------------------------------------------------------------------------


class _Load:
    """Open-loop streaming completions at a rate that changes by phase; records every request."""

    def __init__(self, url: str, max_tokens: int, ignore_eos: bool = False) -> None:
        self.url, self.max_tokens, self.ignore_eos = url, max_tokens, ignore_eos
        self.rate = 0.0
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> _Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=300)

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as client:
            running: set[asyncio.Task[None]] = set()
            n, next_at = 0, time.monotonic()
            while not self._stop.is_set():
                rate = self.rate
                if rate <= 0:
                    next_at = time.monotonic()
                    await asyncio.sleep(0.05)
                    continue
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                next_at += 1.0 / rate
                n += 1
                task = asyncio.create_task(self.one(client, n))
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.gather(*running, return_exceptions=True)

    async def one(self, client: httpx.AsyncClient, n: int) -> None:
        body = {
            "model": MODEL,
            "prompt": f"Request {n}: tell me about autoscaling on Kubernetes, please.",
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        if self.ignore_eos:  # every answer `max_tokens` long (both engines take vLLM's extension)
            body["ignore_eos"] = True
        started = time.monotonic()
        ttft: float | None = None
        error: str | None = None
        try:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    error = status_error(response.status_code, await response.aread())
                else:
                    done = False
                    async for line in response.aiter_lines():
                        if line.startswith("data: ") and ttft is None:
                            ttft = time.monotonic() - started
                        done = done or line == "data: [DONE]"
                    if not done:
                        error = "stream cut before [DONE]"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        self.requests.append(Request(started, time.monotonic(), ttft, error))


def status_error(status: int, body: bytes) -> str:
    """`HTTP <status>`, with the OpenAI-style error's code (else type) where the body has one:
    whose answer a failure was (the router's `no_replica`, an engine's own)."""
    try:
        parsed = json.loads(body)
        detail = parsed.get("error", parsed) if isinstance(parsed, dict) else {}
        what = (detail.get("code") or detail.get("type")) if isinstance(detail, dict) else None
    except ValueError:
        what = None
    return f"HTTP {status}" + (f" ({what})" if what else "")


# the demo's rates assume one replica serves this many requests/s: its burst (6/s) is 1.5x that,
# which three replicas sharing this machine's two cores still serve
DEMO_CAPACITY = 4.0
MAX_TOKENS = 48  # the answer each request of the load asks for


@dataclass(frozen=True)
class Calibration:
    """What one busy replica served: the rate phases are scaled by, and the tokens a request of
    the load costs as the engine's own counters (the ones kvscale's law reads) count them."""

    requests_per_s: float
    tokens_per_request: float

    @property
    def tokens_per_s(self) -> float:
        return self.requests_per_s * self.tokens_per_request


def calibrate(
    url: str, seconds: float = 15.0, concurrency: int = 8, ignore_eos: bool = False
) -> Calibration:
    """One replica behind `url` kept busy by `concurrency` clients: the requests/s it completes
    (phases scaled by it load every machine alike: a burst 1.5x what one replica serves) and the
    prompt + generated tokens each cost (the prompt as the model's tokenizer splits it, the
    answer as long as the engine made it: not a count assumed here)."""
    load = _Load(url, MAX_TOKENS, ignore_eos)
    before = served_tokens(url)

    async def main() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            end = time.monotonic() + seconds

            async def client_loop(n: int) -> None:
                while time.monotonic() < end:
                    await load.one(client, n)
                    n += concurrency

            await asyncio.gather(*(client_loop(k) for k in range(concurrency)))

    asyncio.run(main())
    done = sum(1 for r in load.requests if r.error is None)
    if not done:
        raise AssertionError(f"no request to {url} completed while calibrating")
    return Calibration(done / seconds, (served_tokens(url) - before) / done)


def served_tokens(url: str) -> float:
    """Prompt + generated tokens an engine has served (vLLM's counters, which both engines keep)."""
    samples = parse_prometheus_text(httpx.get(f"{url}/metrics", timeout=30).text)
    counts = [total(samples, f"vllm:{kind}_tokens_total") for kind in ("prompt", "generation")]
    if None in counts:
        raise AssertionError(f"{url}/metrics has no vllm:prompt/generation_tokens_total")
    return sum(c or 0.0 for c in counts)


def scaled(phases: Sequence[Phase], capacity: float) -> list[Phase]:
    """`phases` (written for DEMO_CAPACITY) for a replica that serves `capacity` requests/s."""
    return [Phase(p.name, round(p.rate * capacity / DEMO_CAPACITY, 2), p.seconds) for p in phases]


def _sample(api: KubeApi, namespace: str) -> Sample:
    found = api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{DEPLOYMENT}")
    status = found.get("status", {})
    return Sample(
        t=time.monotonic(),
        desired=int(found["spec"].get("replicas", 0)),
        replicas=int(status.get("replicas", 0)),
        ready=int(status.get("readyReplicas", 0)),
    )


class _Sampler:
    def __init__(self, api: KubeApi, namespace: str, into: list[Sample]) -> None:
        self.api, self.namespace, self.into = api.clone(), namespace, into
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.api.close()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            try:
                self.into.append(_sample(self.api, self.namespace))
            except Exception:  # a missed sample: the next one comes in a second
                continue


def replay(
    api: KubeApi,
    namespace: str,
    url: str,
    autoscaler: str,
    phases: Sequence[Phase],
    settle_s: float,
    max_tokens: int = MAX_TOKENS,
    ignore_eos: bool = False,
    lead_in_s: float = 0.0,
) -> Run:
    """Replay `phases` against `url`, then keep the last phase's rate until the Deployment is
    back at its minimum (at most `settle_s`, folded into the last phase). A lead-in first holds
    the first phase's rate for `lead_in_s`, outside `run.phases`: the figures leave it out."""
    run = Run(autoscaler)
    with _Sampler(api, namespace, run.samples), _Load(url, max_tokens, ignore_eos) as load:
        if lead_in_s > 0 and phases:
            load.rate = phases[0].rate
            time.sleep(lead_in_s)
        for i, phase in enumerate(phases):
            start = time.monotonic()  # before the rate: no request of the phase precedes it
            load.rate = phase.rate
            time.sleep(phase.seconds)
            if i == len(phases) - 1:
                with_min = lambda: _sample(api, namespace).replicas == MIN_REPLICAS  # noqa: E731
                # measured as it is where it does not come back: the figures show where it stopped
                with contextlib.suppress(AssertionError):
                    wait_for(with_min, settle_s, f"{autoscaler} back at {MIN_REPLICAS}", 1.0)
            run.phases.append((phase.name, start, time.monotonic()))
        load.rate = 0
    run.requests = sorted(load.requests, key=lambda r: r.started)
    return run
