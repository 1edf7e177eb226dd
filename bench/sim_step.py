"""`python -m bench sim_step`: what the simulator's aggregation costs in accuracy, and its speed.

The simulator advances every replica in steps of `dt` seconds with the batch fixed for the step
(a fluid model of engine steps). As `dt` shrinks toward one engine step (tens of milliseconds)
that converges to a per-step model, so the spread between `dt` = 0.25 s and the coarser steps the
CLI and benchmarks use is the error aggregation adds. Same workload (Azure conv x4, one hour),
same spec and profile, fixed fleets (static and oracle) so the control law's own sensitivity to
timing does not mix in. Also measured: CPU seconds per simulated hour at about 200 requests/s.
"""

from __future__ import annotations

import os
import time
from typing import Any

from kvscale.sim import oracle as orc
from kvscale.sim.compare import Scenario, derive_spec, workload_of
from kvscale.sim.policies import Oracle, Static
from kvscale.sim.profile import load_profile
from kvscale.sim.recorder import quantile_rows
from kvscale.sim.report import policy_summary
from kvscale.sim.run import Settings, limits_for, simulate, targets_for
from kvscale.traces import default_traces_dir

STEPS = (0.25, 1.0, 2.0, 5.0)


def run(quick: bool = False) -> dict[str, Any]:
    profile = load_profile("h200-kvscale-eager")
    traces = default_traces_dir()
    hours = 0.25 if quick else 1.0
    s = Scenario("azure-conv", traces, profile, hours=hours, rate_scale=4.0)
    wl = workload_of(s)
    shapes = orc.lengths_of(wl)
    spec = derive_spec(s, shapes, 40, None)
    cap = orc.calibrate(profile, limits_for(spec, profile), targets_for(spec), shapes)
    needed = orc.needed_per_minute(orc.demand_per_minute(wl), cap, 1, 40)
    rows: dict[str, Any] = {}
    for dt in STEPS:
        for policy in (Static(int(needed.max())), Oracle(needed)):
            start = policy.replicas if isinstance(policy, Static) else int(needed[0])
            rec = simulate(wl, spec, profile, policy, start, Settings(dt_s=dt))
            summary = policy_summary(rec, spec, wl.duration_s)
            ttft50 = quantile_rows(rec.recorder.ttft.sum(axis=0, keepdims=True), 0.5)[0]
            rows[f"{policy.name}@dt={dt}"] = {
                "gpu_hours": summary["gpu_hours"],
                "slo_minutes_fraction": summary["slo_minutes_fraction"],
                "ttft_p50_s": round(float(ttft50), 4),
                "ttft_p99_s": summary["ttft_p99_s"],
                "itl_p99_s": summary["itl_p99_s"],
                "goodput_fraction": summary["goodput_fraction"],
                "wall_s": summary["wall_s"],
            }
    return {
        "what": "aggregation error: the same fixed fleets simulated with 0.25-5 s steps",
        "workload": {"trace": "azure-conv", "rate_scale": 4.0, "hours": hours},
        "replica_capacity_tokens_per_s": round(cap.tokens_per_s, 1),
        "runs": rows,
        "speed": _speed(profile, traces, 0.1 if quick else 1.0),
    }


def _speed(profile: Any, traces: Any, hours: float) -> dict[str, Any]:
    s = Scenario("servegen-m-large", traces, profile, hours=hours)
    wl = workload_of(s)
    spec = derive_spec(s, orc.lengths_of(wl), 200, None)
    cpu, wall = time.process_time(), time.perf_counter()
    rec = simulate(wl, spec, profile, Static(30), 30, Settings(dt_s=1.0))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    requests = float(rec.recorder.series["arrivals"].sum())
    return {
        "trace": "servegen-m-large (rate scale 1), static 30 replicas, dt 1 s",
        "simulated_hours": hours,
        "requests_per_s": round(requests / (hours * 3600), 1),
        "cpu_s_per_simulated_hour": round(cpu / hours, 2),
        "wall_s_per_simulated_hour": round(wall / hours, 2),
        "load_average_after": os.getloadavg()[0],
        "projected_cpu_s_for_24h_six_policies": round(cpu / hours * 24 * 6, 0),
    }
