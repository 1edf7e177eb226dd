"""Rotary position embeddings with the scaling variants Llama-family checkpoints use.

Frequencies follow Hugging Face's `rope_type`s (default, linear, llama3, yarn) so that logits
match `transformers` bit for bit in fp32; cos/sin are cached once for every position.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from kvscale_engine.config import ConfigError

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [tokens, 1, head_dim]


class RotaryEmbedding(nn.Module):
    def __init__(
        self, head_dim: int, theta: float, max_positions: int, scaling: dict[str, Any]
    ) -> None:
        super().__init__()
        inv_freq, attention_factor = rope_frequencies(head_dim, theta, max_positions, scaling)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", emb.cos() * attention_factor, persistent=False)
        self.register_buffer("sin", emb.sin() * attention_factor, persistent=False)

    def at(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos and sin for a step's positions, looked up once and shared by every layer."""
        return (
            self.cos[positions].unsqueeze(1).to(dtype),
            self.sin[positions].unsqueeze(1).to(dtype),
        )


def rotate(rope: Rope, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k: [tokens, heads, head_dim], rotated by `RotaryEmbedding.at`'s cos and sin."""
    cos, sin = rope
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_frequencies(
    dim: int, theta: float, max_positions: int, scaling: dict[str, Any]
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the attention factor for a `rope_type`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    if rope_type == "yarn":
        return _yarn(dim, theta, max_positions, scaling)
    raise ConfigError(f"rope_type {rope_type!r} is not supported (default, linear, llama3, yarn)")


def _llama3(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor, low, high = (
        float(s["factor"]),
        float(s["low_freq_factor"]),
        float(s["high_freq_factor"]),
    )
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(
    dim: int, theta: float, max_positions: int, s: dict[str, Any]
) -> tuple[torch.Tensor, float]:
    factor = float(s["factor"])
    original = int(s.get("original_max_position_embeddings") or max_positions)
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
