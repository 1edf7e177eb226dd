"""What one replica carries within the SLO, learned online from what the replicas did.

Throughput a replica sustained while the endpoint met its SLO is a lower bound on its capacity;
throughput at which the SLO broke while requests queued is an upper bound. With no bound yet the
estimate is the prior (the spec's hint, else a conservative default), moved inside the bounds
once there are any; with both bounds it is at least their geometric mean, so a pessimistic prior
rises as replicas prove they carry more while staying below the load at which the SLO broke.
Both bounds are slowly forgotten, because the workload's mix (prompt and output lengths) changes
what a replica carries; a forgotten upper bound is how the estimate probes upward again. A probe
goes at most `reach` times the lower bound: an upper bound forgotten for hours (0.5% an interval
from 11.8k to 35k tokens/s on ServeGen) would otherwise put the geometric mean at twice what any
replica carried within the SLO, and the law would consolidate onto replicas that cannot carry it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_PRIOR = 1000.0  # tokens/s per replica when the spec gives no hint: conservative
FORGET = 0.995  # per interval: the lower bound shrinks and the upper bound widens by this much


@dataclass(frozen=True)
class Observation:
    """One interval's evidence, per ready replica."""

    tokens_per_s: float  # prompt + generated tokens/s per ready replica
    within_slo: bool | None  # None: no latency observed in the window
    saturated: bool  # requests queued, preempted, or the KV cache nearly full


@dataclass(frozen=True)
class ReplicaCapacity:
    """Bounds on what one replica carries, tokens/s; frozen, serialisable."""

    low: float | None = None
    high: float | None = None

    def value(self, prior: float | None, reach: float = math.inf) -> float:
        """The estimate the law sizes with; a probe between the bounds goes at most `reach`
        times the lower one."""
        base = prior if prior is not None else DEFAULT_PRIOR
        if self.high is not None:
            base = min(base, self.high)
        if self.low is not None:
            base = max(base, self.low)
        if self.low is not None and self.high is not None:
            return max(base, min(math.sqrt(self.low * self.high), reach * self.low))
        return base

    def learn(self, seen: Observation) -> ReplicaCapacity:
        low = self.low * FORGET if self.low is not None else None
        high = self.high / FORGET if self.high is not None else None
        x = seen.tokens_per_s
        if seen.within_slo and x > 0:
            low = max(low or 0.0, x)
            if high is not None and high < low:
                high = None  # the old violation no longer describes this workload
        elif seen.within_slo is False and seen.saturated and x > 0:
            high = x if high is None else min(high, x)
            if low is not None and low > high:
                low = high * FORGET
        return ReplicaCapacity(low=low, high=high)
