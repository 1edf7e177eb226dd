"""spec.podTemplate: what a cluster may change of an endpoint's engine pods.

A documented subset of the PodSpec and the engine container: pull secrets, tolerations, node
selection and affinity, env/envFrom, labels and annotations, priority and runtime classes,
resource overrides, extra volumes and mounts. The operator merges it into the engine Deployment it
renders as server-side apply merges (maps by key, lists keyed by name; `kvscale.children.overrides`)
and never lets it reach what the operator's contract rests on: ports, probes, the command and its
managed flags have no field here, and CEL refuses the labels the operator selects on, the
annotations it writes, GPUs outside resources.gpusPerReplica/gpuType, and volumes or mounts named
or placed like the operator's.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from kvscale.api import rules
from kvscale.api.base import Model, rules_of, validations

# what the operator itself names and mounts in an engine pod (kvscale.children.engine)
OPERATOR_VOLUMES = ("tmp", "model", "dshm")
OPERATOR_MOUNTS = ("/tmp", "/models", "/dev/shm")
OPERATOR_LABEL_PREFIXES = ("kvscale.io/", "app.kubernetes.io/")
OPERATOR_ANNOTATION_PREFIXES = ("kvscale.io/", "controller.kubernetes.io/pod-deletion-cost")
GPU_RESOURCE = "nvidia.com/gpu"
GPU_NODE_LABEL = "nvidia.com/gpu.product"

LABELS_MESSAGE = (
    "podTemplate.labels must not set kvscale.io/* or app.kubernetes.io/* labels: the operator "
    "selects and names its pods by them"
)
ANNOTATIONS_MESSAGE = (
    "podTemplate.annotations must not set kvscale.io/* annotations or "
    "controller.kubernetes.io/pod-deletion-cost: the operator writes them"
)
NODE_SELECTOR_MESSAGE = (
    f"podTemplate.nodeSelector must not set {GPU_NODE_LABEL}: use resources.gpuType"
)
GPU_RESOURCE_MESSAGE = (
    f"podTemplate.resources must not set {GPU_RESOURCE}: use resources.gpusPerReplica (the "
    "capacity controller counts GPUs from it)"
)
VOLUME_NAME_MESSAGE = (
    "podTemplate.volumes must not be named like the operator's own ("
    + ", ".join(OPERATOR_VOLUMES)
    + ")"
)
MOUNT_VOLUME_MESSAGE = "every podTemplate.volumeMounts[].name must name one of podTemplate.volumes"
MOUNT_PATH_MESSAGE = (
    "podTemplate.volumeMounts must not mount at or under the operator's mounts ("
    + ", ".join(OPERATOR_MOUNTS)
    + ")"
)

QUALIFIED = (
    "qualified names such as example.com/team (an optional DNS prefix and '/', then at most 63 "
    "letters, digits, '-', '_', '.')"
)
KEY_MESSAGE = "podTemplate label, annotation and nodeSelector keys must be " + QUALIFIED
_PREFIX = rules.DNS_SUBDOMAIN[1:-1]  # unanchored
KEY = rf"^(?:{_PREFIX}/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


def _name(what: str, **field: Any) -> Any:
    """A Field for the name of an object in the endpoint's namespace (a DNS subdomain)."""
    return Field(
        min_length=1, max_length=253, pattern=rules.DNS_SUBDOMAIN, description=what, **field
    )


def keys_rule(field: str, message: str) -> tuple[str, str]:
    """CEL, with its message: every key of the map `self.<field>` is a qualified name (KEY)."""
    return (f"!has(self.{field}) || self.{field}.all(k, k.{rules.matches(KEY)})", message)


def qualified(keys: dict[str, Any] | None) -> bool:
    """Whether every key of a map is a qualified name (KEY), as `keys_rule` checks at admission."""
    return all(re.fullmatch(KEY, k) for k in keys or {})


def _keys_without(prefixes: tuple[str, ...]) -> str:
    """CEL: no key of the map `self.<field>` starts with one of `prefixes`."""
    return " && ".join(f"!k.startsWith('{p}')" for p in prefixes)


LabelKey = str  # checked by CEL (KEY): a structural schema has no pattern for keys
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE, description="A label value.")]
NodeLabels = dict[LabelKey, LabelValue]
MAX_NODE_LABELS = 16
MAX_TOLERATIONS = 16
Quantity = Annotated[
    int | str,
    # a pattern, as Kubernetes' own schemas check quantities: CEL's isQuantity over a value of
    # unbounded length in a list or map costs more than admission allows
    Field(description="A quantity (500m, 2, 8Gi).", json_schema_extra={"pattern": rules.QUANTITY}),
    AfterValidator(rules.quantity),
]


class LocalObjectReference(Model):
    """A Secret in the endpoint's namespace."""

    name: Annotated[str, _name("Name of the Secret.")]


class Toleration(Model):
    """A toleration added to the pods (the operator's own stay)."""

    key: Annotated[
        str | None, Field(max_length=317, description="Taint key; empty with Exists: all.")
    ] = None
    operator: Annotated[
        Literal["Exists", "Equal"], Field(description="Exists, or Equal to value.")
    ] = "Equal"
    value: Annotated[str | None, Field(max_length=63, description="Taint value (Equal).")] = None
    effect: Annotated[
        Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None,
        Field(description="Taint effect matched; empty: all."),
    ] = None
    toleration_seconds: Annotated[
        int | None,
        Field(ge=0, description="How long a NoExecute taint is tolerated before eviction."),
    ] = None


class Requirement(Model):
    """A label requirement: key, operator, values."""

    key: Annotated[str, Field(min_length=1, max_length=317, description="Label key.")]
    operator: Annotated[
        Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"],
        Field(description="How the values are matched."),
    ]
    values: Annotated[
        list[Annotated[str, Field(max_length=63, description="A value.")]],
        Field(max_length=64, description="Values (In, NotIn; one integer for Gt, Lt)."),
    ] = []


class NodeSelectorTerm(Model):
    """Node label requirements, all of which must hold."""

    match_expressions: Annotated[
        list[Requirement], Field(max_length=16, description="Requirements on node labels.")
    ] = []


class NodeSelector(Model):
    """Node selector terms, any one of which must hold."""

    node_selector_terms: Annotated[
        list[NodeSelectorTerm], Field(min_length=1, max_length=8, description="The terms (ORed).")
    ]


class PreferredNode(Model):
    """A weighted node preference."""

    weight: Annotated[int, Field(ge=1, le=100, description="Weight, 1-100.")]
    preference: NodeSelectorTerm


class NodeAffinity(Model):
    """Node affinity, beyond resources.gpuType."""

    required_during_scheduling_ignored_during_execution: Annotated[
        NodeSelector | None, Field(description="Nodes the pods must run on.")
    ] = None
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[PreferredNode], Field(max_length=16, description="Nodes the pods prefer.")
    ] = []


class LabelSelector(Model):
    """Pods selected by labels."""

    match_labels: Annotated[
        dict[LabelKey, LabelValue] | None,
        Field(max_length=32, description="Labels the pods must carry."),
    ] = None
    match_expressions: Annotated[
        list[Requirement], Field(max_length=16, description="Requirements on pod labels.")
    ] = []


class PodAffinityTerm(Model):
    """Pods to run near (affinity) or away from (anti-affinity), per topology domain."""

    label_selector: LabelSelector
    topology_key: Annotated[
        str,
        Field(min_length=1, max_length=317, description="Node label of the topology domain."),
    ]
    namespaces: Annotated[
        list[Annotated[str, Field(max_length=63, description="A namespace.")]],
        Field(max_length=16, description="Namespaces of the pods (empty: the endpoint's)."),
    ] = []


class PreferredPods(Model):
    """A weighted pod (anti-)affinity term."""

    weight: Annotated[int, Field(ge=1, le=100, description="Weight, 1-100.")]
    pod_affinity_term: PodAffinityTerm


class PodAffinity(Model):
    """Pod (anti-)affinity terms."""

    required_during_scheduling_ignored_during_execution: Annotated[
        list[PodAffinityTerm], Field(max_length=8, description="Terms that must hold.")
    ] = []
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[PreferredPods], Field(max_length=16, description="Terms preferred.")
    ] = []


class Affinity(Model):
    """Scheduling constraints of the engine pods (a subset of the PodSpec's)."""

    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class KeySelector(Model):
    """One key of a Secret or ConfigMap in the endpoint's namespace."""

    name: Annotated[str, _name("Name of the Secret or ConfigMap.")]
    key: Annotated[str, Field(min_length=1, max_length=253, description="The key.")]
    optional: Annotated[bool | None, Field(description="Start even if it is missing.")] = None


class EnvSource(Model):
    """Where an environment variable's value comes from: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                "[has(self.secretKeyRef), has(self.configMapKeyRef)].filter(x, x).size() == 1",
                "valueFrom must set exactly one of secretKeyRef or configMapKeyRef",
            )
        )
    )
    secret_key_ref: Annotated[
        KeySelector | None, Field(description="A key of a Secret (e.g. an HF_TOKEN).")
    ] = None
    config_map_key_ref: Annotated[
        KeySelector | None, Field(description="A key of a ConfigMap.")
    ] = None

    @model_validator(mode="after")
    def _one(self) -> EnvSource:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise ValueError("valueFrom must set exactly one of secretKeyRef or configMapKeyRef")
        return self


class EnvVar(Model):
    """An environment variable of the engine container: a value, or valueFrom a key."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            ("!has(self.value) || !has(self.valueFrom)", "env sets value or valueFrom, not both")
        )
    )
    name: Annotated[
        str, Field(min_length=1, max_length=256, pattern=ENV_NAME, description="Variable name.")
    ]
    value: Annotated[str | None, Field(max_length=32768, description="Its value.")] = None
    value_from: Annotated[EnvSource | None, Field(description="Its value, from a key.")] = None

    @model_validator(mode="after")
    def _one(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError("env sets value or valueFrom, not both")
        return self


class NamedRef(Model):
    """A Secret or ConfigMap in the endpoint's namespace."""

    name: Annotated[str, _name("Its name.")]
    optional: Annotated[bool | None, Field(description="Start even if it is missing.")] = None


class EnvFromSource(Model):
    """Every key of a Secret or ConfigMap as environment variables: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                "[has(self.secretRef), has(self.configMapRef)].filter(x, x).size() == 1",
                "envFrom must set exactly one of secretRef or configMapRef",
            )
        )
    )
    prefix: Annotated[
        str | None, Field(max_length=64, description="Prepended to every variable name.")
    ] = None
    secret_ref: Annotated[NamedRef | None, Field(description="A Secret.")] = None
    config_map_ref: Annotated[NamedRef | None, Field(description="A ConfigMap.")] = None

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom must set exactly one of secretRef or configMapRef")
        return self


class ResourceOverrides(Model):
    """Requests and limits of the engine container, by resource name."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                f"(!has(self.requests) || !('{GPU_RESOURCE}' in self.requests)) && "
                f"(!has(self.limits) || !('{GPU_RESOURCE}' in self.limits))",
                GPU_RESOURCE_MESSAGE,
            )
        )
    )
    requests: Annotated[
        dict[str, Quantity] | None,
        Field(max_length=16, description="Requests by resource name."),
    ] = None
    limits: Annotated[
        dict[str, Quantity] | None,
        Field(max_length=16, description="Limits by resource name."),
    ] = None

    @model_validator(mode="after")
    def _no_gpus(self) -> ResourceOverrides:
        if GPU_RESOURCE in (self.requests or {}) or GPU_RESOURCE in (self.limits or {}):
            raise ValueError(GPU_RESOURCE_MESSAGE)
        return self


class EmptyDir(Model):
    """A scratch directory that lives as long as the pod."""

    medium: Annotated[
        Literal["", "Memory"], Field(description="Memory for a tmpfs; empty: the node's disk.")
    ] = ""
    size_limit: Annotated[Quantity | None, Field(description="Most it may hold.")] = None


class SecretVolume(Model):
    """A Secret's keys as files."""

    secret_name: Annotated[str, _name("Name of the Secret.")]
    optional: Annotated[bool | None, Field(description="Start even if it is missing.")] = None


class ConfigMapVolume(Model):
    """A ConfigMap's keys as files."""

    name: Annotated[str, _name("Name of the ConfigMap.")]
    optional: Annotated[bool | None, Field(description="Start even if it is missing.")] = None


class ClaimVolume(Model):
    """A PersistentVolumeClaim in the endpoint's namespace."""

    claim_name: Annotated[str, _name("Name of the claim.")]
    read_only: Annotated[bool | None, Field(description="Mount it read-only.")] = None


VOLUME_SOURCES = ("emptyDir", "secret", "configMap", "persistentVolumeClaim")


# no hostPath: a node directory is only a model source, which the cluster's admission policy governs
class Volume(Model):
    """An extra volume: exactly one of emptyDir, secret, configMap or persistentVolumeClaim."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                f"[{', '.join(f'has(self.{s})' for s in VOLUME_SOURCES)}].filter(x, x).size() == 1",
                "a podTemplate volume sets exactly one of " + ", ".join(VOLUME_SOURCES),
            )
        )
    )
    name: Annotated[
        str,
        Field(min_length=1, max_length=63, pattern=rules.DNS_LABEL, description="Volume name."),
    ]
    empty_dir: Annotated[EmptyDir | None, Field(description="A scratch directory.")] = None
    secret: Annotated[SecretVolume | None, Field(description="A Secret's keys as files.")] = None
    config_map: Annotated[
        ConfigMapVolume | None, Field(description="A ConfigMap's keys as files.")
    ] = None
    persistent_volume_claim: Annotated[
        ClaimVolume | None, Field(description="A PersistentVolumeClaim.")
    ] = None

    @model_validator(mode="after")
    def _one(self) -> Volume:
        sources = (self.empty_dir, self.secret, self.config_map, self.persistent_volume_claim)
        if sum(s is not None for s in sources) != 1:
            raise ValueError(
                "a podTemplate volume sets exactly one of " + ", ".join(VOLUME_SOURCES)
            )
        return self


class VolumeMount(Model):
    """Where the engine container mounts one of podTemplate.volumes."""

    name: Annotated[
        str,
        Field(min_length=1, max_length=63, description="Name of one of podTemplate.volumes."),
    ]
    mount_path: Annotated[
        str,
        Field(
            min_length=2,
            max_length=1024,
            pattern=r"^/",
            description="Absolute path in the container.",
            json_schema_extra=validations(rules.NO_DOT_DOT_RULE),
        ),
    ]
    sub_path: Annotated[
        str | None,
        Field(
            max_length=1024,
            pattern=r"^[^/]",
            description="Directory inside the volume to mount instead of its root.",
            json_schema_extra=validations(rules.NO_DOT_DOT_RULE),
        ),
    ] = None
    read_only: Annotated[bool | None, Field(description="Mount it read-only.")] = None


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


DESCRIPTION = (
    "Changes to the engine pods for a real cluster, merged into the Deployment the operator "
    "renders (maps by key, lists keyed by name, the operator's own entries kept); "
    "imagePullSecrets go to the router pods too (they pull the operator's router image). Ports, "
    "probes, the command and the managed flags cannot be set."
)


class PodTemplate(Model):
    """What a cluster may change of the engine pods (see DESCRIPTION)."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            *(keys_rule(m, KEY_MESSAGE) for m in ("labels", "annotations", "nodeSelector")),
            (
                "!has(self.labels) || self.labels.all(k, "
                + _keys_without(OPERATOR_LABEL_PREFIXES)
                + ")",
                LABELS_MESSAGE,
            ),
            (
                "!has(self.annotations) || self.annotations.all(k, "
                + _keys_without(OPERATOR_ANNOTATION_PREFIXES)
                + ")",
                ANNOTATIONS_MESSAGE,
            ),
            (
                f"!has(self.nodeSelector) || !('{GPU_NODE_LABEL}' in self.nodeSelector)",
                NODE_SELECTOR_MESSAGE,
            ),
            (
                "!has(self.volumes) || self.volumes.all(v, !(v.name in ["
                + ", ".join(f"'{v}'" for v in OPERATOR_VOLUMES)
                + "]))",
                VOLUME_NAME_MESSAGE,
            ),
            (
                "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) "
                "&& self.volumes.exists(v, v.name == m.name))",
                MOUNT_VOLUME_MESSAGE,
            ),
            (
                "!has(self.volumeMounts) || self.volumeMounts.all(m, !(["
                + ", ".join(f"'{p}'" for p in OPERATOR_MOUNTS)
                + "].exists(p, m.mountPath == p || m.mountPath.startsWith(p + '/'))))",
                MOUNT_PATH_MESSAGE,
            ),
        )
    )
    labels: Annotated[
        dict[LabelKey, LabelValue] | None,
        Field(max_length=32, description="Labels added to the engine pods (mesh, cost)."),
    ] = None
    annotations: Annotated[
        dict[LabelKey, Annotated[str, Field(max_length=4096, description="A value.")]] | None,
        Field(max_length=32, description="Annotations added to the engine pods."),
    ] = None
    image_pull_secrets: Annotated[
        list[LocalObjectReference],
        Field(
            max_length=8,
            description="Secrets to pull the images with (engine and router pods).",
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        ),
    ] = []
    tolerations: Annotated[
        list[Toleration],
        Field(max_length=MAX_TOLERATIONS, description="Tolerations added to the GPU's own."),
    ] = []
    node_selector: Annotated[
        NodeLabels | None,
        Field(
            max_length=MAX_NODE_LABELS,
            description="Node labels the pods require, added to resources.gpuType's.",
        ),
    ] = None
    affinity: Annotated[
        Affinity | None, Field(description="Node and pod (anti-)affinity of the engine pods.")
    ] = None
    priority_class_name: Annotated[
        str | None, _name("PriorityClass of the engine pods.", default=None)
    ]
    runtime_class_name: Annotated[
        str | None, _name("RuntimeClass of the engine pods (e.g. nvidia).", default=None)
    ]
    env: Annotated[
        list[EnvVar],
        Field(
            max_length=64,
            description="Environment of the engine container; an entry replaces the "
            "operator's variable of the same name.",
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        ),
    ] = []
    env_from: Annotated[
        list[EnvFromSource],
        Field(max_length=8, description="Secrets and ConfigMaps loaded as environment."),
    ] = []
    resources: Annotated[
        ResourceOverrides | None,
        Field(
            description="Requests and limits of the engine container that replace those of the "
            "same name the operator derives from spec.resources (requests equal limits), or add "
            "others (ephemeral-storage, hugepages)."
        ),
    ] = None
    volumes: Annotated[
        list[Volume],
        Field(
            max_length=16,
            description="Extra volumes of the engine pods (no hostPath: a node directory is "
            "only a model source, which the cluster's admission policy governs).",
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        ),
    ] = []
    volume_mounts: Annotated[
        list[VolumeMount],
        Field(
            max_length=16,
            description="Mounts of podTemplate.volumes in the engine container.",
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["mountPath"],
            },
        ),
    ] = []

    @model_validator(mode="after")
    def _contract(self) -> PodTemplate:
        for keys in (self.labels, self.annotations, self.node_selector):
            if not qualified(keys):
                raise ValueError(KEY_MESSAGE)
        if any(k.startswith(OPERATOR_LABEL_PREFIXES) for k in self.labels or {}):
            raise ValueError(LABELS_MESSAGE)
        if any(k.startswith(OPERATOR_ANNOTATION_PREFIXES) for k in self.annotations or {}):
            raise ValueError(ANNOTATIONS_MESSAGE)
        if GPU_NODE_LABEL in (self.node_selector or {}):
            raise ValueError(NODE_SELECTOR_MESSAGE)
        names = {v.name for v in self.volumes}
        if names & set(OPERATOR_VOLUMES):
            raise ValueError(VOLUME_NAME_MESSAGE)
        if any(m.name not in names for m in self.volume_mounts):
            raise ValueError(MOUNT_VOLUME_MESSAGE)
        if any(_under(m.mount_path, OPERATOR_MOUNTS) for m in self.volume_mounts):
            raise ValueError(MOUNT_PATH_MESSAGE)
        return self
