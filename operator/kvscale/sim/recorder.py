"""The ground truth of a run, per minute: what users saw and what the GPUs cost.

Unlike the signals (what a controller can read: bucketed, delayed, per scrape), this records every
request's TTFT in the minute it arrived (a refused request counts as an infinite TTFT), the
inter-token gaps decoding sequences saw (weighted by tokens), and GPU-seconds split into serving,
idle (Ready with nothing queued or running) and warming (created, not Ready). Latencies go into
fine log-spaced bins (40 a decade, so a p99 read from them is within 6% of the exact value).

Deferrable requests (mixed workloads) are judged by their deadline, not the latency SLO: their
TTFT stays out of the histograms, and each completes within (`deferred_met`) or past its deadline
or is refused (`deferred_missed`); `valley_tokens` are their tokens served after release into
spare capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvscale.sim.arrivals import Batch
from kvscale.sim.endpoint import Endpoint
from kvscale.sim.engine import F, StepOutcome

EDGES = np.logspace(-3, 4, 7 * 40 + 1)  # 1 ms .. 10,000 s
NB = len(EDGES) + 1  # bin i holds (EDGES[i-1], EDGES[i]]; the last one is above 10,000 s


@dataclass(frozen=True)
class Targets:
    ttft_s: float
    itl_s: float


class Recorder:
    def __init__(self, duration_s: float, targets: Targets, gpus_per_replica: int) -> None:
        m = math.ceil(duration_s / 60.0)
        self.targets, self.gpus = targets, gpus_per_replica
        self.ttft = np.zeros((m, NB), dtype=np.float32)
        self.itl = np.zeros((m, NB), dtype=np.float32)
        names = (
            "arrivals", "demand_tokens", "refused", "successes", "good", "served_tokens",
            "gpu_s", "idle_gpu_s", "warming_gpu_s", "replicas", "ready", "desired",
            "deferred_tokens", "valley_tokens", "deferred_met", "deferred_missed",
        )  # fmt: skip
        self.series = {n: np.zeros(m) for n in names}

    @property
    def minutes(self) -> int:
        return len(self.series["arrivals"])

    def add(self, t0: float, dt: float, batch: Batch, out: StepOutcome, ep: Endpoint) -> None:
        m, s = min(int(t0 // 60), self.minutes - 1), self.series
        s["arrivals"][m] += len(batch)
        s["demand_tokens"][m] += float(batch.input.sum() + batch.output.sum())
        interactive = ~out.first_deferred
        self._bin(self.ttft, out.first_at[interactive], out.ttft[interactive], None)
        refused = np.isinf(out.refused_deadline)
        self._bin(self.ttft, out.refused_at[refused], np.full(int(refused.sum()), np.inf), None)
        _add(s["refused"], self._minute(out.refused_at), None)
        _add(s["deferred_missed"], self._minute(out.refused_at[~refused]), None)
        if len(out.itl_gap):
            self.itl[m] += np.bincount(
                np.searchsorted(EDGES, out.itl_gap), out.itl_weight, minlength=NB
            ).astype(np.float32)
        done_m = self._minute(out.done_at)
        good = (out.done_ttft <= self.targets.ttft_s) & (out.done_tpot <= self.targets.itl_s)
        deferred = np.isfinite(out.done_deadline)
        good &= ~deferred
        met = out.done_end <= out.done_deadline
        _add(s["deferred_met"], done_m[deferred & met], None)
        _add(s["deferred_missed"], done_m[deferred & ~met], None)
        _add(s["deferred_tokens"], done_m[deferred], out.done_tokens[deferred])
        valley = deferred & out.done_valley
        _add(s["valley_tokens"], done_m[valley], out.done_tokens[valley])
        _add(s["successes"], done_m, None)
        _add(s["good"], done_m[good], None)
        _add(s["served_tokens"], done_m, out.done_tokens)
        alive = list(ep.replicas.values())
        warming = sum(1 for r in alive if not r.ready(t0))
        busy_slots = ep.engines.outstanding()
        idle = sum(1 for r in alive if r.ready(t0) and busy_slots[r.slot] == 0)
        frac = dt / 60.0
        s["gpu_s"][m] += len(alive) * dt * self.gpus
        s["warming_gpu_s"][m] += warming * dt * self.gpus
        s["idle_gpu_s"][m] += idle * dt * self.gpus
        s["replicas"][m] += len(alive) * frac
        s["ready"][m] += (len(alive) - warming) * frac

    def decided(self, t: float, desired: int) -> None:
        m = min(int(t // 60), self.minutes - 1)
        self.series["desired"][m:] = desired

    def _minute(self, at: F) -> NDArray[np.int64]:
        # a lead-in's request stamped before time 0 (refused for its wait) counts in minute 0
        return np.clip((at // 60).astype(np.int64), 0, self.minutes - 1)

    def _bin(self, hist: NDArray[Any], at: F, values: F, weights: F | None) -> None:
        if len(at) == 0:
            return
        rows = self._minute(at)
        first, last = int(rows.min()), int(rows.max()) + 1  # only the minutes touched
        idx = (rows - first) * NB + np.searchsorted(EDGES, values)
        counts = np.bincount(idx, weights, minlength=(last - first) * NB)
        hist[first:last] += counts.reshape(last - first, NB).astype(np.float32)


def _add(series: F, rows: NDArray[np.int64], weights: F | None) -> None:
    """series[row] += weight (or 1) for each row, touching only the rows' span."""
    if len(rows) == 0:
        return
    first = int(rows.min())
    counts = np.bincount(rows - first, weights)
    series[first : first + len(counts)] += counts


def quantile_rows(hist: NDArray[Any], q: float) -> F:
    """Per row, the q-quantile read from the log bins (upper edge of the bin it falls in)."""
    total = hist.sum(axis=1)
    cum = np.cumsum(hist, axis=1)
    idx = (cum < (q * total)[:, None]).sum(axis=1)
    upper = np.r_[EDGES, np.inf]
    out = upper[np.minimum(idx, NB - 1)]
    return np.where(total > 0, out, np.nan)
