"""What one replica carries within the SLO, measured on the simulator itself, and the oracle's plan.

The capacity is found by bisection: one replica, Poisson arrivals with the trace's own mix of
lengths, the largest rate at which, after a warm-up, the p99 TTFT and p99 inter-token gap stay
within the SLO with nothing refused. The oracle then gives each minute ceil(demand / capacity)
replicas (at least the spec's minimum), and static peak the largest of those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvscale.sim.arrivals import Batch, RateWorkload, Shapes, TraceWorkload, Workload
from kvscale.sim.engine import Engines, Limits
from kvscale.sim.profile import EngineProfile
from kvscale.sim.recorder import Targets

WARMUP_S = 120.0
MEASURE_S = 300.0
STEP_S = 1.0
ITERATIONS = 14


@dataclass(frozen=True)
class Capacity:
    requests_per_s: float
    tokens_per_s: float  # prompt + output tokens per second at that rate, with the trace's mix


def lengths_of(workload: Workload) -> Shapes:
    if isinstance(workload, TraceWorkload):
        return workload.shapes
    if isinstance(workload, RateWorkload):
        return workload.lengths
    raise TypeError(f"no lengths for {type(workload).__name__}")


def meets_slo(
    profile: EngineProfile, limits: Limits, targets: Targets, shapes: Shapes, rate: float, seed: int
) -> bool:
    rng = np.random.default_rng(seed)
    engines = Engines(profile, limits, 1)
    ttft: list[np.ndarray] = []
    gaps: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    steps = int((WARMUP_S + MEASURE_S) / STEP_S)
    for k in range(steps):
        t0 = k * STEP_S
        n = int(rng.poisson(rate * STEP_S))
        pick = rng.integers(0, len(shapes.input), n)
        at = np.sort(t0 + rng.random(n) * STEP_S)
        batch = Batch(at, shapes.input[pick], shapes.output[pick], shapes.cached[pick])
        engines.add(batch, np.zeros(n, dtype=np.int64))
        out = engines.step(t0, STEP_S)
        if t0 < WARMUP_S:
            continue
        if len(out.refused_at):
            return False
        ttft.append(out.ttft)
        gaps.append(out.itl_gap)
        weights.append(out.itl_weight)
    t = np.concatenate(ttft)
    g, w = np.concatenate(gaps), np.concatenate(weights)
    if len(t) == 0:
        return True
    if float(np.quantile(t, 0.99)) > targets.ttft_s:
        return False
    return _weighted_quantile(g, w, 0.99) <= targets.itl_s if len(g) else True


def calibrate(
    profile: EngineProfile, limits: Limits, targets: Targets, shapes: Shapes, seed: int = 0
) -> Capacity:
    mean_tokens = float(np.mean(shapes.input + shapes.output))
    mean_prefill = float(np.mean(np.maximum(shapes.input - shapes.cached, 1)))
    hi = max(profile.prefill_tokens_per_s) / mean_prefill * 1.5
    lo = 0.0
    for i in range(ITERATIONS):
        mid = (lo + hi) / 2
        if meets_slo(profile, limits, targets, shapes, mid, seed + i):
            lo = mid
        else:
            hi = mid
    return Capacity(lo, lo * mean_tokens)


def needed_per_minute(
    demand_tokens: np.ndarray, capacity: Capacity, min_replicas: int, max_replicas: int
) -> np.ndarray:
    per_s = demand_tokens / 60.0
    raw = np.ceil(per_s / max(capacity.tokens_per_s, 1e-9)).astype(np.int64)
    return np.clip(raw, max(min_replicas, 0), max_replicas)


def demand_per_minute(workload: Workload) -> np.ndarray:
    minutes = math.ceil(workload.duration_s / 60.0)
    out = np.zeros(minutes)
    for chunk in workload.chunks():
        m = np.minimum((chunk.at // 60).astype(np.int64), minutes - 1)
        out += np.bincount(m, (chunk.input + chunk.output).astype(float), minlength=minutes)
    return out


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    i = int(np.searchsorted(cum, q * cum[-1]))
    return float(values[order][min(i, len(values) - 1)])
