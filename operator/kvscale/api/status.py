"""The LLMEndpoint status, v1alpha1.

Status is conditions plus observedGeneration and what the controllers measured and decided; no
`phase`. Conditions follow `metav1.Condition` exactly and form a list-map keyed by `type`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

CONDITION_TYPES = (
    "Ready",
    "Reconciling",
    "Stalled",
    "Available",
    "Progressing",
    "Degraded",
    "MetricsAvailable",
    "CapacityLimited",
)


class _Status(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class Condition(_Status):
    """`metav1.Condition`, with its upstream bounds and patterns."""

    type: Annotated[
        str,
        Field(
            max_length=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        ),
    ]
    status: Literal["True", "False", "Unknown"]
    observed_generation: Annotated[int | None, Field(alias="observedGeneration", ge=0)] = None
    last_transition_time: Annotated[
        str, Field(alias="lastTransitionTime", json_schema_extra={"format": "date-time"})
    ]
    reason: Annotated[
        str,
        Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
    ]
    message: Annotated[str, Field(max_length=32768)]


Seconds = Annotated[float | None, Field(ge=0)]


class CapacityStatus(_Status):
    """The capacity controller's last decision and what it was based on."""

    desired: Annotated[int | None, Field(ge=0)] = None
    current: Annotated[int | None, Field(ge=0)] = None
    ready: Annotated[int | None, Field(ge=0)] = None
    starting: Annotated[int | None, Field(ge=0)] = None
    reason: str | None = None
    message: str | None = None
    demand_tokens_per_second: Annotated[float | None, Field(alias="demandTokensPerSecond")] = None
    forecast_tokens_per_second: Annotated[float | None, Field(alias="forecastTokensPerSecond")] = (
        None
    )
    per_replica_tokens_per_second: Annotated[
        float | None, Field(alias="perReplicaTokensPerSecond")
    ] = None
    startup_seconds: Annotated[Seconds, Field(alias="startupSeconds")] = None
    forecast_error: Annotated[float | None, Field(alias="forecastError", ge=0)] = None
    victim: str | None = None
    updated_at: Annotated[
        str | None, Field(alias="updatedAt", json_schema_extra={"format": "date-time"})
    ] = None
    controller_state: Annotated[
        str | None,
        Field(
            alias="controllerState",
            max_length=4096,
            description="The control law's state (JSON), so a restarted operator resumes it.",
        ),
    ] = None


class RoutingStatus(_Status):
    weights: dict[str, float] = {}
    updated_at: Annotated[
        str | None, Field(alias="updatedAt", json_schema_extra={"format": "date-time"})
    ] = None
    reason: str | None = None


class SLOStatus(_Status):
    ttft_p99_seconds: Annotated[Seconds, Field(alias="ttftP99Seconds")] = None
    itl_p99_seconds: Annotated[Seconds, Field(alias="itlP99Seconds")] = None
    attainment: Annotated[float | None, Field(ge=0, le=1)] = None
    window_seconds: Annotated[int | None, Field(alias="windowSeconds")] = None
    minutes: Annotated[
        list[int],
        Field(max_length=60, description="Recent minutes: 1 within the SLO, 0 not (oldest first)."),
    ] = []


class CostStatus(_Status):
    gpu_hours: Annotated[float | None, Field(alias="gpuHours", ge=0)] = None
    wasted_gpu_hours: Annotated[float | None, Field(alias="wastedGpuHours", ge=0)] = None
    successful_requests: Annotated[float | None, Field(alias="successfulRequests", ge=0)] = None
    tokens: Annotated[float | None, Field(ge=0)] = None
    per_successful_request: Annotated[float | None, Field(alias="perSuccessfulRequest")] = None
    per_million_tokens: Annotated[float | None, Field(alias="perMillionTokens")] = None
    currency: str | None = None
    since: Annotated[str | None, Field(json_schema_extra={"format": "date-time"})] = None


class Decision(_Status):
    time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    from_replicas: Annotated[int, Field(alias="fromReplicas", ge=0)]
    to_replicas: Annotated[int, Field(alias="toReplicas", ge=0)]
    reason: str
    message: str = ""
    demand_tokens_per_second: Annotated[float | None, Field(alias="demandTokensPerSecond")] = None
    forecast_tokens_per_second: Annotated[float | None, Field(alias="forecastTokensPerSecond")] = (
        None
    )
    per_replica_tokens_per_second: Annotated[
        float | None, Field(alias="perReplicaTokensPerSecond")
    ] = None
    ttft_p99_seconds: Annotated[Seconds, Field(alias="ttftP99Seconds")] = None
    waiting: Annotated[float | None, Field(ge=0)] = None
    kv_usage: Annotated[float | None, Field(alias="kvUsage", ge=0)] = None


class LLMEndpointStatus(_Status):
    observed_generation: Annotated[int | None, Field(alias="observedGeneration")] = None
    replicas: Annotated[int | None, Field(ge=0)] = None
    ready_replicas: Annotated[int | None, Field(alias="readyReplicas", ge=0)] = None
    desired_replicas: Annotated[int | None, Field(alias="desiredReplicas", ge=0)] = None
    selector: str | None = None
    conditions: Annotated[
        list[Condition],
        Field(
            max_length=16,
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        ),
    ] = []
    capacity: CapacityStatus | None = None
    routing: RoutingStatus | None = None
    slo: SLOStatus | None = None
    cost: CostStatus | None = None
    decisions: Annotated[list[Decision], Field(max_length=10)] = []
