"""A small online demand forecaster: Holt's linear smoothing with a damped trend.

Demand is sampled once per capacity interval, but intervals are not exactly equal (ticks slip,
the operator restarts), so level and trend are updated per second of elapsed time. The trend is
damped toward zero so that one noisy minute cannot project a large rise over the horizon; the
one-step-ahead error is tracked (an EWMA of the relative error) and reported, so users can see
how far to trust the forecast.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ALPHA = 0.5  # weight of the newest observation in the level
BETA = 0.2  # weight of the newest slope in the trend
ERROR_WEIGHT = 0.2  # weight of the newest error in its EWMA
TREND_HALF_LIFE_S = 600.0  # the trend's projection fades with this half-life


@dataclass(frozen=True)
class Forecaster:
    """Level (tokens/s), trend (tokens/s per second) and the error so far; frozen, serialisable."""

    level: float | None = None
    trend: float = 0.0
    updated_at: float | None = None
    error: float | None = None  # EWMA of |actual - predicted| / max(actual, predicted)

    def predict(self, at: float) -> float:
        """Demand expected at time `at` (never negative); 0 before the first observation."""
        if self.level is None or self.updated_at is None:
            return 0.0
        return max(0.0, self.level + self.trend * _damped(at - self.updated_at))

    def observe(self, demand: float, at: float) -> Forecaster:
        """The forecaster after seeing `demand` at time `at`."""
        if self.level is None or self.updated_at is None:
            return Forecaster(level=demand, trend=0.0, updated_at=at, error=None)
        dt = at - self.updated_at
        if dt <= 0:
            return self
        predicted = self.predict(at)
        scale = max(demand, predicted)
        miss = abs(demand - predicted) / scale if scale > 0 else 0.0
        error = (
            miss if self.error is None else (1 - ERROR_WEIGHT) * self.error + ERROR_WEIGHT * miss
        )
        level = ALPHA * demand + (1 - ALPHA) * predicted
        slope = (level - self.level) / dt
        trend = BETA * slope + (1 - BETA) * self.trend * _decay(dt)
        return replace(self, level=level, trend=trend, updated_at=at, error=error)


def _decay(dt: float) -> float:
    return float(0.5 ** (dt / TREND_HALF_LIFE_S))


def _damped(horizon: float) -> float:
    """Seconds of trend that count over `horizon`: the integral of the fading trend."""
    if horizon <= 0:
        return 0.0
    rate = 0.6931471805599453 / TREND_HALF_LIFE_S
    return float((1 - 0.5 ** (horizon / TREND_HALF_LIFE_S)) / rate)
