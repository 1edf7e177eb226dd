"""kvscale's alerts fire on the local cluster from the real operator: a metrics outage.

kvscale is installed from manifests/ (the operator runs as a pod; the e2e Prometheus scrapes its
`kvscale_operator_*` series in a job of its own, with honor_labels, and evaluates
manifests/prometheus/alerting-rules.yaml). An endpoint reads its signals from a second Prometheus,
run by this test with the cluster's discovery and scrape configuration. Stopping that one is the
outage: the operator sets MetricsAvailable=False (Unreachable) and exports
`kvscale_operator_metrics_available 0`; KvscaleMetricsStale goes pending at once and fires after
its real `for: 2m`, labelled with the endpoint's namespace and name; when the signal source
answers again the alert resolves. The whole test takes about four minutes, most of it the `for`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvscale_cluster import process
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.ports import free_port
from kvscale_cluster.prometheus import alerts, prometheus_binary

ALERT = "KvscaleMetricsStale"
FOR_S = 120  # the rule's `for`


def _endpoint(prometheus_url: str) -> dict[str, Any]:
    return {
        "apiVersion": "kvscale.io/v1alpha1",
        "kind": "LLMEndpoint",
        "metadata": {"name": "chat"},
        "spec": {
            "model": {"name": "tiny", "source": {"dummy": {"preset": "llama-tiny"}}},
            "resources": {"gpusPerReplica": 0, "cpu": "500m", "memory": "1Gi"},
            "scaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "capacityIntervalSeconds": 10,
                "routingIntervalSeconds": 2,
                "signals": {"source": "prometheus", "prometheusUrl": prometheus_url},
            },
        },
    }


def _start_prometheus(cluster: Cluster, address: str, work: Path) -> process.Component:
    """The endpoint's own signal source: the cluster's scrape configuration on `address`, where
    the operator's pod reaches it (the host's address on the pod network)."""
    argv = [
        prometheus_binary(),
        f"--config.file={cluster.directory / 'prometheus' / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address={address}",
        "--log.level=warn",
    ]
    prom = process.start("prometheus-signals", argv, work)

    def ready() -> bool:
        try:
            return httpx.get(f"http://{address}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(lambda: process.alive(prom.pid) and ready(), 60, "the signals Prometheus")
    return prom


def _metrics_condition(cluster: Cluster, namespace: str) -> dict[str, Any]:
    out = kubectl(cluster, "-n", namespace, "get", "llme", "chat", "-o", "json").stdout
    conditions = json.loads(out).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "MetricsAvailable"), {})


def _exported(cluster: Cluster, namespace: str) -> float | None:
    """kvscale_operator_metrics_available of the endpoint, as the cluster's Prometheus has it."""
    query = f'kvscale_operator_metrics_available{{namespace="{namespace}", endpoint="chat"}}'
    response = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": query})
    result = response.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def _stale(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return [
        a
        for a in alerts(cluster.prometheus_url)
        if a["labels"]["alertname"] == ALERT
        and a["labels"].get("namespace") == namespace
        and a["labels"].get("endpoint") == "chat"
    ]


def _state(cluster: Cluster, namespace: str, state: str) -> dict[str, Any] | None:
    return next((a for a in _stale(cluster, namespace) if a["state"] == state), None)


@pytest.mark.timeout(900)
def test_metrics_stale_fires_from_the_operator_during_a_metrics_outage_and_resolves(
    cluster: Cluster, installed: None, namespace: str, tmp_path: Path
) -> None:
    address = f"{cluster.host_ip}:{free_port(cluster.host_ip)}"
    prom = _start_prometheus(cluster, address, tmp_path)
    try:
        body = json.dumps(_endpoint(f"http://{address}"))
        kubectl(cluster, "apply", "--server-side", "-n", namespace, "-f", "-", stdin=body)
        kubectl(cluster, "-n", namespace, "wait", "llme/chat", "--for=condition=Available",
                "--timeout=300s")  # fmt: skip
        wait_for(
            lambda: _metrics_condition(cluster, namespace).get("status") == "True",
            180,
            "MetricsAvailable=True from the signals Prometheus",
        )
        wait_for(lambda: _exported(cluster, namespace) == 1, 90, "metrics_available 1 scraped")
        assert not _stale(cluster, namespace), "stale alert while the signals are fresh"

        process.stop(prom.pid)  # the outage
        wait_for(
            lambda: _metrics_condition(cluster, namespace).get("reason") == "Unreachable",
            90,
            "MetricsAvailable=False, Unreachable",
        )
        wait_for(lambda: _exported(cluster, namespace) == 0, 60, "metrics_available 0 scraped")
        pending = wait_for(lambda: _state(cluster, namespace, "pending"), 60, f"{ALERT} pending")
        firing = wait_for(
            lambda: _state(cluster, namespace, "firing"), FOR_S + 120, f"{ALERT} firing"
        )
        assert firing["activeAt"] == pending["activeAt"]  # one outage, one alert
        assert firing["labels"]["severity"] == "warning"
        assert f"LLMEndpoint {namespace}/chat" in firing["annotations"]["description"]

        prom = _start_prometheus(cluster, address, tmp_path)  # the source answers again
        wait_for(
            lambda: _metrics_condition(cluster, namespace).get("status") == "True",
            120,
            "MetricsAvailable=True again",
        )
        wait_for(lambda: not _stale(cluster, namespace), 60, f"{ALERT} resolved")
    finally:
        process.stop(prom.pid)
