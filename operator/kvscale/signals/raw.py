"""One replica's /metrics at one instant, typed: the contract's counters, gauges and histograms.

A raw sample holds cumulative values only; rates and quantiles need two samples and live in
`window`. Series of one family are combined per replica (data-parallel ranks of one pod add up),
and the first spelling of a signal that is present wins (see `contract`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvscale.signals.contract import (
    COUNTERS,
    ENGINES,
    GAUGES,
    HISTOGRAMS,
    REQUIRED_COUNTERS,
    REQUIRED_GAUGES,
    REQUIRED_HISTOGRAMS,
    CounterKey,
    GaugeKey,
    HistogramKey,
    Spelling,
    counter_sample_names,
    created_sample_names,
    engine_of,
    sample_names,
    spelt_for,
)
from kvscale.signals.exposition import Exposition, Point, parse_exposition

_NAMES = sample_names()
_CREATED = created_sample_names()


@dataclass(frozen=True)
class Buckets:
    """A classic histogram's cumulative bucket counts, by upper bound (`le`), sorted."""

    bounds: tuple[float, ...] = ()
    counts: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        assert len(self.bounds) == len(self.counts), "one count per bound"

    @property
    def total(self) -> float:
        """Observations (the +Inf bucket), 0 when the histogram has no +Inf bucket."""
        return self.counts[-1] if self.bounds and math.isinf(self.bounds[-1]) else 0.0


@dataclass(frozen=True)
class RawSample:
    """Cumulative values of one replica at `taken_at` (unix seconds)."""

    taken_at: float
    counters: Mapping[CounterKey, float] = field(default_factory=dict)
    gauges: Mapping[GaugeKey, float] = field(default_factory=dict)
    histograms: Mapping[HistogramKey, Buckets] = field(default_factory=dict)
    started_at: float | None = None  # when the counters began (`_created`), if exported
    engine: str | None = None  # whose names it exports (`vllm`, `sglang`), if any the contract's

    @property
    def read_nothing(self) -> bool:
        """No series of the contract at all: not an engine whose names kvscale reads."""
        return not (self.counters or self.gauges or self.histograms)

    def missing(self, router: bool = False) -> tuple[str, ...]:
        """The contract's families this sample lacks (none when complete), in its engine's names."""
        if router:
            return () if GaugeKey.PENDING in self.gauges else GAUGES[GaugeKey.PENDING].names[:1]
        gone = [COUNTERS[k] for k in REQUIRED_COUNTERS if k not in self.counters]
        gone += [GAUGES[k] for k in REQUIRED_GAUGES if k not in self.gauges]
        gone += [HISTOGRAMS[k] for k in REQUIRED_HISTOGRAMS if k not in self.histograms]
        return tuple(spelt_for(spelling, self.engine) for spelling in gone)

    def zero(self, at: float) -> RawSample:
        """The same counters and histograms at zero, as they were when they began at `at`."""
        return RawSample(
            taken_at=at,
            counters=dict.fromkeys(self.counters, 0.0),
            gauges=self.gauges,
            histograms={
                k: Buckets(h.bounds, tuple(0.0 for _ in h.counts))
                for k, h in self.histograms.items()
            },
            started_at=at,
            engine=self.engine,
        )


def parse_replica(text: str, scraped_at: float) -> RawSample:
    """One /metrics text -> a raw sample; timestamps in the text win over `scraped_at`."""
    exposition = parse_exposition(text, _NAMES)
    counters = {k: v for k, s in COUNTERS.items() if (v := _counter(exposition, s)) is not None}
    gauges = {k: v for k, s in GAUGES.items() if (v := _gauge(exposition, s)) is not None}
    histograms = {
        k: h for k, s in HISTOGRAMS.items() if (h := _histogram(exposition, s)) is not None
    }
    stamps = [p.timestamp for ps in exposition.values() for p in ps if p.timestamp is not None]
    return RawSample(
        taken_at=max(stamps) if stamps else scraped_at,
        counters=counters,
        gauges=gauges,
        histograms=histograms,
        started_at=_started_at(exposition),
        engine=_engine(exposition),
    )


def _counted(points: Sequence[Point], spelling: Spelling) -> list[Point]:
    return [p for p in points if not any(p.label(k) == v for k, v in spelling.exclude)]


def _counter(exposition: Exposition, spelling: Spelling) -> float | None:
    for family in spelling.names:
        for name in counter_sample_names(family):
            if name in exposition:
                return sum(p.value for p in _counted(exposition[name], spelling))
    return None


def _gauge(exposition: Exposition, spelling: Spelling) -> float | None:
    for name in spelling.names:
        points = _counted(exposition.get(name, []), spelling)
        if points:
            values = [p.value for p in points]
            if spelling.combine == "max":
                return max(values)
            if spelling.combine == "mean":
                return sum(values) / len(values)
            return sum(values)
    return None


def _histogram(exposition: Exposition, spelling: Spelling) -> Buckets | None:
    for name in spelling.names:
        points = _counted(exposition.get(f"{name}_bucket", []), spelling)
        if points:
            by_bound: dict[float, float] = {}
            for p in points:
                le = p.label("le")
                if le is not None:
                    bound = float(le)
                    by_bound[bound] = by_bound.get(bound, 0.0) + p.value
            bounds = tuple(sorted(by_bound))
            return Buckets(bounds, tuple(by_bound[b] for b in bounds))
    return None


def _started_at(exposition: Exposition) -> float | None:
    """When the counters began (`_created` of the prompt-token counter), if exported."""
    created = [p.value for name in _CREATED for p in exposition.get(name, [])]
    return max(created) if created else None


def _engine(exposition: Exposition) -> str | None:
    """The engine whose names the exposition carries; vLLM's when (oddly) both appear."""
    found = {engine_of(name) for name in exposition}
    return next((e for e in ENGINES if e in found), None)
