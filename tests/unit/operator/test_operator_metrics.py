"""The operator's /metrics: names Prometheus takes as they are, series that go with their pod or
endpoint, the endpoints' SLO targets, and the operator's own passes, errors and API calls."""

from __future__ import annotations

import asyncio
import platform
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from kubernetes import client

from kvscale.api.v1alpha1 import SLOSpec
from kvscale.controllers.capacity import CapacityState, Decision
from kvscale.kube import Kube, KubeError
from kvscale.operator_metrics import OperatorMetrics, version
from kvscale.signals.snapshot import Fleet, Snapshot

SNAP = Snapshot(taken_at=0.0, window_s=60, replicas=(), fleet=Fleet(current=1, ready=1))

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def test_metrics_keep_their_names_in_openmetrics() -> None:
    metrics = OperatorMetrics()
    port = metrics.serve(0)
    try:
        metrics.desired.labels("prod", "chat").set(3)
        response = httpx.get(
            f"http://127.0.0.1:{port}/metrics", headers={"Accept": PROMETHEUS_ACCEPT}
        )
    finally:
        metrics.close()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert (
        'kvscale_operator_desired_replicas{endpoint="chat",namespace="prod"} 3.0' in response.text
    )
    assert ":" not in "".join(
        line.split("{")[0] for line in response.text.splitlines() if not line.startswith("#")
    )


def _value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _series(metrics: OperatorMetrics, name: str) -> list[dict[str, str]]:
    return [s.labels for fam in metrics.registry.collect() for s in fam.samples if s.name == name]


def test_a_gone_pod_and_a_deleted_endpoint_lose_their_series() -> None:
    metrics = OperatorMetrics()
    d = Decision(3, "DemandForecast", "m", CapacityState(), 500.0, 600.0, 250.0)
    for key in (("ns", "ep"), ("ns", "other")):
        metrics.record(key, d, SNAP, 8, True, 0.9, 0.5, 0.01)
        metrics.slo(key, SLOSpec())
        metrics.weights(key, {"p0": 1.0, "p1": 0.5})
    metrics.weights(("ns", "ep"), {"p0": 1.0, "p2": 1.0})
    weighted = {
        (s["endpoint"], s["pod"]) for s in _series(metrics, "kvscale_operator_routing_weight")
    }
    assert weighted == {("ep", "p0"), ("ep", "p2"), ("other", "p0"), ("other", "p1")}

    metrics.forget(("ns", "ep"))
    for family in metrics.registry.collect():
        for sample in family.samples:
            assert sample.labels.get("endpoint") != "ep", sample
    assert _value(metrics, "kvscale_operator_gpu_seconds_total", namespace="ns", endpoint="other")


def test_slo_targets_are_exported_with_the_bucket_the_rules_count_up_to() -> None:
    metrics = OperatorMetrics()
    key = ("prod", "chat")
    metrics.slo(key, SLOSpec())  # the defaults: 2 s (no bucket bound: 2.5 holds it), 0.2 s
    assert _series(metrics, "kvscale_operator_endpoint_slo_ttft_seconds") == [
        {"namespace": "prod", "endpoint": "chat", "le": "2.5"}
    ]
    ttft = dict(namespace="prod", endpoint="chat", le="2.5")
    assert _value(metrics, "kvscale_operator_endpoint_slo_ttft_seconds", **ttft) == 2.0
    itl = dict(namespace="prod", endpoint="chat", le="0.2")
    assert _value(metrics, "kvscale_operator_endpoint_slo_itl_seconds", **itl) == 0.2
    target = "kvscale_operator_endpoint_slo_attainment_target_ratio"
    assert _value(metrics, target, namespace="prod", endpoint="chat") == 0.99

    metrics.slo(key, SLOSpec(ttft_p99_seconds=1.0, attainment_target=0.95))
    assert _series(metrics, "kvscale_operator_endpoint_slo_ttft_seconds") == [
        {"namespace": "prod", "endpoint": "chat", "le": "1"}
    ]
    assert _value(metrics, target, namespace="prod", endpoint="chat") == 0.95


def test_passes_are_counted_and_timed_by_handler_and_result() -> None:
    metrics = OperatorMetrics()
    with metrics.reconciling("pass"):
        pass
    with pytest.raises(KubeError), metrics.reconciling("reconcile"):
        raise KubeError(500, "boom")
    with pytest.raises(asyncio.CancelledError), metrics.reconciling("pass"):
        raise asyncio.CancelledError  # stopping a worker is not a result
    metrics.error("pass", KubeError(500, "boom"))
    total = "kvscale_operator_reconcile_total"
    assert _value(metrics, total, handler="pass", result="success") == 1
    assert _value(metrics, total, handler="pass", result="error") is None
    assert _value(metrics, total, handler="reconcile", result="error") == 1
    seconds = "kvscale_operator_reconcile_duration_seconds_count"
    assert _value(metrics, seconds, handler="reconcile", result="error") == 1
    errors = "kvscale_operator_errors_total"
    assert _value(metrics, errors, handler="pass", kind="KubeError") == 1


def test_build_info_names_the_version() -> None:
    (info,) = _series(OperatorMetrics(), "kvscale_operator_build_info")
    assert info["version"] and info["version"] == version()
    assert info["python_version"] == platform.python_version()


class _Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path.endswith("/chat")
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"kind": "Deployment"}' if found else b'{"message": "not found"}')

    def do_PATCH(self) -> None:
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"message": "forbidden"}')

    def log_message(self, *args: object) -> None:
        pass


def test_every_kube_api_request_is_timed_by_verb_resource_and_code() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    metrics = OperatorMetrics()
    configuration = client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    kube = Kube(client.ApiClient(configuration), observe=metrics.kube_request)
    try:
        assert kube.get("apps/v1", "Deployment", "ns", "chat") == {"kind": "Deployment"}
        assert kube.get("apps/v1", "Deployment", "ns", "gone") is None
        with pytest.raises(KubeError):
            kube.patch_endpoint_status("ns", "chat", {"replicas": 1})
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(KubeError):  # nobody answers now
        kube.get("v1", "Pod", "ns", "p")
    count = "kvscale_operator_kube_request_duration_seconds_count"
    assert _value(metrics, count, verb="GET", resource="deployments", code="200") == 1
    assert _value(metrics, count, verb="GET", resource="deployments", code="404") == 1
    assert _value(metrics, count, verb="PATCH", resource="llmendpoints/status", code="403") == 1
    assert _value(metrics, count, verb="GET", resource="pods", code="0") == 1
