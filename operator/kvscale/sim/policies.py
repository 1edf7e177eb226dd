"""Who decides the replica count: kvscale's own control law, and the baselines users would pick.

Every policy sees the same thing the operator sees, one `Snapshot` per tick of its own interval
(built by the simulator's scraper), and answers a replica count and, optionally, the pod to
drain; a policy that needs a history keeps its own. kvscale's policy holds the operator's
`CapacityLaw` (the law with the history its spec sizes and its state) and calls it exactly as the
operator's capacity loop does. The baselines:

- static: N replicas all the time (by default the replicas the oracle's peak minute needs);
- reactive (SageServe-style thresholds): +1 replica when the mean KV-cache usage of Ready replicas
  exceeds `up` (default 0.5), -1 below `down` (default 0.25), once per interval;
- hpa: the Horizontal Pod Autoscaler's algorithm on one per-pod metric with an AverageValue
  target: running requests (by default 0.7 x maxNumSeqs: GPU busy time would read 100% whenever
  a batch runs), KV-cache usage, or, as KEDA's Prometheus scaler feeds it, waiting requests
  (default 5) or prompt + generated tokens/s; HPA's 10% tolerance, its default scale-up limit
  (double or +4 per 15 s) and 300 s scale-down stabilization;
- oracle: each minute exactly the replicas that minute needs (from the calibrated per-replica
  capacity), ready at once.

`kvscale.sim.tuning` sweeps each baseline's knob and picks the setting a user would keep.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.controllers.capacity import CapacityLaw, CapacityState
from kvscale.signals.snapshot import Snapshot

HPA_INTERVAL_S = 15.0
HPA_TOLERANCE = 0.1
HPA_DOWN_STABILIZATION_S = 300.0


@dataclass(frozen=True)
class Choice:
    desired: int
    victim: str | None = None
    reason: str = ""


class Policy(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def interval_s(self) -> float: ...
    @property
    def instant(self) -> bool: ...  # new replicas are Ready at once (the oracle only)

    def decide(self, snap: Snapshot, now: float) -> Choice: ...


@dataclass
class Kvscale:
    """The operator's capacity law, through the interface the operator uses."""

    spec: LLMEndpointSpec
    name: str = "kvscale"
    instant: bool = False
    law: CapacityLaw | None = None

    @property
    def interval_s(self) -> float:
        return float(self.spec.scaling.capacity_interval_seconds)

    def decide(self, snap: Snapshot, now: float) -> Choice:
        if self.law is None:  # as the operator's loop starts: from the replicas there are
            self.law = CapacityLaw(CapacityState(desired=snap.fleet.current))
        d = self.law.decide(snap, self.spec, now)
        return Choice(d.desired, d.victim, d.reason)


@dataclass
class Static:
    replicas: int
    name: str = "static"
    interval_s: float = 60.0
    instant: bool = False

    def decide(self, snap: Snapshot, now: float) -> Choice:
        return Choice(self.replicas, reason="Static")


@dataclass
class Reactive:
    min_replicas: int
    max_replicas: int
    up: float = 0.5
    down: float = 0.25
    name: str = "reactive"
    interval_s: float = 60.0
    instant: bool = False

    def decide(self, snap: Snapshot, now: float) -> Choice:
        current = snap.fleet.current
        if not snap.replicas:
            want = current + (1 if snap.pending_requests > 0 else 0)
        elif snap.kv_usage_mean > self.up:
            want = current + 1
        elif snap.kv_usage_mean < self.down:
            want = current - 1
        else:
            want = current
        return Choice(_clamp(want, self.min_replicas, self.max_replicas), reason="Threshold")


@dataclass
class HPA:
    """HPA's algorithm on one per-pod metric, averaged over the Ready replicas."""

    name: str
    min_replicas: int
    max_replicas: int
    target: float  # AverageValue per replica
    metric_name: str  # "running", "kv", "waiting" or "tokens"
    interval_s: float = HPA_INTERVAL_S
    instant: bool = False
    _recent: deque[tuple[float, int]] = field(default_factory=deque)

    def decide(self, snap: Snapshot, now: float) -> Choice:
        current = max(snap.fleet.current, 0)
        ready = len(snap.replicas)
        total = _metric_total(snap, self.metric_name)
        if ready == 0:
            want = max(current, 1) if total > 0 or snap.pending_requests > 0 else current
        else:
            ratio = (total / ready) / self.target
            want = current if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(ready * ratio)
        # scale-up limit: max(100% of current, 4 pods) per 15 s
        want = min(want, current + max(current, 4))
        want = _clamp(want, self.min_replicas, self.max_replicas)
        self._recent.append((now, want))
        while self._recent and self._recent[0][0] < now - HPA_DOWN_STABILIZATION_S:
            self._recent.popleft()
        if want < current:  # scale-down: the highest recommendation of the window
            want = min(current, max(w for _, w in self._recent))
        return Choice(want, reason="HPA")


@dataclass
class Oracle:
    """Each minute exactly what it needs: `needed[m]` replicas, Ready at once."""

    needed: np.ndarray
    name: str = "oracle"
    interval_s: float = 60.0
    instant: bool = True

    def decide(self, snap: Snapshot, now: float) -> Choice:
        m = min(round(now / 60.0), len(self.needed) - 1)
        return Choice(int(self.needed[m]), reason="Oracle")


def _metric_total(snap: Snapshot, metric: str) -> float:
    """The metric summed over the Ready replicas (what HPA divides by their count)."""
    if metric == "running":
        return snap.running
    if metric == "kv":
        return sum(r.kv_usage for r in snap.replicas)
    if metric == "tokens":
        return snap.tokens_per_s
    return snap.waiting + snap.pending_requests


def _clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))
