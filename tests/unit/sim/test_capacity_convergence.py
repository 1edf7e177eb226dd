"""The capacity the law learns in the simulator converges to the profile's: from a prior at half
of it, the latency model's estimate is within 25% of the calibrated capacity (the Poisson load a
replica carries within the SLO) from the 10th capacity interval on; the law sizes within that band
from the 40th interval on (first from the throughput it saw: the start-up's overload is a break
within twice what held, which keeps the model out until it is forgotten), and from the 80th
(40 minutes at 30 s intervals) with the model's estimate, within 10% of the profile's."""

from __future__ import annotations

from sim_helpers import TRACES

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.controllers.capacity import TTFT_EVIDENCE
from kvscale.signals.snapshot import Snapshot
from kvscale.sim import oracle as orc
from kvscale.sim.arrivals import open_workload
from kvscale.sim.policies import Choice, Kvscale
from kvscale.sim.profile import load_profile
from kvscale.sim.run import Settings, limits_for, simulate, targets_for
from kvscale_cluster.specs import spec_body

MODEL_BY = 10  # intervals until the latency model's estimate is within the band
LAW_BY = 40  # intervals until the law sizes within the band
SOLVED_BY = 80  # intervals until the law sizes with the model's estimate, within CLOSE
BAND = 0.25
CLOSE = 0.1

MODEL = {"name": "sim", "source": {"dummy": {"preset": "llama-3-8b"}}, "maxModelLen": 8192}
ENGINE = {"maxNumSeqs": 64, "maxNumBatchedTokens": 2048}
SCALING = {
    "minReplicas": 1,
    "maxReplicas": 40,
    "capacityIntervalSeconds": 30,
    "scaleDownStabilizationSeconds": 120,
}


def spec(**scaling: object) -> LLMEndpointSpec:
    body = spec_body(model=MODEL, engine=ENGINE, scaling={**SCALING, **scaling})
    return LLMEndpointSpec.model_validate(body)


class Watched(Kvscale):
    """kvscale's policy, noting after each decision what the law sizes with and the model's
    own estimate."""

    seen: list[tuple[float, str, float | None]]

    def decide(self, snap: Snapshot, now: float) -> Choice:
        choice = super().decide(snap, now)
        assert self.law is not None
        state, slo = self.law.state, self.spec.slo
        used, source = state.replica_capacity(self.spec)
        solved = state.model.capacity(TTFT_EVIDENCE * slo.ttft_p99_seconds, slo.itl_p99_seconds)
        self.seen.append((used, source, solved))
        return choice


def test_learned_capacity_converges_to_the_profiles() -> None:
    profile = load_profile("h200-kvscale-eager")
    workload = open_workload("azure-conv", TRACES, hours=1.0, rate_scale=3.0)
    shapes = orc.lengths_of(workload)
    plain = spec()
    truth = orc.calibrate(profile, limits_for(plain, profile), targets_for(plain), shapes)
    c = truth.tokens_per_s
    endpoint = spec(replicaCapacityTokensPerSecond=round(0.5 * c))
    policy = Watched(endpoint)
    policy.seen = []
    simulate(workload, endpoint, profile, policy, 2, Settings(dt_s=1.0))
    seen = policy.seen
    assert len(seen) >= 110  # an hour of 30 s intervals

    solved = [s for _, _, s in seen[MODEL_BY:]]
    assert all(s is not None and abs(s / c - 1) <= BAND for s in solved), solved
    assert all(abs(used / c - 1) <= BAND for used, _, _ in seen[LAW_BY:])
    solved_late = seen[SOLVED_BY:]
    assert {source for _, source, _ in solved_late} == {"solved from the latency model"}
    assert all(abs(used / c - 1) <= CLOSE for used, _, _ in solved_late)
    assert seen[0][2] is None  # the model knew nothing at first
