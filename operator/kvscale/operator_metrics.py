"""The operator's own Prometheus metrics: what the control loops decided and measured, how its
passes and API calls went, and each endpoint's SLO targets for the alerting rules to join on.

One registry per operator (held by the workers, never a module global), served on
`--metrics-port` (default 8081) for the same scrape annotations as the engines.
"""

from __future__ import annotations

import contextlib
import platform
import threading
import time
from collections.abc import Iterator
from importlib import metadata
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from kvscale.api import v1alpha1 as api
from kvscale.controllers.capacity import Decision
from kvscale.signals.contract import ITL_BUCKETS, TTFT_BUCKETS, bucket_at_or_above
from kvscale.signals.snapshot import Snapshot

LABELS = ("namespace", "endpoint")
PREFIX = "kvscale_operator_"
# a pass or a Kubernetes API call: milliseconds up to the API client's read timeout and beyond
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def version() -> str:
    """kvscale's installed version ("unknown" when run from a tree that is not installed)."""
    try:
        return metadata.version("kvscale")
    except metadata.PackageNotFoundError:
        return "unknown"


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
        self.slo_ttft = gauge(
            "endpoint_slo_ttft_seconds",
            "spec.slo.ttftP99Seconds; `le` is the TTFT bucket bound the rules count up to",
            ("le",),
        )
        self.slo_itl = gauge(
            "endpoint_slo_itl_seconds",
            "spec.slo.itlP99Seconds; `le` is the ITL bucket bound the rules count up to",
            ("le",),
        )
        self.slo_target = gauge(
            "endpoint_slo_attainment_target_ratio",
            "spec.slo.attainmentTarget: the share of requests that must be good (0..1)",
        )
        self._pods: dict[tuple[str, str], set[str]] = {}
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
        # the operator's own health
        self.build_info = Gauge(
            PREFIX + "build_info",
            "1, labelled with the operator's version",
            ("version", "python_version"),
            registry=r,
        )
        self.build_info.labels(version(), platform.python_version()).set(1)
        self.reconciles = Counter(
            PREFIX + "reconcile",
            "Passes of the endpoint workers, by handler (pass: one tick of the loops and the "
            "status write; reconcile: applying the children) and result (success, error)",
            ("handler", "result"),
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            PREFIX + "reconcile_duration_seconds",
            "Duration of the endpoint workers' passes, by handler and result",
            ("handler", "result"),
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            PREFIX + "errors",
            "Errors a worker caught and retried, by handler and exception type",
            ("handler", "kind"),
            registry=r,
        )
        self.kube_seconds = Histogram(
            PREFIX + "kube_request_duration_seconds",
            "Kubernetes API requests, by verb, resource and HTTP status (0: no answer)",
            ("verb", "resource", "code"),
            buckets=DURATION_BUCKETS,
            registry=r,
        )

    @contextlib.contextmanager
    def reconciling(self, handler: str) -> Iterator[None]:
        """Count and time what runs inside as one `handler` pass; a cancellation is no result."""
        start = time.perf_counter()
        try:
            yield
        except Exception:
            self._reconciled(handler, "error", start)
            raise
        self._reconciled(handler, "success", start)

    def _reconciled(self, handler: str, result: str, start: float) -> None:
        self.reconciles.labels(handler, result).inc()
        self.reconcile_seconds.labels(handler, result).observe(time.perf_counter() - start)

    def error(self, handler: str, err: BaseException) -> None:
        self.errors.labels(handler, type(err).__name__).inc()

    def kube_request(self, verb: str, resource: str, code: int, seconds: float) -> None:
        self.kube_seconds.labels(verb, resource, str(code)).observe(seconds)

    def slo(self, key: tuple[str, str], slo: api.SLOSpec) -> None:
        """The endpoint's targets, as the recording rules read them."""
        for metric, target, buckets in (
            (self.slo_ttft, slo.ttft_p99_seconds, TTFT_BUCKETS),
            (self.slo_itl, slo.itl_p99_seconds, ITL_BUCKETS),
        ):
            le = bucket_at_or_above(target, buckets)
            _drop(metric, (*LABELS, "le"), key, keep=(*key, le))
            metric.labels(*key, le).set(target)
        self.slo_target.labels(*key).set(slo.attainment_target)

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
        """The replicas' weights; a pod that is gone loses its series."""
        for pod in self._pods.get(key, set()) - set(weights):
            with contextlib.suppress(KeyError):
                self.weight.remove(*key, pod)
        self._pods[key] = set(weights)
        for pod, w in weights.items():
            self.weight.labels(*key, pod).set(w)

    def forget(self, key: tuple[str, str]) -> None:
        """Drop every series of an endpoint (it was deleted)."""
        self._pods.pop(key, None)
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
            self.gpu_seconds,
            self.slo_target,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(*key)
        _drop(self.weight, (*LABELS, "pod"), key)
        _drop(self.decisions, (*LABELS, "reason"), key)
        _drop(self.slo_ttft, (*LABELS, "le"), key)
        _drop(self.slo_itl, (*LABELS, "le"), key)


def _drop(
    metric: Gauge | Counter,
    names: tuple[str, ...],
    key: tuple[str, str],
    keep: tuple[str, ...] | None = None,
) -> None:
    """Remove `metric`'s series of endpoint `key` (labels `names`, endpoint labels first), but
    `keep`."""
    children = {
        tuple(sample.labels[n] for n in names)
        for family in metric.collect()
        for sample in family.samples
    }
    for values in children:
        if values[: len(key)] == key and values != keep:
            metric.remove(*values)
