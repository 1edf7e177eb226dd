"""The load tester's view of /metrics: sample name -> {labels -> value}, and sums over labels.

The load test reads an engine's /metrics before, during and after a run; it speaks HTTP only.
The text is parsed by the operator's one exposition parser (`prometheus_client`'s, lenient per
line), so the load tester and the signals read /metrics alike.
"""

from __future__ import annotations

from kvscale.signals.exposition import Labels, parse_exposition

__all__ = ["Labels", "parse_prometheus_text", "total"]


def parse_prometheus_text(text: str) -> dict[str, dict[Labels, float]]:
    """sample name -> {sorted (label, value) pairs -> value}; comments and junk are skipped."""
    return {
        name: {point.labels: point.value for point in points}
        for name, points in parse_exposition(text).items()
    }


def total(samples: dict[str, dict[Labels, float]], name: str, **match: str) -> float | None:
    """Sum of a sample over every label set that matches; None when the server lacks it."""
    series = samples.get(name)
    if series is None:
        return None
    return sum(
        v for labels, v in series.items() if all(dict(labels).get(k) == x for k, x in match.items())
    )
