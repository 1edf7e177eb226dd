"""The figures of one kvscale-vs-KEDA run (e2e/kvscale_demo/versus.py `replay`): replica-seconds,
the share of intervals within the SLO, p99 TTFT per phase, failures (those in scale-in windows
apart), scaling changes, the time from the burst to the first added Ready replica; the run's
timeline for the JSON and the PNG; and, over several runs, the like-for-like baseline."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from kvscale_demo.versus import (
    MIN_REPLICAS,
    REFUSED,
    SAMPLE_EVERY_S,
    SLO_INTERVAL_S,
    SLO_TTFT_S,
    Run,
    Sample,
)


def p99(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def _scale_in_windows(samples: Sequence[Sample], tail_s: float = 5.0) -> list[tuple[float, float]]:
    """From each drop of the desired replicas until the pods are down to it (plus `tail_s`)."""
    windows: list[tuple[float, float]] = []
    for before, after in itertools.pairwise(samples):
        if after.desired < before.desired:
            gone = next(
                (s.t for s in samples if s.t >= after.t and s.replicas <= after.desired), after.t
            )
            windows.append((max(before.t, after.t - SAMPLE_EVERY_S), gone + tail_s))
    return windows


def measure(run: Run, slo_s: float = SLO_TTFT_S) -> dict[str, Any]:
    """Replica-seconds, SLO share, p99 TTFT per phase, failures (in scale-in windows too),
    scaling changes and the time from the burst to the first added Ready replica, over the
    phases only: what a lead-in before them (`replay`'s `lead_in_s`) sent or scaled is left out."""
    begin, end = run.phases[0][1], run.phases[-1][2]
    inside = [s for s in run.samples if begin <= s.t <= end]
    requests = [r for r in run.requests if begin <= r.started <= end]
    replica_s = sum(a.replicas * (b.t - a.t) for a, b in itertools.pairwise(inside))
    intervals = max(1, math.ceil((end - begin) / SLO_INTERVAL_S))
    within = 0
    for k in range(intervals):
        lo, hi = begin + k * SLO_INTERVAL_S, begin + (k + 1) * SLO_INTERVAL_S
        there = [r for r in requests if lo <= r.started < hi]
        ttft = p99([r.ttft_s for r in there if r.ttft_s is not None])
        within += int(not any(r.error for r in there) and (ttft is None or ttft <= slo_s))
    per_phase: dict[str, Any] = {}
    for name, lo, hi in run.phases:
        there = [r for r in requests if lo <= r.started < hi]
        ttft = p99([r.ttft_s for r in there if r.ttft_s is not None])
        per_phase[name] = {
            "requests": len(there),
            "failed": sum(1 for r in there if r.error),
            "p99_ttft_s": None if ttft is None else round(ttft, 3),
        }
    # a scale-in that reaches into the phases counts; one over before them (in a lead-in) does not
    windows = [w for w in _scale_in_windows(run.samples) if w[1] >= begin]
    failed = [r for r in requests if r.error]
    cut = [r for r in failed if any(lo <= r.ended <= hi for lo, hi in windows)]
    changes = sum(1 for a, b in itertools.pairwise(inside) if a.desired != b.desired)
    burst = next((lo for name, lo, _ in run.phases if name == "burst"), None)
    first_added: float | None = None
    if burst is not None:
        at_burst = max((s.ready for s in run.samples if s.t <= burst), default=MIN_REPLICAS)
        added = next((s.t for s in run.samples if s.t >= burst and s.ready > at_burst), None)
        first_added = None if added is None else round(added - burst, 1)
    return {
        "replica_seconds": round(replica_s, 1),
        "slo_share": round(within / intervals, 3),
        "slo_intervals": intervals,
        "phases": per_phase,
        "requests": len(requests),
        "failed": len(failed),
        # of those, refused at admission (429 with Retry-After: back-pressure, never accepted)
        "refused": sum(1 for r in failed if (r.error or "").startswith(REFUSED)),
        "failed_in_scale_in": len(cut),
        "scale_in_windows": len(windows),
        "failure_examples": sorted({r.error or "" for r in failed})[:5],
        "scaling_changes": changes,
        "max_replicas": max((s.desired for s in inside), default=0),
        "final_replicas": run.samples[-1].replicas if run.samples else None,
        "burst_to_first_added_ready_s": first_added,
    }


def cheapest_no_worse(figures: dict[str, dict[str, Any]], reference: str) -> str | None:
    """Of the runs other than `reference`, the one with the fewest replica-seconds among those
    whose SLO share is no lower than the reference's (None if none reaches it): the tuned
    baseline that a like-for-like cost comparison needs."""
    bar = figures[reference]["slo_share"]
    peers = [n for n, f in figures.items() if n != reference and f["slo_share"] >= bar]
    return min(peers, key=lambda n: figures[n]["replica_seconds"], default=None)


def timeline(run: Run) -> dict[str, Any]:
    """The run's samples and phases, seconds from its start (for the JSON and the PNG)."""
    zero = run.phases[0][1]
    return {
        "phases": [(n, round(lo - zero, 1), round(hi - zero, 1)) for n, lo, hi in run.phases],
        "samples": [asdict(s) | {"t": round(s.t - zero, 1)} for s in run.samples],
        "ttft": [
            (round(r.started - zero, 2), None if r.ttft_s is None else round(r.ttft_s, 3))
            for r in run.requests
        ],
    }
