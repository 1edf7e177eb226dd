"""What one replica carries within the SLO, solved from how its latency grows with its load.

Throughput observed (`replica_capacity`) says what replicas did, not what they could do: an
endpoint running at a fifth of its capacity proves only that a fifth fits, and with a pessimistic
prior it is sized as if full. The engine's latency says more. A replica's p99 time to first token
and inter-token latency grow with the tokens/s it carries, and as a queue's do (M/M/1: W = S/(1-u)
at utilisation u, so 1/W = 1/S - u/S) the inverse of a latency falls about linearly with its load:

    1 / latency ≈ a - b · tokens_per_s

One line per latency (TTFT, ITL) is fitted online from each Ready replica's p99 and token rate by
least squares with exponential forgetting (the sufficient statistics of recursive least squares:
six numbers a line, kept in the law's state); the replicas read in one interval weigh one
interval together, so a large fleet does not pass for many independent points. The slope's
standard error is the fit's uncertainty. Solved for the SLO with the slope at its upper
confidence bound (`Z` standard errors steeper, pivoted about the data's centre, where the line is
best known), a line gives a capacity the data support, not merely one they allow.

A line says nothing (`None`, and the law sizes as before) with fewer than `MIN_INTERVALS`
intervals of weight, with load spread less than `MIN_SPREAD` of its mean (flat data: the slope
is unknown); it bounds nothing unless its latency grows with load beyond doubt (the slope more
than `Z` errors above zero): a latency flat over the data says nothing of where it turns up.
Beyond the data a line is optimistic (an engine's tail latency is flat until its batch fills,
then turns up sharply), so the law bounds the solution by what it observed (`replica_capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

FORGET = 0.98  # per interval: about 35 intervals' half-life, as the workload's mix drifts
MIN_INTERVALS = 6.0  # weight of evidence (intervals) before a line is solved
MIN_SPREAD = 0.05  # standard deviation of the load over its mean: below it the data are flat
MIN_LATENCY_SPREAD = 0.01  # ... of 1/latency: below it latency did not move (a flat line)
Z = 2.0  # standard errors the slope is steepened by: about 97.5% one-sided


@dataclass(frozen=True)
class Line:
    """Weighted sums of (x = tokens/s, y = 1/latency) with forgetting; frozen, serialisable."""

    w: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    syy: float = 0.0

    def add(self, points: Iterable[tuple[float, float]], forget: float = FORGET) -> Line:
        """This line aged by one interval, with the interval's points (weighing one together)."""
        pts = [(x, 1.0 / latency) for x, latency in points if latency > 0 and x > 0]
        k = forget
        w, sx, sy = self.w * k, self.sx * k, self.sy * k
        sxx, sxy, syy = self.sxx * k, self.sxy * k, self.syy * k
        each = 1.0 / len(pts) if pts else 0.0
        for x, y in pts:
            w, sx, sy = w + each, sx + each * x, sy + each * y
            sxx, sxy, syy = sxx + each * x * x, sxy + each * x * y, syy + each * y * y
        return Line(w, sx, sy, sxx, sxy, syy)

    def fit(self) -> Fit | None:
        """Intercept, slope (of 1/latency on load) and the slope's standard error, if the data
        say enough."""
        if self.w < MIN_INTERVALS:
            return None
        mx, my = self.sx / self.w, self.sy / self.w
        sxx = self.sxx - self.w * mx * mx
        if mx <= 0 or sxx <= 0 or math.sqrt(sxx / self.w) < MIN_SPREAD * mx:
            return None
        sxy = self.sxy - self.w * mx * my
        syy = self.syy - self.w * my * my
        if my <= 0 or syy <= 0 or math.sqrt(syy / self.w) < MIN_LATENCY_SPREAD * my:
            return Fit(mx, my, 0.0, 0.0)  # latency did not move: flat (not float noise)
        slope = sxy / sxx
        residual = max(syy - slope * sxy, 0.0) / (self.w - 2.0)
        return Fit(mx, my, -slope, math.sqrt(residual / sxx))


@dataclass(frozen=True)
class Fit:
    """1/latency = mean_y - slope · (x - mean_x), the slope with its standard error."""

    mean_x: float
    mean_y: float
    slope: float  # how fast 1/latency falls per token/s (positive: latency grows with load)
    slope_se: float

    @property
    def falls(self) -> bool:
        """Latency grows with load beyond doubt (the slope is more than `Z` errors above 0)."""
        return self.slope > Z * self.slope_se and self.slope > 0

    def solve(self, target_s: float) -> float:
        """Tokens/s at which latency reaches `target_s`, with the slope `Z` errors steeper."""
        steep = self.slope + Z * self.slope_se
        return max(self.mean_x + (self.mean_y - 1.0 / target_s) / steep, 0.0)


@dataclass(frozen=True)
class LatencyModel:
    """Both lines: time to first token and inter-token latency against a replica's tokens/s."""

    ttft: Line = Line()
    itl: Line = Line()

    def learn(
        self, ttft: Iterable[tuple[float, float]], itl: Iterable[tuple[float, float]]
    ) -> LatencyModel:
        """One interval's (tokens/s, p99 seconds) per replica for each latency."""
        return LatencyModel(self.ttft.add(ttft), self.itl.add(itl))

    def capacity(self, ttft_target_s: float, itl_target_s: float) -> float | None:
        """Tokens/s one replica carries within both targets; None unless the TTFT line is known
        and a known line falls (a latency flat over the data bounds nothing: the other decides;
        flat in both, nothing says where latency turns up). An ITL line without evidence (no
        decoding seen) leaves TTFT to decide.
        """
        ttft, itl = self.ttft.fit(), self.itl.fit()
        if ttft is None:
            return None
        lines = ((ttft, ttft_target_s), (itl, itl_target_s))
        falling = [(f, t) for f, t in lines if f is not None and f.falls]
        return min(f.solve(t) for f, t in falling) if falling else None

    @classmethod
    def from_dict(cls, raw: dict[str, dict[str, float]] | None) -> LatencyModel:
        data = raw or {}
        return cls(Line(**(data.get("ttft") or {})), Line(**(data.get("itl") or {})))
