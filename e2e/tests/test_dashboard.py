"""kvscale's Grafana dashboard: its JSON is rendered from render.py, every query parses, and every
query returns data from the e2e Prometheus (which loads kvscale's recording rules) while the tiny
sample serves completions through its Service: the engines' and routers' series, the recording
rules over them, and the operator's own kvscale_operator_* series, scraped from the operator's
pod (installed from manifests/, as a user installs it).

The endpoint gets short control intervals and a small per-replica capacity prior, so that the
load makes the real capacity loop scale it up: the scaling-decisions panel then has a decision
to count.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
import yaml
from dashboard_queries import DASHBOARD, dashboard_queries, load, substitute

from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.install import ROOT

SAMPLE = ROOT / "manifests" / "samples" / "tiny-dummy.yaml"
RENDER = DASHBOARD.parent / "render.py"


def _values(namespace: str, endpoint: str) -> dict[str, str]:
    return {"datasource": "prometheus", "namespace": namespace, "endpoint": endpoint}


# -- the dashboard itself
def test_dashboard_json_is_rendered_from_render_py() -> None:
    done = subprocess.run(
        [sys.executable, str(RENDER), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_every_panel_and_variable_query_is_extracted() -> None:
    dashboard = load()
    queries = dashboard_queries(dashboard)
    targets = sum(len(p.get("targets") or []) for p in dashboard["panels"])
    assert len(queries) == targets + 2  # + the namespace and endpoint variables
    assert any("kvscale_operator_" in q.expr for q in queries)


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each expression (as a recording rule)."""
    promtool = subprocess.run(["which", "promtool"], capture_output=True, text=True).stdout
    assert promtool.strip(), "promtool is not installed (`make system-deps`)"
    queries = dashboard_queries(load())
    rules = [
        {"record": f"dashboard:query_{i}", "expr": substitute(q.expr, _values("ns", "ep"))}
        for i, q in enumerate(queries)
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool.strip(), "check", "rules", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- on the cluster
def _result(cluster: Cluster, expr: str) -> list[float]:
    """The values of an instant query now (raises while Prometheus answers with an error)."""
    response = httpx.get(
        f"{cluster.prometheus_url}/api/v1/query", params={"query": expr}, timeout=5
    )
    body = response.json()
    assert body["status"] == "success", body
    return [float(item["value"][1]) for item in body["data"]["result"]]


def _serve_load(base_url: str, model: str, stop: threading.Event) -> None:
    """Completions one after another through the Service until ``stop``, so every rate and
    latency window has fresh requests."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    turn = 0
    while not stop.is_set():
        prompt = f"A shared system prompt for the dashboard test. Request {turn} asks:"
        # refusals and hiccups are data too: the queries judge the result
        with contextlib.suppress(openai.APIError):
            client.completions.create(model=model, prompt=prompt, max_tokens=8)
        turn += 1


def test_every_query_returns_data_from_the_e2e_prometheus(
    cluster: Cluster, installed: None, namespace: str
) -> None:
    body = yaml.safe_load(SAMPLE.read_text())
    name, model = body["metadata"]["name"], body["spec"]["model"]["name"]
    # decide every 10 s, and believe one replica carries 5 tokens/s until it learns better:
    # the load below then makes the operator scale up, a decision for the decisions panel
    body["spec"]["scaling"] |= {
        "maxReplicas": 2,
        "capacityIntervalSeconds": 10,
        "routingIntervalSeconds": 1,
        "replicaCapacityTokensPerSecond": 5,
    }
    apply = ["apply", "--server-side", "-n", namespace, "-f", "-"]
    kubectl(cluster, *apply, stdin=json.dumps(body))
    kubectl(cluster, "-n", namespace, "wait", f"llme/{name}", "--for=condition=Available",
            "--timeout=300s")  # fmt: skip
    # the Service users call: the endpoint's routers, which relay to the engines
    service = yaml.safe_load(
        kubectl(cluster, "-n", namespace, "get", "svc", name, "-o", "yaml").stdout
    )
    port = service["spec"]["ports"][0]["port"]
    base_url = f"http://{service['spec']['clusterIP']}:{port}/v1"
    models = f"{base_url}/models"
    wait_for(lambda: httpx.get(models, timeout=5).status_code == 200, 120, f"{models} answering")

    stop = threading.Event()
    load_thread = threading.Thread(target=_serve_load, args=(base_url, model, stop), daemon=True)
    load_thread.start()
    try:
        values = _values(namespace, name)
        for query in dashboard_queries(load()):
            expr = substitute(query.expr, values)

            def has_data(expr: str = expr) -> bool:
                found = _result(cluster, expr)
                return bool(found) and all(math.isfinite(v) for v in found)

            wait_for(has_data, 120, f"data for {query.where}: {expr}")
    finally:
        stop.set()
        load_thread.join(timeout=60)
