"""All policies on one trace: same workload, same spec, same profile, same seed.

Steps: open the workload; derive the endpoint spec unless one is given (maximum length covering
the trace, `maxNumSeqs`/`maxNumBatchedTokens` as `kvscale plan` recommends for the profile and
SLO, `replicaCapacityTokensPerSecond` from the calibrated capacity as `kvscale plan` writes it);
calibrate one replica's capacity; tune the oracle (the largest per-replica load at which a
per-minute ceil(demand / load) schedule still meets the SLO in the target share of minutes, found
by bisection on the first `ORACLE_TUNE_HOURS`); size static peak from it; then run each policy,
in parallel processes when `jobs` > 1.
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.controllers.feasibility import Feasibility
from kvscale.sim import oracle as orc
from kvscale.sim import reference, tuning
from kvscale.sim.arrivals import Shapes, Workload, open_workload
from kvscale.sim.feasibility import assess
from kvscale.sim.policies import Kvscale, Oracle, Policy, Static
from kvscale.sim.profile import EngineProfile
from kvscale.sim.run import Recording, Settings, limits_for, simulate, targets_for
from kvscale.sim.sizing import recommend_limits

POLICIES = ("kvscale", *tuning.KNOBS, "oracle")
ORACLE_TUNE_HOURS = 1.0
ORACLE_TUNE_STEPS = 5


@dataclass(frozen=True)
class Scenario:
    trace: str
    traces_dir: Path
    profile: EngineProfile
    hours: float | None = None
    time_scale: float = 1.0
    rate_scale: float = 1.0
    length_trace: str = "azure-conv"
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.2
    gpu_hour_price: float = 3.5
    prior: bool = True  # replicaCapacityTokensPerSecond from the calibration, as `plan` does
    spec: LLMEndpointSpec | None = None
    settings: Settings = field(default_factory=Settings)
    policies: tuple[str, ...] = POLICIES
    tune: bool = False  # sweep each baseline's knob (kvscale.sim.tuning), not only its default


@dataclass
class Comparison:
    scenario: Scenario
    spec: LLMEndpointSpec
    capacity: orc.Capacity
    oracle_tokens_per_s: float
    needed: np.ndarray
    demand_tokens: np.ndarray
    recordings: dict[str, Recording]
    duration_s: float
    feasibility: Feasibility
    tune_minutes: int = 0
    sweeps: dict[str, list[tuning.Outcome]] = field(default_factory=dict)  # baseline -> settings
    # with a sweep: the cheapest causal follower of each window (kvscale.sim.reference)
    references: list[reference.Point] = field(default_factory=list)
    reference_lag: int | None = None


def workload_of(s: Scenario) -> Workload:
    return open_workload(
        s.trace,
        s.traces_dir,
        hours=s.hours,
        time_scale=s.time_scale,
        rate_scale=s.rate_scale,
        length_trace=s.length_trace,
        seed=s.settings.seed,
    )


def derive_spec(
    s: Scenario, shapes: Shapes, max_replicas: int, prior: float | None
) -> LLMEndpointSpec:
    longest = int(np.max(shapes.input + shapes.output))
    max_len = min(max(2 ** math.ceil(math.log2(longest)), 4096), 131072)
    context = float(np.mean(shapes.input + shapes.output / 2))
    seqs, batched = recommend_limits(s.profile.kv_tokens, context, s.profile, s.itl_slo_s)
    scaling: dict[str, Any] = {"minReplicas": 1, "maxReplicas": max_replicas}
    if prior is not None:
        scaling["replicaCapacityTokensPerSecond"] = round(prior, 1)
    return LLMEndpointSpec.model_validate(
        {
            "model": {
                "name": "sim",
                "source": {"dummy": {"preset": "llama-3-8b"}},
                "maxModelLen": max_len,
            },
            "engine": {"maxNumSeqs": seqs, "maxNumBatchedTokens": batched},
            "resources": {"gpusPerReplica": s.profile.gpus_per_replica, "gpuType": s.profile.gpu},
            "slo": {"ttftP99Seconds": s.ttft_slo_s, "itlP99Seconds": s.itl_slo_s},
            "scaling": scaling,
            "cost": {"gpuHourPrice": s.gpu_hour_price},
        }
    )


def slo_fraction(rec: Recording, spec: LLMEndpointSpec) -> float:
    return float(tuning.ok_minutes(rec, spec).mean())


def tune_oracle(s: Scenario, spec: LLMEndpointSpec, cap: orc.Capacity, demand: np.ndarray) -> float:
    """The largest tokens/s per replica the oracle may plan with and still meet the SLO."""
    hours = min(s.hours or math.inf, ORACLE_TUNE_HOURS)
    wl = open_workload(
        s.trace, s.traces_dir, hours=hours if math.isfinite(hours) else None,
        time_scale=s.time_scale, rate_scale=s.rate_scale, length_trace=s.length_trace,
        seed=s.settings.seed,
    )  # fmt: skip
    minutes = math.ceil(wl.duration_s / 60)
    goal = spec.slo.attainment_target
    lo, hi = 0.3 * cap.tokens_per_s, cap.tokens_per_s
    scale = spec.scaling

    def ok(per_replica: float) -> bool:
        c = orc.Capacity(cap.requests_per_s, per_replica)
        need = orc.needed_per_minute(demand[:minutes], c, scale.min_replicas, scale.max_replicas)
        rec = simulate(wl, spec, s.profile, Oracle(need), int(need[0]), _cold(s.settings))
        return slo_fraction(rec, spec) >= goal

    if ok(hi):
        return hi
    for _ in range(ORACLE_TUNE_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def make_policy(
    name: str, spec: LLMEndpointSpec, needed: np.ndarray, static: int, capacity: float
) -> Policy:
    """A policy by name; a baseline's name alone means its default setting."""
    if name == "kvscale":
        return Kvscale(spec)
    if name == "oracle":
        return Oracle(needed)
    if name in tuning.KNOBS:
        return tuning.policy(tuning.default_setting(name, spec, static, capacity), spec)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


@dataclass(frozen=True)
class _Job:
    workload: Workload
    spec: LLMEndpointSpec
    profile: EngineProfile
    policy: Policy
    initial: int
    settings: Settings
    progress: bool
    setting: tuning.Setting | None = None  # a sweep's non-default setting: only its outcome
    window: int = 0


def _run_one(job: _Job) -> Recording | tuning.Outcome:
    rec = simulate(
        job.workload, job.spec, job.profile, job.policy, job.initial, job.settings, job.progress
    )
    if job.setting is None:
        return rec
    # a sweep's run comes back as three numbers a part: its per-minute histograms stay here
    return tuning.outcome(job.setting, rec, job.spec, job.window)


@dataclass(frozen=True)
class _Reference:
    """One window's search for the cheapest causal follower (kvscale.sim.reference)."""

    workload: Workload
    spec: LLMEndpointSpec
    profile: EngineProfile
    settings: Settings
    need: np.ndarray  # each minute's demand over the oracle's per-replica capacity
    lag: int
    window: int


def _search(job: _Reference) -> reference.Point | None:
    def run(plan: np.ndarray) -> tuple[float, float]:
        rec = simulate(
            job.workload, job.spec, job.profile, Oracle(plan), int(plan[0]), job.settings
        )
        return slo_fraction(rec, job.spec), float(rec.recorder.series["gpu_s"].sum() / 3600)

    sc = job.spec.scaling
    bounds = (sc.min_replicas, sc.max_replicas)
    return reference.cheapest(run, job.need, job.lag, job.window, tuning.TUNE_GOAL, bounds)


def compare(s: Scenario, jobs: int = 1, progress: bool = False) -> Comparison:
    wl = workload_of(s)
    shapes = orc.lengths_of(wl)
    spec = s.spec or derive_spec(s, shapes, 1000, None)
    cap = orc.calibrate(s.profile, limits_for(spec, s.profile), targets_for(spec), shapes)
    demand = orc.demand_per_minute(wl)
    if s.spec is None:  # maxReplicas: twice the Poisson-capacity peak, as a user would bound it
        peak = int(orc.needed_per_minute(demand, cap, 1, 1000).max())
        spec = derive_spec(
            s, shapes, max(2 * peak, peak + 4), cap.tokens_per_s if s.prior else None
        )
    slo = spec.slo
    feasible = assess(
        s.profile, limits_for(spec, s.profile), shapes, slo.ttft_p99_seconds, slo.attainment_target
    )
    per_replica = tune_oracle(s, spec, cap, demand)
    tuned = orc.Capacity(cap.requests_per_s * per_replica / cap.tokens_per_s, per_replica)
    sc = spec.scaling
    needed = orc.needed_per_minute(demand, tuned, sc.min_replicas, sc.max_replicas)
    static = int(needed.max())
    window = tuning.tuning_minutes(s.trace, math.ceil(wl.duration_s / 60))
    shown = progress and jobs == 1
    runs = []
    for name in s.policies:
        policy = make_policy(name, spec, needed, static, cap.tokens_per_s)
        settings = _cold(s.settings) if isinstance(policy, Oracle) else s.settings
        runs.append(_Job(wl, spec, s.profile, policy, _initial(policy, needed), settings, shown))
    swept = [n for n in s.policies if n in tuning.KNOBS] if s.tune else []
    for name in swept:
        for setting in tuning.sweep(name, spec, static, cap.tokens_per_s):
            if not setting.default:  # the default runs above, under the baseline's name
                policy = tuning.policy(setting, spec)
                initial = _initial(policy, needed)
                runs.append(
                    _Job(wl, spec, s.profile, policy, initial, s.settings, shown, setting, window)
                )
    lag = reference.lag_minutes(spec, s.profile) if s.tune else None
    searches = [
        _Reference(wl, spec, s.profile, _cold(s.settings), demand / 60.0 / per_replica, lag, w)
        for w in reference.WINDOWS
        if lag is not None
    ]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_run_one, runs))
            points = list(pool.map(_search, searches))
    else:
        results = [_run_one(r) for r in runs]
        points = [_search(r) for r in searches]
    recs = {r.policy: r for r in results if isinstance(r, Recording)}
    sweeps: dict[str, list[tuning.Outcome]] = {}
    for name in swept:
        default = tuning.default_setting(name, spec, static, cap.tokens_per_s)
        found = [r for r in results if isinstance(r, tuning.Outcome) and r.setting.baseline == name]
        found.append(tuning.outcome(default, recs[name], spec, window))
        sweeps[name] = sorted(found, key=lambda o: o.setting.value)
    return Comparison(
        s,
        spec,
        cap,
        per_replica,
        needed,
        demand,
        recs,
        wl.duration_s,
        feasible,
        window,
        sweeps,
        [p for p in points if p is not None],
        lag,
    )


def _cold(settings: Settings) -> Settings:
    """The oracle's settings: no lead-in (its plan starts at time 0; its replicas are Ready at
    once, so it has no state to settle)."""
    return replace(settings, lead_in_s=0.0)


def _initial(policy: Policy, needed: np.ndarray) -> int:
    """Every policy starts from the replicas the first minute needs; static from its own."""
    return policy.replicas if isinstance(policy, Static) else int(needed[0])


def with_policies(s: Scenario, names: tuple[str, ...]) -> Scenario:
    return replace(s, policies=names)
