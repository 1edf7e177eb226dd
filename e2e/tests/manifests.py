"""Manifests the cluster tests apply: Deployments of the kvscale/testserver image."""

from __future__ import annotations

from typing import Any

PORT = 8080


def server_deployment(
    name: str,
    replicas: int,
    marker_dir: str = "",
    gpus: int = 0,
    term_delay: float = 0.5,
    grace: int = 10,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "server",
        "image": "kvscale/testserver:0.1",
        "args": ["--port", str(PORT), "--term-delay", str(term_delay)],
        "ports": [{"name": "http", "containerPort": PORT}],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "TERM_MARKER_DIR", "value": marker_dir},
        ],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
        "livenessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 2},
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name},
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(PORT),
                    },
                },
                "spec": {"terminationGracePeriodSeconds": grace, "containers": [container]},
            },
        },
    }


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": PORT, "targetPort": "http"}]},
    }


def pod(name: str, image: str, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image}
    for key in ("command", "args", "env"):
        if key in spec:
            container[key] = spec.pop(key)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], **spec},
    }
