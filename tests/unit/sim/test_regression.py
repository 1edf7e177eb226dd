"""A short simulation of every policy on the committed ServeGen sample: what must hold.

12 hours of ServeGen m-large's aggregate rates (time-compressed 12x into one simulated hour, 0.3x
rate, about 70 requests/s at the mean) with Azure conv lengths, on the shipped H200 profile of the
kvscale engine, at 5 s steps. The issue's invariants are checked literally; where they do not
hold today the test is an expected failure that names the measured numbers, and turns red the day
they hold (strict), so the marker cannot outlive the problem.
"""

from __future__ import annotations

from typing import Any

import pytest
from sim_helpers import TRACES

from kvscale.sim.compare import Scenario, compare
from kvscale.sim.profile import load_profile
from kvscale.sim.report import summarise
from kvscale.sim.run import Settings


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    scenario = Scenario(
        "servegen-m-large",
        TRACES,
        load_profile("h200-kvscale-eager"),
        hours=1.0,
        time_scale=12.0,
        rate_scale=0.3,
        settings=Settings(dt_s=5.0),
    )
    return summarise(compare(scenario))


def test_kvscale_meets_the_slo_in_the_target_share_of_minutes(report: dict[str, Any]) -> None:
    kv = report["policies"]["kvscale"]
    assert kv["slo_minutes_fraction"] >= 0.99, kv
    assert kv["refused"] == 0


def test_the_oracle_meets_the_slo_for_less_than_static_and_kvscale(report: dict[str, Any]) -> None:
    p = report["policies"]
    assert p["oracle"]["slo_minutes_fraction"] >= 0.99
    assert p["static"]["slo_minutes_fraction"] >= 0.99
    assert p["oracle"]["gpu_hours"] <= p["kvscale"]["gpu_hours"] <= p["static"]["gpu_hours"] * 1.05
    assert p["oracle"]["gpu_hours"] < p["static"]["gpu_hours"]


@pytest.mark.xfail(
    strict=True,
    reason="On the eager H200 profile the engine is step-bound before it is KV-bound: queued "
    "prompts wait outside the KV cache, so KV usage stays near 0.4 at capacity and the reactive "
    "policy (up above 0.5) never scales up, and HPA on running/maxNumSeqs sits below its 0.7 "
    "target. Both spend fewer GPU-hours than the oracle while missing the SLO in most minutes "
    "(measured: reactive 6.0 GPU-h at 17% SLO minutes, HPA 2.1 at 0%, oracle 8.5, kvscale 10.5).",
)
def test_issue_invariants_oracle_fewest_and_kvscale_below_reactive(
    report: dict[str, Any],
) -> None:
    p = report["policies"]
    oracle = p["oracle"]["gpu_hours"]
    assert all(oracle <= q["gpu_hours"] for q in p.values()), {
        n: q["gpu_hours"] for n, q in p.items()
    }
    assert p["kvscale"]["gpu_hours"] < p["reactive"]["gpu_hours"]
