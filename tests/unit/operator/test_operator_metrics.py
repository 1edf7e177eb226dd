"""The operator's /metrics answers Prometheus in OpenMetrics, which it asks for first, with the
names unchanged: they carry no colon for prometheus_client to escape."""

from __future__ import annotations

import httpx

from kvscale.operator_metrics import OperatorMetrics

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
