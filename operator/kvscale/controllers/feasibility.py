"""Whether a TTFT SLO can be met at all: no replica count beats a prompt's own prefill.

A request whose prompt alone takes longer to prefill on an idle replica than the TTFT SLO misses
it however many replicas run. When more requests than the SLO's attainment target allows are
like that, the SLO is infeasible for the workload: the simulator, `kvscale plan` and the operator
say so instead of scaling (or reporting a normal table) in vain, and suggest the SLO `kvscale
plan` would set: twice the prefill time at the attainment quantile (half the SLO for prefill,
half for queueing and mixed batches), rounded up to a round number. The simulator and `plan`
know each request's idle prefill time from the engine profile; the operator sees it as the p99
TTFT of a window in which no request waited and no replica was full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscale.signals.snapshot import Snapshot

PREFILL_SHARE = 0.5  # of a suggested SLO the prefill at the attainment quantile may take
ROUND_STEPS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0)
KV_FULL = 0.9


@dataclass(frozen=True)
class Feasibility:
    """A TTFT SLO against the prefill time requests need with no queue in front of them."""

    slo_s: float
    attainment: float  # the SLO's target share (0..1)
    prefill_s: float  # prefill alone at the attainment quantile, seconds
    share_over: float | None = None  # of requests whose prefill alone exceeds the SLO

    @property
    def feasible(self) -> bool:
        return self.prefill_s <= self.slo_s

    @property
    def suggested_slo_s(self) -> float:
        return round_up(self.prefill_s / PREFILL_SHARE)

    def message(self) -> str:
        q = f"p{self.attainment * 100:g}"
        if self.feasible:
            took = f"prefill alone takes {self.prefill_s:.2f} s at {q}"
            return f"The {self.slo_s:g} s TTFT SLO is feasible: {took}"
        if self.share_over is not None:
            why = (
                f"{self.share_over:.1%} of requests take longer than that to prefill on an idle "
                f"replica ({q} {self.prefill_s:.2f} s)"
            )
        else:
            why = f"p99 TTFT was {self.prefill_s:.2f} s while no request waited, prefill alone"
        return (
            f"The {self.slo_s:g} s TTFT SLO is infeasible for this workload: {why}; no replica "
            f"count meets it; kvscale plan would set {self.suggested_slo_s:g} s"
        )

    def to_dict(self) -> dict[str, float | bool | None]:
        return {
            "ttft_slo_s": self.slo_s,
            "feasible": self.feasible,
            "prefill_at_target_s": round(self.prefill_s, 4),
            "share_over_slo": None if self.share_over is None else round(self.share_over, 4),
            "suggested_ttft_slo_s": self.suggested_slo_s,
        }


def round_up(seconds: float) -> float:
    """The smallest of 1, 1.5, 2, 3, 5, 7.5 x 10^k at or above `seconds` (at least 0.1 s)."""
    x = max(seconds, 0.1)
    decade = 10.0 ** math.floor(math.log10(x))
    return next(round(s * decade, 6) for s in ROUND_STEPS if s * decade >= x * (1 - 1e-9))


def observed(snap: Snapshot, slo_s: float) -> Feasibility | None:
    """The check on what the operator sees: the p99 TTFT of a window in which nothing queued.

    With requests waiting, refused or held, a replica's KV cache full or preemptions, TTFT holds
    queueing too and says nothing about prefill alone: None.
    """
    ttft = snap.latency.ttft_p99
    quiet = (
        snap.ok
        and snap.replicas
        and snap.waiting == 0
        and snap.pending_requests == 0
        and snap.refusals_per_s == 0
        and snap.preemptions_per_s == 0
        and snap.kv_usage_max <= KV_FULL
    )
    if not quiet or ttft is None or snap.successes_per_s <= 0:
        return None
    return Feasibility(slo_s, 0.99, ttft)
