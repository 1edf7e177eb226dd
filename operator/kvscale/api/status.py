"""The LLMEndpoint status, v1alpha1.

Status is conditions plus observedGeneration and what the controllers measured and decided; no
`phase`. Conditions follow `metav1.Condition` exactly and form a list-map keyed by `type`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

CONDITION_TYPES = (
    "Ready",
    "Reconciling",
    "Stalled",
    "Available",
    "Progressing",
    "Degraded",
    "MetricsAvailable",
    "CapacityLimited",
    "SLOFeasible",
)


Seconds = Annotated[float | None, Field(ge=0)]
Count = Annotated[int | None, Field(ge=0)]
Amount = Annotated[float | None, Field(ge=0)]
Time = Annotated[str | None, Field(json_schema_extra={"format": "date-time"})]


def _says(description: str) -> Any:
    return Field(description=description)


class _Status(BaseModel):
    model_config = ConfigDict(
        extra="ignore", frozen=True, populate_by_name=True, alias_generator=to_camel
    )


class Condition(_Status):
    """`metav1.Condition`, with its upstream bounds and patterns."""

    type: Annotated[
        str,
        Field(
            max_length=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
            description="Condition type (Ready, Available, Progressing, Degraded, ...).",
        ),
    ]
    status: Annotated[Literal["True", "False", "Unknown"], _says("True, False or Unknown.")]
    observed_generation: Annotated[
        Count, _says("metadata.generation the condition was computed from.")
    ] = None
    last_transition_time: Annotated[
        str,
        Field(
            description="When status last changed (RFC 3339).",
            json_schema_extra={"format": "date-time"},
        ),
    ]
    reason: Annotated[
        str,
        Field(
            min_length=1,
            max_length=1024,
            pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
            description="Why, in one CamelCase word.",
        ),
    ]
    message: Annotated[str, Field(max_length=32768, description="Why, in a sentence.")]


class CapacityStatus(_Status):
    """The capacity controller's last decision and what it was based on."""

    desired: Annotated[Count, _says("Replicas the controller decided on.")] = None
    current: Annotated[Count, _says("Replicas that existed at the decision.")] = None
    ready: Annotated[Count, _says("Ready replicas at the decision.")] = None
    starting: Annotated[Count, _says("Replicas still starting at the decision.")] = None
    reason: Annotated[str | None, _says("The decision's reason code (CamelCase).")] = None
    message: Annotated[str | None, _says("The decision's reason, in a sentence.")] = None
    demand_tokens_per_second: Annotated[
        float | None, _says("Measured demand (prompt + generated tokens per second).")
    ] = None
    forecast_tokens_per_second: Annotated[
        float | None, _says("Forecast demand over the start-up horizon (tokens per second).")
    ] = None
    per_replica_tokens_per_second: Annotated[
        float | None, _says("What one replica carries within the SLO (tokens per second).")
    ] = None
    deferred_tokens_per_second: Annotated[
        float | None,
        _says("The rate the deferred backlog's deadlines require (tokens per second, in demand)."),
    ] = None
    startup_seconds: Annotated[Seconds, _says("Measured replica start-up time, in seconds.")] = None
    forecast_error: Annotated[
        Amount, _says("Moving average of the forecast's relative error (0.1 = 10%).")
    ] = None
    victim: Annotated[str | None, _says("Pod being drained before a scale-in.")] = None
    updated_at: Annotated[Time, _says("When the decision was taken (RFC 3339).")] = None
    controller_state: Annotated[
        str | None,
        Field(
            max_length=4096,
            description="The control law's state (JSON), so a restarted operator resumes it.",
        ),
    ] = None


class RoutingStatus(_Status):
    """The routing-weights controller's last update."""

    weights: Annotated[
        dict[str, float], _says("Routing weight per replica pod (0 drains it).")
    ] = {}
    updated_at: Annotated[Time, _says("When the weights were published (RFC 3339).")] = None
    reason: Annotated[str | None, _says("Why the weights changed (CamelCase).")] = None


class SLOStatus(_Status):
    """Measured latency against spec.slo."""

    ttft_p99_seconds: Annotated[Seconds, _says("Measured p99 time to first token, in seconds.")] = (
        None
    )
    itl_p99_seconds: Annotated[Seconds, _says("Measured p99 inter-token latency, in seconds.")] = (
        None
    )
    attainment: Annotated[
        float | None, Field(ge=0, le=1, description="Share of recent minutes within the SLO.")
    ] = None
    window_seconds: Annotated[int | None, _says("Window of the attainment, in seconds.")] = None
    minutes: Annotated[
        list[Annotated[int, _says("1: the minute was within the SLO; 0: it was not.")]],
        Field(max_length=60, description="Recent minutes: 1 within the SLO, 0 not (oldest first)."),
    ] = []


class TrafficClassStatus(_Status):
    """One traffic class: an interactive one's SLO attainment, a deferrable one's deadlines."""

    name: Annotated[str, _says("The traffic class (spec.trafficClasses[].name).")]
    deferrable: Annotated[bool, _says("True when the class sets deadlineSeconds.")] = False
    slo_attainment: Annotated[
        float | None,
        Field(
            ge=0,
            le=1,
            description="Interactive: status.slo.attainment (engines measure latency per "
            "endpoint, not per class).",
        ),
    ] = None
    deadline_attainment: Annotated[
        float | None,
        Field(
            ge=0, le=1, description="Deferrable: completions within the deadline, since `since`."
        ),
    ] = None
    deadline_met: Annotated[Amount, _says("Deferred requests answered within their deadline.")] = (
        None
    )
    deadline_missed: Annotated[
        Amount, _says("Deferred requests answered late, or refused as unable to make it.")
    ] = None
    backlog_requests: Annotated[Amount, _says("Deferred requests the routers hold now.")] = None
    backlog_tokens: Annotated[
        Amount, _says("Tokens (prompt + max output) of the held deferred requests.")
    ] = None
    oldest_age_seconds: Annotated[
        Seconds, _says("How long the oldest held deferred request has waited, in seconds.")
    ] = None
    valley_tokens: Annotated[
        float | None,
        Field(ge=0, description="Tokens served from spare capacity (released, not forced)."),
    ] = None
    since: Annotated[Time, _says("Start of the counting (RFC 3339).")] = None


class CostStatus(_Status):
    """What the endpoint cost since `since`, at spec.cost's prices."""

    gpu_hours: Annotated[Amount, _says("GPU-hours the replicas held.")] = None
    wasted_gpu_hours: Annotated[Amount, _says("GPU-hours of replicas warming up or idle.")] = None
    successful_requests: Annotated[Amount, _says("Requests that completed.")] = None
    tokens: Annotated[Amount, _says("Prompt and generated tokens processed.")] = None
    per_successful_request: Annotated[
        float | None, _says("Cost per successful request, in currency.")
    ] = None
    per_million_tokens: Annotated[float | None, _says("Cost per million tokens, in currency.")] = (
        None
    )
    currency: Annotated[str | None, _says("ISO 4217 code of the amounts.")] = None
    since: Annotated[Time, _says("Start of the accounting (RFC 3339).")] = None


class Decision(_Status):
    """One change of the replica count, with what it was based on."""

    time: Annotated[
        str,
        Field(
            description="When it was taken (RFC 3339).", json_schema_extra={"format": "date-time"}
        ),
    ]
    from_replicas: Annotated[int, Field(ge=0, description="Replicas before.")]
    to_replicas: Annotated[int, Field(ge=0, description="Replicas after.")]
    reason: Annotated[str, _says("Reason code (CamelCase).")]
    message: Annotated[str, _says("The reason, in a sentence.")] = ""
    demand_tokens_per_second: Annotated[
        float | None, _says("Measured demand (tokens per second).")
    ] = None
    forecast_tokens_per_second: Annotated[
        float | None, _says("Forecast demand (tokens per second).")
    ] = None
    per_replica_tokens_per_second: Annotated[
        float | None, _says("Per-replica capacity within the SLO (tokens per second).")
    ] = None
    ttft_p99_seconds: Annotated[Seconds, _says("Measured p99 time to first token, in seconds.")] = (
        None
    )
    waiting: Annotated[Amount, _says("Requests queued across replicas.")] = None
    kv_usage: Annotated[Amount, _says("Highest KV-cache usage across replicas (0-1).")] = None


class ImagesStatus(_Status):
    """The images the endpoint's pods run: its Deployments' pod templates, which their rolling
    updates converge the pods to."""

    engine: Annotated[str | None, _says("Image of the engine replicas.")] = None
    router: Annotated[str | None, _says("Image of the routers (the kvscale-router command).")] = (
        None
    )
    pinned: Annotated[
        bool | None,
        _says(
            "Whether spec.engine.image pins the engine image; false: the endpoint follows the "
            "operator's default, and a new default rolls it. The routers follow the operator's "
            "default router image either way."
        ),
    ] = None


class LLMEndpointStatus(_Status):
    """What the operator observed and decided."""

    observed_generation: Annotated[
        int | None, _says("metadata.generation the operator last acted on.")
    ] = None
    replicas: Annotated[Count, _says("Engine replicas that exist (the current count).")] = None
    ready_replicas: Annotated[Count, _says("Engine replicas ready to serve.")] = None
    desired_replicas: Annotated[Count, _says("Engine replicas the operator asks for.")] = None
    selector: Annotated[
        str | None, _says("Label selector of the engine pods (for the scale subresource).")
    ] = None
    url: Annotated[
        str | None,
        _says("In-cluster base URL of the endpoint's OpenAI API (the router Service <name>)."),
    ] = None
    conditions: Annotated[
        list[Condition],
        Field(
            max_length=16,
            description="Standard conditions, a list-map keyed by type.",
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        ),
    ] = []
    images: ImagesStatus | None = None
    capacity: CapacityStatus | None = None
    routing: RoutingStatus | None = None
    slo: SLOStatus | None = None
    cost: CostStatus | None = None
    decisions: Annotated[
        list[Decision], Field(max_length=10, description="The last replica changes, newest last.")
    ] = []
    traffic_classes: Annotated[
        list[TrafficClassStatus],
        Field(
            max_length=16,
            description="Per traffic class: SLO attainment, or deadlines and backlog.",
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        ),
    ] = []
