"""The TTFT SLO's feasibility: the share of requests whose prefill alone exceeds it, the SLO
`kvscale plan` would suggest, and the operator's reading of it from a quiet window."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import limits, profile

from kvscale.controllers.feasibility import Feasibility, observed, round_up
from kvscale.signals.snapshot import Latency, ReplicaSignals, Snapshot
from kvscale.sim.arrivals import Shapes
from kvscale.sim.feasibility import assess, idle_prefill_s
from kvscale.status.loops import feasibility_condition


@pytest.mark.parametrize(
    ("seconds", "rounded"),
    [(0.01, 0.1), (0.4, 0.5), (1.0, 1.0), (1.01, 1.5), (8.2, 10.0), (12, 15)],
)
def test_suggestions_are_round_numbers_at_or_above(seconds: float, rounded: float) -> None:
    assert round_up(seconds) == rounded


def shapes(inputs: list[int]) -> Shapes:
    n = len(inputs)
    return Shapes(np.zeros(n), np.array(inputs), np.full(n, 10), np.zeros(n, dtype=np.int64))


def test_prefill_on_an_idle_replica_is_chunked_at_the_profiles_rate() -> None:
    # the test profile prefills 10k tokens/s at any chunk
    took = idle_prefill_s(profile(), limits(batched=2048), shapes([1000, 40_000]))
    assert took == pytest.approx([0.1, 4.0])


def test_long_prompts_make_a_short_slo_infeasible_and_plan_suggests_one() -> None:
    # 97 prompts of 1k tokens (0.1 s) and 3 of 40k (4 s): 3% cannot meet 2 s on any replica
    mix = shapes([1000] * 97 + [40_000] * 3)
    verdict = assess(profile(), limits(), mix, 2.0, 0.99)
    assert not verdict.feasible and verdict.share_over == pytest.approx(0.03)
    assert verdict.prefill_s == pytest.approx(4.0)
    assert verdict.suggested_slo_s == 10.0  # twice the p99 prefill, rounded up
    assert "3.0% of requests" in verdict.message() and "plan would set 10 s" in verdict.message()
    assert assess(profile(), limits(), mix, verdict.suggested_slo_s, 0.99).feasible
    # the same mix within the share the attainment target allows: feasible
    assert assess(profile(), limits(), mix, 2.0, 0.95).feasible


def snap(ttft: float, waiting: float = 0.0) -> Snapshot:
    rep = ReplicaSignals(pod="p", successes_per_s=1.0, waiting=waiting, running=2)
    return Snapshot(taken_at=0.0, window_s=60.0, replicas=(rep,), latency=Latency(ttft_p99=ttft))


def test_the_operator_judges_only_windows_in_which_nothing_queued() -> None:
    assert observed(snap(9.0, waiting=3), 2.0) is None  # queueing is in that TTFT
    slow = observed(snap(9.0), 2.0)
    assert slow is not None and not slow.feasible and slow.suggested_slo_s == 20.0
    cond = feasibility_condition(slow)
    assert (cond.type, cond.status, cond.reason) == ("SLOFeasible", "False", "PrefillExceedsSLO")
    assert "no replica count meets it" in cond.message
    fine = observed(snap(0.3), 2.0)
    assert fine is not None and feasibility_condition(fine).status == "True"


def test_a_feasible_verdict_says_how_much_room_prefill_leaves() -> None:
    assert Feasibility(2.0, 0.99, 0.5).message() == (
        "The 2 s TTFT SLO is feasible: prefill alone takes 0.50 s at p99"
    )
