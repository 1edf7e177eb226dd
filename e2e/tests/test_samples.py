"""kvscale installed from manifests/ as a platform team would, and every sample endpoint serving.

The operator runs as a pod under its own ServiceAccount; each sample is applied with kubectl and
waited on until `Available`; then the engine answers the official `openai` client on its pod IP
and Prometheus has its vLLM-compatible metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.install import ROOT

# vllm-*.yaml: test_vllm.py applies them (vLLM's start-up and its checkpoint are that module's)
SAMPLES = sorted(
    s for s in (ROOT / "manifests" / "samples").glob("*.yaml") if not s.name.startswith("vllm-")
)


def _engine_pods(cluster: Cluster, namespace: str, endpoint: str) -> list[dict[str, Any]]:
    out = kubectl(
        cluster,
        "-n",
        namespace,
        "get",
        "pods",
        "-o",
        "json",
        "-l",
        f"kvscale.io/endpoint={endpoint}",
    ).stdout
    pods: list[dict[str, Any]] = json.loads(out)["items"]
    return pods


def _prometheus_has(cluster: Cluster, query: str) -> bool:
    url = f"{cluster.prometheus_url}/api/v1/query"
    result = httpx.get(url, params={"query": query}, timeout=5).json()["data"]["result"]
    return bool(result)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.stem for s in SAMPLES])
def test_sample_becomes_available_and_serves(
    cluster: Cluster, installed: None, namespace: str, sample: Path
) -> None:
    body = yaml.safe_load(sample.read_text())
    name, model = body["metadata"]["name"], body["spec"]["model"]["name"]
    kubectl(cluster, "apply", "--server-side", "-n", namespace, "-f", str(sample))
    kubectl(
        cluster,
        "-n",
        namespace,
        "wait",
        f"llme/{name}",
        "--for=condition=Available",
        "--timeout=300s",
    )
    table = kubectl(cluster, "-n", namespace, "get", "llme", name).stdout
    assert model in table and "True" in table, table

    ip = _engine_pods(cluster, namespace, name)[0]["status"]["podIP"]
    client = openai.OpenAI(base_url=f"http://{ip}:8000/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(model=model, prompt="Hello", max_tokens=8)
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    assert completion.choices[0].finish_reason == "length"

    query = f'vllm:generation_tokens_total{{model_name="{model}",namespace="{namespace}"}}'
    wait_for(lambda: _prometheus_has(cluster, query), 60, f"Prometheus to scrape {query}")
