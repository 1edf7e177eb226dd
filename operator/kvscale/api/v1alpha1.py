"""The LLMEndpoint API, v1alpha1: the single source of truth for the CRD schema.

The CRD YAML in `crds/` is generated from these models (`kvscale crd`), so every default, bound,
enum and cross-field rule lives here once. Cross-field rules are CEL (`x-kubernetes-validations`)
so the API server refuses bad objects at admission; pydantic validators mirror the ones the
operator relies on so that a spec that slipped past an older CRD still fails cleanly.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from kvscale.api import rules
from kvscale.api.base import Model, rules_of, validations
from kvscale.api.images import ENGINE_IMAGE, VLLM_IMAGE, DefaultImages
from kvscale.api.pod_template import DESCRIPTION as POD_TEMPLATE_DESCRIPTION
from kvscale.api.pod_template import PodTemplate
from kvscale.api.router import DESCRIPTION as ROUTER_DESCRIPTION
from kvscale.api.router import RouterSpec

GROUP = "kvscale.io"
VERSION = "v1alpha1"
KIND = "LLMEndpoint"
PLURAL = "llmendpoints"
SINGULAR = "llmendpoint"
SHORT_NAMES = ("llme",)

DNS_LABEL = rules.DNS_LABEL
ENDPOINT_RULES = rules.ENDPOINT_RULES  # on the whole object: metadata.name

GPU_TYPE_MESSAGE = "resources.gpuType needs resources.gpusPerReplica of at least 1"


# --- spec.model ---------------------------------------------------------------------------


def _path(pattern: str, description: str, **field: Any) -> Any:
    """A path's Field: at most 4096 characters, `pattern`, and no `..` segments (a CEL rule at
    admission; `rules.no_dot_dot` checks the same when parsed)."""
    return Field(
        max_length=4096,
        pattern=pattern,
        description=description,
        json_schema_extra=validations(rules.NO_DOT_DOT_RULE),
        **field,
    )


class HostPathSource(Model):
    """A checkpoint directory on the node, mounted read-only."""

    path: Annotated[
        str,
        _path(
            r"^/", "Absolute path of a Hugging Face checkpoint directory on the node.", min_length=1
        ),
        AfterValidator(rules.no_dot_dot),
    ]


class PVCSource(Model):
    """A checkpoint on a PersistentVolumeClaim, mounted read-only."""

    claim_name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=253,
            pattern=rules.DNS_SUBDOMAIN,
            description="PersistentVolumeClaim in the endpoint's namespace.",
        ),
    ]
    sub_path: Annotated[
        str,
        _path(
            r"^([^/].*)?$",
            "Relative directory inside the volume that holds the checkpoint.",
            default="",
        ),
        AfterValidator(rules.no_dot_dot),
    ]


class DummySource(Model):
    """Seeded random weights of a named shape: no checkpoint needed (benchmarks, demos)."""

    preset: Annotated[
        Literal["llama-tiny", "llama-bench-cpu", "llama-3-8b", "mistral-7b", "qwen2-0.5b"],
        Field(description="Model shape of the seeded random weights (benchmarks, demos)."),
    ] = "llama-tiny"


# an http(s) URL that is not link-local (CEL at admission, rules.prometheus_url when parsed)
HttpURL = Annotated[
    str | None, AfterValidator(lambda url: url if url is None else rules.prometheus_url(url))
]


def _url(description: str) -> Any:
    return Field(
        max_length=2048,
        description=description,
        json_schema_extra=validations(*rules.PROMETHEUS_URL_RULES),
    )


HF_REPO = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$"
HF_REVISION = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$"


class SecretKey(Model):
    """A key of a Secret in the endpoint's namespace."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=253,
            pattern=rules.DNS_SUBDOMAIN,
            description="Name of the Secret.",
        ),
    ]
    key: Annotated[
        str, Field(min_length=1, max_length=253, description="Key of the token in the Secret.")
    ] = "HF_TOKEN"


class HuggingFaceSource(Model):
    """A Hugging Face Hub repository, downloaded by an init container into the model volume in
    the Hub's cache layout (huggingface_hub's snapshot_download; HF_ENDPOINT selects a mirror)."""

    repo: Annotated[
        str,
        Field(
            min_length=1,
            max_length=192,
            pattern=HF_REPO,
            description="Repository id, e.g. Qwen/Qwen2.5-0.5B-Instruct.",
        ),
    ]
    revision: Annotated[
        str,
        Field(
            max_length=255,
            pattern=HF_REVISION,
            description="Branch, tag or commit; a new one rolls the replicas onto it.",
        ),
    ] = "main"
    token_secret: Annotated[
        SecretKey | None,
        Field(
            description="Secret key holding the Hub token (HF_TOKEN), for private or gated repos."
        ),
    ] = None
    endpoint: Annotated[
        HttpURL, _url("Hub URL (HF_ENDPOINT), e.g. a mirror (default: the Hub's).")
    ] = None
    claim_name: Annotated[
        str | None,
        Field(
            max_length=253,
            pattern=rules.DNS_SUBDOMAIN,
            description="PersistentVolumeClaim to keep the download on, filled once and reused "
            "by every replica and restart (ReadWriteMany for several nodes); unset: an emptyDir "
            "per pod.",
        ),
    ] = None


SOURCE_MESSAGE = "model.source must set exactly one of hostPath, pvc, dummy or huggingface"


class ModelSource(Model):
    """Where the weights come from: exactly one of hostPath, pvc, dummy or huggingface."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                "[has(self.hostPath), has(self.pvc), has(self.dummy), has(self.huggingface)]"
                ".filter(x, x).size() == 1",
                SOURCE_MESSAGE,
            )
        )
    )
    host_path: HostPathSource | None = None
    pvc: PVCSource | None = None
    dummy: DummySource | None = None
    huggingface: HuggingFaceSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        sources = (self.host_path, self.pvc, self.dummy, self.huggingface)
        if sum(x is not None for x in sources) != 1:
            raise ValueError(SOURCE_MESSAGE)
        return self


class ModelSpec(Model):
    """The model the endpoint serves."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$",
            description="Model name served on the OpenAI API (the `model` field clients send).",
        ),
    ]
    source: ModelSource
    max_model_len: Annotated[
        int,
        Field(ge=16, le=1_048_576, description="Context length in tokens."),
    ] = 4096


# --- spec.engine --------------------------------------------------------------------------


class EngineSpec(Model):
    """The inference engine each replica runs."""

    image: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=512,
                description=(
                    "Engine image, pinned; unset, the endpoint follows the operator's default "
                    "for its kind (an operator upgrade or a changed default rolls it) "
                    f"(this version's defaults: {ENGINE_IMAGE} for kind kvscale, "
                    f"{VLLM_IMAGE} for kind vllm). The routers run the operator's default "
                    "router image either way."
                ),
                json_schema_extra=validations(rules.matches_rule(rules.IMAGE, rules.IMAGE_MESSAGE)),
            ),
            AfterValidator(rules.image_reference),
        ]
        | None
    ) = None
    kind: Annotated[
        Literal["kvscale", "vllm"],
        Field(description="Engine flavour: selects the argument and metrics adapter."),
    ] = "kvscale"
    block_size: Annotated[
        Literal[8, 16, 32, 64, 128],
        Field(description="Tokens per KV-cache block."),
    ] = 16
    memory_fraction: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="Fraction of device memory for weights, activations and KV cache.",
        ),
    ] = 0.9
    max_num_seqs: Annotated[int, Field(ge=1, le=4096, description="Max sequences in a batch.")] = (
        256
    )
    max_num_batched_tokens: Annotated[
        int,
        Field(
            ge=16,
            le=1_048_576,
            description="Token budget of one scheduler step (chunked prefill splits longer ones).",
        ),
    ] = 8192
    enable_prefix_caching: Annotated[
        bool,
        Field(description="Reuse the KV cache of shared prompt prefixes across requests."),
    ] = True
    extra_args: Annotated[
        list[
            Annotated[
                str,
                Field(
                    max_length=1024,
                    description="One argument: a flag (--name, --name=value) or a value.",
                    json_schema_extra=validations(
                        rules.matches_rule(rules.ARGUMENT, rules.ARGUMENT_MESSAGE),
                        rules.matches_rule(
                            rules.MANAGED_FLAG, rules.MANAGED_FLAG_MESSAGE, negate=True
                        ),
                    ),
                ),
                AfterValidator(rules.engine_argument),
            ]
        ],
        Field(max_length=64, description="Appended to the engine's arguments."),
    ] = []

    def container_image(self, defaults: DefaultImages) -> str:
        """The image replicas run: the pinned `image`, else the operator's default for the kind."""
        if self.image is not None:
            return self.image
        return defaults.for_kind(self.kind)


# --- spec.resources -----------------------------------------------------------------------

# int-or-string, as in Pod specs (`cpu: 4`); rendered into the pod spec as a string
Quantity = Annotated[
    int | str,
    Field(json_schema_extra=validations(*rules.QUANTITY_RULES)),
    AfterValidator(rules.positive_quantity),
]


class ResourcesSpec(Model):
    """What each replica requests (requests equal limits)."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                "!has(self.gpuType) || self.gpusPerReplica > 0",
                GPU_TYPE_MESSAGE,
            )
        )
    )
    gpus_per_replica: Annotated[
        int,
        Field(ge=0, le=16, description="GPUs (nvidia.com/gpu) per replica; 0 runs on CPU."),
    ] = 1
    gpu_type: Annotated[
        str | None,
        Field(
            max_length=63,
            pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
            description="Node label nvidia.com/gpu.product the replicas must run on.",
        ),
    ] = None
    cpu: Annotated[
        Quantity,
        Field(description="CPU request and limit per replica (cores, or m: millicores)."),
    ] = "2"
    memory: Annotated[
        Quantity,
        Field(
            description="Memory request and limit per replica (a quantity in bytes: 8Gi, 512Mi)."
        ),
    ] = "8Gi"

    @model_validator(mode="after")
    def _gpu_type_needs_gpus(self) -> ResourcesSpec:
        if self.gpu_type is not None and self.gpus_per_replica == 0:
            raise ValueError(GPU_TYPE_MESSAGE)
        return self


# --- spec.slo / trafficClasses ------------------------------------------------------------


class SLOSpec(Model):
    """The latency targets interactive requests are served within."""

    ttft_p99_seconds: Annotated[
        float,
        Field(gt=0, le=600, description="p99 time to first token, in seconds."),
    ] = 2.0
    itl_p99_seconds: Annotated[
        float,
        Field(gt=0, le=60, description="p99 inter-token latency, in seconds."),
    ] = 0.2
    attainment_target: Annotated[
        float,
        Field(
            ge=0.5,
            le=1,
            description="Fraction (0.5-1) of requests that must meet both targets.",
        ),
    ] = 0.99


MAX_DEFERRABLE_CLASSES = 4
INTERACTIVE_QUEUE_WAIT_SECONDS = 30.0  # an interactive class's maxQueueWaitSeconds when unset
INTERACTIVE_QUEUE_WAIT_LIMIT = 3600
DEADLINE_LIMIT = 86_400
QUEUE_WAIT_UNDER_DEADLINE = (
    "a deferrable class's maxQueueWaitSeconds must be at least its deadlineSeconds (the router "
    "holds its requests until the deadline; leave maxQueueWaitSeconds out and it is the deadline)"
)
LONG_WAIT_NEEDS_DEADLINE = (
    f"maxQueueWaitSeconds above {INTERACTIVE_QUEUE_WAIT_LIMIT} needs a deferrable class "
    "(set deadlineSeconds)"
)
TOO_MANY_DEFERRABLE = f"at most {MAX_DEFERRABLE_CLASSES} trafficClasses may set deadlineSeconds"


# An interactive class (no deadline) carries the latency SLO and is admitted or refused at once;
# a deferrable class (deadlineSeconds) is held by the router, earliest deadline first, and released
# into spare capacity, and the capacity law counts only the rate its deadlines require.
class TrafficClass(Model):
    """One class of requests: its priority, how long it may queue, and (deferrable) its deadline."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                "!has(self.deadlineSeconds) || !has(self.maxQueueWaitSeconds) "
                "|| self.maxQueueWaitSeconds >= self.deadlineSeconds",
                QUEUE_WAIT_UNDER_DEADLINE,
            ),
            (
                "has(self.deadlineSeconds) || !has(self.maxQueueWaitSeconds) "
                f"|| self.maxQueueWaitSeconds <= {INTERACTIVE_QUEUE_WAIT_LIMIT}",
                LONG_WAIT_NEEDS_DEADLINE,
            ),
        )
    )
    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=63,
            pattern=DNS_LABEL,
            description="Class name (a DNS label), unique in the list; requests name it.",
        ),
    ]
    priority: Annotated[int, Field(ge=0, le=1000, description="Higher is admitted first.")] = 0
    max_queue_wait_seconds: Annotated[
        float | None,
        Field(
            gt=0,
            le=DEADLINE_LIMIT,
            description="A request that would wait longer, in seconds, is refused with 429 "
            "(default: 30 s for an interactive class, the deadline for a deferrable one).",
        ),
    ] = None
    deadline_seconds: Annotated[
        float | None,
        Field(
            gt=0,
            le=DEADLINE_LIMIT,
            description="Makes the class deferrable: each request must complete within this many "
            "seconds of arrival, and is held until spare capacity (or its deadline) releases it.",
        ),
    ] = None

    @model_validator(mode="after")
    def _queue_wait(self) -> TrafficClass:
        wait = self.max_queue_wait_seconds
        if wait is None:
            return self
        if self.deadline_seconds is not None and wait < self.deadline_seconds:
            raise ValueError(QUEUE_WAIT_UNDER_DEADLINE)
        if self.deadline_seconds is None and wait > INTERACTIVE_QUEUE_WAIT_LIMIT:
            raise ValueError(LONG_WAIT_NEEDS_DEADLINE)
        return self

    @property
    def deferrable(self) -> bool:
        return self.deadline_seconds is not None

    @property
    def queue_wait_seconds(self) -> float:
        """The queue-wait limit in force: as set, else the deadline or the interactive default."""
        if self.max_queue_wait_seconds is not None:
            return self.max_queue_wait_seconds
        return self.deadline_seconds or INTERACTIVE_QUEUE_WAIT_SECONDS

    def rendered(self) -> dict[str, Any]:
        """The class as `--traffic-classes` carries it to the engine and the router
        (engine-image/traffic-classes.schema.json); `deadlineSeconds` only when deferrable."""
        out: dict[str, Any] = {
            "name": self.name,
            "priority": self.priority,
            "maxQueueWaitSeconds": self.queue_wait_seconds,
        }
        if self.deadline_seconds is not None:
            out["deadlineSeconds"] = self.deadline_seconds
        return out


# --- spec.scaling / cost ------------------------------------------------------------------


class SignalsSpec(Model):
    """Where the controllers read the replicas' metrics."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                "self.source != 'prometheus' || has(self.prometheusUrl)",
                "scaling.signals.prometheusUrl is required when source is prometheus",
            )
        )
    )
    source: Annotated[
        Literal["direct", "prometheus"],
        Field(description="Scrape replicas' /metrics directly, or query Prometheus."),
    ] = "direct"
    prometheus_url: Annotated[
        HttpURL, _url("Base URL of the Prometheus HTTP API (http or https, not link-local).")
    ] = None


class ScalingSpec(Model):
    """The capacity and routing controllers' bounds and timing."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                "self.minReplicas <= self.maxReplicas",
                "scaling.minReplicas must not exceed scaling.maxReplicas",
            ),
            (
                "!has(self.scaleToZeroAfterSeconds) || self.minReplicas == 0",
                "scaling.scaleToZeroAfterSeconds needs scaling.minReplicas: 0",
            ),
        )
    )
    min_replicas: Annotated[
        int,
        Field(
            ge=0,
            le=1000,
            description="Fewest replicas the capacity controller keeps (0 allows scale to "
            "zero); the scale subresource's spec.replicas, so `kubectl scale` sets this floor.",
        ),
    ] = 1
    max_replicas: Annotated[
        int, Field(ge=1, le=1000, description="Most replicas the capacity controller runs.")
    ] = 4
    scale_to_zero_after_seconds: Annotated[
        int | None,
        Field(
            ge=30,
            le=86_400,
            description="Idle time, in seconds, after which the last replica is removed.",
        ),
    ] = None
    capacity_interval_seconds: Annotated[
        int,
        Field(ge=10, le=600, description="Seconds between the capacity controller's decisions."),
    ] = 60
    routing_interval_seconds: Annotated[
        float,
        Field(ge=1, le=60, description="Seconds between routing-weight updates."),
    ] = 3.0
    forecast_horizon_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=3600,
            description="Cap, in seconds, on how far ahead demand is forecast (0 turns "
            "forecasting off).",
        ),
    ] = 300
    headroom: Annotated[
        float, Field(ge=0, le=4, description="Spare capacity kept above the forecast (0.2 = 20%).")
    ] = 0.2
    scale_down_stabilization_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=3600,
            description="Seconds demand must stay low before a replica is removed.",
        ),
    ] = 300
    replica_capacity_tokens_per_second: Annotated[
        float | None,
        Field(
            gt=0,
            le=10_000_000,
            description="Prior for what one replica carries within the SLO (prompt + generated "
            "tokens per second), e.g. from `kvscale plan`; the controller refines it online.",
        ),
    ] = None
    signals: SignalsSpec = SignalsSpec()

    @model_validator(mode="after")
    def _bounds(self) -> ScalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("scaling.minReplicas must not exceed scaling.maxReplicas")
        return self


class CostSpec(Model):
    """Prices for the cost figures in status.cost."""

    gpu_hour_price: Annotated[
        float, Field(ge=0, le=10_000, description="Price of one GPU-hour, in currency.")
    ] = 0.0
    currency: Annotated[
        str, Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code of the prices.")
    ] = "USD"


# --- the endpoint -------------------------------------------------------------------------


class LLMEndpointSpec(Model):
    """The desired state of an LLM inference endpoint."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(
            (
                "!has(self.replicas) || !has(self.scaling) "
                "|| self.replicas <= self.scaling.maxReplicas",
                "spec.replicas must not exceed scaling.maxReplicas",
            ),
            (
                "!has(self.trafficClasses) || "
                "self.trafficClasses.all(c, self.trafficClasses.exists_one(d, d.name == c.name))",
                "trafficClasses names must be unique",
            ),
            (
                "!has(self.trafficClasses) || "
                "self.trafficClasses.filter(c, has(c.deadlineSeconds)).size() "
                f"<= {MAX_DEFERRABLE_CLASSES}",
                TOO_MANY_DEFERRABLE,
            ),
            (
                "!has(self.engine) || !has(self.engine.maxNumBatchedTokens) "
                "|| !has(self.engine.maxNumSeqs) "
                "|| self.engine.maxNumBatchedTokens >= self.engine.maxNumSeqs",
                "engine.maxNumBatchedTokens must be at least engine.maxNumSeqs "
                "(every running sequence needs one token per step)",
            ),
        )
    )
    model: ModelSpec
    engine: EngineSpec = EngineSpec()
    resources: ResourcesSpec = ResourcesSpec()
    slo: SLOSpec = SLOSpec()
    traffic_classes: Annotated[
        list[TrafficClass],
        Field(
            max_length=16,
            description="Admission classes: priority and queueing per class of request; a "
            "list-map keyed by name (server-side apply merges entries by name).",
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        ),
    ] = []
    scaling: ScalingSpec = ScalingSpec()
    cost: CostSpec = CostSpec()
    pod_template: Annotated[PodTemplate | None, Field(description=POD_TEMPLATE_DESCRIPTION)] = None
    router: Annotated[RouterSpec | None, Field(description=ROUTER_DESCRIPTION)] = None
    replicas: Annotated[
        int | None,
        Field(
            ge=0,
            le=1000,
            description="Pins the replica count and suspends autoscaling (unset: autoscaled).",
        ),
    ] = None

    @model_validator(mode="after")
    def _cross_field(self) -> LLMEndpointSpec:
        names = [c.name for c in self.traffic_classes]
        if len(names) != len(set(names)):
            raise ValueError("trafficClasses names must be unique")
        if sum(c.deferrable for c in self.traffic_classes) > MAX_DEFERRABLE_CLASSES:
            raise ValueError(TOO_MANY_DEFERRABLE)
        if self.replicas is not None and self.replicas > self.scaling.max_replicas:
            raise ValueError("spec.replicas must not exceed scaling.maxReplicas")
        return self

    @property
    def pinned(self) -> bool:
        return self.replicas is not None
