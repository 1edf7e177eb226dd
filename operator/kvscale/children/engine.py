"""Renders the objects an LLMEndpoint owns, as plain dicts ready for server-side apply.

Pure functions of the spec: the same spec always renders the same objects, with deterministic
names and labels, so applying them twice changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvscale.api import v1alpha1 as api
from kvscale.api.images import DEFAULTS, DefaultImages
from kvscale.children import overrides
from kvscale.children.engine_args import (
    DRAIN_SECONDS,
    ENDPOINTS,
    ENGINE_PORT,
    HUB_CACHE,
    MODEL_MOUNT,
    SHUTDOWN_GRACE_SECONDS,
    engine_args,
    engine_env,
    hub_link,
)

JSON = dict[str, Any]

MANAGED_BY = "kvscale"
ENDPOINT_LABEL = "kvscale.io/endpoint"
ROLE_LABEL = "kvscale.io/role"
GRACE_SECONDS = SHUTDOWN_GRACE_SECONDS + DRAIN_SECONDS + 15
STARTUP_PERIOD_SECONDS = 2
SHM_SIZE = "2Gi"  # vLLM's workers exchange tensors through /dev/shm (64 MiB by default)
FETCH_CONTAINER = "fetch-model"  # the init container of a huggingface source


@dataclass(frozen=True)
class Owner:
    """What an owner reference needs of the LLMEndpoint."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> JSON:
        return {
            "apiVersion": f"{api.GROUP}/{api.VERSION}",
            "kind": api.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def engine_name(endpoint: str) -> str:
    return f"{endpoint}-engine"


def selector_labels(endpoint: str, role: str = "engine") -> dict[str, str]:
    return {ENDPOINT_LABEL: endpoint, ROLE_LABEL: role}


def selector_string(endpoint: str, role: str = "engine") -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(endpoint, role).items()))


def labels(endpoint: str, role: str = "engine") -> dict[str, str]:
    return {
        "app.kubernetes.io/name": f"kvscale-{role}",
        "app.kubernetes.io/instance": endpoint,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        **selector_labels(endpoint, role),
    }


def metadata(owner: Owner, name: str, role: str = "engine") -> JSON:
    """A child's name, labels and owner reference (the endpoint: its deletion collects them)."""
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner.name, role),
        "ownerReferences": [owner.reference()],
    }


def restricted_security() -> JSON:
    """A container's securityContext: non-root, read-only root, no escalation, no capabilities."""
    return {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def http_service(owner: Owner, name: str, role: str) -> JSON:
    """A ClusterIP Service `name` on the engine's port, to the pods of `role`."""
    port = {"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name, role),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name, role),
            "ports": [port],
        },
    }


def desired_replicas(spec: api.LLMEndpointSpec) -> int:
    """The replica count before autoscaling: a pinned count, else the minimum."""
    if spec.replicas is not None:
        return spec.replicas
    return spec.scaling.min_replicas


def _resources(spec: api.LLMEndpointSpec) -> JSON:
    amounts: JSON = {"cpu": str(spec.resources.cpu), "memory": str(spec.resources.memory)}
    if spec.resources.gpus_per_replica:
        amounts["nvidia.com/gpu"] = str(spec.resources.gpus_per_replica)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _model_volume(spec: api.LLMEndpointSpec) -> tuple[list[JSON], list[JSON]]:
    """Volumes and mounts that bring the checkpoint into the engine container."""
    source = spec.model.source
    if source.host_path is not None:
        volume = {"name": "model", "hostPath": {"path": source.host_path.path, "type": "Directory"}}
        return [volume], [{"name": "model", "mountPath": source.host_path.path, "readOnly": True}]
    if source.pvc is not None:
        volume = {
            "name": "model",
            "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True},
        }
        mount = {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
        return [volume], [mount]
    if source.huggingface is not None:  # filled by the init container, read-only to the engine
        claim = source.huggingface.claim_name
        where = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
        return [{"name": "model", **where}], [
            {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
        ]
    return [], []


def kvscale_image(spec: api.LLMEndpointSpec, images: DefaultImages) -> str:
    """An image of kvscale's own (engine, fetch): the engine's for a kvscale engine,
    else the operator's default engine image."""
    return spec.engine.container_image(images) if spec.engine.kind == "kvscale" else images.engine


def fetch_container(spec: api.LLMEndpointSpec, images: DefaultImages) -> JSON | None:
    """The init container that downloads a huggingface source into the model volume (the Hub's
    cache layout, so a claim is filled once: later pods download only what changed)."""
    source = spec.model.source.huggingface
    if source is None:
        return None
    env: list[JSON] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HUB_OFFLINE", "value": "0"},  # the image runs offline by default
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        {"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"},
    ]
    if source.endpoint:
        env.append({"name": "HF_ENDPOINT", "value": source.endpoint})
    if source.token_secret is not None:
        ref = {"name": source.token_secret.name, "key": source.token_secret.key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return {
        "name": FETCH_CONTAINER,
        "image": kvscale_image(spec, images),
        "command": ["kvscale-engine"],
        "args": [
            "fetch",
            "--repo",
            source.repo,
            "--revision",
            source.revision,
            "--cache-dir",
            HUB_CACHE,
            "--link",
            hub_link(source),
        ],
        "env": env,
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "2Gi"},
        },
        "securityContext": restricted_security(),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "model", "mountPath": MODEL_MOUNT},
        ],
    }


def probe(path: str, period: int, failures: int) -> JSON:
    """An HTTP probe on the container's `http` port."""
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def _engine_container(spec: api.LLMEndpointSpec, images: DefaultImages) -> JSON:
    _, mounts = _model_volume(spec)
    paths = ENDPOINTS[spec.engine.kind]
    container: JSON = {
        "name": "engine",
        "image": spec.engine.container_image(images),
        "args": engine_args(spec),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "env": engine_env(spec),
        "resources": _resources(spec),
        # a replica that still loads or compiles is not killed: it has `startup_s` to answer
        "startupProbe": probe(
            paths.live, STARTUP_PERIOD_SECONDS, paths.startup_s // STARTUP_PERIOD_SECONDS
        ),
        "readinessProbe": probe(paths.ready, 2, 2),
        "livenessProbe": probe(paths.live, 10, 3),
        "securityContext": restricted_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *mounts],
    }
    if spec.engine.kind == "vllm":
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    # no preStop hook: a hook's httpGet can only GET, and drain is POST-only; SIGTERM itself turns
    # readiness false, serves through a grace delay, drains, then exits (within GRACE_SECONDS)
    return container


def engine_deployment(
    owner: Owner,
    spec: api.LLMEndpointSpec,
    replicas: int,
    images: DefaultImages = DEFAULTS,
) -> JSON:
    """The engine Deployment: a rolling update (one surge pod, none unavailable, gated on
    readiness) rolls the replicas whenever the template changes, a new default image included."""
    volumes, _ = _model_volume(spec)
    pod_spec: JSON = {
        "containers": [_engine_container(spec, images)],
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "volumes": [{"name": "tmp", "emptyDir": {}}, *volumes],
    }
    if spec.engine.kind == "vllm":
        shm = {"medium": "Memory", "sizeLimit": SHM_SIZE}
        pod_spec["volumes"].append({"name": "dshm", "emptyDir": shm})
    fetch = fetch_container(spec, images)
    if fetch is not None:
        pod_spec["initContainers"] = [fetch]
    if spec.resources.gpus_per_replica:
        pod_spec["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    if spec.resources.gpu_type:
        pod_spec["nodeSelector"] = {"nvidia.com/gpu.product": spec.resources.gpu_type}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, engine_name(owner.name)),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(owner.name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": overrides.pod_template(
                {
                    "metadata": {
                        "labels": labels(owner.name),
                        "annotations": {
                            "prometheus.io/scrape": "true",
                            "prometheus.io/port": str(ENGINE_PORT),
                            "prometheus.io/path": "/metrics",
                            "kvscale.io/model": spec.model.name,
                        },
                    },
                    "spec": pod_spec,
                },
                spec.pod_template,
            ),
        },
    }


def engine_service(owner: Owner) -> JSON:
    return http_service(owner, engine_name(owner.name), "engine")


def engine_pdb(owner: Owner) -> JSON:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner, engine_name(owner.name)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner.name)},
        },
    }


def render(
    owner: Owner,
    spec: api.LLMEndpointSpec,
    replicas: int,
    images: DefaultImages = DEFAULTS,
) -> list[JSON]:
    """Every child of the endpoint, in the order they are applied; `images` are the operator's
    defaults for an endpoint that pins none."""
    return [
        engine_service(owner),
        engine_pdb(owner),
        engine_deployment(owner, spec, replicas, images),
    ]
