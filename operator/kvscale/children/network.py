"""The NetworkPolicy that fences an endpoint's engine pods, `<name>-engine`.

An engine's admin port (drain, undrain) has no authentication: only the operator may reach it.
The OpenAI port (8000: the API, probes, /metrics) is for the endpoint's own routers, the operator
(direct scrape of /metrics) and metrics scrapers in namespaces a cluster admin labels
`kvscale.io/metrics-scraper=true`. Kubelet probes come from the node, which NetworkPolicy
implementations let through. The policy only restricts ingress: what engines reach is unchanged.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from kvscale.children.engine import JSON, Owner, engine_name, metadata, selector_labels
from kvscale.children.engine_args import ENGINE_PORT

OPERATOR_LABELS = {"app.kubernetes.io/name": "kvscale-operator"}  # manifests/base/operator.yaml
SCRAPER_LABEL = "kvscale.io/metrics-scraper"
NAMESPACE_ENV = "KVSCALE_OPERATOR_NAMESPACE"
DEFAULT_NAMESPACE = "kvscale-system"
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@functools.cache
def operator_namespace() -> str:
    """The namespace the operator's pods run in: $KVSCALE_OPERATOR_NAMESPACE, else its own pod's
    (a pod's service account files say it), else kvscale-system (the manifests' namespace)."""
    if os.environ.get(NAMESPACE_ENV):
        return os.environ[NAMESPACE_ENV]
    if POD_NAMESPACE_FILE.is_file():
        return POD_NAMESPACE_FILE.read_text().strip()
    return DEFAULT_NAMESPACE


def engine_network_policy(owner: Owner, operator_ns: str) -> JSON:
    """Ingress to the engine pods: every port from the operator, the OpenAI port from the
    endpoint's routers and from labelled scraper namespaces, nothing from anyone else."""
    operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_ns}},
        "podSelector": {"matchLabels": OPERATOR_LABELS},
    }
    routers = {"podSelector": {"matchLabels": selector_labels(owner.name, "router")}}
    scrapers = {"namespaceSelector": {"matchLabels": {SCRAPER_LABEL: "true"}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(owner, engine_name(owner.name)),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [operator]},  # every port: the API, /metrics and the admin port (drain)
                {
                    "from": [routers, scrapers],
                    "ports": [{"protocol": "TCP", "port": ENGINE_PORT}],
                },
            ],
        },
    }
