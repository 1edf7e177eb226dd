"""Mixed traffic: interactive chat plus daily deferrable batch jobs, three ways of serving it.

The workload, from the shared traces:

- interactive: ServeGen m-large's aggregate rates (Alibaba Bailian, 10-minute windows from
  midnight of day 1) as Poisson arrivals with Azure 2023 conversation lengths. Not Azure conv's
  own hour: it is a flat Poisson stream that looped has no valleys, while a real day's rates rise
  and fall (day 1 ranges about 1.8x between its 10-minute windows) and leave spare capacity that
  batch work can fill, or not;
- batch: two daily jobs shaped like the Azure 2023 code trace (its requests, lengths and on/off
  arrival bursts over 57 minutes, rate-scaled), one submitted at 09:00 with a 4-hour deadline and
  one at 14:00 with a 1-hour deadline: both in the busy part of the day, not the night's valley,
  so deferral must find spare capacity between interactive peaks. The jobs' rate is set so that
  batch tokens are `batch_share` of all tokens (25% by default: an assumption, not a measured mix).

The setups, on the same arrivals, spec, profile and seed:

- `deferral`: kvscale as issue 21 builds it: the router holds batch requests earliest deadline
  first (sim/deferral.py) and releases them into spare capacity at the lowest engine priority;
  the capacity law sees the backlog (tokens due within each horizon) and counts only the rate
  its deadlines require;
- `all_interactive`: the same law and endpoint, every request served at once at one priority
  (batch requests may queue in the engine up to their deadline);
- `two_pools`: an interactive endpoint and a batch endpoint (minReplicas 0, scale to zero after
  300 s, as a user would set a batch pool), each scaled by the law, batch served at once.

Reported per setup: GPU-hours, the share of minutes whose interactive p99s met the SLO, deferred
requests met and missed (completed past the deadline, or refused), and batch tokens served in
valleys (released into spare capacity; only deferral has a notion of it).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.sim import oracle as orc
from kvscale.sim.arrivals import Batch, Shapes, TraceWorkload, Workload, open_workload
from kvscale.sim.compare import Scenario, derive_spec
from kvscale.sim.deferral import DeferralQueue
from kvscale.sim.endpoint import Endpoint
from kvscale.sim.engine import Deferred
from kvscale.sim.policies import Kvscale
from kvscale.sim.profile import EngineProfile
from kvscale.sim.recorder import Recorder
from kvscale.sim.run import Settings, limits_for, targets_for
from kvscale.sim.signals import Scraper
from kvscale.sim.tuning import ok_minutes

INTERACTIVE = "servegen-m-large"
LENGTHS = "azure-conv"
BATCH = "azure-code"
DAY_S = 86_400.0
JOBS = (("batch-4h", 9 * 3600.0, 14_400.0), ("batch-1h", 14 * 3600.0, 3600.0))
SETUPS = ("deferral", "all_interactive", "two_pools")
MAX_REPLICAS = 64
BATCH_POOL_IDLE_S = 300


@dataclass(frozen=True)
class MixedScenario:
    traces_dir: Path
    profile: EngineProfile
    hours: float = 24.0
    rate_scale: float = 0.1  # of ServeGen's rates (the capacity_sim bench's setting)
    batch_share: float = 0.25
    ttft_slo_s: float = 2.0
    settings: Settings = field(default_factory=lambda: Settings(dt_s=2.0))
    jobs: tuple[tuple[str, float, float], ...] = JOBS  # (class, submitted at s of day, deadline)


class Job:
    """A daily batch job: the code trace's arrivals from `start_s` each day, rate-scaled."""

    def __init__(self, name: str, start_s: float, deadline_s: float, trace: Workload) -> None:
        self.name, self.start_s, self.deadline_s, self.trace = name, start_s, deadline_s, trace

    def window(self, t0: float, t1: float) -> Batch:
        local = (t0 - self.start_s) % DAY_S
        if local + (t1 - t0) > self.trace.duration_s:
            return _empty()
        b = self.trace.window(local, local + (t1 - t0))
        return Batch(b.at + (t0 - local), b.input, b.output, b.cached)

    def deferred(self, batch: Batch, low: bool) -> Deferred:
        n = len(batch)
        no = np.zeros(n, dtype=bool)
        return Deferred(batch.at + self.deadline_s, np.full(n, self.deadline_s), no | low, no)


@dataclass
class Pool:
    """One endpoint with its scraper, law and ground truth (and, for deferral, its queue)."""

    spec: LLMEndpointSpec
    endpoint: Endpoint
    scraper: Scraper
    policy: Kvscale
    recorder: Recorder
    queue: DeferralQueue | None = None
    next_tick: float = 0.0
    decisions: list[tuple[float, int, str]] = field(default_factory=list)

    def begin(self, t0: float, dt: float) -> None:
        self.endpoint.became_ready(t0 - dt, t0)
        self.endpoint.settle(t0)

    def finish(self, t0: float, dt: float, arrivals: Batch) -> None:
        ep, t1 = self.endpoint, t0 + dt
        self.recorder.add(t0, dt, arrivals, ep.engines.step(t0, dt), ep)
        self.scraper.maybe_scrape(t1, ep)
        if t1 + 1e-9 < self.next_tick:
            return
        self.next_tick += self.policy.interval_s
        snap = self.scraper.snapshot(t1, ep.fleet(t1), float(ep.engines.held()))
        if self.queue is not None:
            snap = replace(snap, deferred=(self.queue.backlog(t1, *self.scraper.deferred_rates),))
        choice = self.policy.decide(snap, t1)
        ep.scale_to(choice.desired, t1, choice.victim)
        if not self.decisions or choice.desired != self.decisions[-1][1]:
            self.decisions.append((t1, choice.desired, choice.reason))
        self.recorder.decided(t1, choice.desired)


def compare_mixed(s: MixedScenario) -> dict[str, Any]:
    """The three setups on one workload; the `mixed` section of the capacity_sim bench."""
    interactive = open_workload(
        INTERACTIVE, s.traces_dir, hours=s.hours, rate_scale=s.rate_scale,
        length_trace=LENGTHS, seed=s.settings.seed,
    )  # fmt: skip
    code = open_workload(BATCH, s.traces_dir, hours=None, seed=s.settings.seed)
    assert isinstance(code, TraceWorkload)
    job_scale = _job_scale(s, interactive, code)
    scenario = Scenario(
        trace=INTERACTIVE, traces_dir=s.traces_dir, profile=s.profile, hours=s.hours,
        rate_scale=s.rate_scale, ttft_slo_s=s.ttft_slo_s, settings=s.settings,
    )  # fmt: skip
    conv = orc.lengths_of(interactive)
    both = Shapes(
        *(np.concatenate([a, b]) for a, b in zip(_fields(conv), _fields(code.shapes), strict=True))
    )
    draft = derive_spec(scenario, both, MAX_REPLICAS, None)
    cap = orc.calibrate(s.profile, limits_for(draft, s.profile), targets_for(draft), conv)
    spec = derive_spec(scenario, both, MAX_REPLICAS, cap.tokens_per_s)
    classes = [{"name": "chat", "priority": 10}] + [
        {"name": name, "deadlineSeconds": deadline} for name, _, deadline in s.jobs
    ]
    mixed = _with(spec, trafficClasses=classes)
    batch_pool = _with(
        mixed,
        scaling={
            **spec.scaling.model_dump(by_alias=True, exclude_none=True),
            "minReplicas": 0,
            "scaleToZeroAfterSeconds": BATCH_POOL_IDLE_S,
        },
    )
    results: dict[str, Any] = {}
    for setup in SETUPS:
        started = time.perf_counter()
        jobs = [
            Job(name, start, deadline, _scaled(code, job_scale, s.settings.seed + i))
            for i, (name, start, deadline) in enumerate(s.jobs)
        ]
        pools = _run(setup, s, mixed, batch_pool, cap.tokens_per_s, interactive, jobs)
        results[setup] = _summary(pools, mixed) | {
            "wall_s": round(time.perf_counter() - started, 1)
        }
    return {
        "what": __doc__.split("\n\n")[0] if __doc__ else "",
        "workload": {
            "interactive": f"{INTERACTIVE} rates x{s.rate_scale}, {LENGTHS} lengths",
            "batch": [
                {
                    "trace": BATCH,
                    "rate_scale": round(job_scale, 2),
                    "submitted_at_h": start / 3600,
                    "deadline_s": deadline,
                    "class": name,
                }
                for name, start, deadline in s.jobs
            ],
            "batch_share_of_tokens": s.batch_share,
            "hours": s.hours,
        },
        "spec": mixed.model_dump(by_alias=True, exclude_defaults=True, mode="json"),
        "replica_capacity_tokens_per_s": round(cap.tokens_per_s, 1),
        "settings": {"dt_s": s.settings.dt_s, "seed": s.settings.seed},
        "setups": results,
        "targets": _targets(results),
    }


def _run(
    setup: str,
    s: MixedScenario,
    spec: LLMEndpointSpec,
    batch_spec: LLMEndpointSpec,
    capacity: float,
    interactive: Workload,
    jobs: list[Job],
) -> list[Pool]:
    rng = np.random.default_rng(s.settings.seed)
    main = _pool(spec, s, rng, 1)
    pools = [main]
    if setup == "deferral":
        main.queue = DeferralQueue(capacity)
    if setup == "two_pools":
        pools.append(_pool(batch_spec, s, rng, 0))
    dt = s.settings.dt_s
    for k in range(math.ceil(interactive.duration_s / dt)):
        t0 = k * dt
        for p in pools:
            p.begin(t0, dt)
        chat = interactive.window(t0, t0 + dt)
        main.endpoint.route(chat, t0)
        batches = [(job, job.window(t0, t0 + dt)) for job in jobs]
        arrivals = {id(p): [chat] if p is main else [] for p in pools}
        for job, b in batches:
            if not len(b):
                continue
            if main.queue is not None:
                main.queue.hold(b, np.full(len(b), job.deadline_s))
            else:
                pools[-1].endpoint.route(b, t0, job.deferred(b, low=False))
            arrivals[id(pools[-1])].append(b)
        if main.queue is not None:
            main.queue.saw_interactive(float(chat.input.sum() + chat.output.sum()), dt)
            main.queue.release(main.endpoint, t0, dt)
        for p in pools:
            p.finish(t0, dt, _concat(arrivals[id(p)]))
    return pools


def _pool(spec: LLMEndpointSpec, s: MixedScenario, rng: np.random.Generator, start: int) -> Pool:
    ep = Endpoint("sim", s.profile, limits_for(spec, s.profile), spec.scaling.max_replicas, rng)
    ep.scale_to(start, 0.0, instant=True)
    interval = spec.scaling.capacity_interval_seconds
    scraper = Scraper(s.settings.scrape_interval_s, s.settings.scrape_delay_s, interval)
    recorder = Recorder(s.hours * 3600, targets_for(spec), s.profile.gpus_per_replica)
    policy = Kvscale(spec)
    return Pool(spec, ep, scraper, policy, recorder, next_tick=policy.interval_s)


def _summary(pools: list[Pool], spec: LLMEndpointSpec) -> dict[str, Any]:
    main = pools[0]
    series = [p.recorder.series for p in pools]
    total = {k: float(sum(x[k].sum() for x in series)) for k in series[0]}
    missed = total["deferred_missed"] + sum(p.queue.missed for p in pools if p.queue)
    ok = ok_minutes(_as_recording(main), spec)
    return {
        "gpu_hours": round(total["gpu_s"] / 3600, 2),
        "interactive_slo_minutes_fraction": round(float(ok.mean()), 4),
        "deferred_met": int(total["deferred_met"]),
        "deferred_missed": int(missed),
        "batch_tokens_served": int(total["deferred_tokens"]),
        "valley_tokens_served": int(total["valley_tokens"]),
        "interactive_refused": int(main.recorder.series["refused"].sum())
        - int(main.recorder.series["deferred_missed"].sum()),
        "peak_replicas": [int(np.ceil(p.recorder.series["replicas"].max())) for p in pools],
        "mean_replicas": [round(float(p.recorder.series["replicas"].mean()), 2) for p in pools],
        "reasons": [_reasons(p) for p in pools],
    }


def _targets(r: dict[str, Any]) -> dict[str, Any]:
    mine, flat, two = (
        r["deferral"],
        r.get("all_interactive", r["deferral"]),
        r.get("two_pools", r["deferral"]),
    )
    saving = 1 - mine["gpu_hours"] / flat["gpu_hours"] if flat["gpu_hours"] else 0.0
    return {
        "gpu_hours_saving_vs_all_interactive": {
            "target": ">= 0.25", "value": round(saving, 3), "met": saving >= 0.25,
        },
        "interactive_slo_minutes_fraction": {
            "target": ">= 0.99", "value": mine["interactive_slo_minutes_fraction"],
            "met": mine["interactive_slo_minutes_fraction"] >= 0.99,
        },
        "missed_deadlines": {
            "target": "0", "value": mine["deferred_missed"], "met": mine["deferred_missed"] == 0,
        },
        "gpu_hours_vs_two_pools": {
            "target": "<= 1.0", "value": round(mine["gpu_hours"] / two["gpu_hours"], 3),
            "met": mine["gpu_hours"] <= two["gpu_hours"],
        },
    }  # fmt: skip


def _job_scale(s: MixedScenario, interactive: Workload, code: TraceWorkload) -> float:
    """Copies of the code trace per job so batch tokens are `batch_share` of all tokens."""
    chat = sum(float(b.input.sum() + b.output.sum()) for b in interactive.chunks())
    runs = sum(
        1 for _, start, _ in s.jobs for day in range(math.ceil(s.hours / 24))
        if day * DAY_S + start + code.duration_s <= s.hours * 3600
    )  # fmt: skip
    per_copy = float(code.shapes.input.sum() + code.shapes.output.sum())
    return chat * s.batch_share / (1 - s.batch_share) / max(runs, 1) / per_copy


def _scaled(code: TraceWorkload, scale: float, seed: int) -> TraceWorkload:
    from kvscale.sim.arrivals import Replay

    return TraceWorkload(code.name, code.shapes, Replay(1.0, scale, code.duration_s, seed))


def _with(spec: LLMEndpointSpec, **changes: Any) -> LLMEndpointSpec:
    body = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    return LLMEndpointSpec.model_validate(body | changes)


def _fields(s: Shapes) -> tuple[np.ndarray, ...]:  # type: ignore[type-arg]
    return (s.at, s.input, s.output, s.cached)


def _concat(batches: list[Batch]) -> Batch:
    if not batches:
        return _empty()
    if len(batches) == 1:
        return batches[0]
    return Batch(*(np.concatenate(parts) for parts in zip(*map(_fields_b, batches), strict=True)))


def _fields_b(b: Batch) -> tuple[np.ndarray, ...]:  # type: ignore[type-arg]
    return (b.at, b.input, b.output, b.cached)


def _empty() -> Batch:
    z = np.zeros(0, dtype=np.int64)
    return Batch(np.zeros(0), z, z, z)


def _reasons(p: Pool) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, _, reason in p.decisions:
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def _as_recording(p: Pool) -> Any:
    from kvscale.sim.run import Recording

    return Recording("kvscale", p.recorder)
