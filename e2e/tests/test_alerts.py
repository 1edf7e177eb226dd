"""The e2e Prometheus evaluates kvscale's alerting rules on what it scrapes, and keeps the labels
of the operator's series (its own scrape job, with honor_labels).

A pod labelled like the operator exports `kvscale_operator:metrics_available 0` for an endpoint
in another namespace, as the operator does while it cannot read an endpoint's metrics; the
KvscaleMetricsStale alert must go pending at once and fire after its `for: 2m`, labelled with the
endpoint's namespace, not the pod's.
"""

from __future__ import annotations

import textwrap
from typing import Any

import httpx
from kubernetes import client

from kvscale_cluster.fixtures import Cluster, wait_for
from kvscale_cluster.prometheus import alerts

PORT = 9100


def _exporter(namespace: str, text: str) -> dict[str, Any]:
    script = textwrap.dedent(
        f"""
        import http.server
        BODY = {text.encode()!r}
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(BODY)
        http.server.HTTPServer(("0.0.0.0", {PORT}), Handler).serve_forever()
        """
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "operator-metrics",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "kvscale-operator"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT)},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "kvscale/testserver",
                    "command": ["python", "-c", script],
                    "ports": [{"name": "metrics", "containerPort": PORT}],
                }
            ]
        },
    }


def _stale(cluster: Cluster, namespace: str, state: str) -> bool:
    return any(
        a["labels"]["alertname"] == "KvscaleMetricsStale"
        and a["labels"].get("namespace") == namespace
        and a["labels"].get("endpoint") == "chat"
        and a["state"] == state
        for a in alerts(cluster.prometheus_url)
    )


def test_metrics_stale_alert_fires_with_the_endpoints_labels(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    described = f"{namespace}-apps"  # the endpoint's namespace, not the exporting pod's
    text = (
        "# TYPE kvscale_operator:metrics_available gauge\n"
        f'kvscale_operator:metrics_available{{namespace="{described}",endpoint="chat"}} 0\n'
    )
    client.CoreV1Api(kube).create_namespaced_pod(namespace, _exporter(namespace, text))

    query = f'kvscale_operator:metrics_available{{namespace="{described}"}}'

    def scraped() -> bool:
        response = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": query})
        return bool(response.json()["data"]["result"])

    wait_for(scraped, 90, f"Prometheus to scrape {query}")
    wait_for(lambda: _stale(cluster, described, "pending"), 30, "KvscaleMetricsStale pending")
    wait_for(lambda: _stale(cluster, described, "firing"), 180, "KvscaleMetricsStale firing")
    firing = next(
        a for a in alerts(cluster.prometheus_url) if a["labels"].get("namespace") == described
    )
    assert firing["labels"]["severity"] == "warning"
    assert f"LLMEndpoint {described}/chat" in firing["annotations"]["description"]
