"""The latency model: lines of 1/latency against a replica's tokens/s, fitted online and solved
for the SLO, that say nothing when the data cannot tell."""

from __future__ import annotations

import json
import random
from dataclasses import asdict

import pytest

from kvscale.controllers.latency_model import MIN_INTERVALS, LatencyModel, Line

CAPACITY = 1000.0  # tokens/s at which the queue's latency would grow without bound
IDLE_S = 0.05  # latency of an idle replica


def queueing(load: float) -> float:
    """M/M/1-shaped latency: IDLE_S / (1 - load / CAPACITY)."""
    return IDLE_S / (1.0 - load / CAPACITY)


def noisy_line(intervals: int, seed: int = 1, lo: float = 100.0, hi: float = 800.0) -> Line:
    rng = random.Random(seed)
    line = Line()
    for _ in range(intervals):
        points = []
        for _ in range(3):  # three replicas a interval
            load = rng.uniform(lo, hi)
            points.append((load, queueing(load) * (1 + rng.gauss(0, 0.05))))
        line = line.add(points)
    return line


def test_recovers_known_parameters_from_noisy_points() -> None:
    fit = noisy_line(200).fit()
    assert fit is not None
    # 1/latency = 1/IDLE_S - load / (IDLE_S * CAPACITY): intercept 20, slope 0.02
    intercept = fit.mean_y + fit.slope * fit.mean_x
    assert intercept == pytest.approx(1 / IDLE_S, rel=0.05)
    assert fit.slope == pytest.approx(1 / (IDLE_S * CAPACITY), rel=0.1)
    assert fit.falls
    # solved for a 0.5 s target: where IDLE_S / (1 - x/C) = 0.5, i.e. x = 900, from below
    solved = fit.solve(0.5)
    assert 0.8 * 900 < solved < 900 * 1.02


def test_uncertainty_shrinks_with_evidence() -> None:
    errors = []
    for intervals in (8, 30, 150):
        fit = noisy_line(intervals, seed=3).fit()
        assert fit is not None
        errors.append(fit.slope_se)
    assert errors[0] > errors[1] > errors[2]
    # and the conservative solution closes in on the truth from below
    solved = [noisy_line(n, seed=3).fit().solve(0.5) for n in (8, 150)]  # type: ignore[union-attr]
    assert solved[0] < solved[1] <= 900 * 1.02


def test_few_points_say_nothing() -> None:
    assert noisy_line(int(MIN_INTERVALS) - 1).fit() is None
    assert LatencyModel().capacity(1.5, 0.2) is None


def test_flat_load_says_nothing() -> None:
    """Every interval at the same load: the slope is unknown, whatever the latencies."""
    line = noisy_line(100, lo=500.0, hi=505.0)
    assert line.fit() is None


def test_flat_latency_bounds_nothing() -> None:
    """Load moved but latency did not (a replica far below its knee, or a step-shaped engine):
    nothing says where latency turns up, so the model gives no capacity."""
    points = [[(load, 0.05)] for load in range(100, 900, 50)]
    line = Line()
    for p in points:
        line = line.add(p)
    model = LatencyModel(line, line)
    assert model.capacity(1.5, 0.2) is None


def test_only_a_latency_that_grows_bounds_the_capacity() -> None:
    ttft = noisy_line(100)
    itl = Line()
    rng = random.Random(5)
    for _ in range(100):  # ITL that does not grow with load (noise only)
        itl = itl.add([(rng.uniform(100, 800), 0.02 * (1 + rng.gauss(0, 0.05)))])
    model = LatencyModel(ttft, itl)
    solved = model.capacity(0.5, 0.2)
    assert solved is not None
    assert solved == pytest.approx(ttft.fit().solve(0.5))  # type: ignore[union-attr]


def test_old_points_are_forgotten() -> None:
    """A mix that changes moves the line: the newest intervals weigh most."""
    line = noisy_line(100)
    rng = random.Random(9)
    for _ in range(300):  # replicas now twice as fast
        load = rng.uniform(200, 1600)
        line = line.add([(load, IDLE_S / (1 - load / (2 * CAPACITY)))])
    fit = line.fit()
    assert fit is not None
    assert fit.slope == pytest.approx(1 / (IDLE_S * 2 * CAPACITY), rel=0.05)


def test_state_is_small_and_serialisable() -> None:
    model = LatencyModel(noisy_line(50), noisy_line(50, seed=2))
    raw = json.loads(json.dumps(asdict(model)))
    assert LatencyModel.from_dict(raw) == model
    assert len(json.dumps(raw)) < 600
