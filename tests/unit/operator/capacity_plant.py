"""A tiny model of an endpoint for the control-law tests: replicas that start after a delay, a
true per-replica capacity, a backlog that grows when demand exceeds it, and TTFT that breaks the
SLO while requests wait. Pure Python; the law sees it only through `Snapshot`s."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.controllers.capacity import CapacityLaw, Decision
from kvscale.signals.snapshot import Fleet, Latency, Problem, ReplicaSignals, Snapshot
from kvscale_cluster.specs import llm_spec

TOKENS_PER_REQUEST = 500.0


def spec(**scaling: object) -> LLMEndpointSpec:
    base: dict[str, object] = {
        "minReplicas": 1,
        "maxReplicas": 10,
        "capacityIntervalSeconds": 60,
        "scaleDownStabilizationSeconds": 300,
        "replicaCapacityTokensPerSecond": 1000,
        "headroom": 0.2,
    }
    base.update(scaling)
    return llm_spec(scaling=base)


@dataclass
class Plant:
    capacity: float = 1000.0  # what one replica really carries within the SLO
    startup_s: float = 60.0
    gpu_slots: int = 100  # replicas the nodes can place
    pods: list[tuple[str, float]] = field(default_factory=list)  # (name, created at)
    backlog_tokens: float = 0.0
    made: int = 0

    def apply(self, desired: int, now: float) -> None:
        while len(self.pods) < desired:
            self.made += 1
            self.pods.append((f"pod-{self.made}", now))
        while len(self.pods) > desired:
            # a ReplicaSet removes pods that are not ready (or not placed) first, newest first
            waiting = [p for p in self.pods if not self._ready(p, now)]
            self.pods.remove(waiting[-1] if waiting else self.pods[-1])

    def _placed(self) -> list[tuple[str, float]]:
        return self.pods[: self.gpu_slots]

    def _ready(self, pod: tuple[str, float], now: float) -> bool:
        return pod in self._placed() and now - pod[1] >= self.startup_s

    def observe(self, demand: float, now: float, interval: float) -> Snapshot:
        ready = [p for p in self.pods if self._ready(p, now)]
        placed = len(self._placed())
        offered = demand + self.backlog_tokens / interval
        served = min(offered, len(ready) * self.capacity)
        self.backlog_tokens = max(0.0, (offered - served) * interval) if ready else 0.0
        waiting = self.backlog_tokens / TOKENS_PER_REQUEST
        slow = waiting > 0
        replicas = tuple(
            ReplicaSignals(
                pod=name,
                prompt_tokens_per_s=served / len(ready) * 0.5,
                generation_tokens_per_s=served / len(ready) * 0.5,
                running=served / len(ready) / TOKENS_PER_REQUEST,
                waiting=waiting / len(ready),
                kv_usage=min(1.0, served / len(ready) / self.capacity * 0.8),
                successes_per_s=served / len(ready) / TOKENS_PER_REQUEST,
                latency=Latency(ttft_p99=5.0 if slow else 0.5, itl_p99=0.05),
                created_at=created,
            )
            for name, created in ready
        )
        return Snapshot(
            taken_at=now,
            window_s=interval,
            replicas=replicas,
            latency=Latency(ttft_p99=5.0 if slow else 0.5, itl_p99=0.05) if ready else Latency(),
            pending_requests=demand / TOKENS_PER_REQUEST if not self.pods else 0.0,
            fleet=Fleet(
                current=len(self.pods),
                ready=len(ready),
                starting=placed - len(ready),
                unschedulable=len(self.pods) - placed,
                unschedulable_reason="0/2 nodes are available: 2 Insufficient nvidia.com/gpu",
                startup_seconds=self.startup_s,
            ),
        )


def run(
    demands: list[float],
    endpoint: LLMEndpointSpec,
    plant: Plant | None = None,
    outage: set[int] | None = None,
    start: int = 1,
) -> list[Decision]:
    """Closes the loop for one decision per interval; returns every decision."""
    plant = plant or Plant()
    interval = float(endpoint.scaling.capacity_interval_seconds)
    plant.apply(start, -1e6)
    law = CapacityLaw()
    decisions = []
    for i, d in enumerate(demands):
        now = i * interval
        snap = plant.observe(d, now, interval)
        if outage and i in outage:
            snap = Snapshot(
                taken_at=now,
                window_s=interval,
                problem=Problem.UNREACHABLE,
                message="connection refused",
                fleet=snap.fleet,
            )
        decision = law.decide(snap, endpoint, now)
        decisions.append(decision)
        plant.apply(decision.desired, now)
    return decisions
