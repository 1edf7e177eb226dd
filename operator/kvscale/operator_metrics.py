"""The operator's own Prometheus metrics: what the control loops decided and measured.

One registry per operator (held by the workers, never a module global), served on
`--metrics-port` (default 8081) for the same scrape annotations as the engines.
"""

from __future__ import annotations

import contextlib
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app

from kvscale.controllers.capacity import Decision
from kvscale.signals.snapshot import Snapshot

LABELS = ("namespace", "endpoint")
PREFIX = "kvscale_operator_"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        """Scrapes every few seconds are not worth a log line."""


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._server: WSGIServer | None = None
        r = self.registry

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(PREFIX + name, doc, (*LABELS, *extra), registry=r)

        self.desired = gauge("desired_replicas", "Replicas the operator decided")
        self.ready = gauge("ready_replicas", "Engine replicas Ready")
        self.max = gauge("max_replicas", "scaling.maxReplicas of the endpoint")
        self.demand = gauge("demand_tokens_per_second", "Token demand incl. queued backlog")
        self.forecast = gauge("forecast_tokens_per_second", "Demand forecast over the horizon")
        self.capacity = gauge(
            "replica_capacity_tokens_per_second", "Learned per-replica capacity within the SLO"
        )
        self.attainment = gauge(
            "slo_interval_attainment_ratio",
            "Share of recent capacity intervals whose p99s were within the SLO targets (0..1)",
        )
        self.metrics_available = gauge("metrics_available", "1 when the signals are usable")
        self.capacity_limited = gauge("capacity_limited", "1 when replicas cannot be scheduled")
        self.cost_per_request = gauge(
            "cost_per_successful_request", "Accumulated cost per successful request"
        )
        self.weight = gauge("routing_weight", "Routing weight of a replica", ("pod",))
        self.decisions = Counter(
            PREFIX + "scaling_decisions",
            "Capacity decisions that changed the replica count, by reason",
            (*LABELS, "reason"),
            registry=r,
        )
        self.gpu_seconds = Counter(
            PREFIX + "gpu_seconds",
            "GPU-seconds spent by the endpoint's replicas",
            LABELS,
            registry=r,
        )

    def serve(self, port: int) -> int:
        """Serve /metrics on `port` (0: any free port); returns the port."""
        app = make_wsgi_app(self.registry)
        self._server = make_server("", port, app, _Server, handler_class=_QuietHandler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def record(
        self,
        key: tuple[str, str],
        decision: Decision,
        snap: Snapshot,
        max_replicas: int,
        changed: bool,
        attainment: float | None,
        gpu_hours: float,
        cost_per_request: float | None,
    ) -> None:
        self.desired.labels(*key).set(decision.desired)
        self.ready.labels(*key).set(snap.fleet.ready)
        self.max.labels(*key).set(max_replicas)
        self.demand.labels(*key).set(decision.demand_tokens_per_s)
        self.forecast.labels(*key).set(decision.forecast_tokens_per_s)
        self.capacity.labels(*key).set(decision.per_replica_tokens_per_s)
        self.metrics_available.labels(*key).set(1 if snap.ok else 0)
        self.capacity_limited.labels(*key).set(1 if snap.fleet.unschedulable else 0)
        if attainment is not None:
            self.attainment.labels(*key).set(attainment)
        if cost_per_request is not None:
            self.cost_per_request.labels(*key).set(cost_per_request)
        if gpu_hours > 0:
            self.gpu_seconds.labels(*key).inc(gpu_hours * 3600)
        if changed:
            self.decisions.labels(*key, decision.reason).inc()

    def weights(self, key: tuple[str, str], weights: dict[str, float]) -> None:
        for pod, w in weights.items():
            self.weight.labels(*key, pod).set(w)

    def forget(self, key: tuple[str, str]) -> None:
        """Drop an endpoint's series (it was deleted)."""
        for metric in (
            self.desired,
            self.ready,
            self.max,
            self.demand,
            self.forecast,
            self.capacity,
            self.attainment,
            self.metrics_available,
            self.capacity_limited,
            self.cost_per_request,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(*key)
