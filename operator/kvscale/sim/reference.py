"""The best causal follower, tuned in hindsight: where a policy that reacts to measured demand can
get on a trace, beside the oracle that knows each minute's demand before it comes.

A causal policy knows demand only up to its last decision, and a replica it adds serves only
after its start-up: its replicas for minute m follow demand measured `lag` minutes before (the
capacity interval plus the median start-up, in whole minutes). A follower sizes minute m for
`factor` times the peak of the `window` minutes of demand ending `lag` minutes before, over the
oracle's per-replica capacity, and gets exactly that, Ready on the minute, from exact demand (no
scrape, no noise). For each window the smallest factor that meets the SLO in the goal's share of
minutes is found by bisection in the simulator; the cheapest window's follower is the reference.
It is tuned on the whole trace after the fact, which no deployed policy can do, so it shows about
how close to the oracle a policy that does not forecast beyond its lag can come. It is not a
proof that no policy can do better: one that predicts the trace (its loop, a daily cycle) may.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.sim.profile import EngineProfile

WINDOWS = (1, 3, 5)  # minutes of measured demand a follower takes the peak of
FACTORS = (1.0, 2.5)  # the range bisected: the oracle's own sizing to 2.5 times it
BISECTIONS = 6  # the factor found to within (2.5 - 1) / 2^6 = 0.023


@dataclass(frozen=True)
class Follower:
    lag: int  # minutes between the last demand it knows and the minute it sizes
    window: int  # minutes of demand it takes the peak of
    factor: float  # times that peak over one replica's capacity

    def plan(self, need: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Replicas per minute; `need[m]` is minute m's demand over one replica's capacity.

        The first minutes, with less than `lag` minutes behind them, see the first minute's
        demand: an advantage over a real policy, never a handicap.
        """
        out = np.empty(len(need), dtype=np.int64)
        for m in range(len(need)):
            last = max(m - self.lag, 0)
            first = max(last - self.window + 1, 0)
            out[m] = math.ceil(self.factor * float(need[first : last + 1].max()) - 1e-9)
        return np.clip(out, lo, hi)


@dataclass(frozen=True)
class Point:
    follower: Follower
    slo_minutes_fraction: float
    gpu_hours: float

    def to_dict(self, oracle_gpu_hours: float | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            **asdict(self.follower),
            "slo_minutes_fraction": round(self.slo_minutes_fraction, 4),
            "gpu_hours": round(self.gpu_hours, 3),
        }
        out["factor"] = round(self.follower.factor, 3)
        if oracle_gpu_hours:
            out["gpu_hours_vs_oracle"] = round(self.gpu_hours / oracle_gpu_hours, 3)
        return out


def lag_minutes(spec: LLMEndpointSpec, profile: EngineProfile) -> int:
    """Whole minutes from the demand a decision reads to the minute a replica it adds serves."""
    reaction = spec.scaling.capacity_interval_seconds + profile.startup.median_s
    return max(1, round(reaction / 60.0))


def cheapest(
    run: Callable[[np.ndarray], tuple[float, float]],
    need: np.ndarray,
    lag: int,
    window: int,
    goal: float,
    bounds: tuple[int, int],
) -> Point | None:
    """The follower of this lag and window with the smallest factor that meets `goal`, found by
    bisection; `run(plan)` simulates a plan and returns (SLO minutes fraction, GPU-hours). None
    when even the largest factor misses the goal."""
    lo, hi = FACTORS
    follower = Follower(lag, window, hi)
    slo, gpu_hours = run(follower.plan(need, *bounds))
    if slo < goal:
        return None  # even the largest factor misses: no follower of this shape meets the goal
    best = Point(follower, slo, gpu_hours)
    for _ in range(BISECTIONS):
        follower = Follower(lag, window, (lo + hi) / 2)
        slo, gpu_hours = run(follower.plan(need, *bounds))
        if slo >= goal:
            best, hi = Point(follower, slo, gpu_hours), follower.factor
        else:
            lo = follower.factor
    return best
