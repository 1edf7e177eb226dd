"""Debian's Prometheus, discovering pods through our API server.

Debian builds Prometheus without ``kubernetes_sd_configs``; ``pod_discovery`` serves the same
pod targets and ``__meta_kubernetes_pod_*`` labels over ``http_sd_configs``, so the relabelling
below is exactly what a real cluster's Prometheus (``kubernetes_sd_configs: [{role: pod}]``) uses.
Pods opt in with the usual annotations: ``prometheus.io/scrape: "true"``, ``prometheus.io/port``
and ``prometheus.io/path`` (default ``/metrics``). Targets carry ``namespace``, ``pod`` and
``node`` labels plus the pod's labels. Scrapes every 2 s; data is kept for 2 h. kvscale's
recording and alerting rules (``manifests/prometheus/*-rules.yaml``) are loaded as a user's own
Prometheus would load them, evaluated every 2 s. The operator's pod (label
``app.kubernetes.io/name: kvscale-operator``) is scraped by its own job with ``honor_labels``:
its ``kvscale_operator_*`` series carry the ``namespace`` of the endpoint they describe, which the
pod's own ``namespace`` target label would otherwise push aside into ``exported_namespace``.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from . import process
from .ports import free_port
from .wait import GiveUp, wait_for

SCRAPE_INTERVAL = "2s"
RULE_FILES = tuple(
    sorted((Path(__file__).resolve().parents[2] / "manifests" / "prometheus").glob("*-rules.yaml"))
)


OPERATOR_POD = {
    "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
    "regex": "kvscale-operator",
}


def _config(discovery_url: str) -> dict[str, object]:
    relabel: list[dict[str, object]] = [
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
            "regex": "true",
            "action": "keep",
        },
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
            "regex": "(.+)",
            "target_label": "__metrics_path__",
        },
        {
            "source_labels": [
                "__meta_kubernetes_pod_ip",
                "__meta_kubernetes_pod_annotation_prometheus_io_port",
            ],
            "regex": "(.+);([0-9]+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    ]
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [str(path) for path in RULE_FILES],
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "scrape_timeout": "1s",
                "http_sd_configs": [{"url": discovery_url, "refresh_interval": SCRAPE_INTERVAL}],
                "relabel_configs": [{**OPERATOR_POD, "action": "drop"}, *relabel],
            },
            {
                "job_name": "kvscale-operator",
                "scrape_timeout": "1s",
                "honor_labels": True,
                "http_sd_configs": [{"url": discovery_url, "refresh_interval": SCRAPE_INTERVAL}],
                "relabel_configs": [{**OPERATOR_POD, "action": "keep"}, *relabel],
            },
        ],
    }


def alerts(prometheus_url: str) -> list[dict[str, Any]]:
    """The alerts Prometheus holds now, pending or firing (``/api/v1/alerts``), each with
    ``labels``, ``annotations``, ``state`` and ``activeAt``."""
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/alerts", timeout=5) as response:
        found: list[dict[str, Any]] = json.load(response)["data"]["alerts"]
    return found


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(found).exists():
        raise RuntimeError("prometheus is not installed; run `make system-deps`")
    return found


def _ready(url: str, component: process.Component) -> bool:
    if not process.alive(component.pid):
        raise GiveUp(f"{component.name} exited:\n{process.tail(component.log)}")
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def start_prometheus(
    kubeconfig: Path, work: Path, logs: Path, host: str
) -> tuple[list[process.Component], str]:
    """Start pod discovery and Prometheus (listening on ``host``); return both and its URL."""
    work.mkdir(parents=True, exist_ok=True)
    discovery_port = free_port()
    discovery = process.start(
        "pod-discovery",
        [
            sys.executable,
            "-m",
            "kvscale_cluster.pod_discovery",
            f"--kubeconfig={kubeconfig}",
            f"--port={discovery_port}",
        ],
        logs,
    )
    discovery_url = f"http://127.0.0.1:{discovery_port}/targets"
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump(_config(discovery_url), sort_keys=False))
    url = f"http://{host}:{free_port(host)}"
    argv = [
        prometheus_binary(),
        f"--config.file={config}",
        f"--storage.tsdb.path={work / 'data'}",
        "--storage.tsdb.retention.time=2h",
        f"--web.listen-address={url.removeprefix('http://')}",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]
    prom = process.start("prometheus", argv, logs)
    wait_for(lambda: _ready(discovery_url, discovery), 30, "pod discovery /targets")
    wait_for(lambda: _ready(f"{url}/-/ready", prom), 30, "prometheus /-/ready")
    return [discovery, prom], url
