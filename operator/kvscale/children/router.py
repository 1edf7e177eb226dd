"""Renders what the operator creates for an endpoint's router, as plain dicts for server-side
apply: its ServiceAccount, Role and RoleBinding (read the engine pods, EndpointSlices and the
routing ConfigMap), the router Deployment, the Service `<name>` clients use, and the routing
ConfigMap `<name>-routing`.

The ConfigMap is rendered without `data`: the routing loop publishes `weights.json` into it under
its own field manager, so that re-applying the children never removes the published weights.
"""

from __future__ import annotations

import json

from kvscale.api import v1alpha1 as api
from kvscale.api.images import DEFAULTS, DefaultImages
from kvscale.children import overrides
from kvscale.children.engine import (
    JSON,
    Owner,
    http_service,
    labels,
    metadata,
    probe,
    restricted_security,
    selector_labels,
)
from kvscale.children.engine_args import ENGINE_PORT

ROUTER_PORT = 8080
ROUTER_COMMAND = "kvscale-router"
ROUTER_DRAIN_SECONDS = 30
# after SIGTERM the router serves this long with /ready false, closing each connection after its
# response, before it stops accepting: the Service's endpoints and clients' pools move on first
ROUTER_SHUTDOWN_GRACE_SECONDS = 5
ROLE = "router"


def router_name(endpoint: str) -> str:
    return f"{endpoint}-router"


def routing_configmap_name(endpoint: str) -> str:
    return f"{endpoint}-routing"


def client_url(owner: Owner) -> str:
    """The in-cluster base URL of the OpenAI API clients use: the router Service `<name>`."""
    return f"http://{owner.name}.{owner.namespace}.svc:{ENGINE_PORT}/v1"


def router_replicas(spec: api.LLMEndpointSpec) -> int:
    """Two routers (no single point of failure) once the endpoint may have two replicas."""
    most = spec.replicas if spec.replicas is not None else spec.scaling.max_replicas
    return 2 if max(most, spec.scaling.max_replicas) >= 2 else 1


def router_image(images: DefaultImages) -> str:
    """The operator's default router image, for every endpoint: a pinned engine image or a vLLM
    engine does not decide which router fronts it (they meet over HTTP and /metrics)."""
    return images.router


def router_args(owner: Owner, spec: api.LLMEndpointSpec) -> list[str]:
    args = [
        "--endpoint", owner.name, "--namespace", owner.namespace,
        "--port", str(ROUTER_PORT), "--engine-port", str(ENGINE_PORT),
        "--block-size", str(spec.engine.block_size),
        "--shutdown-grace-seconds", str(ROUTER_SHUTDOWN_GRACE_SECONDS),
        "--drain-seconds", str(ROUTER_DRAIN_SECONDS),
    ]  # fmt: skip
    if spec.traffic_classes:
        classes = [c.rendered() for c in spec.traffic_classes]
        args += ["--traffic-classes", json.dumps(classes, separators=(",", ":"))]
    return args


def service_account(owner: Owner) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(owner, router_name(owner.name), ROLE),
    }


def role(owner: Owner) -> JSON:
    read = ["get", "list", "watch"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(owner, router_name(owner.name), ROLE),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [routing_configmap_name(owner.name)],
                "verbs": read,
            },
        ],
    }


def role_binding(owner: Owner) -> JSON:
    name = router_name(owner.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(owner, name, ROLE),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }


def _container(owner: Owner, spec: api.LLMEndpointSpec, images: DefaultImages) -> JSON:
    return {
        "name": ROLE,
        "image": router_image(images),
        "command": [ROUTER_COMMAND],
        "args": router_args(owner, spec),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "readinessProbe": probe("/ready", 2, 2),
        "livenessProbe": probe("/health", 10, 3),
        "securityContext": restricted_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def router_deployment(
    owner: Owner, spec: api.LLMEndpointSpec, images: DefaultImages = DEFAULTS
) -> JSON:
    match = selector_labels(owner.name, ROLE)
    spread = {
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": match},
            "topologyKey": "kubernetes.io/hostname",
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, router_name(owner.name), ROLE),
        "spec": {
            "replicas": router_replicas(spec),
            "selector": {"matchLabels": match},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {
                    "labels": labels(owner.name, ROLE),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(ROUTER_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": overrides.router_placement(
                    overrides.pull_secrets(
                        {
                            "serviceAccountName": router_name(owner.name),
                            "automountServiceAccountToken": True,  # it watches the API
                            "containers": [_container(owner, spec, images)],
                            "terminationGracePeriodSeconds": ROUTER_SHUTDOWN_GRACE_SECONDS
                            + ROUTER_DRAIN_SECONDS
                            + 5,
                            "affinity": {
                                "podAntiAffinity": {
                                    "preferredDuringSchedulingIgnoredDuringExecution": [spread]
                                }
                            },
                            "securityContext": {
                                "runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "volumes": [{"name": "tmp", "emptyDir": {}}],
                        },
                        spec.pod_template,
                    ),
                    spec.router,
                ),
            },
        },
    }


def router_service(owner: Owner) -> JSON:
    """`<name>`: the address clients use, on the engine's port, served by the routers."""
    return http_service(owner, owner.name, ROLE)


def routing_configmap(owner: Owner) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, routing_configmap_name(owner.name), ROLE),
    }


def render_router(
    owner: Owner, spec: api.LLMEndpointSpec, images: DefaultImages = DEFAULTS
) -> list[JSON]:
    """Every router child, in the order they are applied (RBAC before the pods that use it)."""
    return [
        service_account(owner),
        role(owner),
        role_binding(owner),
        routing_configmap(owner),
        router_service(owner),
        router_deployment(owner, spec, images),
    ]
