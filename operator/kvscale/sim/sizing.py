"""KV-cache budget arithmetic: weights are a floor, KV grows per token, the rest is headroom.

From a model's shape (an HF `config.json` or a named architecture), a dtype and a GPU: weight
bytes, KV bytes per token, how many KV tokens and blocks fit at a memory fraction (after weights
and the activation peak of one `maxNumBatchedTokens` forward), and the concurrency that allows at
a context length. The activation estimate follows the shape of a decoder forward (hidden states,
MLP intermediates, QKV, the sampler's logits for `maxNumSeqs` rows) plus a fixed allowance for
memory outside PyTorch's allocator (CUDA/cuBLAS workspaces); `tests/unit/sim/test_sizing.py` checks
the result against the KV blocks vLLM logged for Llama-3-8B.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

GIB = 2**30
NON_TORCH_BYTES = int(0.5 * GIB)  # CUDA context-side workspaces the allocator does not see
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}

# name -> (device memory as CUDA reports it in GiB, memory bandwidth in bytes/s), datasheets
GPUS: dict[str, tuple[float, float]] = {
    "a100-40gb": (39.39, 1.555e12),
    "a100-80gb": (79.15, 2.039e12),
    "h100-80gb": (79.19, 3.35e12),
    "h200": (139.8, 4.8e12),
    "l4": (22.03, 0.3e12),
}

_LLAMA_3_8B: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 8192,
}  # fmt: skip

ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama-3-8b": _LLAMA_3_8B,
    "llama-3.1-8b": {**_LLAMA_3_8B, "max_position_embeddings": 131072},  # 3.1: a 128k context
    "llama-3-70b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 8192,
        "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "max_position_embeddings": 8192,
    },
    "mistral-7b": {
        "model_type": "mistral", "vocab_size": 32768, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 32768,
    },
    "qwen2-0.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "max_position_embeddings": 32768, "tie_word_embeddings": True,
    },
}  # fmt: skip


class SizingError(ValueError):
    """A model, GPU or budget setting is invalid, or the model does not fit."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    tied_embeddings: bool = False
    qkv_bias: bool = False

    @classmethod
    def from_config(cls, raw: dict[str, Any], name: str = "model") -> ModelShape:
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            return cls(
                name=name,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                max_positions=int(raw.get("max_position_embeddings", 2048)),
                tied_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=raw.get("model_type") == "qwen2" or bool(raw.get("attention_bias")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SizingError(f"config of {name} lacks or mangles a decoder field: {exc}") from exc

    @classmethod
    def load(cls, source: str) -> ModelShape:
        """A named architecture, a config.json file, or a checkpoint directory holding one."""
        if source in ARCHITECTURES:
            return cls.from_config(ARCHITECTURES[source], source)
        path = Path(source)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            names = ", ".join(ARCHITECTURES)
            raise SizingError(f"{source!r} is neither a config.json/checkpoint nor one of: {names}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise SizingError(f"{path} is not JSON: {exc}") from exc
        return cls.from_config(raw.get("text_config", raw), path.parent.name or str(path))

    @property
    def params(self) -> int:
        h, hd = self.hidden_size, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        layer = attn + 3 * h * self.intermediate_size + 2 * h
        embed = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * layer + embed + h

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes


@dataclass(frozen=True)
class Budget:
    model: ModelShape
    gpu_memory_bytes: int  # per GPU
    gpus: int  # tensor-parallel GPUs per replica
    memory_fraction: float
    dtype_bytes: int
    kv_dtype_bytes: int
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int

    def __post_init__(self) -> None:
        if not 0 < self.memory_fraction <= 1:
            raise SizingError("memory fraction must be in (0, 1]")
        if self.gpus < 1 or self.block_size < 1 or self.gpu_memory_bytes <= 0:
            raise SizingError("gpus, block size and GPU memory must be positive")

    @property
    def weight_bytes(self) -> int:
        return self.model.params * self.dtype_bytes

    @property
    def activation_bytes(self) -> int:
        """Peak of one forward over max_num_batched_tokens tokens, per GPU, plus non-torch."""
        m, n = self.model, self.max_num_batched_tokens
        per_token = (
            4 * m.hidden_size
            + 3 * m.intermediate_size // self.gpus
            + (m.num_heads + 2 * m.num_kv_heads) * m.head_dim // self.gpus
        )
        logits = m.vocab_size * 4 * self.max_num_seqs
        return n * per_token * self.dtype_bytes + logits + NON_TORCH_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.kv_dtype_bytes)

    @property
    def kv_bytes(self) -> int:
        """KV-cache bytes over all GPUs of a replica."""
        per_gpu = int(self.gpu_memory_bytes * self.memory_fraction)
        per_gpu -= self.weight_bytes // self.gpus + self.activation_bytes
        return max(per_gpu, 0) * self.gpus

    @property
    def blocks(self) -> int:
        return self.kv_bytes // (self.kv_bytes_per_token * self.block_size)

    @property
    def kv_tokens(self) -> int:
        return self.blocks * self.block_size

    def max_concurrency(self, context: int) -> float:
        return self.kv_tokens / context


def gpu_memory(gpu: str | None, memory_gib: float | None) -> tuple[int, float | None]:
    """(bytes per GPU, bandwidth or None) from a named GPU or an explicit size."""
    if memory_gib is not None:
        if memory_gib <= 0:
            raise SizingError("GPU memory must be positive")
        return int(memory_gib * GIB), GPUS[gpu][1] if gpu in GPUS else None
    if gpu is None:
        raise SizingError(f"give a GPU ({', '.join(GPUS)}) or its memory in GiB")
    if gpu not in GPUS:
        raise SizingError(f"unknown GPU {gpu!r}: one of {', '.join(GPUS)}, or --gpu-memory-gib")
    mem, bandwidth = GPUS[gpu]
    return int(mem * GIB), bandwidth


def round_down(value: float, step: int) -> int:
    return max(step, math.floor(value / step) * step)


class StepModel(Protocol):
    def decode_step(self, batch: FloatArray, context: FloatArray) -> FloatArray: ...
    def prefill_rate(self, tokens_in_step: FloatArray) -> FloatArray: ...


DECODE_SHARE = 0.5  # of the ITL SLO a decode step may take; prefill chunks get the rest
STEP_SHARE = 0.8  # a mixed step (decode + a prefill chunk) stays under this share of the ITL SLO
MAX_SEQS = 1024


def recommend_limits(
    kv_tokens: int, context: float, profile: StepModel | None = None, itl_slo_s: float | None = None
) -> tuple[int, int]:
    """(maxNumSeqs, maxNumBatchedTokens) for a mean context, within the ITL SLO with a profile.

    maxNumSeqs: the sequences the KV cache holds at that context (multiple of 8, at most 1024),
    fewer if a decode step at that batch would take more than half the ITL SLO.
    maxNumBatchedTokens: the largest prefill chunk (multiple of 256) that keeps a mixed step
    under 80% of the ITL SLO; 2048 without a profile; never below maxNumSeqs.
    """
    if context <= 0 or kv_tokens <= 0:
        raise SizingError("context and KV tokens must be positive")
    seqs = min(round_down(kv_tokens / context, 8), MAX_SEQS)
    if profile is None or itl_slo_s is None:
        return seqs, max(2048, seqs)
    ctx = np.array([context])

    def step(b: float) -> float:
        return float(profile.decode_step(np.array([b]), ctx)[0])

    while seqs > 8 and step(seqs) > DECODE_SHARE * itl_slo_s:
        seqs -= 8
    budget = STEP_SHARE * itl_slo_s - step(seqs)
    best = 256
    for chunk in range(256, 32768 + 1, 256):
        rate = float(profile.prefill_rate(np.array([float(chunk)]))[0])
        if chunk / rate <= budget:
            best = chunk
    return seqs, max(best, seqs)
