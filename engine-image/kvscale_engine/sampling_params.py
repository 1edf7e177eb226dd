"""Per-request sampling settings, validated once; a bad value is a client error (HTTP 400)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class SamplingError(ValueError):
    """A sampling parameter is out of range."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    max_tokens: int = 16
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _require(
            0.0 <= self.temperature <= 100.0,
            f"temperature must be in [0, 100], got {self.temperature}",
        )
        _require(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _require(self.top_k >= -1, f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}")
        _require(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _require(all(isinstance(s, str) and s for s in stop), "stop strings must be non-empty")
        _require(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids must be non-negative integers",
        )
        _require(
            self.seed is None or isinstance(self.seed, int),
            f"seed must be an integer, got {self.seed!r}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def max_stop_len(self) -> int:
        return max((len(s) for s in self.stop), default=0)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise SamplingError(message)
