"""A simulation's lead-in: each policy runs on the looped trace's end before time 0, and only time
0 onwards is recorded, so it meets the trace in the state its own decisions left (as on a cluster
that had been serving it), not from a fleet sized for the first minute with nothing learned."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from sim_helpers import TRACES, profile

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.signals.snapshot import Snapshot
from kvscale.sim.arrivals import TraceWorkload, open_workload
from kvscale.sim.policies import Choice
from kvscale.sim.run import Settings, simulate
from kvscale_cluster.specs import spec_body

SPEC = LLMEndpointSpec.model_validate(spec_body(scaling={"minReplicas": 1, "maxReplicas": 8}))


@dataclass
class Fixed:
    """Always `replicas`; remembers when it was asked."""

    replicas: int
    name: str = "fixed"
    interval_s: float = 60.0
    instant: bool = False
    asked: list[float] = field(default_factory=list)

    def decide(self, snap: Snapshot, now: float) -> Choice:
        self.asked.append(now)
        return Choice(self.replicas, reason="Fixed")


def test_before_time_zero_the_workload_replays_its_loops_end() -> None:
    short = open_workload("azure-conv", TRACES, hours=0.25, rate_scale=1.0)
    assert isinstance(short, TraceWorkload)
    period = short.period_s
    span = min(60.0, period / 2)
    lead = short.window(-span, 0.0)
    # the same trace, its first loop's last `span` seconds
    whole = open_workload("azure-conv", TRACES, hours=0.25, rate_scale=1.0)
    assert whole.duration_s > period and int((period - span) // 600) == int(period // 600)
    later = whole.window(period - span, period)
    assert len(lead) > 0
    np.testing.assert_allclose(lead.at + period, later.at)
    np.testing.assert_array_equal(lead.input, later.input)
    np.testing.assert_array_equal(lead.output, later.output)


@pytest.mark.parametrize("lead_in_s", [0.0, 600.0])
def test_a_lead_in_runs_the_policy_but_records_only_the_run(lead_in_s: float) -> None:
    wl = open_workload("azure-conv", TRACES, hours=0.25, rate_scale=4.0)
    policy = Fixed(3)
    rec = simulate(wl, SPEC, profile(), policy, 2, Settings(dt_s=2.0, lead_in_s=lead_in_s))
    cold = simulate(
        open_workload("azure-conv", TRACES, hours=0.25, rate_scale=4.0),
        SPEC,
        profile(),
        Fixed(3),
        2,
        Settings(dt_s=2.0),
    )
    series = rec.recorder.series
    # the recorded run is the same trace window whatever came before it
    np.testing.assert_array_equal(series["arrivals"], cold.recorder.series["arrivals"])
    assert len(series["arrivals"]) == 15
    assert min(policy.asked) == pytest.approx(-lead_in_s + 60.0)
    if lead_in_s:
        # the third replica was added and turned Ready in the lead-in: the run starts with it
        assert rec.decisions[0] == (0.0, 3, "Initial")
        assert series["replicas"][0] == pytest.approx(3.0)
        assert series["warming_gpu_s"][0] == 0.0
    else:
        # from the warm start: two replicas, the third ordered at the first tick and warming
        assert rec.decisions[:2] == [(0.0, 2, "Initial"), (60.0, 3, "Fixed")]
        assert series["replicas"][0] == pytest.approx(2.0)
        assert series["warming_gpu_s"][1] > 0.0
