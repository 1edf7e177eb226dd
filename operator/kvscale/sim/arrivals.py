"""Arrivals for the simulator: a trace stretched to any length and rate, served a chunk at a time.

Per-request traces (Azure 2023, Mooncake) are replayed with their own timestamps, compressed by
`time_scale`, looped to fill the requested hours, and scaled in rate by copying each request
`rate_scale` times on average (whole copies plus one with the fractional probability), each copy
shifted uniformly within `COPY_SPREAD_S` around the original, so copies keep the trace's shape at
minute scale without stacking into artificial bursts within a second. ServeGen's 10-minute
aggregate rates become Poisson arrivals at the window's rate, with lengths drawn from a named
per-request trace. Arrays are generated per chunk from a seed, so any window is reproducible and
memory stays flat over a 14-day run.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvscale.traces import TraceError, TraceRequest, load_azure, load_mooncake, load_trace

CHUNK_S = 600.0
COPY_SPREAD_S = 60.0
SERVEGEN_WINDOW_S = 600.0
SERVEGEN_FILE = "servegen/m-large-aggregate-rate-10min.csv"
NAMED = ("azure-conv", "azure-code", "mooncake", "servegen-m-large")

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Batch:
    """Requests arriving in a window, struct of arrays, sorted by arrival."""

    at: FloatArray
    input: IntArray
    output: IntArray
    cached: IntArray  # prompt tokens a prefix cache already holds (Mooncake hash ids)

    def __len__(self) -> int:
        return len(self.at)

    def select(self, mask: NDArray[Any] | slice) -> Batch:
        return Batch(self.at[mask], self.input[mask], self.output[mask], self.cached[mask])


@dataclass(frozen=True)
class Shapes:
    """Per-request lengths of a trace, with arrival offsets (seconds from its first request)."""

    at: FloatArray
    input: IntArray
    output: IntArray
    cached: IntArray

    @property
    def span_s(self) -> float:
        return float(self.at[-1] - self.at[0]) + 1.0 if len(self.at) else 0.0


def shapes_from(rows: list[TraceRequest]) -> Shapes:
    if not rows:
        raise TraceError("trace has no requests")
    seen: set[int] = set()
    cached = []
    for r in rows:  # leading run of already-seen prefix blocks, in arrival order
        hit = 0
        for h in r.prefix_blocks:
            if h not in seen:
                break
            hit += r.block_tokens
        seen.update(r.prefix_blocks)
        cached.append(min(hit, r.input_len - 1))
    at = np.array([r.arrival_s or 0.0 for r in rows])
    return Shapes(
        at - at.min(),
        np.array([r.input_len for r in rows], dtype=np.int64),
        np.array([r.output_len for r in rows], dtype=np.int64),
        np.array(cached, dtype=np.int64),
    )


@dataclass(frozen=True)
class Replay:
    """How a trace is played: time compressed, rate multiplied, looped to a length, seeded."""

    time_scale: float
    rate_scale: float
    duration_s: float
    seed: int

    def __post_init__(self) -> None:
        if self.time_scale <= 0 or self.rate_scale <= 0:
            raise TraceError("time and rate scales must be positive")


class Workload:
    """Arrivals over [0, duration_s), and before 0 the loop's end (a simulation's lead-in):
    `window(t0, t1)` must be called with increasing t0."""

    def __init__(self, name: str, replay: Replay) -> None:
        self.name = name
        self.duration_s = replay.duration_s
        self.seed = replay.seed
        self._chunk_index: int | None = None  # none loaded (a lead-in's chunks are negative)
        self._chunk = _empty()

    def _generate(self, start: float, end: float, rng: np.random.Generator) -> Batch:
        raise NotImplementedError

    def chunk(self, index: int) -> Batch:
        start = index * CHUNK_S
        end = min(start + CHUNK_S, self.duration_s)
        # a lead-in's chunks (negative: the loop's end, before time 0) get seeds of their own
        rng = np.random.default_rng([self.seed, index] if index >= 0 else [self.seed, 0, -index])
        batch = self._generate(start, end, rng)
        order = np.argsort(batch.at, kind="stable")
        return batch.select(order)

    def chunks(self) -> Iterator[Batch]:
        for index in range(math.ceil(self.duration_s / CHUNK_S)):
            yield self.chunk(index)

    def window(self, t0: float, t1: float) -> Batch:
        """Arrivals in [t0, t1); windows must not straddle a chunk boundary."""
        index = int(t0 // CHUNK_S)
        if t1 > (index + 1) * CHUNK_S + 1e-9:
            raise ValueError(f"window [{t0}, {t1}) straddles a {CHUNK_S:.0f} s chunk")
        if index != self._chunk_index:
            self._chunk, self._chunk_index = self.chunk(index), index
        lo, hi = np.searchsorted(self._chunk.at, [t0, t1])
        return self._chunk.select(slice(int(lo), int(hi)))


class TraceWorkload(Workload):
    """A per-request trace, time-scaled, looped and rate-scaled."""

    def __init__(self, name: str, shapes: Shapes, replay: Replay) -> None:
        super().__init__(name, replay)
        self.shapes = shapes
        self.period_s = shapes.span_s / replay.time_scale
        self.time_scale = replay.time_scale
        self.rate_scale = replay.rate_scale

    def _generate(self, start: float, end: float, rng: np.random.Generator) -> Batch:
        s, parts = self.shapes, []
        scaled = s.at / self.time_scale
        # one loop either side: copies shifted across a loop boundary wrap around
        first_loop = int(start // self.period_s) - 1
        last_loop = int(end // self.period_s) + 1
        for loop in range(first_loop, last_loop + 1):
            at = scaled + loop * self.period_s
            lo, hi = np.searchsorted(at, [start - COPY_SPREAD_S, end + COPY_SPREAD_S])
            if hi > lo:
                idx = np.arange(lo, hi)
                parts.append((at[idx], idx))
        if not parts:
            return _empty()
        at = np.concatenate([p[0] for p in parts])
        idx = np.concatenate([p[1] for p in parts])
        copies = np.floor(self.rate_scale) + (rng.random(len(idx)) < self.rate_scale % 1.0)
        rep = np.repeat(np.arange(len(idx)), copies.astype(np.int64))
        shift = rng.uniform(-COPY_SPREAD_S / 2, COPY_SPREAD_S / 2, len(rep))
        shift[np.r_[True, rep[1:] != rep[:-1]]] = 0.0  # the first copy keeps its time
        t = at[rep] + shift
        keep = (t >= start) & (t < end)
        i = idx[rep][keep]
        return Batch(t[keep], s.input[i], s.output[i], s.cached[i])


class RateWorkload(Workload):
    """Poisson arrivals at piecewise-constant rates, lengths drawn from a per-request trace."""

    def __init__(
        self,
        name: str,
        window_start_s: FloatArray,
        rate_per_s: FloatArray,
        lengths: Shapes,
        replay: Replay,
    ) -> None:
        super().__init__(name, replay)
        self.starts = (window_start_s - window_start_s[0]) / replay.time_scale
        self.rates = rate_per_s * replay.rate_scale
        self.window_s = SERVEGEN_WINDOW_S / replay.time_scale
        self.period_s = float(self.starts[-1]) + self.window_s
        self.lengths = lengths

    def rate_at(self, t: FloatArray) -> FloatArray:
        local = np.mod(t, self.period_s)
        return self.rates[np.clip(np.searchsorted(self.starts, local, "right") - 1, 0, None)]

    def _generate(self, start: float, end: float, rng: np.random.Generator) -> Batch:
        edges = np.arange(start, end, 1.0)
        rates = self.rate_at(edges)
        widths = np.minimum(edges + 1.0, end) - edges
        counts = rng.poisson(rates * widths)
        at = np.repeat(edges, counts) + rng.random(int(counts.sum())) * np.repeat(widths, counts)
        pick = rng.integers(0, len(self.lengths.input), len(at))
        return Batch(
            at, self.lengths.input[pick], self.lengths.output[pick], self.lengths.cached[pick]
        )


def load_servegen_rates(path: Path) -> tuple[FloatArray, FloatArray]:
    """(window_start_s, aggregate_rate_rps) from ServeGen's derived 10-minute aggregate CSV."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        starts = np.array([float(r["window_start_s"]) for r in rows])
        rates = np.array([float(r["aggregate_rate_rps"]) for r in rows])
    except (KeyError, ValueError) as exc:
        raise TraceError(f"{path} is not a ServeGen aggregate-rate CSV: {exc}") from exc
    if not len(starts):
        raise TraceError(f"{path} has no rows")
    return starts, rates


def sniff(path: Path) -> str:
    """The format of a trace file: azure, mooncake or servegen."""
    if path.suffix == ".jsonl":
        return "mooncake"
    with path.open() as f:
        header = f.readline()
    if "TIMESTAMP" in header:
        return "azure"
    if "aggregate_rate_rps" in header:
        return "servegen"
    raise TraceError(f"{path}: not an Azure CSV, Mooncake JSONL or ServeGen aggregate CSV")


def open_workload(
    trace: str,
    traces_dir: Path,
    *,
    hours: float | None,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    length_trace: str = "azure-conv",
    seed: int = 0,
) -> Workload:
    """A named trace from the traces folder, or a file in one of the three formats."""

    def replay(span_s: float) -> Replay:
        return Replay(time_scale, rate_scale, hours * 3600 if hours else span_s, seed)

    path = Path(trace)
    kind = trace if trace in NAMED else sniff(path) if path.exists() else None
    if kind is None:
        raise TraceError(f"unknown trace {trace!r}: use one of {', '.join(NAMED)} or a file path")
    if kind in ("servegen-m-large", "servegen"):
        rates_path = traces_dir / SERVEGEN_FILE if kind == "servegen-m-large" else path
        if not rates_path.exists():
            raise TraceError(f"trace file {rates_path} not found (set --traces-dir)")
        starts, rates = load_servegen_rates(rates_path)
        lengths = shapes_from(load_trace(length_trace, traces_dir))
        span = (starts[-1] - starts[0] + SERVEGEN_WINDOW_S) / time_scale
        return RateWorkload(trace, starts, rates, lengths, replay(span))
    if kind in NAMED:
        rows = load_trace(kind, traces_dir)
    else:
        rows = load_mooncake(path) if kind == "mooncake" else load_azure(path)
        rows.sort(key=lambda r: r.arrival_s or 0.0)
    shapes = shapes_from(rows)
    return TraceWorkload(trace, shapes, replay(shapes.span_s / time_scale))


def _empty() -> Batch:
    z = np.zeros(0, dtype=np.int64)
    return Batch(np.zeros(0), z, z, z)
