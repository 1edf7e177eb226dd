"""What the demo watches: one `Sample` of an endpoint every couple of seconds.

The endpoint's own account comes from its `LLMEndpoint` status (what the operator decided,
published and measured), the fleet's view from Prometheus (the recording rules over the engines'
and routers' series), exactly the places an operator of the platform would look.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

API = ("kvscale.io", "v1alpha1", "llmendpoints")
QUERIES = {
    "waiting": "kvscale_endpoint:requests_waiting:sum",
    "running": "kvscale_endpoint:requests_running:sum",
    "held": "kvscale_endpoint:router_pending_requests:sum",
    "ttft_p99": "kvscale_endpoint:ttft_seconds:p99_rate1m",
    "tokens_per_s": "kvscale_endpoint:tokens:rate1m",
}


@dataclass(frozen=True)
class Sample:
    """The endpoint at `t` seconds into the load pattern."""

    t: float
    phase: str
    offered_rps: float
    desired: int | None = None
    replicas: int | None = None
    ready: int | None = None
    weights: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    message: str = ""
    demand: float | None = None  # tokens/s the capacity loop measured
    per_replica: float | None = None  # tokens/s one replica carries, as learned
    operator_ttft_p99: float | None = None  # the operator's last capacity window
    attainment: float | None = None
    cost_per_request: float | None = None
    currency: str = "USD"
    waiting: float | None = None
    running: float | None = None
    held: float | None = None
    ttft_p99: float | None = None  # Prometheus, over 1 min
    tokens_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(value: Any) -> float | None:
    try:
        found = float(value)
    except (TypeError, ValueError):
        return None
    return found if math.isfinite(found) else None


def from_status(t: float, phase: str, offered: float, status: dict[str, Any]) -> Sample:
    """The status fields of a sample (a pure function of the endpoint's status)."""
    capacity = status.get("capacity") or {}
    slo = status.get("slo") or {}
    cost = status.get("cost") or {}
    weights = (status.get("routing") or {}).get("weights") or {}
    return Sample(
        t=t,
        phase=phase,
        offered_rps=offered,
        desired=status.get("desiredReplicas"),
        replicas=status.get("replicas"),
        ready=status.get("readyReplicas"),
        weights={pod: float(w) for pod, w in weights.items()},
        reason=str(capacity.get("reason") or ""),
        message=str(capacity.get("message") or ""),
        demand=_number(capacity.get("demandTokensPerSecond")),
        per_replica=_number(capacity.get("perReplicaTokensPerSecond")),
        operator_ttft_p99=_number(slo.get("ttftP99Seconds")),
        attainment=_number(slo.get("attainment")),
        cost_per_request=_number(cost.get("perSuccessfulRequest")),
        currency=str(cost.get("currency") or "USD"),
    )


class Watcher:
    """Reads one endpoint's status and its Prometheus series."""

    def __init__(self, api_client: Any, prometheus_url: str, namespace: str, name: str) -> None:
        from kubernetes import client

        self.objects = client.CustomObjectsApi(api_client)
        self.http = httpx.Client(base_url=prometheus_url, timeout=5)
        self.namespace = namespace
        self.name = name

    def close(self) -> None:
        self.http.close()

    def _body(self) -> dict[str, Any]:
        group, version, plural = API
        body = self.objects.get_namespaced_custom_object(
            group, version, self.namespace, plural, self.name
        )
        return dict(body) if isinstance(body, dict) else {}

    def status(self) -> dict[str, Any]:
        return dict(self._body().get("status") or {})

    def spec(self) -> dict[str, Any]:
        return dict(self._body().get("spec") or {})

    def query(self, metric: str) -> float | None:
        selector = f'{{namespace="{self.namespace}", endpoint="{self.name}"}}'
        try:
            response = self.http.get("/api/v1/query", params={"query": metric + selector})
            result = response.json()["data"]["result"]
        except (httpx.HTTPError, ValueError, KeyError):
            return None
        return _number(result[0]["value"][1]) if result else None

    def sample(self, t: float, phase: str, offered: float, status: dict[str, Any]) -> Sample:
        base = from_status(t, phase, offered, status)
        seen = {key: self.query(metric) for key, metric in QUERIES.items()}
        return Sample(**{**base.to_dict(), **seen})
