"""Request shapes for load tests: public traces (read in place, never copied) or synthetic.

Azure LLM inference 2023 (conv, code) gives arrival times and token counts; Mooncake's
conversation trace adds prefix-block hash ids (512-token blocks; equal ids mean a shared prefix).
Lengths can be scaled and capped to fit a small model's context.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512
TRACE_FILES = {
    "azure-conv": "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
    "azure-code": "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
    "mooncake": "mooncake-fast25/conversation_trace.jsonl",
}
SYNTHETIC = ("fixed", "random")
DATASETS = (*TRACE_FILES, *SYNTHETIC)


class TraceError(ValueError):
    """A trace is missing or malformed, or a length setting is invalid."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float | None  # seconds from the trace's first request; None for synthetic
    input_len: int
    output_len: int
    prefix_blocks: tuple[int, ...] = ()  # Mooncake hash ids, in prompt order
    block_tokens: int = MOONCAKE_BLOCK_TOKENS


@dataclass(frozen=True)
class LengthPolicy:
    """Scale, then cap, trace lengths: a 7k-token trace prompt can drive a 512-token model."""

    input_scale: float = 1.0
    output_scale: float = 1.0
    max_input_len: int | None = None
    max_output_len: int | None = None

    def __post_init__(self) -> None:
        if self.input_scale <= 0 or self.output_scale <= 0:
            raise TraceError("length scales must be positive")
        for cap in (self.max_input_len, self.max_output_len):
            if cap is not None and cap < 1:
                raise TraceError("length caps must be >= 1")

    def apply(self, req: TraceRequest) -> TraceRequest:
        return replace(
            req,
            input_len=_scaled(req.input_len, self.input_scale, self.max_input_len),
            output_len=_scaled(req.output_len, self.output_scale, self.max_output_len),
            block_tokens=max(1, round(req.block_tokens * self.input_scale)),
        )


def _scaled(value: int, scale: float, cap: int | None) -> int:
    scaled = max(1, round(value * scale))
    return scaled if cap is None else min(cap, scaled)


def _azure_time(text: str) -> float:
    """Seconds since the epoch from '2023-11-16 18:15:46.6805900' (7 fractional digits)."""
    whole, _, frac = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
    return base + (float(f"0.{frac}") if frac else 0.0)


def load_azure(path: Path) -> list[TraceRequest]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise TraceError(f"{path} has no rows")
    times = [_azure_time(r["TIMESTAMP"]) for r in rows]
    start = min(times)
    return [
        TraceRequest(t - start, max(1, int(r["ContextTokens"])), max(1, int(r["GeneratedTokens"])))
        for t, r in zip(times, rows, strict=True)
    ]


def load_mooncake(path: Path) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            out.append(
                TraceRequest(
                    row["timestamp"] / 1000.0,
                    max(1, int(row["input_length"])),
                    max(1, int(row["output_length"])),
                    tuple(int(h) for h in row.get("hash_ids", ())),
                )
            )
    return out


def load_trace(name: str, traces_dir: Path) -> list[TraceRequest]:
    if name not in TRACE_FILES:
        raise TraceError(f"unknown trace {name!r}; choose from {', '.join(TRACE_FILES)}")
    path = traces_dir / TRACE_FILES[name]
    if not path.exists():
        raise TraceError(f"trace file {path} not found (set --traces-dir)")
    rows = load_mooncake(path) if name == "mooncake" else load_azure(path)
    return sorted(rows, key=lambda r: r.arrival_s or 0.0)


def synthetic(
    kind: str, count: int, input_len: int, output_len: int, range_ratio: float, rng: random.Random
) -> list[TraceRequest]:
    """`fixed`: every request the same; `random`: uniform within +-range_ratio of each length."""
    if input_len < 1 or output_len < 1:
        raise TraceError("input and output lengths must be >= 1")
    if not 0.0 <= range_ratio < 1.0:
        raise TraceError("range ratio must be in [0, 1)")

    def draw(mean: int) -> int:
        if kind == "fixed" or range_ratio == 0:
            return mean
        low, high = max(1, round(mean * (1 - range_ratio))), round(mean * (1 + range_ratio))
        return rng.randint(low, max(low, high))

    return [TraceRequest(None, draw(input_len), draw(output_len)) for _ in range(count)]


def select(
    rows: list[TraceRequest], count: int, window_start_s: float | None, rng: random.Random
) -> list[TraceRequest]:
    """`count` requests: a contiguous window from window_start_s (replay) or a seeded sample."""
    if count < 1:
        raise TraceError("need at least one request")
    if window_start_s is not None:
        window = [r for r in rows if (r.arrival_s or 0.0) >= window_start_s][:count]
        if not window:
            raise TraceError(f"no trace requests after {window_start_s} s")
        return window
    if count <= len(rows):
        picked = sorted(rng.sample(range(len(rows)), count))
        return [rows[i] for i in picked]
    return [rows[rng.randrange(len(rows))] for _ in range(count)]
