"""The causal reference's followers (kvscale.sim.reference): causal, the oracle at no lag, and the
cheapest factor found by bisection; and the like-for-like tuned pick the report sets beside it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvscale.sim import oracle as orc
from kvscale.sim.reference import BISECTIONS, FACTORS, Follower, cheapest
from kvscale.sim.report import like_for_like

NEED = np.random.default_rng(7).uniform(0.5, 9.0, 90)  # minutes of demand over a capacity


def test_with_no_lag_one_window_and_factor_one_it_is_the_oracles_plan() -> None:
    per_replica = 1000.0
    demand = NEED * 60.0 * per_replica  # tokens a minute
    oracle = orc.needed_per_minute(demand, orc.Capacity(1.0, per_replica), 1, 50)
    np.testing.assert_array_equal(Follower(0, 1, 1.0).plan(NEED, 1, 50), oracle)


@pytest.mark.parametrize(("lag", "window"), [(1, 1), (2, 3), (3, 5)])
def test_a_minutes_demand_reaches_only_the_minutes_lag_after_it(lag: int, window: int) -> None:
    follower = Follower(lag, window, 1.3)
    base = follower.plan(NEED, 1, 100)
    for m in (10, 40, 70):
        spiked = NEED.copy()
        spiked[m] = 50.0
        changed = np.flatnonzero(follower.plan(spiked, 1, 100) != base)
        assert changed.tolist() == list(range(m + lag, min(m + lag + window, len(NEED))))


def _share_sized(plan: np.ndarray) -> tuple[float, float]:
    """A stand-in for the simulator: a minute meets the SLO when its replicas cover its need."""
    return float(np.mean(plan >= NEED)), float(plan.sum() / 60.0)


@pytest.mark.parametrize("goal", [0.9, 0.99])
def test_the_cheapest_factor_is_found_within_the_bisections_precision(goal: float) -> None:
    point = cheapest(_share_sized, NEED, 1, 3, goal, (1, 100))
    assert point is not None and point.slo_minutes_fraction >= goal
    step = (FACTORS[1] - FACTORS[0]) / 2**BISECTIONS
    below = Follower(1, 3, point.follower.factor - step)
    assert _share_sized(below.plan(NEED, 1, 100))[0] < goal
    assert point.gpu_hours == pytest.approx(point.follower.plan(NEED, 1, 100).sum() / 60.0)


def test_no_follower_when_even_the_largest_factor_misses() -> None:
    # a need no replica count reaches within the bounds
    assert cheapest(_share_sized, NEED, 1, 1, 0.99, (1, 3)) is None


def test_like_for_like_skips_a_cheaper_pick_that_missed_more_minutes() -> None:
    def pick(value: float, gpu_hours: float, slo: float) -> dict[str, Any]:
        judged = {"gpu_hours": gpu_hours, "slo_minutes_fraction": slo, "minutes": 180}
        return {"tuned_value": value, "tuned": {"judged": judged}}

    tuned = {
        "kvscale": {"judged": {"gpu_hours": 66.0, "slo_minutes_fraction": 0.994, "minutes": 180}},
        "baselines": {
            "hpa": pick(142.4, 54.5, 0.933),  # cheaper, but tuned on one hour it missed more
            "hpa-kv": pick(0.15, 66.0, 1.0),
            "static": pick(23, 69.0, 1.0),
            "keda": {"tuned_value": None, "tuned": None},  # no setting met the goal
        },
    }
    like = like_for_like(tuned)
    assert like is not None
    assert like["baseline"] == "hpa-kv@0.15" and like["kvscale_gpu_hours_ratio"] == 1.0
    tuned["kvscale"]["judged"]["slo_minutes_fraction"] = 1.0 + 1e-9  # none has as many
    assert like_for_like(tuned) is None
