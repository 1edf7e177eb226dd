"""Request shapes for load tests and the simulator: public traces, or synthetic.

Azure LLM inference 2023 (conv, code) gives arrival times and token counts; Mooncake's
conversation trace adds prefix-block hash ids (512-token blocks; equal ids mean a shared prefix).
Lengths can be scaled and capped to fit a small model's context.

Trace files are read from one folder: `--traces-dir`, else $KVSCALE_TRACES_DIR, else the cache
(${KVSCALE_CACHE:-~/.cache/kvscale}/traces). A named public trace missing there is downloaded
into the cache from its repository at a pinned commit and checked against a pinned SHA-256
($KVSCALE_TRACES_MIRROR replaces https://raw.githubusercontent.com, e.g. for an internal mirror).
tests/data/traces holds a few hundred rows of each, for the tests.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import urllib.error
import urllib.request
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
TRACES_DIR_ENV = "KVSCALE_TRACES_DIR"
MIRROR_ENV = "KVSCALE_TRACES_MIRROR"
GITHUB_RAW = "https://raw.githubusercontent.com"
DOWNLOAD_TIMEOUT_S = 30.0


class TraceError(ValueError):
    """A trace is missing or malformed, or a length setting is invalid."""


@dataclass(frozen=True)
class PublicTrace:
    """A trace file in a public repository, pinned to a commit and to its SHA-256."""

    repo: str
    commit: str
    path: str  # in the repository
    sha256: str
    licence: str

    def url(self, base: str = GITHUB_RAW) -> str:
        return f"{base.rstrip('/')}/{self.repo}/{self.commit}/{self.path}"


_AZURE = ("Azure/AzurePublicDataset", "b469a113cedca53ddc3bdea71a143dc4b7d8700c")
_MOONCAKE = ("kvcache-ai/Mooncake", "3b5a594133958449a1feaf1c9e0fc1b553e34a28")
PUBLIC_TRACES = {
    "azure-conv": PublicTrace(
        *_AZURE,
        "data/AzureLLMInferenceTrace_conv.csv",
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        "CC-BY-4.0",
    ),
    "azure-code": PublicTrace(
        *_AZURE,
        "data/AzureLLMInferenceTrace_code.csv",
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        "CC-BY-4.0",
    ),
    "mooncake": PublicTrace(
        *_MOONCAKE,
        "FAST25-release/traces/conversation_trace.jsonl",
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        "Apache-2.0",
    ),
}


def cache_dir() -> Path:
    root = os.environ.get("KVSCALE_CACHE") or Path.home() / ".cache" / "kvscale"
    return Path(root) / "traces"


def default_traces_dir() -> Path:
    """$KVSCALE_TRACES_DIR, else the download cache."""
    env = os.environ.get(TRACES_DIR_ENV)
    return Path(env) if env else cache_dir()


def download(trace: PublicTrace, dest: Path, base_url: str | None = None) -> Path:
    """Fetch `trace` to `dest` atomically, refusing content without the pinned SHA-256."""
    url = trace.url(base_url or os.environ.get(MIRROR_ENV) or GITHUB_RAW)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    try:
        with (
            urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp,
            partial.open("wb") as f,
        ):
            while chunk := resp.read(1 << 16):
                digest.update(chunk)
                f.write(chunk)
    except (urllib.error.URLError, OSError) as err:
        partial.unlink(missing_ok=True)
        reason = getattr(err, "reason", err)
        raise TraceError(
            f"could not download {url} ({reason}); offline? Copy the file to {dest}, or point "
            f"--traces-dir / ${TRACES_DIR_ENV} at a folder that has it"
        ) from err
    if digest.hexdigest() != trace.sha256:
        partial.unlink()
        raise TraceError(
            f"{url} has SHA-256 {digest.hexdigest()}, not the pinned {trace.sha256}: refused"
        )
    partial.replace(dest)
    return dest


def trace_path(name: str, traces_dir: Path | None = None) -> Path:
    """The file of trace `name`: in `traces_dir`, else in the cache, else downloaded there."""
    if name not in TRACE_FILES:
        raise TraceError(f"unknown trace {name!r}; choose from {', '.join(TRACE_FILES)}")
    folder = traces_dir or default_traces_dir()
    for candidate in (folder / TRACE_FILES[name], cache_dir() / TRACE_FILES[name]):
        if candidate.exists():
            return candidate
    if name not in PUBLIC_TRACES:
        raise TraceError(f"trace file {folder / TRACE_FILES[name]} not found (set --traces-dir)")
    try:
        return download(PUBLIC_TRACES[name], cache_dir() / TRACE_FILES[name])
    except TraceError as err:
        raise TraceError(f"trace {name!r} not found in {folder}, and {err}") from err


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


def load_trace(name: str, traces_dir: Path | None = None) -> list[TraceRequest]:
    path = trace_path(name, traces_dir)
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
