"""What the tiers read back from the cluster: an LLMEndpoint's status and its conditions, a pod's
readiness and its one container's status, and the address of an endpoint's Service and whether
it takes connections yet."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

from kvscale.kube import Kube

API = "kvscale.io/v1alpha1"
JSON = dict[str, Any]


def status(api: Kube, namespace: str, name: str) -> JSON:
    """The endpoint's `status` (empty before the operator wrote one)."""
    found = api.get(API, "LLMEndpoint", namespace, name)
    assert found is not None, f"no LLMEndpoint {namespace}/{name}"
    return dict(found.get("status") or {})


def condition(st: JSON, type_: str) -> JSON:
    """The condition of that type in a status, empty when it has none."""
    return next((c for c in st.get("conditions", []) if c["type"] == type_), {})


def ready(pod: JSON) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def container_status(pod: JSON) -> JSON:
    """The status of the pod's only container (empty before the kubelet reported one)."""
    (found,) = pod.get("status", {}).get("containerStatuses") or [{}]
    return dict(found)


def service_url(api: Kube, namespace: str, name: str, port: int = 8000) -> str:
    """`http://<ClusterIP>:<port>` of the Service `name`: where clients reach an endpoint."""
    service = api.get("v1", "Service", namespace, name)
    assert service is not None, f"no Service {namespace}/{name}"
    return f"http://{service['spec']['clusterIP']}:{port}"


def accepts_connections(url: str) -> bool:
    """Whether `http://host:port` takes a TCP connection now. A Service's endpoints reach the
    proxy a moment after its pods turn Ready (the EndpointSlice controller, then the proxy's
    watch), as with kube-proxy; until then a ClusterIP refuses connections."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=3):
            return True
    except OSError:
        return False
