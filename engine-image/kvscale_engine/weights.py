"""Weights: HF parameter names and shapes, seeded random init, and safetensors loading.

Dummy models and the tiny test checkpoints share `init_param`, so `dummy:<dir>` and a checkpoint
written by `write_tiny_checkpoint` into that directory hold the same values (on the same device).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from kvscale_engine.config import ConfigError
from kvscale_engine.model_config import ModelConfig

Shape = tuple[int, ...]


def param_shapes(cfg: ModelConfig) -> dict[str, Shape]:
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes: dict[str, Shape] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h),
            f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h),
            f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.mlp.gate_proj.weight": (inter, h),
            f"{p}.mlp.up_proj.weight": (inter, h),
            f"{p}.mlp.down_proj.weight": (h, inter),
        }
        if cfg.attention_bias:
            shapes |= {
                f"{p}.self_attn.{n}_proj.bias": (s,) for n, s in (("q", q), ("k", kv), ("v", kv))
            }
            if cfg.model_type != "qwen2":
                shapes[f"{p}.self_attn.o_proj.bias"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def init_param(
    name: str, shape: Shape, seed: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Seeded per name, so the values do not depend on the order parameters are visited in."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    out = torch.empty(shape, dtype=torch.float32, device=device).normal_(generator=gen)
    if name.endswith("norm.weight"):
        out = 1.0 + 0.1 * out
    elif name.endswith(".bias"):
        out = 0.1 * out
    elif name == "lm_head.weight":
        out = out * (4.0 / math.sqrt(shape[1]))
    elif "embed_tokens" not in name:
        out = out / math.sqrt(shape[1])
    return out.to(dtype)


def init_weights(cfg: ModelConfig, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    cpu = torch.device("cpu")
    return {n: init_param(n, s, seed, dtype, cpu) for n, s in param_shapes(cfg).items()}


def iter_checkpoint(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a (possibly sharded) safetensors checkpoint."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors files in {path}")
    for file in files:
        with safe_open(str(path / file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield name, f.get_tensor(name)
