"""Engine configuration: one frozen dataclass, validated once at the edge.

Everything the engine derives from user input (blocks per sequence, the dummy-model switch, the
salt that keys the prefix cache) is a property here, so the rest of the engine never re-validates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

SchedulingMode = Literal["continuous", "static"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
AttentionBackend = Literal["auto", "reference", "flex"]
DecodeAttention = Literal["auto", "reference", "triton", "cpu"]  # auto: triton on CUDA, cpu on CPU

DUMMY_PREFIX = "dummy:"


class ConfigError(ValueError):
    """A user-supplied engine setting is invalid."""


@dataclass(frozen=True)
class EngineConfig:
    model: str
    max_model_len: int = 2048
    block_size: int = 16
    memory_fraction: float = 0.9
    num_kv_blocks: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    scheduling: SchedulingMode = "continuous"
    device: str = "auto"
    dtype: DType = "auto"
    seed: int = 0
    attention_backend: AttentionBackend = "auto"
    decode_attention: DecodeAttention = "auto"
    enforce_eager: bool = False  # no CUDA graphs for decode steps
    # fp32 on the CPU: a second copy of each linear's weight for small steps, the C kernel's
    # panels for 1-48 rows, else the checkpoint's layout for 1-3 (packed_linear.py; twice the
    # weight memory)
    small_batch_weights: bool = True
    priority_aging_steps: int = 100

    def __post_init__(self) -> None:
        _require(bool(self.model.strip()), "model must name a checkpoint directory or dummy:<arch>")
        if self.is_dummy:
            _require(bool(self.model_source), "dummy model needs a source: dummy:<dir-or-arch>")
        _require(self.max_model_len >= 1, f"max_model_len must be >= 1, got {self.max_model_len}")
        _require(
            1 <= self.block_size <= 1024 and self.block_size & (self.block_size - 1) == 0,
            f"block_size must be a power of two in [1, 1024], got {self.block_size}",
        )
        _require(
            0.0 < self.memory_fraction <= 1.0,
            f"memory_fraction must be in (0, 1], got {self.memory_fraction}",
        )
        _require(
            self.num_kv_blocks is None or self.num_kv_blocks >= 1,
            f"num_kv_blocks must be >= 1 or unset, got {self.num_kv_blocks}",
        )
        _require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        _require(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}",
        )
        _require(
            self.scheduling in ("continuous", "static"),
            f"scheduling must be 'continuous' or 'static', got {self.scheduling!r}",
        )
        _require(
            self.dtype in ("auto", "float32", "bfloat16", "float16"),
            f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}",
        )
        _require(
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            f"device must be auto, cpu, cuda or cuda:<n>, got {self.device!r}",
        )
        _require(
            self.attention_backend in ("auto", "reference", "flex"),
            f"attention_backend must be auto, reference or flex, got {self.attention_backend!r}",
        )
        _require(
            self.decode_attention in ("auto", "reference", "triton", "cpu"),
            "decode_attention must be auto, reference, triton or cpu, got "
            f"{self.decode_attention!r}",
        )
        _require(
            self.priority_aging_steps >= 1,
            f"priority_aging_steps must be >= 1, got {self.priority_aging_steps}",
        )

    @property
    def is_dummy(self) -> bool:
        return self.model.startswith(DUMMY_PREFIX)

    @property
    def model_source(self) -> str:
        """The checkpoint directory, or for dummy models the directory or architecture name."""
        return self.model.removeprefix(DUMMY_PREFIX)

    @property
    def max_blocks_per_seq(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    @property
    def cache_salt(self) -> str:
        """Everything besides token ids that changes the KV a block holds."""
        return f"{self.model}|{self.dtype}|seed={self.seed if self.is_dummy else ''}"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
