"""Prometheus text exposition, parsed by one pure function over `prometheus_client`'s parser.

Everything in kvscale that reads /metrics text (the direct scrape, the load tester) goes through
`parse_exposition`. The parser is strict; a scrape is not: a line it refuses is skipped on its
own, so one malformed line costs that line, not the replica's whole sample.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Point:
    """One sample line: sorted labels, value, and the exporter's timestamp (seconds) if any."""

    labels: Labels
    value: float
    timestamp: float | None = None

    def label(self, name: str) -> str | None:
        return next((v for k, v in self.labels if k == name), None)


Exposition = dict[str, list[Point]]  # sample name (with _total/_bucket/...) -> its points


def parse_exposition(text: str, names: Collection[str] | None = None) -> Exposition:
    """Sample name -> points. With `names`, only sample lines of those names are parsed."""
    if names is not None:
        lines = [line for line in text.splitlines() if _name(line) in names]
        text = "\n".join(lines) + "\n"
    samples: Exposition = {}
    try:
        _collect(text, samples)
    except ValueError:
        samples.clear()
        for line in text.splitlines():
            if line and not line.startswith("#"):
                try:
                    _collect(line + "\n", samples)
                except ValueError:
                    continue
    return samples


def _name(line: str) -> str:
    return line.split("{", 1)[0].split(" ", 1)[0]


def _collect(text: str, into: Exposition) -> None:
    for name, labels, value, timestamp in _samples(text):
        into.setdefault(name, []).append(Point(labels, value, timestamp))


def _samples(text: str) -> Iterator[tuple[str, Labels, float, float | None]]:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            stamp = None if s.timestamp is None else float(s.timestamp)
            yield s.name, tuple(sorted(s.labels.items())), float(s.value), stamp
