"""The decoder's shape, read from an HF `config.json` (or a named architecture for dummy weights).

Llama, Mistral and Qwen2 share one decoder; they differ only in the fields parsed here
(attention bias, sliding window, RoPE scaling, tied embeddings). No torch here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscale_engine.config import ConfigError

SUPPORTED = ("llama", "mistral", "qwen2")

# Real model shapes, so benchmarks can use them without downloads.
NAMED_ARCHS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rope_theta": 500000.0, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
    },
    "mistral-7b": {
        "model_type": "mistral", "vocab_size": 32768, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
    },
    "qwen2-0.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
        "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
    },
    # ~40M parameters: big enough that compute dominates on 2 CPU cores, small enough to bench.
    "llama-bench-cpu": {
        "model_type": "llama", "vocab_size": 8192, "hidden_size": 512,
        "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 2, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    },
    "llama-bench-vllm": {  # llama-bench-cpu with the checkpoint tokenizer's vocabulary
        "model_type": "llama", "vocab_size": 512, "hidden_size": 512,
        "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 2, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    },
    "llama-tiny": {
        "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rope_theta": 10000.0, "max_position_embeddings": 2048,
    },
}  # fmt: skip


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    sliding_window: int | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        model_type = raw.get("model_type", "")
        if model_type not in SUPPORTED:
            raise ConfigError(f"model_type {model_type!r} is not one of {', '.join(SUPPORTED)}")
        heads = int(raw["num_attention_heads"])
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        return cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling={} if rope_type == "default" else {**rope, "rope_type": rope_type},
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
            sliding_window=_sliding_window(model_type, raw),
        )

    @classmethod
    def from_source(cls, source: str) -> ModelConfig:
        """A checkpoint directory or a name from NAMED_ARCHS."""
        if source in NAMED_ARCHS:
            return cls.from_dict(NAMED_ARCHS[source])
        path = Path(source) / "config.json"
        if not path.exists():
            names = ", ".join(NAMED_ARCHS)
            raise ConfigError(f"{source!r} is neither a checkpoint directory nor one of: {names}")
        data: dict[str, Any] = json.loads(path.read_text())
        return cls.from_dict(data)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token at 1 byte per element; multiply by the dtype size."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim


def _sliding_window(model_type: str, raw: dict[str, Any]) -> int | None:
    if model_type == "qwen2" and not raw.get("use_sliding_window", False):
        return None
    window = raw.get("sliding_window")
    return int(window) if window else None
