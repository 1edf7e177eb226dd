"""The routers' deferred queue, as they export it: the series, their parser, and the backlog.

Routers hold deferrable requests (traffic classes with `deadlineSeconds`) earliest deadline first
and export, per class (`traffic_class`):

- `kvscale_router_deferred_queue_requests`: gauge, requests held;
- `kvscale_router_deferred_queue_tokens{due_within}`: gauge, tokens (prompt + max_tokens) of the
  held requests due within `due_within` seconds from now, cumulative as histogram buckets, for
  each bound in `DUE_WITHIN` and `+Inf` (every held token);
- `kvscale_router_deferred_oldest_age_seconds`: gauge, the longest a held request has waited;
- `kvscale_router_deferred_served_tokens_total{release}`: counter, prompt + generated tokens of
  deferred requests served to completion, by why they were released (`spare`: into a replica's
  spare capacity, i.e. a valley; `deadline`: to finish before the deadline);
- `kvscale_router_deferred_completed_total{outcome}`: counter, deferred requests completed within
  (`met`) or past (`missed`) their deadline, a request refused as too late counting as missed.

Absent series read as an empty backlog: a router without deferrable classes exports none. The
direct scrape reads them from each router's /metrics and takes counter rates between two of its
readings; the Prometheus source asks the same of PromQL (`Queries.deferred`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvscale.signals.exposition import parse_exposition
from kvscale.signals.snapshot import DeferredBacklog

PREFIX = "kvscale_router_deferred_"
REQUESTS = f"{PREFIX}queue_requests"
TOKENS = f"{PREFIX}queue_tokens"
OLDEST = f"{PREFIX}oldest_age_seconds"
SERVED = f"{PREFIX}served_tokens"  # a counter: exposed as ..._total
COMPLETED = f"{PREFIX}completed"  # a counter: exposed as ..._total
DUE_WITHIN = (60, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400)  # and +Inf
NAMES = frozenset({REQUESTS, TOKENS, OLDEST, f"{SERVED}_total", f"{COMPLETED}_total"})

PerClass = dict[str, float]


@dataclass(frozen=True)
class DeferredReading:
    """One router's deferred series at one instant (counters cumulative), by traffic class."""

    taken_at: float
    requests: Mapping[str, float] = field(default_factory=dict)
    oldest_age_s: Mapping[str, float] = field(default_factory=dict)
    due: Mapping[str, Mapping[float, float]] = field(default_factory=dict)  # class -> bound -> tok
    counters: Mapping[tuple[str, str], PerClass] = field(default_factory=dict)  # (series, label)

    @property
    def classes(self) -> set[str]:
        return set(self.requests) | set(self.due)


def parse_router(text: str, taken_at: float) -> DeferredReading:
    """A router's /metrics text -> its deferred reading (empty when it exports none)."""
    points = parse_exposition(text, NAMES)
    requests: PerClass = defaultdict(float)
    oldest: PerClass = {}
    due: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    counters: dict[tuple[str, str], PerClass] = defaultdict(lambda: defaultdict(float))
    for p in points.get(REQUESTS, []):
        requests[p.label("traffic_class") or ""] += p.value
    for p in points.get(OLDEST, []):
        cls = p.label("traffic_class") or ""
        oldest[cls] = max(oldest.get(cls, 0.0), p.value)
    for p in points.get(TOKENS, []):
        bound = p.label("due_within")
        if bound is not None:
            due[p.label("traffic_class") or ""][float(bound)] += p.value
    for name, label in ((SERVED, "release"), (COMPLETED, "outcome")):
        for p in points.get(f"{name}_total", []):
            counters[(name, p.label(label) or "")][p.label("traffic_class") or ""] += p.value
    return DeferredReading(taken_at, dict(requests), oldest, due, counters)


def backlogs(
    newest: Sequence[DeferredReading], base: Sequence[DeferredReading | None]
) -> tuple[DeferredBacklog, ...]:
    """Every router's newest reading, summed per class, with counter rates since `base` (the
    same router's reading a window earlier, or None: no rate yet)."""
    requests: PerClass = defaultdict(float)
    oldest: PerClass = {}
    due: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    rates: dict[tuple[str, str], PerClass] = defaultdict(lambda: defaultdict(float))
    for now, before in zip(newest, base, strict=True):
        for cls, n in now.requests.items():
            requests[cls] += n
        for cls, age in now.oldest_age_s.items():
            oldest[cls] = max(oldest.get(cls, 0.0), age)
        for cls, bounds in now.due.items():
            for bound, tokens in bounds.items():
                due[cls][bound] += tokens
        if before is not None and now.taken_at > before.taken_at:
            span = now.taken_at - before.taken_at
            for key, per_class in now.counters.items():
                for cls, value in per_class.items():
                    previous = before.counters.get(key, {}).get(cls, 0.0)
                    rates[key][cls] += max(0.0, value - previous) / span  # a reset: from zero
    return from_series(requests, oldest, due, rates)


def from_series(
    requests: Mapping[str, float],
    oldest: Mapping[str, float],
    due: Mapping[str, Mapping[float, float]],
    rates: Mapping[tuple[str, str], Mapping[str, float]],
) -> tuple[DeferredBacklog, ...]:
    """Per-class backlogs from summed gauges and counter rates keyed (series, label value)."""

    def rate(series: str, label: str, cls: str) -> float:
        return rates.get((series, label), {}).get(cls, 0.0)

    classes = sorted(set(requests) | set(due) | {c for r in rates.values() for c in r})
    return tuple(
        DeferredBacklog(
            traffic_class=cls,
            requests=requests.get(cls, 0.0),
            oldest_age_s=oldest.get(cls),
            due=tuple(sorted(due.get(cls, {}).items(), key=lambda kv: _order(kv[0]))),
            served_tokens_per_s=rate(SERVED, "spare", cls) + rate(SERVED, "deadline", cls),
            valley_tokens_per_s=rate(SERVED, "spare", cls),
            met_per_s=rate(COMPLETED, "met", cls),
            missed_per_s=rate(COMPLETED, "missed", cls),
        )
        for cls in classes
    )


def _order(bound: float) -> float:
    return math.inf if math.isinf(bound) else bound
