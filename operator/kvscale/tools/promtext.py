"""Prometheus text exposition, parsed by one pure function (stdlib only).

The load test reads an engine's /metrics before, during and after a run; it speaks HTTP only,
so it parses the text itself instead of importing anything from the engine.
"""

from __future__ import annotations

import re

Labels = tuple[tuple[str, str], ...]
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus_text(text: str) -> dict[str, dict[Labels, float]]:
    """sample name -> {sorted (label, value) pairs -> value}; comments and junk are skipped."""
    samples: dict[str, dict[Labels, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, raw_labels, raw_value = match.groups()
        try:
            value = float(raw_value)
        except ValueError:
            continue
        labels = tuple(sorted((k, _unescape(v)) for k, v in _LABEL.findall(raw_labels or "")))
        samples.setdefault(name, {})[labels] = value
    return samples


def total(samples: dict[str, dict[Labels, float]], name: str, **match: str) -> float | None:
    """Sum of a sample over every label set that matches; None when the server lacks it."""
    series = samples.get(name)
    if series is None:
        return None
    return sum(
        v for labels, v in series.items() if all(dict(labels).get(k) == x for k, x in match.items())
    )


def _unescape(value: str) -> str:
    return value.replace(r"\"", '"').replace(r"\n", "\n").replace("\\\\", "\\")
