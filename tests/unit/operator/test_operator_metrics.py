"""The operator's /metrics keeps its `kvscale_operator:*` names whatever format Prometheus asks
for first (prometheus_client escapes colons to `_` in OpenMetrics)."""

from __future__ import annotations

import httpx

from kvscale.operator_metrics import OperatorMetrics

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def test_metrics_keep_their_colon_names_when_openmetrics_is_asked_for() -> None:
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
    assert (
        'kvscale_operator:desired_replicas{endpoint="chat",namespace="prod"} 3.0' in response.text
    )
    assert "kvscale_operator_desired_replicas" not in response.text
