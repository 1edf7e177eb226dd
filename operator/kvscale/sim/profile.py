"""An engine performance profile: what one replica of one engine on one GPU type can do.

A profile is a JSON file (shipped ones live in `kvscale/profiles/`, `kvscale profile` writes new
ones from the real engine): prefill throughput by tokens per engine step, decode step time by
batch size (and, where measured, context length), KV token capacity and the start-up time of a new
replica. Where a table has a single context column, longer contexts add the time to read their KV
from device memory at `memory_bytes_per_s` (a roofline term, stated in the profile's sources).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


class ProfileError(ValueError):
    """A profile file is missing or malformed."""


@dataclass(frozen=True)
class StartupTime:
    """Pod created -> Ready, seconds: log-normal around a median (measured), spread (sigma)."""

    median_s: float
    sigma: float = 0.0

    def sample(self, rng: np.random.Generator) -> float:
        if self.sigma <= 0:
            return self.median_s
        return float(self.median_s * math.exp(rng.normal(0.0, self.sigma)))


@dataclass(frozen=True)
class EngineProfile:
    name: str
    gpu: str
    engine: str
    model: str
    gpus_per_replica: int
    kv_tokens: int
    kv_bytes_per_token: int
    memory_bytes_per_s: float
    prefill_tokens: tuple[float, ...]  # tokens in one engine step
    prefill_tokens_per_s: tuple[float, ...]
    decode_batch: tuple[float, ...]
    decode_context: tuple[float, ...]  # context lengths of the table's columns
    decode_step_s: tuple[tuple[float, ...], ...]  # [batch][context]
    startup: StartupTime
    sources: dict[str, str]

    def __post_init__(self) -> None:
        _check(self.kv_tokens > 0, "kv_tokens must be positive")
        _check(self.gpus_per_replica >= 1, "gpus_per_replica must be >= 1")
        _check(len(self.prefill_tokens) == len(self.prefill_tokens_per_s) > 0, "prefill table")
        _check(_increasing(self.prefill_tokens), "prefill tokens must increase")
        _check(min(self.prefill_tokens_per_s) > 0, "prefill tokens/s must be positive")
        _check(_increasing(self.decode_batch) and _increasing(self.decode_context), "axes")
        _check(len(self.decode_step_s) == len(self.decode_batch), "one decode row per batch")
        _check(
            all(len(row) == len(self.decode_context) for row in self.decode_step_s),
            "one decode column per context",
        )
        _check(min(min(r) for r in self.decode_step_s) > 0, "decode steps must be positive")

    def prefill_rate(self, tokens_in_step: FloatArray) -> FloatArray:
        """Prefill tokens/s when a step carries this many prompt tokens (clamped to the table)."""
        rate = np.interp(tokens_in_step, self.prefill_tokens, self.prefill_tokens_per_s)
        return np.asarray(rate, dtype=np.float64)

    def decode_step(self, batch: FloatArray, context: FloatArray) -> FloatArray:
        """Seconds of one decode step for `batch` sequences of mean `context` tokens."""
        table = np.asarray(self.decode_step_s)
        b = np.clip(batch, self.decode_batch[0], None)
        ctx_axis = np.asarray(self.decode_context)
        if len(ctx_axis) == 1:
            base = np.interp(b, self.decode_batch, table[:, 0])
        else:  # bilinear in (batch, context) inside the table
            c = np.clip(context, ctx_axis[0], ctx_axis[-1])
            by_ctx = np.stack(
                [np.interp(b, self.decode_batch, table[:, j]) for j in range(len(ctx_axis))]
            )
            j = np.clip(np.searchsorted(ctx_axis, c) - 1, 0, len(ctx_axis) - 2)
            w = (c - ctx_axis[j]) / (ctx_axis[j + 1] - ctx_axis[j])
            cols = np.arange(by_ctx.shape[1])
            base = by_ctx[j, cols] * (1 - w) + by_ctx[j + 1, cols] * w
        # beyond the table: a larger batch costs its share of the last segment's slope, a longer
        # context the time to read its extra KV once per step
        top = self.decode_batch[-1]
        if len(self.decode_batch) > 1:
            slope = (table[-1] - table[-2]) / (self.decode_batch[-1] - self.decode_batch[-2])
            base = base + np.clip(batch - top, 0, None) * max(float(np.mean(slope)), 0.0)
        extra_ctx = np.clip(context - ctx_axis[-1], 0, None)
        read_s = batch * extra_ctx * self.kv_bytes_per_token / self.memory_bytes_per_s
        return np.asarray(base + read_s, dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu": self.gpu,
            "engine": self.engine,
            "model": self.model,
            "gpus_per_replica": self.gpus_per_replica,
            "kv_tokens": self.kv_tokens,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "memory_bytes_per_s": self.memory_bytes_per_s,
            "prefill": {
                "tokens_in_step": list(self.prefill_tokens),
                "tokens_per_s": list(self.prefill_tokens_per_s),
            },
            "decode": {
                "batch": list(self.decode_batch),
                "context": list(self.decode_context),
                "step_s": [list(r) for r in self.decode_step_s],
            },
            "startup": {"median_s": self.startup.median_s, "sigma": self.startup.sigma},
            "sources": self.sources,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EngineProfile:
        try:
            return cls(
                name=str(raw["name"]),
                gpu=str(raw["gpu"]),
                engine=str(raw["engine"]),
                model=str(raw["model"]),
                gpus_per_replica=int(raw.get("gpus_per_replica", 1)),
                kv_tokens=int(raw["kv_tokens"]),
                kv_bytes_per_token=int(raw["kv_bytes_per_token"]),
                memory_bytes_per_s=float(raw["memory_bytes_per_s"]),
                prefill_tokens=tuple(map(float, raw["prefill"]["tokens_in_step"])),
                prefill_tokens_per_s=tuple(map(float, raw["prefill"]["tokens_per_s"])),
                decode_batch=tuple(map(float, raw["decode"]["batch"])),
                decode_context=tuple(map(float, raw["decode"]["context"])),
                decode_step_s=tuple(tuple(map(float, r)) for r in raw["decode"]["step_s"]),
                startup=StartupTime(
                    float(raw["startup"]["median_s"]), float(raw["startup"].get("sigma", 0.0))
                ),
                sources={str(k): str(v) for k, v in raw.get("sources", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ProfileError):
                raise
            raise ProfileError(f"profile {raw.get('name', '?')!r} is malformed: {exc}") from exc


def shipped() -> list[str]:
    """Names of the profiles that ship with kvscale."""
    folder = resources.files("kvscale") / "profiles"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_profile(name_or_path: str) -> EngineProfile:
    """A shipped profile by name, or a JSON file."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ProfileError(f"profile file {path} not found")
        text = path.read_text()
    else:
        res = resources.files("kvscale") / "profiles" / f"{name_or_path}.json"
        if not res.is_file():
            raise ProfileError(
                f"unknown profile {name_or_path!r}; shipped: {', '.join(shipped())}, or a path"
            )
        text = res.read_text()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile {name_or_path} is not JSON: {exc}") from exc
    return EngineProfile.from_dict(raw)


def _increasing(values: tuple[float, ...]) -> bool:
    return len(values) > 0 and all(a < b for a, b in pairwise(values))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ProfileError(message)
