"""One simulated run: a workload, an endpoint spec, a profile and a policy, step by step.

Each step routes the step's arrivals, runs every replica's engine for `dt`, records the ground
truth, lets the scraper sample the Ready replicas, and on the policy's interval builds a
`Snapshot` from the scraped samples and asks the policy for a replica count, which the endpoint
actuates (start-up delay, drain). All policies start from the same warm fleet: the replicas the
first minute needs, Ready. With a lead-in (`Settings.lead_in_s`) the run starts that long before
time 0, on the looped workload's end, and only time 0 onwards is recorded: each policy meets the
trace in the state its own decisions on the traffic before it left, as on a cluster that had been
serving it, not from a fleet sized for the trace's first minute with nothing learned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.sim.arrivals import Workload
from kvscale.sim.endpoint import Endpoint
from kvscale.sim.engine import Limits
from kvscale.sim.policies import Policy
from kvscale.sim.profile import EngineProfile
from kvscale.sim.recorder import Recorder, Targets
from kvscale.sim.signals import Scraper

DEFAULT_QUEUE_WAIT_S = 30.0
# the comparisons' lead-in: the law's history and capacity estimate, HPA's and KEDA's windows and a
# replica's start-up all settle well within it
LEAD_IN_S = 1800.0


@dataclass(frozen=True)
class Settings:
    dt_s: float = 1.0
    scrape_interval_s: float = 15.0
    scrape_delay_s: float = 0.0
    seed: int = 0
    lead_in_s: float = 0.0  # run this long before time 0 unrecorded (the workload's loop end)


@dataclass
class Recording:
    policy: str
    recorder: Recorder
    decisions: list[tuple[float, int, str]] = field(default_factory=list)
    steps: int = 0
    wall_s: float = 0.0

    @property
    def flaps(self) -> int:
        """Reversals of the replica count's direction (up then down, or down then up)."""
        values = [d for _, d, _ in self.decisions]
        steps = np.sign(np.diff(values)) if len(values) > 1 else np.zeros(0)
        moves = steps[steps != 0]
        return int(np.count_nonzero(moves[1:] != moves[:-1])) if len(moves) > 1 else 0


def limits_for(spec: LLMEndpointSpec, profile: EngineProfile) -> Limits:
    waits = [c.queue_wait_seconds for c in spec.traffic_classes if not c.deferrable]
    return Limits(
        max_num_seqs=spec.engine.max_num_seqs,
        max_num_batched_tokens=spec.engine.max_num_batched_tokens,
        kv_tokens=profile.kv_tokens,
        max_model_len=spec.model.max_model_len,
        max_queue_wait_s=min(waits) if waits else DEFAULT_QUEUE_WAIT_S,
    )


def targets_for(spec: LLMEndpointSpec) -> Targets:
    return Targets(spec.slo.ttft_p99_seconds, spec.slo.itl_p99_seconds)


def simulate(
    workload: Workload,
    spec: LLMEndpointSpec,
    profile: EngineProfile,
    policy: Policy,
    initial_replicas: int,
    settings: Settings = Settings(),
    progress: bool = False,
) -> Recording:
    import time

    started = time.perf_counter()
    dt = settings.dt_s
    rng = np.random.default_rng(settings.seed)
    ep = Endpoint("sim", profile, limits_for(spec, profile), spec.scaling.max_replicas, rng)
    first = -round(settings.lead_in_s / dt)  # the lead-in's steps are negative
    ep.scale_to(initial_replicas, first * dt, instant=True)
    scraper = Scraper(
        settings.scrape_interval_s, settings.scrape_delay_s, spec.scaling.capacity_interval_seconds
    )
    rec = Recorder(workload.duration_s, targets_for(spec), profile.gpus_per_replica)
    out = Recording(policy.name, rec)
    steps = int(np.ceil(workload.duration_s / dt))
    next_tick = first * dt + policy.interval_s
    desired = initial_replicas
    bar = tqdm(
        total=steps - first, desc=policy.name, unit="step", disable=not progress, mininterval=1.0
    )
    for k in range(first, steps):
        t0 = k * dt
        if k == 0:  # what the lead-in left (or the warm start) is the run's first decision
            rec.decided(0.0, desired)
            out.decisions.append((0.0, desired, "Initial"))
        ep.became_ready(t0 - dt, t0)
        ep.settle(t0)
        batch = workload.window(t0, t0 + dt)
        ep.route(batch, t0)
        result = ep.engines.step(t0, dt)
        if k >= 0:
            rec.add(t0, dt, batch, result, ep)
        t1 = t0 + dt
        scraper.maybe_scrape(t1, ep)
        if t1 + 1e-9 >= next_tick:
            next_tick += policy.interval_s
            snap = scraper.snapshot(t1, ep.fleet(t1), float(ep.engines.held()))
            choice = policy.decide(snap, t1)
            ep.scale_to(choice.desired, t1, choice.victim, instant=policy.instant)
            desired = choice.desired
            if k >= 0:
                if choice.desired != out.decisions[-1][1]:
                    out.decisions.append((t1, choice.desired, choice.reason))
                rec.decided(t1, choice.desired)
        if (k - first) % 600 == 599:
            bar.update(600)
    bar.update(steps - first - bar.n)
    bar.close()
    out.steps = steps
    out.wall_s = time.perf_counter() - started
    return out
