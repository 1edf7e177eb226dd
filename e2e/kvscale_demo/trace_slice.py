"""A slice of a public trace as the phases `versus.replay` plays: each step at its own rate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvscale_demo.versus import Phase


@dataclass(frozen=True)
class TraceSlice:
    """Part of a public trace as phases: each `step_s` of it at its own arrival rate."""

    start_s: float  # where the slice begins in the trace
    phases: list[Phase]  # rates relative to the slice's busiest step (1.0 there)
    peak_to_mean: float


def trace_slice(arrivals: Sequence[float], minutes: float, step_s: float = 30.0) -> TraceSlice:
    """The `minutes` of a trace (arrival times in seconds) that ask most of an autoscaler: of
    every window of that length starting on a step, the one whose busiest step is furthest above
    its mean (ties: the earliest). Each step becomes a phase at its arrival count relative to
    the window's busiest step; `scaled_trace` turns those into requests/s for this machine."""
    if not arrivals:
        raise ValueError("the trace has no arrivals")
    first = min(arrivals)
    steps = math.floor((max(arrivals) - first) / step_s) + 1
    counts = [0] * steps
    for at in arrivals:
        counts[math.floor((at - first) / step_s)] += 1
    width = round(minutes * 60 / step_s)
    if width < 1 or width > steps:
        raise ValueError(f"a {minutes} min slice does not fit a trace of {steps * step_s:.0f} s")
    best, best_ratio = 0, -1.0
    for begin in range(steps - width + 1):
        window = counts[begin : begin + width]
        mean = sum(window) / width
        ratio = max(window) / mean if mean > 0 else 0.0
        if ratio > best_ratio:
            best, best_ratio = begin, ratio
    window = counts[best : best + width]
    peak = max(window)
    phases = [
        Phase(f"t{k * step_s / 60:05.1f}m", count / peak, step_s) for k, count in enumerate(window)
    ]
    return TraceSlice(best * step_s, phases, round(best_ratio, 3))


def scaled_trace(part: TraceSlice, capacity: float, peak_share: float = 1.5) -> list[Phase]:
    """The slice's phases in requests/s: its busiest step at `peak_share` times what one replica
    serves (`capacity` requests/s), as the demo's burst is."""
    return [Phase(p.name, round(p.rate * peak_share * capacity, 2), p.seconds) for p in part.phases]
