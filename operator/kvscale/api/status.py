"""The LLMEndpoint status, v1alpha1.

Status is conditions plus observedGeneration and what the controllers measured and decided; no
`phase`. Conditions follow `metav1.Condition` exactly and form a list-map keyed by `type`.
"""

from __future__ import annotations

from typing import Annotated, Literal

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
        ),
    ]
    status: Literal["True", "False", "Unknown"]
    observed_generation: Count = None
    last_transition_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    reason: Annotated[
        str,
        Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
    ]
    message: Annotated[str, Field(max_length=32768)]


class CapacityStatus(_Status):
    """The capacity controller's last decision and what it was based on."""

    desired: Count = None
    current: Count = None
    ready: Count = None
    starting: Count = None
    reason: str | None = None
    message: str | None = None
    demand_tokens_per_second: float | None = None
    forecast_tokens_per_second: float | None = None
    per_replica_tokens_per_second: float | None = None
    deferred_tokens_per_second: Annotated[
        float | None,
        Field(description="The rate the deferred backlog's deadlines require (counted in demand)."),
    ] = None
    startup_seconds: Seconds = None
    forecast_error: Amount = None
    victim: str | None = None
    updated_at: Time = None
    controller_state: Annotated[
        str | None,
        Field(
            max_length=4096,
            description="The control law's state (JSON), so a restarted operator resumes it.",
        ),
    ] = None


class RoutingStatus(_Status):
    weights: dict[str, float] = {}
    updated_at: Time = None
    reason: str | None = None


class SLOStatus(_Status):
    ttft_p99_seconds: Seconds = None
    itl_p99_seconds: Seconds = None
    attainment: Annotated[float | None, Field(ge=0, le=1)] = None
    window_seconds: int | None = None
    minutes: Annotated[
        list[int],
        Field(max_length=60, description="Recent minutes: 1 within the SLO, 0 not (oldest first)."),
    ] = []


class TrafficClassStatus(_Status):
    """One traffic class: an interactive one's SLO attainment, a deferrable one's deadlines."""

    name: str
    deferrable: bool = False
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
    deadline_met: Amount = None
    deadline_missed: Amount = None
    backlog_requests: Amount = None
    backlog_tokens: Amount = None
    oldest_age_seconds: Seconds = None
    valley_tokens: Annotated[
        float | None,
        Field(ge=0, description="Tokens served from spare capacity (released, not forced)."),
    ] = None
    since: Time = None


class CostStatus(_Status):
    gpu_hours: Amount = None
    wasted_gpu_hours: Amount = None
    successful_requests: Amount = None
    tokens: Amount = None
    per_successful_request: float | None = None
    per_million_tokens: float | None = None
    currency: str | None = None
    since: Time = None


class Decision(_Status):
    time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    from_replicas: Annotated[int, Field(ge=0)]
    to_replicas: Annotated[int, Field(ge=0)]
    reason: str
    message: str = ""
    demand_tokens_per_second: float | None = None
    forecast_tokens_per_second: float | None = None
    per_replica_tokens_per_second: float | None = None
    ttft_p99_seconds: Seconds = None
    waiting: Amount = None
    kv_usage: Amount = None


class LLMEndpointStatus(_Status):
    observed_generation: int | None = None
    replicas: Count = None
    ready_replicas: Count = None
    desired_replicas: Count = None
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
    traffic_classes: Annotated[
        list[TrafficClassStatus],
        Field(
            max_length=16,
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        ),
    ] = []
