"""Baselines as a platform team tunes them: each knob swept, the cheapest setting that holds the
SLO on a tuning window picked, and judged on the rest of the trace.

A team that picks HPA or KEDA does not keep the first target it wrote: it moves it until the SLO
holds on the traffic it has seen. So each baseline's knob is swept over the range a user would try
(`sweep`), each setting runs over the whole trace (a policy is causal, so its first quarter is
exactly a run over the first quarter), and per trace the pick is the cheapest setting that met the
SLO in at least `TUNE_GOAL` of the minutes of the tuning window (the first quarter of the run, or
day 1 of a run of two days or more of ServeGen); it is judged, with kvscale and the oracle, on the
minutes after the window. Each baseline's default setting is one of the sweep, labelled as such.
kvscale is not in the sweep: it runs with its defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.sim.policies import HPA, Policy, Reactive, Static
from kvscale.sim.recorder import quantile_rows
from kvscale.sim.run import Recording

TUNE_GOAL = 0.99
DAY_MINUTES = 1440

# baseline -> its knob, in words
KNOBS: dict[str, str] = {
    "static": "replicas, all the time",
    "reactive": "mean KV-cache usage above which a replica is added (removed below half of it)",
    "hpa": "HPA AverageValue target on running requests per replica",
    "hpa-kv": "HPA AverageValue target on KV-cache usage per replica",
    "keda": "KEDA Prometheus scaler threshold on waiting requests per replica",
    "keda-tokens": "KEDA Prometheus scaler threshold on prompt + generated tokens/s per replica",
}
REACTIVE_UP = (0.1, 0.15, 0.25, 0.35, 0.5, 0.7)  # default 0.5 (SageServe-style 0.5/0.25)
RUNNING_SHARE = (0.025, 0.05, 0.1, 0.2, 0.4, 0.7)  # of maxNumSeqs; default 0.7 (HPA's usual 70%)
KV_TARGET = (0.05, 0.1, 0.15, 0.25, 0.4, 0.7)  # default 0.7
WAITING = (0.5, 1.0, 2.0, 5.0, 10.0)  # default 5 (the KEDA recipes' threshold)
TOKENS_SHARE = (0.4, 0.55, 0.7, 0.85, 1.0)  # of the calibrated capacity; default 1.0 (plan's)
STATIC_STEPS = 6


@dataclass(frozen=True)
class Setting:
    baseline: str
    value: float
    default: bool = False

    @property
    def name(self) -> str:
        """The policy's name in a report: the baseline itself for its default setting."""
        return self.baseline if self.default else f"{self.baseline}@{self.value:g}"


@dataclass(frozen=True)
class Part:
    """A stretch of a run's minutes: what it cost and how many minutes met the SLO."""

    gpu_hours: float
    slo_minutes_fraction: float
    minutes: int

    def to_dict(self) -> dict[str, float | int]:
        return {
            "gpu_hours": round(self.gpu_hours, 3),
            "slo_minutes_fraction": round(self.slo_minutes_fraction, 4),
            "minutes": self.minutes,
        }


@dataclass(frozen=True)
class Outcome:
    setting: Setting
    tuning: Part
    judged: Part
    whole: Part

    def to_dict(self) -> dict[str, object]:
        return {
            "value": self.setting.value,
            "default": self.setting.default,
            "tuning": self.tuning.to_dict(),
            "judged": self.judged.to_dict(),
            "whole": self.whole.to_dict(),
        }


def tuning_minutes(trace: str, minutes: int) -> int:
    """The tuning window: day 1 of two or more days of ServeGen, else the first quarter."""
    if "servegen" in trace and minutes >= 2 * DAY_MINUTES:
        return DAY_MINUTES
    return max(1, math.ceil(minutes / 4))


def sweep(
    baseline: str, spec: LLMEndpointSpec, static_peak: int, capacity_tokens_per_s: float
) -> list[Setting]:
    """The settings a user would try for one baseline, its default among them."""
    seqs = spec.engine.max_num_seqs
    if baseline == "static":  # from a third of the oracle's peak to a quarter above it
        lo, hi = max(1, round(static_peak / 3)), max(2, math.ceil(1.25 * static_peak))
        values = sorted({int(v) for v in np.linspace(lo, hi, STATIC_STEPS).round()})
        return [Setting("static", v, v == static_peak) for v in sorted({*values, static_peak})]
    table: dict[str, tuple[tuple[float, ...], float, float]] = {
        "reactive": (REACTIVE_UP, 0.5, 1.0),
        "hpa": (RUNNING_SHARE, 0.7, float(seqs)),
        "hpa-kv": (KV_TARGET, 0.7, 1.0),
        "keda": (WAITING, 5.0, 1.0),
        "keda-tokens": (TOKENS_SHARE, 1.0, capacity_tokens_per_s),
    }
    if baseline not in table:
        raise ValueError(f"unknown baseline {baseline!r}; choose from {', '.join(KNOBS)}")
    steps, default, unit = table[baseline]
    return [Setting(baseline, round(s * unit, 3), s == default) for s in steps]


def default_setting(
    baseline: str, spec: LLMEndpointSpec, static_peak: int, capacity_tokens_per_s: float
) -> Setting:
    return next(s for s in sweep(baseline, spec, static_peak, capacity_tokens_per_s) if s.default)


def policy(setting: Setting, spec: LLMEndpointSpec) -> Policy:
    sc, b, v = spec.scaling, setting.baseline, setting.value
    lo, hi = sc.min_replicas, sc.max_replicas
    if b == "static":
        return Static(int(v), name=setting.name)
    if b == "reactive":
        return Reactive(lo, hi, up=v, down=v / 2, name=setting.name)
    metric = {"hpa": "running", "hpa-kv": "kv", "keda": "waiting", "keda-tokens": "tokens"}[b]
    return HPA(setting.name, lo, hi, v, metric)


def ok_minutes(rec: Recording, spec: LLMEndpointSpec) -> np.ndarray:
    """Per minute: both p99s within the SLO (an empty minute meets it)."""
    ttft = np.nan_to_num(quantile_rows(rec.recorder.ttft, 0.99), nan=0.0)
    itl = np.nan_to_num(quantile_rows(rec.recorder.itl, 0.99), nan=0.0)
    return np.asarray((ttft <= spec.slo.ttft_p99_seconds) & (itl <= spec.slo.itl_p99_seconds))


def parts(rec: Recording, spec: LLMEndpointSpec, window: int) -> tuple[Part, Part, Part]:
    """(tuning window, judged rest, whole run) of one run."""
    ok, gpu_s = ok_minutes(rec, spec), rec.recorder.series["gpu_s"]

    def part(sl: slice) -> Part:
        n = len(ok[sl])
        return Part(float(gpu_s[sl].sum() / 3600), float(ok[sl].mean()) if n else 1.0, n)

    return part(slice(0, window)), part(slice(window, None)), part(slice(None))


def outcome(setting: Setting, rec: Recording, spec: LLMEndpointSpec, window: int) -> Outcome:
    return Outcome(setting, *parts(rec, spec, window))


def pick(outcomes: list[Outcome]) -> Outcome | None:
    """The cheapest setting on the tuning window among those that met the goal there."""
    met = [o for o in outcomes if o.tuning.slo_minutes_fraction >= TUNE_GOAL]
    if not met:
        return None
    return min(met, key=lambda o: (o.tuning.gpu_hours, -o.tuning.slo_minutes_fraction))
