"""The routing-weights law: per-replica signals → a weight in [0, 1] per pod, every few seconds.

The router multiplies each replica's share of new requests by its weight, so a replica whose queue
grows, whose KV cache fills, that preempts or whose TTFT runs past its peers' gets less new work
until it recovers; weight 0 stops new work entirely (draining before a scale-in). A replica that
has just turned Ready starts slow: its weight grows from a tenth of its target to the whole
target over its warm-up (as Envoy's and HAProxy's slow start do), so it takes load from an
overloaded peer at once without taking a full share before its first requests have run.

Pure: the caller fetches signals and the pod sets, calls `decide`, publishes the weights and
keeps `decision.state` for the next tick. Weights are relative (replicas loaded like their peers
get 1) and smoothed asymmetrically: they fall fast, so a hot replica sheds load within one tick,
and rise slowly through a dead band, so flat noisy load does not make them oscillate.

For an endpoint with deferrable classes the law also publishes each replica's token budget: the
outstanding tokens (prompt + requested output, as the router counts them) it may carry at the
SLO, which the router's deferred queue fills with spare work. A replica at its capacity c
(tokens/s, as the capacity law learned it, else the spec's prior) works off c x T tokens within
the TTFT target T; work beyond that would keep an interactive arrival that waits behind it past
its target, so c x T is what it may hold, scaled by its weight (a loaded or warming replica
holds less, a draining one none). The budget follows the endpoint: a faster model, a looser SLO or a
larger learned capacity let more deferred work in, where the router's fixed default does not.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvscale.signals.snapshot import ReplicaSignals
from kvscale.timestamps import stamp

DRAINING = "Draining"
WARMING = "WarmingUp"
HOT = "ReplicaHot"
BALANCED = "Balanced"
NO_SIGNALS = "NoSignals"
NO_REPLICAS = "NoReplicas"
WEIGHTS_KEY = "weights.json"  # in the `<endpoint>-routing` ConfigMap


@dataclass(frozen=True)
class RoutingParams:
    """How strongly each signal lowers a replica's weight, and how weights are smoothed."""

    ttft_slo_s: float | None = None  # the endpoint's p99 TTFT target, when it has one
    queue_gain: float = 1.0  # per waiting request per running slot
    kv_knee: float = 0.8  # KV usage above which the penalty starts
    kv_gain: float = 2.0  # at 100 % KV usage
    preemption_gain: float = 2.0  # per preemption per second
    ttft_gain: float = 1.0  # per multiple of the SLO (or of the peers' median) above 1
    ttft_margin_s: float = 0.25  # without an SLO, TTFT this close to the peers' is noise
    tolerance: float = 0.3  # pressure up to (1 + tolerance) x the median is noise ...
    slack: float = 0.25  # ... plus this much (a quarter of a queued request per slot)
    fall: float = 0.8  # share of a drop applied at once
    rise: float = 0.3  # share of a rise applied per tick
    dead_band: float = 0.05  # changes smaller than this are not published
    floor: float = 0.05  # a loaded but serving replica keeps at least this weight
    hot_below: float = 0.5  # weights under this are called hot in the reason
    warm_start: float = 0.1  # share of its target a replica gets as its warm-up begins
    # a replica's capacity at the SLO (tokens/s): with `ttft_slo_s`, sets its token budget
    replica_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("fall", "rise"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")
        if not 0.0 <= self.floor <= 1.0 or not 0.0 <= self.dead_band < 1.0:
            raise ValueError("floor must be in [0, 1] and dead_band in [0, 1)")
        if not 0.0 <= self.kv_knee < 1.0:
            raise ValueError("kv_knee must be in [0, 1)")
        if not 0.0 < self.warm_start <= 1.0:
            raise ValueError("warm_start must be in (0, 1]")


@dataclass(frozen=True)
class RoutingState:
    """The weights last published, per pod: all the law remembers between ticks."""

    weights: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"weights": dict(sorted(self.weights.items()))}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> RoutingState:
        weights = (raw or {}).get("weights") or {}
        return cls({str(k): _clamp(float(v)) for k, v in weights.items() if _finite(v)})


@dataclass(frozen=True)
class RoutingDecision:
    weights: dict[str, float]
    reason: str  # CamelCase code
    message: str  # a sentence
    state: RoutingState
    targets: dict[str, float]  # unsmoothed, for status and debugging
    token_budgets: dict[str, float] = field(default_factory=dict)  # none: not published


def publication(decision: RoutingDecision, now: float) -> str:
    """`weights.json` of the `<endpoint>-routing` ConfigMap, the format the router reads."""
    body: dict[str, Any] = {
        "weights": decision.weights,
        "updatedAt": stamp(now),
        "reason": decision.reason,
    }
    if decision.token_budgets:
        body["tokenBudgets"] = decision.token_budgets
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def token_budgets(weights: Mapping[str, float], params: RoutingParams) -> dict[str, float]:
    """Per pod, the outstanding tokens it may carry at the SLO: weight x capacity x TTFT target
    (see the module docstring); none without a capacity and a TTFT target."""
    if not params.replica_tokens_per_s or not params.ttft_slo_s:
        return {}
    at_slo = params.replica_tokens_per_s * params.ttft_slo_s
    return {pod: float(round(w * at_slo)) for pod, w in weights.items()}


def pressure(r: ReplicaSignals, peers_ttft: float | None, params: RoutingParams) -> float:
    """How overloaded one replica looks: 0 when idle, growing without bound."""
    queue = r.waiting / max(1.0, r.running)
    kv = max(0.0, r.kv_usage - params.kv_knee) / (1.0 - params.kv_knee)
    ttft, mine = 0.0, r.latency.ttft_p99
    if mine is not None and params.ttft_slo_s:  # past the SLO, in multiples of it
        ttft = max(0.0, mine / params.ttft_slo_s - 1.0)
    elif mine is not None and peers_ttft is not None:  # past the peers, beyond a noise margin
        margin = params.ttft_margin_s
        ttft = max(0.0, mine - peers_ttft - margin) / max(peers_ttft, margin)
    return (
        params.queue_gain * queue
        + params.kv_gain * kv
        + params.preemption_gain * r.preemptions_per_s
        + params.ttft_gain * ttft
    )


def targets(signals: Sequence[ReplicaSignals], params: RoutingParams) -> dict[str, float]:
    """Unsmoothed weights: 1 / (1 + excess pressure over the replicas' (low) median).

    Pressure within a tolerance of the median is noise, not load, and costs nothing; so evenly
    loaded replicas all get 1 however busy they are, and only a replica that stands out loses.
    """
    ttfts = [r.latency.ttft_p99 for r in signals if r.latency.ttft_p99 is not None]
    peers = statistics.median(ttfts) if ttfts else None
    load = {r.pod: pressure(r, peers, params) for r in signals}
    if not load:
        return {}
    reference = (1.0 + params.tolerance) * statistics.median_low(load.values()) + params.slack
    return {p: max(params.floor, 1.0 / (1.0 + max(0.0, x - reference))) for p, x in load.items()}


def smooth(previous: float | None, target: float, params: RoutingParams) -> float:
    if previous is None or previous == 0.0:  # a replica that starts serving starts at its target
        return target
    step = target - previous
    if abs(step) < params.dead_band:  # noise: keep the weight (back to 1 once within the band)
        return 1.0 if target == 1.0 else previous
    return _clamp(previous + (params.fall if step < 0 else params.rise) * step)


def decide(
    pods: Collection[str],
    signals: Sequence[ReplicaSignals],
    warming: Mapping[str, float],
    draining: Collection[str],
    state: RoutingState,
    params: RoutingParams = RoutingParams(),
) -> RoutingDecision:
    """Weights for `pods` (every pod the router may see): 0 when draining; for a pod warming up
    (`warming`: the share of its warm-up elapsed, in [0, 1)) its target scaled by a ramp from
    `warm_start` to 1; else the smoothed target from its signals. A serving pod without signals
    keeps its last weight (1 when new), since missing metrics are no evidence of load."""
    serving = [p for p in sorted(pods) if p not in draining]
    measured = [r for r in signals if r.pod in serving]
    goal = targets(measured, params)
    weights: dict[str, float] = {}
    remembered: dict[str, float] = {}
    for pod in sorted(pods):
        if pod in draining:
            weights[pod] = remembered[pod] = 0.0
        elif pod in warming:  # remembered as 0: once warm it starts at its target, unsmoothed
            ramp = params.warm_start + (1.0 - params.warm_start) * _clamp(warming[pod])
            weights[pod] = round(max(params.floor, ramp * goal.get(pod, 1.0)), 4)
            remembered[pod] = 0.0
        elif pod in goal:
            weights[pod] = remembered[pod] = round(
                smooth(state.weights.get(pod), goal[pod], params), 4
            )
        else:
            weights[pod] = remembered[pod] = state.weights.get(pod) or 1.0
    warm = set(warming) - set(draining)
    reason, message = _explain(weights, set(draining), warm, measured, params)
    budgets = token_budgets(weights, params)
    return RoutingDecision(weights, reason, message, RoutingState(remembered), goal, budgets)


def _explain(
    weights: Mapping[str, float],
    draining: set[str],
    warming: set[str],
    measured: Sequence[ReplicaSignals],
    params: RoutingParams,
) -> tuple[str, str]:
    if not weights:
        return NO_REPLICAS, "No replica to route to."
    drained = sorted(draining & set(weights))
    if drained:
        return DRAINING, f"Draining {', '.join(drained)}: no new requests."
    hot = sorted(p for p, w in weights.items() if 0.0 < w < params.hot_below and p not in warming)
    if hot:
        shares = ", ".join(f"{p} at {weights[p]:.2f}" for p in hot)
        return HOT, f"Shifted new requests away from loaded replicas: {shares}."
    warm = sorted(warming & set(weights))
    if warm:
        shares = ", ".join(f"{p} at {weights[p]:.2f}" for p in warm)
        return WARMING, f"Ramping up replicas still warming up: {shares}."
    if not measured:
        return NO_SIGNALS, "No replica signals yet: every serving replica keeps its weight."
    return BALANCED, "Replicas are evenly loaded."


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
