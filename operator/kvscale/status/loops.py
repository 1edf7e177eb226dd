"""What the capacity loop writes into status, computed purely from a tick's results.

`status.capacity` (the decision and its inputs, and the law's state so a restarted operator
resumes it), `status.slo` (measured p99s and the share of recent intervals within the SLO),
`status.cost` (GPU-hours, idle or warming GPU-hours, cost per successful request and per
million tokens, accumulated between ticks), `status.decisions` (the last ten changes) and, when
the spec names traffic classes, `status.trafficClasses` (interactive classes' SLO attainment;
deferrable classes' deadline attainment, backlog and tokens served in valleys, accumulated).
"""

from __future__ import annotations

import json
import math
from typing import Any

from kvscale.api import v1alpha1 as api
from kvscale.controllers.capacity import CapacityState, Decision
from kvscale.controllers.feasibility import Feasibility
from kvscale.signals.snapshot import Snapshot
from kvscale.status.conditions import Cond
from kvscale.timestamps import parse, stamp

JSON = dict[str, Any]
DECISIONS_KEPT = 10
SLO_WINDOW_S = 600.0  # attainment covers the intervals of the last ten minutes


def controller_state(old: JSON) -> CapacityState:
    """The law's state as the last tick left it in status (a fresh one if none or unreadable)."""
    raw = (old.get("capacity") or {}).get("controllerState")
    try:
        return CapacityState.from_dict(json.loads(raw) if raw else None)
    except ValueError:
        return CapacityState()


def report(
    old: JSON,
    decision: Decision,
    snap: Snapshot,
    spec: api.LLMEndpointSpec,
    now: float,
    victim: str | None,
    was: int,
) -> JSON:
    """The sections a capacity tick writes, from the status it read (`old`)."""
    out: JSON = {
        "capacity": capacity(decision, snap, now, victim),
        "slo": slo(old, snap, spec),
        "cost": cost(old, snap, spec, now),
        "decisions": decisions(old, decision, snap, now, was),
    }
    if spec.traffic_classes:
        attained = out["slo"].get("attainment")
        out["trafficClasses"] = traffic_classes(old, snap, spec, now, attained)
    return out


def metrics_condition(snap: Snapshot) -> Cond:
    if snap.problem is None:
        n = len(snap.replicas)
        return Cond("MetricsAvailable", "True", "Fresh", f"Signals of {n} replica(s) read")
    return Cond("MetricsAvailable", "False", snap.problem.value, snap.message or "No signals")


def feasibility_condition(verdict: Feasibility) -> Cond:
    """`SLOFeasible`: whether prefill alone leaves room for the TTFT SLO (last quiet window)."""
    if verdict.feasible:
        return Cond("SLOFeasible", "True", "PrefillWithinSLO", verdict.message())
    return Cond("SLOFeasible", "False", "PrefillExceedsSLO", verdict.message())


def capacity(decision: Decision, snap: Snapshot, now: float, draining: str | None) -> JSON:
    fleet = snap.fleet
    state = json.dumps(decision.state.to_dict(), separators=(",", ":"), allow_nan=False)
    return _clean(
        {
            "desired": decision.desired,
            "current": fleet.current,
            "ready": fleet.ready,
            "starting": fleet.starting,
            "reason": decision.reason,
            "message": decision.message,
            "demandTokensPerSecond": _round(decision.demand_tokens_per_s),
            "forecastTokensPerSecond": _round(decision.forecast_tokens_per_s),
            "perReplicaTokensPerSecond": _round(decision.per_replica_tokens_per_s),
            "deferredTokensPerSecond": _round(decision.deferred_tokens_per_s) or None,
            "startupSeconds": _round(decision.state.startup_s),
            "forecastError": _round(decision.state.forecaster.error, 3),
            "victim": draining,
            "updatedAt": stamp(now),
            "controllerState": state,
        }
    )


def slo(old: JSON, snap: Snapshot, spec: api.LLMEndpointSpec) -> JSON:
    """Measured p99s and the share of recent intervals whose p99s met the SLO.

    Idle intervals (nothing served, nothing waiting) say nothing about the SLO and are skipped.
    """
    before = old.get("slo") or {}
    interval = spec.scaling.capacity_interval_seconds
    keep = max(1, min(60, math.ceil(SLO_WINDOW_S / interval)))
    minutes = list(before.get("minutes") or [])
    latency = snap.latency
    busy = snap.successes_per_s > 0 or snap.waiting > 0 or snap.running > 0
    if snap.ok and busy and (latency.ttft_p99 is not None or latency.itl_p99 is not None):
        met = (latency.ttft_p99 is None or latency.ttft_p99 <= spec.slo.ttft_p99_seconds) and (
            latency.itl_p99 is None or latency.itl_p99 <= spec.slo.itl_p99_seconds
        )
        minutes = [*minutes, int(met)][-keep:]
    return _clean(
        {
            "ttftP99Seconds": _round(latency.ttft_p99, 4),
            "itlP99Seconds": _round(latency.itl_p99, 4),
            "attainment": round(sum(minutes) / len(minutes), 4) if minutes else None,
            "windowSeconds": keep * interval,
            "minutes": minutes,
        }
    )


def cost(old: JSON, snap: Snapshot, spec: api.LLMEndpointSpec, now: float) -> JSON:
    """Accumulated cost since the endpoint's first tick.

    GPU-hours count every replica that exists (replica-hours when `gpusPerReplica` is 0); the
    wasted share is replicas still warming up plus ready replicas that served nothing.
    """
    before = old.get("cost") or {}
    dt = _elapsed(old, spec, now)
    gpus = max(spec.resources.gpus_per_replica, 1)
    fleet = snap.fleet
    idle = sum(1 for r in snap.replicas if r.tokens_per_s == 0 and r.running == 0)
    hours = float(before.get("gpuHours") or 0.0) + fleet.current * gpus * dt / 3600
    wasted = float(before.get("wastedGpuHours") or 0.0) + (
        (max(fleet.current - fleet.ready, 0) + idle) * gpus * dt / 3600
    )
    served = float(before.get("successfulRequests") or 0.0) + snap.successes_per_s * dt
    tokens = float(before.get("tokens") or 0.0) + snap.tokens_per_s * dt
    spent = hours * spec.cost.gpu_hour_price
    return _clean(
        {
            "gpuHours": round(hours, 6),
            "wastedGpuHours": round(wasted, 6),
            "successfulRequests": round(served, 3),
            "tokens": round(tokens, 1),
            "perSuccessfulRequest": round(spent / served, 6) if served >= 1 else None,
            "perMillionTokens": round(spent / tokens * 1e6, 4) if tokens >= 1 else None,
            "currency": spec.cost.currency,
            "since": before.get("since") or stamp(now),
        }
    )


def traffic_classes(
    old: JSON, snap: Snapshot, spec: api.LLMEndpointSpec, now: float, attainment: float | None
) -> list[JSON]:
    """Per class: an interactive one's SLO attainment (the endpoint's), a deferrable one's
    deadlines met and missed and tokens served in valleys (accumulated like cost), and its
    backlog now, from the routers' deferred queue (signals/deferred.py)."""
    before = {c.get("name"): c for c in old.get("trafficClasses") or []}
    dt = _elapsed(old, spec, now) if snap.ok else 0.0
    queues = {b.traffic_class: b for b in snap.deferred} if snap.ok else {}
    out = []
    for c in spec.traffic_classes:
        if not c.deferrable:
            out.append(_clean({"name": c.name, "deferrable": False, "sloAttainment": attainment}))
            continue
        prev = before.get(c.name) or {}
        q = queues.get(c.name)
        met = float(prev.get("deadlineMet") or 0.0) + (q.met_per_s * dt if q else 0.0)
        missed = float(prev.get("deadlineMissed") or 0.0) + (q.missed_per_s * dt if q else 0.0)
        valley = float(prev.get("valleyTokens") or 0.0) + (q.valley_tokens_per_s * dt if q else 0.0)
        entry = {
            "name": c.name,
            "deferrable": True,
            "deadlineAttainment": round(met / (met + missed), 4) if met + missed >= 1 else None,
            "deadlineMet": round(met, 3),
            "deadlineMissed": round(missed, 3),
            "backlogRequests": q.requests if q else prev.get("backlogRequests"),
            "backlogTokens": q.tokens if q else prev.get("backlogTokens"),
            "oldestAgeSeconds": _round(q.oldest_age_s) if q else prev.get("oldestAgeSeconds"),
            "valleyTokens": round(valley, 1),
            "since": prev.get("since") or stamp(now),
        }
        out.append(_clean(entry))
    return out


def decisions(old: JSON, decision: Decision, snap: Snapshot, now: float, was: int) -> list[JSON]:
    """The last ten decisions that changed the replica count, newest last."""
    kept = list(old.get("decisions") or [])
    if decision.desired == was:
        return kept
    entry = _clean(
        {
            "time": stamp(now),
            "fromReplicas": was,
            "toReplicas": decision.desired,
            "reason": decision.reason,
            "message": decision.message,
            "demandTokensPerSecond": _round(decision.demand_tokens_per_s),
            "forecastTokensPerSecond": _round(decision.forecast_tokens_per_s),
            "perReplicaTokensPerSecond": _round(decision.per_replica_tokens_per_s),
            "ttftP99Seconds": _round(snap.latency.ttft_p99, 4),
            "waiting": _round(snap.waiting, 2),
            "kvUsage": _round(snap.kv_usage_max, 3),
        }
    )
    return [*kept, entry][-DECISIONS_KEPT:]


def _elapsed(old: JSON, spec: api.LLMEndpointSpec, now: float) -> float:
    """Seconds since the last tick's status (at most two intervals; 0 on the first tick)."""
    last = parse((old.get("capacity") or {}).get("updatedAt"))
    interval = spec.scaling.capacity_interval_seconds
    return min(max(now - last, 0.0), 2.0 * interval) if last is not None else 0.0


def _round(value: float | None, digits: int = 1) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _clean(obj: JSON) -> JSON:
    return {k: v for k, v in obj.items() if v is not None}
